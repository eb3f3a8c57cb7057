/**
 * What workers report on `hps.<job>.tel.<kind>.<node>` (msgpack), and what
 * the driver reads back: one `batch` message per acknowledged batch (the
 * exactly-once accounting and the progress line), a `progress` message every
 * few seconds, one `done` message when a worker's training loop ends, and its
 * `profile` when it joins and every half minute or so while it trains.
 *
 * Time accounting (for utilisation = busy / wall): `busy_ms` is the real
 * compute of the step graph; `emulated_step_ms` is the step as the emulated
 * device took it (max(real, emulation_reference_step_ms / emulate.speed)),
 * equal to `busy_ms` on a node that is not emulated. An emulated node's
 * device utilisation is therefore emulated_step_ms / wall, its host's CPU use
 * busy_ms / wall. Fields added after the first version default when absent,
 * so older senders (and the API worker) still validate.
 */
import { z } from 'zod';
import { decode, encode, telemetrySubject, telemetryWildcard, type Transport } from '../../runtime/mod.ts';
import { SYNC_MODES, type NodeProfile } from '../../topology/mod.ts';

const msOrNull = () => z.number().nonnegative().nullable().default(null);

export const TELEMETRY_KINDS = { start: 'start', batch: 'batch', progress: 'progress', done: 'done', regroup: 'regroup', profile: 'profile' } as const;

export const batchTelemetrySchema = z.object({
  node: z.string(),
  batch_id: z.string(),
  samples: z.number().int().nonnegative(),
  loss: z.number(),
  /** The batch had been delivered before (a worker died or was too slow with it). */
  redelivered: z.boolean(),
  /** The queue confirmed the acknowledgement (false: the delivery had expired and the batch went back). */
  ack_confirmed: z.boolean(),
  /** Largest shard staleness of the push (versions the gradient lagged). */
  staleness: z.number().int().nonnegative(),
  /** bsp round, null in asp. */
  round: z.number().int().nonnegative().nullable(),
  /** Real compute of this batch's step graph; null when not reported. */
  busy_ms: msOrNull(),
  /** The step as the (emulated) device took it; = busy_ms when not emulated. */
  emulated_step_ms: msOrNull(),
  /** hps: (part of) the update this batch went into was refused by a shard as too stale and dropped; the batch still counts as trained. */
  dropped_stale: z.boolean().default(false),
  /** hps: a shard applied that update without its dense blocks or its rows (past that kind's training.max_staleness { dense, sparse }). */
  part_dropped: z.boolean().default(false),
  /** hps: the worker's sync window the batch was trained in; null otherwise. */
  window: z.number().int().nonnegative().nullable().default(null),
  /** hps: the group the batch was trained in (it changes when the job regroups); null otherwise. */
  group: z.string().nullable().default(null),
});
export type BatchTelemetry = z.infer<typeof batchTelemetrySchema>;

/** Batch ids a progress message names at most (`held_count` counts them all). */
export const PROGRESS_HELD_IDS = 32;

