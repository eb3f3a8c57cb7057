/**
 * What the driver tells every node about the job before training starts: the
 * mode, the workers, and how many batches (and, for bsp, rounds) there are.
 * Written once the batch descriptors are queued, so a worker that sees it
 * knows every batch of the job is already in the queue. Lives in a JetStream
 * KV bucket (NATS) or in memory (embedded mode); nodes poll it, so nodes and
 * driver may start in any order.
 */
import { z } from 'zod';
import { Kvm, type KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { ConfigError, TimeoutError, decode, encode, streamName, type Clock } from '../../runtime/mod.ts';
import { SYNC_MODES, type HetpsConfig, type WorkerGroupConfig } from '../../topology/mod.ts';

/** A worker group as the job runs it: `cluster.worker_groups[]` of the config, or the scheduler's regrouping. */
export const jobGroupSchema = z.object({
  name: z.string().min(1),
  /** Members in rank order. */
  nodes: z.array(z.string().min(1)).min(1),
  sync_mode: z.enum(SYNC_MODES),
  sync_steps: z.number().int().positive().nullable(),
  accumulation_steps: z.number().int().positive().nullable(),
  adaptive_threshold: z.number().int().positive().nullable(),
});

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

export interface JobInfoStore {
  put(info: JobInfo): Promise<void>;
  /** null until the driver has written it. */
  get(): Promise<JobInfo | null>;
}

export function memoryJobInfoStore(): JobInfoStore {
  let info: JobInfo | null = null;
  return {
    async put(i) { info = jobInfoSchema.parse(i); },
    async get() { return info; },
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
      kv ??= await new Kvm(nc).create(bucket, { history: 1 });
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
  };
}

/** Removes an earlier run's job info (driver, before it queues a new run). */
export async function resetNatsJobInfo(nc: NatsConnection, job: string): Promise<void> {
  try {
    const kv = await new Kvm(nc).open(jobInfoBucket(job));
    await kv.destroy();
  } catch { /* not there */ }
}

/** Polls until the job info is there; the error says what is missing. */
export async function waitForJobInfo(store: JobInfoStore, opts: { clock: Clock; timeoutMs: number; runId?: string | null; onWait?: (waitedMs: number) => void }): Promise<JobInfo> {
  const start = opts.clock.monotonic();
  let lastNote = start;
  for (let first = true; ; first = false) {
    const info = await store.get();
    if (info && (opts.runId == null || info.run_id === opts.runId)) return info;
    if (first) opts.onWait?.(0);
    const now = opts.clock.monotonic();
    if (now - start >= opts.timeoutMs) {
      throw new TimeoutError(`no job info after ${Math.round(opts.timeoutMs / 1000)} s: the driver (hetps up) has not queued this job's batches yet`);
    }
    if (now - lastNote >= 5_000) { lastNote = now; opts.onWait?.(now - start); }
    await opts.clock.sleep(200);
  }
}
