/**
 * The scheduler's mailbox is the job's control subjects:
 * `hps.<job>.ctl.<command>`, request/reply, msgpack or JSON (by the
 * `Content-Type: application/json` header), so any NATS client can drive a
 * job. A JSON caller may send the bare fields (`{}` for status); an unknown
 * command is answered with an error that names the known ones.
 */
import { isAbsolute } from 'node:path';
import { z } from 'zod';
import { JSON_CONTENT_TYPE, controlSubject, type Transport } from '../../runtime/mod.ts';
import { regroupRequestSchema } from './regroup.ts';
import type { LoadBalancingReport } from './load-balancer.ts';
import type { ShardingReport } from '../node/config-bridge.ts';

export const schedulerMessages = {
  /** Where the job stands: groups, workers, shards, progress, regroups, recent events. */
  status: z.object({ events: z.number().int().nonnegative().max(1_000).default(20) }),
  /** Stop training at the next window (hps) or step (asp, bsp) boundary; in-flight batches are finished and acknowledged. */
  pause: z.object({ reason: z.string().min(1).default('control command') }),
  /** Continue a paused job. */
  resume: z.object({}),
  /** Move workers between groups (hps): `{ groups: [...] | null, reason }`. */
  regroup: regroupRequestSchema,
  /** hps: every group re-forms unchanged — a fresh pull, then synchronous rounds (the article's `hetps recover --force-sync`). */
  recover: z.object({ reason: z.string().min(1).default('ctl.recover') }),
  /**
   * A coordinated checkpoint now (a pause for the cut, the files written after the resume); replies `{ path, name, bytes, files, batches_done, pause_ms, write_ms }`.
   * `path`: an absolute directory on the driver's machine that does not exist yet (the API's `saveCheckpoint({ path })`): a full checkpoint written there, outside `checkpoint.dir`'s chain and pruning.
   */
  checkpoint: z.object({
    path: z.string().min(1).refine((p) => isAbsolute(p), { message: 'path must be absolute (the driver writes it, from its own working directory)' }).optional(),
    trigger: z.enum(['command', 'api']).default('command'),
  }),
  /** End the job: every node stops (the nodes listen on this subject too). */
  shutdown: z.object({ run_id: z.string().nullable().default(null), reason: z.string().default('ctl.shutdown') }),
};
export type SchedulerMessages = typeof schedulerMessages;
export const CONTROL_COMMANDS = Object.keys(schedulerMessages) as (keyof SchedulerMessages)[];

/** What a worker, a member and a node look like in `status`. */
export type NodeStatusState = string;

export interface JobStatus {
  job: string;
  run_id: string | null;
  mode: 'bsp' | 'asp' | 'hps' | null;
  /** starting (job not created yet) | training | pausing | paused | regrouping | stopping | done */
  state: string;
  plan_version: number | null;
  groups: { name: string; sync_mode: string; members: { node: string; state: NodeStatusState }[] }[];
  workers: {
    node: string; group: string | null; state: NodeStatusState; health: string | null; steps: number; samples: number; samples_per_s: number;
    /** Time in (emulated) steps over training time so far; null before its first batch. */
    utilisation: number | null;
    last_heartbeat_ms: number | null;
    /** The batches it holds now (taken from the queue, not yet acknowledged or given back; at most 32 named) and how many; null: not reported yet. */
    held: string[] | null;
    held_count: number | null;
  }[];
  shards: {
    shard: string; state: string; version: number | null; rows: number | null; bytes: number | null; pulls: number | null; pushes: number | null;
    last_heartbeat_ms: number | null;
    /** Where its replicas are (the plan's placement), and per other replica the updates not yet confirmed (what a failover could lose under async replication). */
    primary: string; backups: string[]; seeding: string[]; replica_lag: Record<string, number> | null;
  }[];
  progress: { samples: number; batches_acked: number; batches_total: number | null; samples_per_s: number; loss: number | null };
  /**
   * The server nodes' loads as load balancing measures them (floats per
   * second), their imbalance, and the primaries moved so far; null where the
   * balancer does not run (load_balancing.enabled false, the embedded mode).
   */
  load_balancing: LoadBalancingReport | null;
  /** How the plan placed the sparse partitions: hotness sharding's expected floats per shard and their imbalance, or why not; null before the job is attached. */
  sharding: ShardingReport | null;
  regroups: unknown[];
  events: { at_ms: number; kind: string; node: string | null; text: string }[];
}

/** What a JSON caller gets back from `hps.<job>.ctl.<command>`: the result, or the error the scheduler refused with. */
export interface ControlReply { type: string; result?: unknown; error?: { message: string } }

/** A control command as any JSON NATS client sends it (the dashboard, `hetps ctl`, the monitor's status); the reply as it came. */
export async function requestControl(transport: Transport, job: string, command: string, fields: unknown, timeoutMs: number): Promise<ControlReply> {
  const m = await transport.request(controlSubject(job, command), new TextEncoder().encode(JSON.stringify(fields ?? {})),
    { timeoutMs, headers: { 'Content-Type': JSON_CONTENT_TYPE } });
  return JSON.parse(new TextDecoder().decode(m.data)) as ControlReply;
}