export const progressTelemetrySchema = z.object({
  node: z.string(),
  group: z.string(),
  steps: z.number().int().nonnegative(),
  samples: z.number().int().nonnegative(),
  /** Mean loss since the previous progress message; null when no step ran. */
  loss: z.number().nullable(),
  samples_per_s: z.number().nonnegative(),
  round: z.number().int().nonnegative().nullable(),
  /** Emulated speed factor (nodes.<name>.emulate.speed), null when the node runs at its own speed. */
  emulated_speed: z.number().nullable(),
  /** The node's compute (and link) are emulated: its times are not real hardware's. */
  emulated: z.boolean().default(false),
  /** Since the previous progress message: real compute, emulated step time, and the wall time of the window. */
  busy_ms: z.number().nonnegative().default(0),
  emulated_step_ms: z.number().nonnegative().default(0),
  window_ms: z.number().nonnegative().default(0),
  /** How long before this message the worker's first training step began (time to target counts from a run's first step); null before it. */
  first_step_ago_ms: msOrNull(),
  /** The worker process's payload bytes on the wire so far, sent and received (its transport's counters). */
  bytes_out: z.number().nonnegative().default(0),
  bytes_in: z.number().nonnegative().default(0),
  /** How the worker's gradients leave it now (communication.compression; adaptive: its current choice); null: not reported. */
  compression: z.enum(['fp16', 'none']).nullable().default(null),
  /** The worker's link utilisation over the last 10 s (topology/compression.ts); null before a second of link activity, or not reported. */
  link_utilisation: z.number().min(0).max(1).nullable().default(null),
  /**
   * The batches the worker holds now (taken from the queue, not yet
   * acknowledged or given back): the first PROGRESS_HELD_IDS ids, and how many in all. A
   * stalled job's driver names who holds what is still unacknowledged.
   * Absent (an older worker): not reported.
   */
  held: z.array(z.string()).max(PROGRESS_HELD_IDS).nullable().default(null),
  held_count: z.number().int().nonnegative().nullable().default(null),
  /** The training loop's state (starting, training, pausing, paused, …); null: not reported. */
  loop_state: z.string().nullable().default(null),
  /** hps: the group's lifecycle state as the worker sees it (running.sync.reducing, degraded, …); null otherwise. */
  group_state: z.string().nullable().default(null),
  /** hps: sync windows completed; null otherwise. */
  windows: z.number().int().nonnegative().nullable().default(null),
  /** How long before this message the worker last acknowledged a batch; null before its first. */
  last_ack_ago_ms: msOrNull(),
});
export type ProgressTelemetry = z.infer<typeof progressTelemetrySchema>;

/** A worker's training loop has started (it has the job, the plan and every shard). */
export const startTelemetrySchema = z.object({
  node: z.string(),
  group: z.string(),
  mode: z.enum(['bsp', 'asp', 'hps']),
  emulated_speed: z.number().nullable(),
  emulated: z.boolean().default(false),
  /** hps: the group's sync mode; null in asp / bsp. */
  sync_mode: z.enum(SYNC_MODES).nullable().default(null),
  /** An emulated node's step time (emulation_reference_step_ms / speed); null when not emulated. */
  emulated_step_target_ms: msOrNull(),
});
export type StartTelemetry = z.infer<typeof startTelemetrySchema>;

export const doneTelemetrySchema = z.object({
  node: z.string(),
  steps: z.number().int().nonnegative(),
  samples: z.number().int().nonnegative(),
  batches_acked: z.number().int().nonnegative(),
  empty_rounds: z.number().int().nonnegative(),
  reason: z.string(),
  /** Whole loop: real compute, emulated step time, wall time from the loop's start. */
  busy_ms: z.number().nonnegative().default(0),
  emulated_step_ms: z.number().nonnegative().default(0),
  wall_ms: z.number().nonnegative().default(0),
  emulated: z.boolean().default(false),
  emulated_speed: z.number().nullable().default(null),
  /** hps: batches whose update was (partly) refused as too stale and dropped. */
  dropped_stale_batches: z.number().int().nonnegative().default(0),
  /** hps: batches whose update a shard applied without its dense blocks or its rows. */
  part_dropped_batches: z.number().int().nonnegative().default(0),
  /** hps: sync windows the worker went through. */
  windows: z.number().int().nonnegative().default(0),
  /** Times the worker left the queue's last batches to faster workers (training.tail_dispatch). */
  tail_declined: z.number().int().nonnegative().default(0),
  /** hps: the windows' wall time by phase, ms summed over windows (see WindowPhases in actors/group/group-sync.ts; `inputs` 0 from a worker before it had that phase); null in asp / bsp. */
  window_phases_ms: z.object({
    steps: z.number(), inputs: z.number().default(0), slices: z.number(), round: z.number(), gather: z.number(), push: z.number(), reports: z.number(),
  }).nullable().default(null),
});
export type DoneTelemetry = z.infer<typeof doneTelemetrySchema>;

/**
 * hps regrouping: `ready` when a worker has paused for groups_version (its
 * last window pushed and acknowledged), `resumed` when it trains in its new
 * group.
 */
export const regroupTelemetrySchema = z.object({
  node: z.string(),
  groups_version: z.number().int().nonnegative(),
  state: z.enum(['ready', 'resumed']),
  group: z.string(),
});
export type RegroupTelemetry = z.infer<typeof regroupTelemetrySchema>;

