/**
 * What the driver tells every node about the job before training starts: the
 * mode, the workers, and how many batches (and, for bsp, rounds) there are.
 * Written once the batch descriptors are queued, so a worker that sees it
 * knows every batch of the job is already in the queue. Lives in a JetStream
 * KV bucket (NATS) or in memory (embedded mode); nodes watch it until it is
 * there, so nodes and driver may start in any order, and then watch it for
 * the driver's later writes (pause, regroup, resume).
 */
import { z } from 'zod';
import { Kvm, type KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { MemoryWatchers, destroyBucket, watchValues } from './kv-watch.ts';
import { CONSISTENT_KV, createKvBucket, type ReplicaOptions } from './replicas.ts';
import { waitOnWatch } from './plan-store.ts';
import { ConfigError, TimeoutError, decode, encode, streamName, type Clock } from '../../runtime/mod.ts';
import { workerGroupSchema, type HetpsConfig, type WorkerGroupConfig } from '../../topology/mod.ts';

/** A worker group as the job runs it: `cluster.worker_groups[]` of the config, or the scheduler's regrouping (one declaration, in topology). */
export const jobGroupSchema = workerGroupSchema;

export const jobInfoSchema = z.object({
  job: z.string().min(1),
  /** Distinguishes runs of the same job name. */
  run_id: z.string().min(1),
  mode: z.enum(['bsp', 'asp', 'hps']),
  /** Worker node names in file order; bsp rounds expect one contribution from each. */
  workers: z.array(z.string().min(1)).min(1),
  total_batches: z.number().int().nonnegative(),
  /** bsp: ceil(total_batches / workers); every worker takes part in each round. */
  rounds: z.number().int().nonnegative(),
  epochs: z.number().int().positive(),
  batch_size: z.number().int().positive(),
  ack_wait_ms: z.number().int().positive(),
  /** How long an hps group waits for a silent (not dead) member (fault_tolerance.worker_recovery_timeout); absent: ack_wait_ms (an older driver). */
  recovery_timeout_ms: z.number().int().positive().optional(),
  /**
   * The worker groups of the run (hps syncs inside each); null: the config's
   * `cluster.worker_groups` (an older driver, or a job without regrouping).
   */
  groups: z.array(jobGroupSchema).nullable().default(null),
  /**
   * Regrouping (actors/scheduler/regroup.ts): bumped each time the driver writes new
   * `groups`. A worker that sees a newer version pauses at its next window
   * boundary, reports ready, and waits until `resume_version` reaches it.
   */
  groups_version: z.number().int().nonnegative().default(0),
  /** The groups version workers may resume training under; < groups_version: a regroup is in progress. */
  resume_version: z.number().int().nonnegative().default(0),
  /**
   * The pending version is a ctl.pause (groups unchanged), not a regroup:
   * workers wait for ctl.resume however long it takes (a regroup resumes by
   * itself, so a long wait there means the driver is gone).
   */
  paused: z.boolean().default(false),
  /**
   * Workers the groups of `groups_version` take back after their group
   * dropped them (dead by the health verdicts, then alive again: a healed
   * link, a continued process). Such a worker gives up the window it was
   * stuck in (its batches go back to the queue) and pauses at once; the
   * resume re-forms its group with it.
   */
  rejoining: z.array(z.string()).default([]),
  /**
   * Standby workers (fault_tolerance.standby_workers) not training: each
   * waits, warm, until the driver moves it into `workers` and a group in
   * place of a dead member (whose name then moves here).
   */
  standbys: z.array(z.string()).default([]),
  /**
   * `hetps up --resume`: the checkpoint the run started from and the batches
   * done before it (left out of `total_batches`); a standby that takes the
   * run over reads which they are from that checkpoint's manifest.
   */
  resumed_from: z.object({ checkpoint: z.string().min(1), batches_done: z.number().int().nonnegative() }).nullable().optional(),
  /**
   * The run is over (its driver marks it as it stops the nodes): a node
   * started later for the job's next run waits for that run's info instead
   * of joining this one.
   */
  ended: z.boolean().optional(),
});
export type JobInfo = z.infer<typeof jobInfoSchema>;

/** The config's worker groups, as the driver writes them into the job info. */
export function jobGroupsFromConfig(config: HetpsConfig): WorkerGroupConfig[] {
  return config.cluster.worker_groups.map((g) => ({ ...g, nodes: [...g.nodes] }));
}

/** The group `node` trains in: the job info's groups when the driver wrote them, else the config's. */
export function groupOfWorker(info: JobInfo, config: HetpsConfig, node: string): WorkerGroupConfig {
  const groups = info.groups ?? config.cluster.worker_groups;
  const g = groups.find((x) => x.nodes.includes(node));
  if (g === undefined) throw new ConfigError(`worker ${node} is in none of the job's groups (${groups.map((x) => `${x.name}: ${x.nodes.join(', ')}`).join('; ')})`);
  return g;
}

/** Called with each job info written (an exception it throws is dropped: the watch goes on). */
export type JobInfoListener = (info: JobInfo) => void;

export interface JobInfoStore {
  put(info: JobInfo): Promise<void>;
  /** null until the driver has written it. */
  get(): Promise<JobInfo | null>;
  /**
   * Calls `listener` with the current job info (if any) and then with every
   * later write, asynchronously and in order. Resolves once the watch is in
   * place (no later write is missed) with the function that ends it.
   */
  watch(listener: JobInfoListener): Promise<() => void>;
}

export function memoryJobInfoStore(): JobInfoStore {
  let info: JobInfo | null = null;
  const watchers = new MemoryWatchers<JobInfo>((i) => jobInfoSchema.parse(i));
  return {
    async put(i) {
      info = jobInfoSchema.parse(i);
      watchers.publish(info);
    },
    async get() { return info; },
    async watch(listener) { return watchers.add(listener, info === null ? [] : [info]); },
  };
}

export function jobInfoBucket(job: string): string { return streamName(job, 'job'); }
const KEY = 'info';

/** The job info in the KV bucket `HPS_<job>_job`; `create` (the driver) makes the bucket, readers only open it. */
export function natsJobInfoStore(nc: NatsConnection, job: string): JobInfoStore {
  let kv: KV | null = null;
  const bucket = jobInfoBucket(job);
  return {
    async put(info) {
      kv ??= await new Kvm(nc).create(bucket, { ...CONSISTENT_KV, history: 1 });
      await kv.put(KEY, encode(jobInfoSchema.parse(info)));
    },
    async get() {
      try {
        kv ??= await new Kvm(nc).open(bucket);
        const e = await kv.get(KEY);
        if (!e || e.operation !== 'PUT' || e.value.byteLength === 0) return null;
        return jobInfoSchema.parse(decode(e.value));
      } catch {
        kv = null; // bucket not there yet (or being recreated): look again next time
        return null;
      }
    },
    async watch(listener) {
      kv ??= await new Kvm(nc).open(bucket);
      // The default (last value, then updates) hands over the current info first, so nothing written before the watch is missed.
      return watchValues(kv, KEY, (v) => jobInfoSchema.parse(v), listener);
    },
  };
}

/** Creates (or opens) the job info bucket with the replicas the cluster can place; the driver's set-up step. */
export async function createJobInfoBucket(nc: NatsConnection, job: string, opts: ReplicaOptions = {}): Promise<{ replicas: number }> {
  const name = jobInfoBucket(job);
  const { replicas } = await createKvBucket(nc, name, { ...opts, history: 1 });
  return { replicas };
}

/** Removes an earlier run's job info (driver, before it queues a new run). */
export async function resetNatsJobInfo(nc: NatsConnection, job: string): Promise<void> {
  await destroyBucket(nc, jobInfoBucket(job));
}

/**
 * Waits on the store's watch until the job info (of `runId`, when given) is
 * there; `onWait` hears 0 when it is not there at once, then the time waited
 * every 5 s. The error says what is missing.
 */
export async function waitForJobInfo(store: JobInfoStore, opts: { clock: Clock; timeoutMs: number; runId?: string | null; onWait?: (waitedMs: number) => void }): Promise<JobInfo> {
  const start = opts.clock.monotonic();
  // A run that has ended is not joined: the job's next run is waited for (a node started before its driver).
  const wanted = (info: JobInfo | null): info is JobInfo => info !== null && info.ended !== true && (opts.runId == null || info.run_id === opts.runId);
  const now = await store.get();
  if (wanted(now)) return now;
  opts.onWait?.(0);
  return waitOnWatch<JobInfo>({
    clock: opts.clock, start, timeoutMs: opts.timeoutMs,
    // Rejects while the bucket does not exist (a node started before the driver): waitOnWatch tries again every second.
    open: (settle) => store.watch((info) => { if (wanted(info)) settle.done(info); }),
    onNote: (ms) => opts.onWait?.(ms),
    timeout: () => new TimeoutError(`no job info after ${Math.round(opts.timeoutMs / 1000)} s: the driver (hetps up) has not queued this job's batches yet`),
  });
}

/**
 * Waits, without a limit, for a job info of `runId` that `accept` takes (a
 * standby waiting for its place; it ends with the job's shutdown), watching
 * the store; the info taken.
 */
export async function waitForJobInfoWhere(store: JobInfoStore, runId: string, accept: (info: JobInfo) => boolean): Promise<JobInfo> {
  let unwatch: (() => void) | null = null;
  let settled = false;
  try {
    return await new Promise<JobInfo>((resolve, reject) => {
      store.watch((info) => {
        if (settled || info.run_id !== runId || !accept(info)) return;
        settled = true;
        resolve(info);
      }).then((u) => { if (settled) u(); else unwatch = u; }, reject);
    });
  } finally {
    (unwatch as (() => void) | null)?.();
  }
}
