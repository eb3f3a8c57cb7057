/**
 * The worker actor's control messages, on `hps.<job>.worker.<node>.<op>`.
 * The training loop runs as a task the actor starts; these let the driver
 * (or any NATS client, in JSON) look at it, pause, resume and stop it.
 */
import type { GroupState } from '../group/group.machine.ts';
import type { WindowPhases } from '../group/group-sync.ts';
import { z } from 'zod';
import type { SyncMode } from '../../topology/mod.ts';

export const workerMessages = {
  /** Counters and the loop's state. */
  stats: z.object({}),
  /** Ends the training loop after the step in progress (its batch is pushed and acknowledged, or left to be redelivered). Reply: `{ stopping, state }`. */
  stop: z.object({ reason: z.string().nullable().default(null) }),
  /**
   * Pauses this worker at its next step boundary (asp: between batches; bsp:
   * between rounds; hps: between windows, still a member of its group, which
   * waits for it). Paused, it holds no batch and pushes nothing. Reply:
   * `{ pausing, state }`; `pausing` is false once the loop has ended.
   */
  pause: z.object({ reason: z.string().nullable().default(null) }),
  /** Lifts a `pause` (not a job-wide pause: the driver resumes that). Reply: `{ resumed, state }`; `resumed` is false when no pause was asked for. */
  resume: z.object({ reason: z.string().nullable().default(null) }),
};
export type WorkerMessages = typeof workerMessages;

/**
 * Lifecycle of a worker's training loop:
 * - `starting`: creating its step session and watching the job info
 * - `training`: taking and training batches
 * - `pausing`: a pause is asked for (mailbox `pause`, or the job's newer groups_version); the step in progress finishes first
 * - `paused`: at a step boundary, holding no batch, pushing nothing, until resumed (mailbox `resume`, or the job's resume_version)
 * - `stopping`: told to stop; the step in progress finishes or is given back
 * - `stopped`: the loop ended on a stop
 * - `done`: the job has no batches left for it (asp: all acknowledged; bsp: every round taken part in; hps: as asp, agreed by the whole group for sync / adaptive groups)
 * - `failed`: the loop threw (see `error`)
 */
export type WorkerLoopState = 'starting' | 'training' | 'pausing' | 'paused' | 'stopping' | 'stopped' | 'done' | 'failed';

/** States after which the loop runs no more. */
export const WORKER_END_STATES: readonly WorkerLoopState[] = ['stopped', 'done', 'failed'];

export interface PauseReply { pausing: boolean; state: WorkerLoopState }
export interface ResumeReply { resumed: boolean; state: WorkerLoopState }
export interface StopReply { stopping: boolean; state: WorkerLoopState }

export interface WorkerStats {
  node: string;
  group: string;
  state: WorkerLoopState;
  mode: 'bsp' | 'asp' | 'hps';
  /** hps: the group's sync mode; null in asp / bsp. */
  sync_mode: SyncMode | null;
  /** hps: sync windows completed. */
  windows: number;
  /** hps: the group's lifecycle state as this worker's replica of the group machine sees it (null in asp / bsp). */
  group_state: GroupState | null;
  /** hps: shards whose part of a window's update was lost with a member dropped mid-round. */
  lost_shard_updates: number;
  /** hps: the windows' wall time by phase, ms summed over windows; null in asp / bsp. */
  window_phases_ms: WindowPhases | null;
  /** hps: batches whose update was (partly) refused as too stale and dropped (still acknowledged). */
  dropped_stale_batches: number;
  /** hps: batches whose update a shard applied without its dense blocks or its rows (past that kind's training.max_staleness). */
  part_dropped_batches: number;
  /** Real compute of the step graphs so far. */
  busy_ms: number;
  /** The steps as the (emulated) device took them; = busy_ms when not emulated. */
  emulated_step_ms: number;
  steps: number;
  samples: number;
  batches_acked: number;
  /** Acknowledgements the queue did not confirm (the delivery had expired; the batch was redelivered). */
  ack_failures: number;
  /** Batches this worker took that had been delivered before. */
  redelivered_taken: number;
  /** bsp rounds this worker took part in without a batch. */
  empty_rounds: number;
  /** Times this worker left the queue's last batches to faster workers (training.tail_dispatch). */
  tail_declined: number;
  /** bsp: the round in progress; null in asp. */
  round: number | null;
  mean_loss: number | null;
  emulated_speed: number | null;
  /** Compute and link are emulated (nodes.<name>.emulate): times are not real hardware's. */
  emulated: boolean;
  error: string | null;
}
