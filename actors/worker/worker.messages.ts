/**
 * The worker actor's control messages, on `hps.<job>.worker.<node>.<op>`.
 * The training loop runs as a task the actor starts; these let the driver
 * (or any NATS client, in JSON) look at it and stop it.
 */
import type { GroupState } from '../group/group.machine.ts';
import type { WindowPhases } from '../group/group-sync.ts';
import { z } from 'zod';
import type { SyncMode } from '../../topology/mod.ts';

export const workerMessages = {
  /** Counters and the loop's state. */
  stats: z.object({}),
  /** Ends the training loop after the step in progress (its batch is pushed and acknowledged, or left to be redelivered). */
  stop: z.object({ reason: z.string().nullable().default(null) }),
};
export type WorkerMessages = typeof workerMessages;

/**
 * Lifecycle of a worker's training loop:
 * - `starting`: creating its step session
 * - `training`: taking and training batches
 * - `done`: the job has no batches left for it (asp: all acknowledged; bsp: every round taken part in; hps: as asp, agreed by the whole group for sync / adaptive groups)
 * - `stopped`: told to stop
 * - `failed`: the loop threw (see `error`)
 */
export type WorkerLoopState = 'starting' | 'training' | 'done' | 'stopped' | 'failed';

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
  /** bsp: the round in progress; null in asp. */
  round: number | null;
  mean_loss: number | null;
  emulated_speed: number | null;
  /** Compute and link are emulated (nodes.<name>.emulate): times are not real hardware's. */
  emulated: boolean;
  error: string | null;
}
