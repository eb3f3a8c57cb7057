/**
 * The workers' latest profiles, where the driver can read them whatever the
 * start order: a JetStream KV bucket `HPS_<job>_profiles` (one key per node)
 * over NATS, a map in embedded mode — the same two backends as the job info
 * (actors/store/job-info.ts). A sibling bucket rather than a key in the job info's:
 * workers write here before the driver has created the job, and the driver
 * rewrites the job info whole.
 *
 * A driver starting a run empties the bucket (`resetNatsProfiles`), so an
 * earlier run's profiles never group this one; a worker that joined before
 * the driver writes its profile again every few seconds until it sees the
 * job (actors/node/profile-reporter.ts), so it is not lost to that reset.
 */
import { Kvm, type KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { CONSISTENT_KV, createKvBucket, type ReplicaOptions } from './replicas.ts';
import { MemoryWatchers, destroyBucket, watchValues } from './kv-watch.ts';
import { decode, encode, streamName } from '../../runtime/mod.ts';
import { profileTelemetrySchema, type ProfileTelemetry } from '../monitor/telemetry.ts';

/** Called with each profile stored (an exception it throws is dropped: the watch goes on). */
export type ProfileListener = (profile: ProfileTelemetry) => void;

export interface ProfileStore {
  put(profile: ProfileTelemetry): Promise<void>;
  /** The latest profile of each of `nodes` that has one. */
  getMany(nodes: readonly string[]): Promise<Map<string, ProfileTelemetry>>;
  /**
   * Calls `listener` with the latest profile of every node that has one, then
   * with every later put, asynchronously. Resolves once the watch is in place
   * (no later put is missed) with the function that ends it; rejects while
   * the store cannot be watched yet (over NATS: no bucket yet).
   */
  watch(listener: ProfileListener): Promise<() => void>;
}

export function memoryProfileStore(): ProfileStore {
  const profiles = new Map<string, ProfileTelemetry>();
  const watchers = new MemoryWatchers<ProfileTelemetry>((p) => profileTelemetrySchema.parse(p));
  return {
    async put(p) {
      const v = profileTelemetrySchema.parse(p);
      profiles.set(v.node, v);
      watchers.publish(v);
    },
    async getMany(nodes) {
      const out = new Map<string, ProfileTelemetry>();
      for (const n of nodes) { const p = profiles.get(n); if (p) out.set(n, p); }
      return out;
    },
    async watch(listener) { return watchers.add(listener, profiles.values()); },
  };
}

export function profileBucket(job: string): string { return streamName(job, 'profiles'); }

/**
 * A node name as a KV key. Node names are subject tokens, which may hold
 * characters KV keys may not (`:` in `a100-node-1:8080`): those are
 * base64url-encoded under another prefix, so the two forms never collide.
 */
export function profileKey(node: string): string {
  return /^[-_A-Za-z0-9]+$/.test(node) ? `n.${node}` : `x.${Buffer.from(node, 'utf8').toString('base64url')}`;
}

/** The driver creates the bucket before it starts the nodes (`createProfileBucket`); a worker that comes first creates it on its first put. */
export function natsProfileStore(nc: NatsConnection, job: string): ProfileStore {
  const bucket = profileBucket(job);
  let writer: KV | null = null;
  let reader: KV | null = null;
  return {
    async put(p) {
      const v = profileTelemetrySchema.parse(p);
      try {
        // A worker that comes first makes a plain bucket; the driver then uses it as it is (createKvBucket).
        writer ??= await new Kvm(nc).create(bucket, { ...CONSISTENT_KV, history: 1 });
        await writer.put(profileKey(v.node), encode(v));
      } catch (e) {
        writer = null; // the bucket was reset under us: create it again next time
        throw e;
      }
    },
    async getMany(nodes) {
      const out = new Map<string, ProfileTelemetry>();
      try {
        reader ??= await new Kvm(nc).open(bucket);
        for (const n of nodes) {
          const e = await reader.get(profileKey(n));
          if (!e || e.operation !== 'PUT' || e.value.byteLength === 0) continue;
          const r = profileTelemetrySchema.safeParse(decode(e.value));
          if (r.success && r.data.node === n) out.set(n, r.data);
        }
      } catch {
        reader = null; // no bucket yet (no worker has joined): look again next time
      }
      return out;
    },
    async watch(listener) {
      try {
        reader ??= await new Kvm(nc).open(bucket);
        // Every key: the last profile of each node first, then each put, so nothing stored before the watch is missed.
        return await watchValues(reader, '>', (v, e) => {
          const r = profileTelemetrySchema.safeParse(v);
          // As getMany: only a profile under its own node's key.
          return r.success && profileKey(r.data.node) === e.key ? r.data : null;
        }, listener);
      } catch (e) {
        reader = null; // no bucket yet (or it was reset): open it again next time
        throw e;
      }
    },
  };
}

/** Creates (or opens) the profile bucket with the replicas the cluster can place; the driver's set-up step, before the workers put. */
export async function createProfileBucket(nc: NatsConnection, job: string, opts: ReplicaOptions = {}): Promise<{ replicas: number }> {
  const name = profileBucket(job);
  const { replicas } = await createKvBucket(nc, name, { ...opts, history: 1 });
  return { replicas };
}

/** Empties the profile bucket of an earlier run of this job name (driver, before it starts the nodes). */
export async function resetNatsProfiles(nc: NatsConnection, job: string): Promise<void> {
  await destroyBucket(nc, profileBucket(job));
}
