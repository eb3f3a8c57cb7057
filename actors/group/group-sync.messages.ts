/**
 * Messages of a group member's reduce mailbox, on
 * `hps.<job>.group.<group>@<member>.<op>` (see `groupMemberSubject`). Members
 * of a `sync` or `adaptive` group send them to each other; nobody else does.
 *
 * Every member runs its own replica of the group's lifecycle machine
 * (group.machine.ts); the messages are what feeds it: `join` (forming),
 * `slice` (the sender's window is closed: `member.ready`), `progress` and
 * `close` (adaptive: `step.completed`, `sync.requested`); any message from a
 * member that was reported lost is its `member.rejoined`.
 *
 * A sync of window `w` (round w + 1) is two exchanges:
 * 1. `slice`: every member sends every member (itself included, locally) the
 *    part of its window's gradients that member reduces — the dense blocks
 *    and sparse rows of the shards it owns among `owners` — as weighted sums
 *    Σ samples·grad, one part per step index (`sync`, `adaptive`) or one for
 *    the whole window (`accumulation`), with the shard versions it computed
 *    from. When the round the machine starts has other members than
 *    `owners` (a member was dropped), the slice is sent again under the
 *    round's members;
 * 2. `pushed`: once a member has pushed its reduced slices to its shards it
 *    tells every member how that went; a member starts window `w + 1` (and
 *    pulls) only when every member has, so it never reads parameters without
 *    its group's last update.
 * With training.stream_slices a member sends each step's part of its slices
 * (`part`) as the step completes; the window's `slice` then carries only what
 * was not streamed (`streamed` says how many parts came before).
 * `progress` and `close` (adaptive groups only) are best-effort tells.
 *
 * While a member is dead by the health verdicts the group is async: a member
 * that begins a window then trains it, pushes its own gradient and tells the
 * others `own` for that window instead of sending slices (see `own`).
 */
import { z } from 'zod';
import { zi32 } from '../../runtime/mod.ts';
import { zGradient } from '../shard/shard.messages.ts';

/** Gradients: float32, or compressed (communication.compression: fp16), decoded on arrival. */
const tensors = {
  /** Σ samples·gradient of each dense block of the receiver's shards. */
  dense: z.array(z.object({ block: z.number().int().nonnegative(), grad: zGradient() })),
  /** Σ samples·gradient of each row of the receiver's shards the sender touched. */
  sparse: z.array(z.object({ table: z.string().min(1), ids: zi32(), grads: zGradient() })),
};

const header = {
  /** The job's run; a message of another run (an old process) is ignored. */
  run_id: z.string().min(1),
  /** The sync window, counted from 0 by every member alike. */
  window: z.number().int().nonnegative(),
  /** The sending member (node name). */
  member: z.string().min(1),
};

export const groupSyncMessages = {
  slice: z.object({
    ...header,
    /** Samples the sender trained on in this window (0: it had no batch). */
    weight: z.number().nonnegative(),
    steps: z.number().int().nonnegative(),
    /** The sender's step counter over the whole run (its `step.completed`). */
    total_steps: z.number().int().nonnegative(),
    /** The membership the receiver's shards were assigned under (reduceOwners over this list). */
    owners: z.array(z.string().min(1)).min(1),
    /** The sender took no batch in this window. */
    idle: z.boolean(),
    /** The sender was idle and saw no batch left anywhere (nothing waiting, nothing in flight). */
    drained: z.boolean(),
    /**
     * The newest job-info groups_version the sender has seen. Every member
     * takes the largest of the window's slices, so a whole group pauses for
     * a regroup after the same window.
     */
    groups_version: z.number().int().nonnegative().default(0),
    /** Per shard the receiver owns: the oldest version the sender's pulls from it answered with in this window. */
    base_versions: z.array(z.object({ shard: z.string().min(1), version: z.number().int().nonnegative() })),
    /**
     * The sender's gradients, one part per step index (or one for the window); `weight`: the samples of that part.
     * With `streamed` k > 0 these are the parts from index k on: parts 0..k-1 came before as `part` messages.
     */
    parts: z.array(z.object({ weight: z.number().nonnegative(), ...tensors })),
    /** Leading parts the sender already sent as `part` messages under the same `owners` (training.stream_slices); 0: every part is in `parts`. */
    streamed: z.number().int().nonnegative().default(0),
    /** The ids of the batches the sender trained in this window (pushed with the window's update, for the shards' applied log). */
    batches: z.array(z.string().min(1)).default([]),
  }),
  /**
   * training.stream_slices: part `index` of the sender's slice of `window`
   * (its gradient of that step, for the receiver's shards under `owners`),
   * sent as soon as the step is done so the slice is mostly out when the
   * window closes. Inert until the window's `slice` arrives saying it was
   * streamed under the same owners: a window dropped for a pause, or dealt
   * anew, never uses it.
   */
  part: z.object({
    ...header,
    index: z.number().int().nonnegative(),
    owners: z.array(z.string().min(1)).min(1),
    part: z.object({ weight: z.number().nonnegative(), ...tensors }),
  }),
  pushed: z.object({
    ...header,
    /** Shards that applied the sender's reduced slice. */
    applied: z.array(z.string()),
    /** Shards that refused it as too stale (StaleUpdateError): that part of the group's gradient is dropped. */
    refused: z.array(z.string()),
    /** Shards that applied it without its dense blocks or its rows (past that kind's training.max_staleness); absent from older members: none. */
    part_dropped: z.array(z.string()).default([]),
    /** Largest staleness the sender's shards reported. */
    staleness: z.number().int().nonnegative(),
    /** The newest job-info groups_version the sender had seen when it reported (a pause noticed during the round's pushes). */
    groups_version: z.number().int().nonnegative().default(0),
  }),
  /** adaptive: the sender's step counter over the whole run is now `steps`. */
  progress: z.object({ ...header, steps: z.number().int().nonnegative() }),
  /** adaptive: the sender closed `window` (the progress gap or its step cap was reached, or it found no batch). */
  close: z.object({ ...header }),
  /**
   * degraded (a member dead by the health verdicts): the sender pushes its
   * window `window` alone and sends no slices for it, so no round of that
   * window can start; a member that began the window in sync pushes its own
   * gradient too instead of waiting for the round.
   */
  own: z.object({ ...header }),
  /** forming: the sender's mailbox is up; answered, so the sender knows this member's is too. */
  join: z.object({ run_id: z.string().min(1), member: z.string().min(1) }),
};
export type GroupSyncMessages = typeof groupSyncMessages;
export type SliceMessage = z.output<typeof groupSyncMessages.slice>;
/** A slice as sent: its gradients may be compressed. */
export type SliceWire = z.input<typeof groupSyncMessages.slice>;
export type PushedMessage = z.output<typeof groupSyncMessages.pushed>;
export type PartMessage = z.output<typeof groupSyncMessages.part>;
/** A streamed part as sent: its gradients may be compressed. */
export type PartWire = z.input<typeof groupSyncMessages.part>;
export type SlicePart = SliceMessage['parts'][number];