/**
 * A worker's profile (topology/grouping.ts `NodeProfile`): published once
 * when it joins (`phase: 'join'`, measured by actors/node/node-profile.ts) and
 * again every `cluster.profiling.republish_seconds` while it trains
 * (`phase: 'training'`, with `step_ms_variance` from its last `steps` step
 * times). Emulation is labelled (`emulated`, `link`). The latest one is also
 * in the job's profile store (actors/store/profile-store.ts).
 */
export const profileTelemetrySchema = z.object({
  node: z.string().min(1),
  matmul_gflops: z.number().positive(),
  gather_rows_per_s: z.number().positive(),
  memory_gb: z.number().positive(),
  cpus: z.number().int().positive(),
  providers: z.array(z.string().min(1)),
  variance: z.number().nonnegative(),
  bandwidth_mbps: z.number().positive(),
  rtt_ms: z.number().nonnegative(),
  step_ms_variance: z.number().nonnegative().nullable(),
  emulated: z.boolean(),
  link: z.enum(['nats', 'embedded', 'emulated']).nullable(),
  phase: z.enum(['join', 'training']),
  /** Step times behind step_ms_variance; 0 at join. */
  steps: z.number().int().nonnegative(),
  /** How long the join-time probe took (device + network), ms. */
  probe_ms: z.number().nonnegative(),
  /**
   * Who measured the device part (matmul, gather, memory, cpus, variance) and
   * the network part (rtt, bandwidth): `node` itself, or `host`: measured
   * once for a machine shared by several nodes (embedded mode, the processes
   * `hetps up` launches on its machine), each node applying its own emulation.
   */
  device_from: z.enum(['node', 'host']).default('node'),
  network_from: z.enum(['node', 'host']).default('node'),
});
export type ProfileTelemetry = z.infer<typeof profileTelemetrySchema>;

/** The NodeProfile inside a profile message (what grouping reads). */
export function nodeProfileOf(t: ProfileTelemetry): NodeProfile {
  const { phase: _phase, steps: _steps, probe_ms: _probe, device_from: _device, network_from: _network, ...profile } = t;
  return { ...profile, providers: [...profile.providers] };
}

export function publishTelemetry(transport: Transport, job: string, kind: keyof typeof TELEMETRY_KINDS, node: string, body: object): void {
  try {
    transport.publish(telemetrySubject(job, TELEMETRY_KINDS[kind], node), encode(body));
  } catch {
    // Telemetry is best effort: a closed connection at shutdown must not fail a step.
  }
}

export interface TelemetryHandlers {
  start?: (t: StartTelemetry) => void;
  batch?: (t: BatchTelemetry) => void;
  progress?: (t: ProgressTelemetry) => void;
  done?: (t: DoneTelemetry) => void;
  regroup?: (t: RegroupTelemetry) => void;
  profile?: (t: ProfileTelemetry) => void;
}

/** Subscribes to a job's worker telemetry; malformed messages are skipped. Returns the unsubscribe function. */
export function subscribeTelemetry(transport: Transport, job: string, handlers: TelemetryHandlers): () => void {
  const subs = (Object.keys(TELEMETRY_KINDS) as (keyof typeof TELEMETRY_KINDS)[]).filter((k) => handlers[k]).map((kind) =>
    transport.subscribe(telemetryWildcard(job, TELEMETRY_KINDS[kind]), (m) => {
      let v: unknown;
      try { v = decode(m.data); } catch { return; }
      if (kind === 'start') { const r = startTelemetrySchema.safeParse(v); if (r.success) handlers.start!(r.data); }
      else if (kind === 'batch') { const r = batchTelemetrySchema.safeParse(v); if (r.success) handlers.batch!(r.data); }
      else if (kind === 'progress') { const r = progressTelemetrySchema.safeParse(v); if (r.success) handlers.progress!(r.data); }
      else if (kind === 'regroup') { const r = regroupTelemetrySchema.safeParse(v); if (r.success) handlers.regroup!(r.data); }
      else if (kind === 'profile') { const r = profileTelemetrySchema.safeParse(v); if (r.success) handlers.profile!(r.data); }
      else { const r = doneTelemetrySchema.safeParse(v); if (r.success) handlers.done!(r.data); }
    }));
  return () => { for (const s of subs) s.unsubscribe(); };
}
