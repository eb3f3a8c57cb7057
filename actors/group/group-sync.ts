/**
 * hps: synchronous inside a worker group, asynchronous between groups. One
 * `GroupMember` per worker runs its group's strategy in windows, and a
 * replica of the group's lifecycle machine (group.machine.ts) per member
 * decides when a window's round starts, who takes part, and what happens
 * when a member goes silent:
 *
 * - `sync` (the reference article's fixed-step sync, sync_steps N): every
 *   member takes N steps with the parameters fixed for the window (dense
 *   parameters pulled once at its start, each batch's rows when it needs
 *   them), keeping each step's Σ samples·gradient apart. Once every member
 *   is ready (`member.ready`: its slices are out; a member out of batches is
 *   ready with fewer steps) the machine starts the round and the group
 *   reduces without a leader — reduce-scatter over NATS: shard i of the plan
 *   is reduced by member i mod M of the round; every member sends each
 *   member its slice, each member sums the slices it receives per step
 *   index and pushes them to its shards as N consecutive updates (one push
 *   per shard: the first step and `later_steps`), each the mean gradient of
 *   the members' k-th batches. So a window is N optimizer steps on batches
 *   of M·B samples whose gradients are up to N − 1 steps delayed — the
 *   article's "larger N, less communication, more gradient delay".
 *   With training.stream_slices (default on) each step's part of a
 *   member's slices goes out as the step completes (`part`), so the slices
 *   are mostly out, and the exchange mostly done, when the window closes.
 * - `adaptive` (adaptive_threshold T): the same exchange, but members step
 *   freely, telling each other their step counters (`progress`); the round
 *   starts when the fastest member leads the slowest by T steps, or one
 *   reached 2·T, or a member ran out of batches (`close` →
 *   `sync.requested`).
 * - `accumulation` (accumulation_steps K): the article's gradient
 *   accumulation, "equivalent to a larger batch": like `sync`, but a round
 *   is one optimizer step on the union of the group's K·M batches.
 * - `async`: a member pushes after every step; no round, no barrier.
 *
 * Between groups nothing waits: the shards scale a push staler than the
 * tolerance and refuse one beyond training.max_staleness (topology/
 * staleness.ts). A refused part is dropped: the window's batches are still
 * acknowledged (counted as dropped stale) and the next window pulls fresh
 * parameters.
 *
 * A member dead by the health actor's verdict degrades the group to async
 * (`degraded`): a round already under way finishes among the others (the
 * round is dealt anew; the dead worker's unacknowledged batches come back
 * from the queue), and every window that starts afterwards is pushed by its
 * member alone, the others told `own` (a member that began the window in
 * sync then pushes alone too). The driver re-forms the group when the
 * member is alive again (a fresh pull, sync again) or when the recovery
 * timeout passes with it still dead (the others form without it).
 * Without health verdicts, a member the group waits for that stays silent
 * for `lostAfterMs` is reported lost (`degraded`, no rounds); if it is not
 * heard from within the recovery timeout the machine drops it and the group
 * goes on in sync without it. A member dropped after it took the slices of
 * a round but before it reported its push takes that part of the round's
 * update with it (`lostShards`, logged).
 *
 * Batches are acknowledged by the caller after `runWindow` returns, i.e. once
 * every shard took (or refused) the group's update of them.
 */
import {
  ActorStoppedError, HetpsError, ValidationError, Wakeup, groupMemberId, isRetryable, type Actor, type ActorContext, type ActorDefinition, type ActorRef, type ActorSystem, type Clock, type Logger,
} from '../../runtime/mod.ts';
import { groupLrMultiplier, splitIdsByShard, type GroupLrRule, type IdsForShard, type ShardPlan, type WorkerGroupConfig } from '../../topology/mod.ts';
import { IdIndex, type Batch } from '../../native-bridge/mod.ts';
import { wireTensorBytes, type GradientTensors, type PushRequest } from '../shard/shard.messages.ts';
import { StopRequestedError } from '../worker/shard-client.ts';
import { anyPartDropped, maxPushStaleness, type ComputedStep, type PreparedStep, type PushResult, type WorkerStepper } from '../worker/step.ts';
import { groupSyncMessages, type GroupSyncMessages, type PartMessage, type PartWire, type PushedMessage, type SliceMessage, type SliceWire } from './group-sync.messages.ts';
import { groupEvents } from './group.events.ts';
import { createGroupActor, groupStateOf, type GroupActor, type GroupState } from './group.machine.ts';
import { syncPolicyFromConfig, type SyncPolicy } from './sync-policy.ts';
import type { HealthState, HealthView } from '../health/health.types.ts';

/** adaptive: a member closes its window after this many times adaptive_threshold steps even when nobody drifted apart. */
export const ADAPTIVE_MAX_STEPS_FACTOR = 2;

/**
 * How often a member stepping checks whether a pause made it drop its
 * window (`discardOnPause`) when nothing tells it (`closeEarlyChanged`
 * absent). A 5 ms poll costs a Node process ~12 ms of CPU a second.
 */
const DROP_CHECK_MS = 5;
/** With `closeEarlyChanged`: the longest a member goes without looking anyway. */
const DROP_RECHECK_MS = 1_000;

/** Steps a member takes in one window at most. */
export function windowStepLimit(group: Pick<WorkerGroupConfig, 'sync_mode' | 'sync_steps' | 'accumulation_steps' | 'adaptive_threshold'>): number {
  switch (group.sync_mode) {
    case 'sync': return group.sync_steps ?? 1;
    case 'accumulation': return group.accumulation_steps ?? 1;
    case 'adaptive': return ADAPTIVE_MAX_STEPS_FACTOR * (group.adaptive_threshold ?? 1);
    case 'async': return 1;
  }
}

/** The modes whose members reduce together in rounds (`async` members push on their own). */
export function reducesInGroup(mode: WorkerGroupConfig['sync_mode']): boolean {
  return mode !== 'async';
}

/** The modes that push a window as one update per step index (`accumulation`: one update for the window). */
export function pushesPerStep(mode: WorkerGroupConfig['sync_mode']): boolean {
  return mode === 'sync' || mode === 'adaptive';
}

/** The shards `member` reduces under `owners` (see reduceOwners). */
function ownedBy(shards: readonly string[], owners: readonly string[], member: string): Set<string> {
  const out = new Set<string>();
  for (const [s, m] of reduceOwners(shards, owners)) if (m === member) out.add(s);
  return out;
}

/** Reduce-scatter ownership: shard i of the plan is reduced (and pushed) by member i mod M. */
export function reduceOwners(shards: readonly string[], members: readonly string[]): Map<string, string> {
  return new Map(shards.map((s, i) => [s, members[i % members.length]!]));
}

// ---------------------------------------------------------------- gradient sums

/**
 * Σ scale·row per id, in float64, ids in first-seen order. A member fills
 * one per step and table every window (and a reducer one per step index
 * every round): the index, the id list and the sums are typed arrays kept
 * across `clear`, so a window allocates nothing once they have grown to a
 * step's ids, and the ids' split by shard is made once per fill, not once
 * per owner that is sent a part of it.
 */
class RowSums {
  private readonly index = new IdIndex(1024);
  private idBuf = new Int32Array(1024);
  private count = 0;
  private sums: Float64Array;
  /** `splitIdsByShard` of the ids as they are now; null after a change. */
  private split: Map<string, IdsForShard> | null = null;
  constructor(readonly dim: number) { this.sums = new Float64Array(dim * 1024); }
  get size(): number { return this.count; }

  /** Adds scale·grads[k] to the row of ids[k]. */
  add(ids: ArrayLike<number>, grads: Float32Array, scale: number): void {
    const d = this.dim;
    this.split = null;
    for (let k = 0; k < ids.length; k++) {
      const id = ids[k]! | 0;
      const row = this.index.getOrSet(id, this.count);
      const to = row * d;
      const from = k * d;
      const sums = row === this.count ? this.newRow(id) : this.sums;
      for (let c = 0; c < d; c++) sums[to + c] = sums[to + c]! + scale * grads[from + c]!;
    }
  }

  /** Appends `id` as the next row (its sums zero), growing the arrays when full; the sums array to write to. */
  private newRow(id: number): Float64Array {
    const row = this.count++;
    if (row === this.idBuf.length) {
      const ids = new Int32Array(row * 2); ids.set(this.idBuf); this.idBuf = ids;
    }
    this.idBuf[row] = id;
    if ((row + 1) * this.dim > this.sums.length) {
      const grown = new Float64Array(this.sums.length * 2);
      grown.set(this.sums);
      this.sums = grown;
    }
    return this.sums;
  }

  /** The ids split by the shard that owns them (`splitIdsByShard`), computed once per change. */
  byShard(plan: ShardPlan): Map<string, IdsForShard> {
    this.split ??= splitIdsByShard(plan, this.idBuf.subarray(0, this.count));
    return this.split;
  }

  /** The rows at `positions` (row indices), times `scale`, as float32. */
  rows(positions: ArrayLike<number>, scale: number): Float32Array<ArrayBuffer> {
    const d = this.dim;
    const out = new Float32Array(positions.length * d);
    for (let j = 0; j < positions.length; j++) {
      const from = positions[j]! * d;
      for (let c = 0; c < d; c++) out[j * d + c] = this.sums[from + c]! * scale;
    }
    return out;
  }

  clear(): void {
    this.index.clear();
    this.sums.fill(0, 0, this.count * this.dim);
    this.count = 0;
    this.split = null;
  }
}

/** Gradient tensors of some shards, as pushes and slices carry them. */
export type ShardTensors = GradientTensors;

/**
 * Dense blocks and sparse rows summed in float64, cut by shard. Holds one
 * member's window (Σ samples·grad of its steps) or, at the reducer, the sum
 * of the members' slices.
 */
export class ShardedSums {
  /** By plan block id; allocated on first use and kept across `clear`. */
  private readonly blocks: (Float64Array | null)[];
  /** Whether block i holds sums since the last `clear` (a block's first add writes it, so `clear` zeroes nothing). */
  private readonly filled: boolean[];
  private readonly tables = new Map<string, RowSums>();

  constructor(private readonly plan: ShardPlan) {
    this.blocks = plan.dense.map(() => null);
    this.filled = plan.dense.map(() => false);
    for (const t of plan.sparseTables) this.tables.set(t.name, new RowSums(t.dim));
  }

  /** Adds scale·g of whole dense parameters (by name) and per-table rows of `ids`. */
  addStep(denseGrads: ReadonlyMap<string, Float32Array>, rowGrads: ReadonlyMap<string, Float32Array> | null, ids: Int32Array | null, scale: number): void {
    for (const b of this.plan.dense) {
      const g = denseGrads.get(b.param);
      if (g === undefined) throw new HetpsError(`no gradient for dense parameter ${b.param}`);
      this.addBlock(b.id, g.subarray(b.offset, b.offset + b.length), scale);
    }
    if (rowGrads !== null && ids !== null && ids.length > 0) {
      for (const [table, sums] of this.tables) {
        const g = rowGrads.get(table);
        if (g === undefined) throw new HetpsError(`no gradient rows for table ${table}`);
        sums.add(ids, g, scale);
      }
    }
  }

  /** Adds scale·tensors (a slice or a push body). */
  addTensors(t: ShardTensors, scale: number): void {
    for (const d of t.dense) this.addBlock(d.block, d.grad, scale);
    for (const s of t.sparse) {
      const sums = this.tables.get(s.table);
      if (sums === undefined) throw new HetpsError(`unknown sparse table ${s.table}`);
      sums.add(s.ids, s.grads, scale);
    }
  }

  private addBlock(id: number, g: Float32Array, scale: number): void {
    const b = this.plan.dense[id];
    if (b === undefined || g.length !== b.length) throw new HetpsError(`dense block ${id}: ${g.length} values do not fit the plan`);
    let acc = this.blocks[id];
    if (acc === null || acc === undefined) { acc = new Float64Array(b.length); this.blocks[id] = acc; }
    if (this.filled[id]) {
      for (let i = 0; i < acc.length; i++) acc[i] = acc[i]! + scale * g[i]!;
    } else {
      for (let i = 0; i < acc.length; i++) acc[i] = scale * g[i]!;
      this.filled[id] = true;
    }
  }

  /** The sums (times `scale`) of the blocks and rows the given shards own, as float32, one entry per shard. */
  byShard(shards: ReadonlySet<string>, scale = 1): Map<string, ShardTensors> {
    const out = new Map<string, ShardTensors>();
    const of = (s: string) => {
      let t = out.get(s);
      if (t === undefined) { t = { dense: [], sparse: [] }; out.set(s, t); }
      return t;
    };
    for (const b of this.plan.dense) {
      const acc = this.blocks[b.id];
      if (!shards.has(b.shard) || !this.filled[b.id] || acc === null || acc === undefined) continue;
      const grad = new Float32Array(acc.length);
      for (let i = 0; i < acc.length; i++) grad[i] = acc[i]! * scale;
      of(b.shard).dense.push({ block: b.id, grad });
    }
    for (const [table, sums] of this.tables) {
      if (sums.size === 0) continue;
      for (const [shard, part] of sums.byShard(this.plan)) {
        if (!shards.has(shard)) continue;
        of(shard).sparse.push({ table, ids: part.ids as Int32Array<ArrayBuffer>, grads: sums.rows(part.positions, scale) });
      }
    }
    return out;
  }

  clear(): void {
    this.filled.fill(false);
    for (const t of this.tables.values()) t.clear();
  }
}

/** Several shards' tensors as one (a slice message covers every shard its receiver owns). */
export function mergeShardTensors(parts: Iterable<ShardTensors>): ShardTensors {
  const out: ShardTensors = { dense: [], sparse: [] };
  for (const p of parts) { out.dense.push(...p.dense); out.sparse.push(...p.sparse); }
  return out;
}

/**
 * One member's window: Σ samples·gradient of its steps — one part per step
 * index (`perStep`: part k holds the k-th step) or one part for the whole
 * window — and the oldest shard versions they were computed from.
 */
export class GradientAccumulator {
  private readonly partsValue: ShardedSums[] = [];
  private readonly weights: number[] = [];
  weight = 0;
  steps = 0;
  private readonly bases = new Map<string, number>();

  constructor(private readonly plan: ShardPlan, readonly perStep: boolean) {}

  add(step: ComputedStep): void {
    const k = this.perStep ? this.steps : 0;
    while (this.partsValue.length <= k) this.partsValue.push(new ShardedSums(this.plan));
    while (this.weights.length <= k) this.weights.push(0);
    this.partsValue[k]!.addStep(step.denseGrads, step.rowGrads, step.uniqueIds, step.samples);
    this.weights[k] = this.weights[k]! + step.samples;
    this.weight += step.samples;
    this.steps++;
    for (const [shard, v] of step.versions) {
      const b = this.bases.get(shard);
      if (b === undefined || v < b) this.bases.set(shard, v);
    }
  }

  /** The parts in use (one per step index taken, or one), with their sample counts. */
  parts(): { sums: ShardedSums; weight: number }[] {
    const n = this.perStep ? this.steps : Math.min(1, this.steps);
    return this.partsValue.slice(0, n).map((sums, k) => ({ sums, weight: this.weights[k]! }));
  }

  baseVersion(shard: string): number | null { return this.bases.get(shard) ?? null; }

  reset(): void {
    for (const p of this.partsValue) p.clear();
    this.weights.fill(0);
    this.weight = 0;
    this.steps = 0;
    this.bases.clear();
  }
}

// ---------------------------------------------------------------- mailbox

interface WindowInbox {
  /** By sender; a slice re-sent under other owners replaces the earlier one. */
  slices: Map<string, SliceMessage>;
  pushed: Map<string, PushedMessage>;
  /** Members that push this window alone (`own`: the group is degraded by a dead member). */
  own: Set<string>;
  /** Streamed parts (training.stream_slices) by sender, under the owners they were dealt for; used when the sender's slice says so. */
  parts: Map<string, { owners: string[]; parts: SliceMessage['parts'] }>;
}

/** What a member's mailbox has received, by window; waiters are woken on every arrival (and on `poke`). */
export class GroupInbox {
  private readonly windows = new Map<number, WindowInbox>();
  private readonly wakeup = new Wakeup();
  /** Windows below this are finished: late (retried) messages for them are dropped. */
  private floor = 0;

  window(w: number): WindowInbox {
    let x = this.windows.get(w);
    if (x === undefined) { x = { slices: new Map(), pushed: new Map(), own: new Set(), parts: new Map() }; this.windows.set(w, x); }
    return x;
  }

  /**
   * A slice; one that says parts were streamed gets them from the parts
   * received before (a ValidationError when they are not all there under
   * the same owners: the sender then sends the whole slice).
   */
  addSlice(m: SliceMessage): void {
    if (m.window < this.floor) return;
    const win = this.window(m.window);
    if (m.streamed > 0) {
      const got = win.parts.get(m.member);
      const have = got !== undefined && sameMembers(got.owners, m.owners) ? got.parts.slice(0, m.streamed) : [];
      let missing = 0;
      for (let k = 0; k < m.streamed; k++) if (have[k] === undefined) missing++;
      if (missing > 0) {
        throw new ValidationError(`slice of window ${m.window} from ${m.member} was streamed in ${m.streamed} part(s), ${missing} of them never arrived under owners ${m.owners.join(', ')}: send the whole slice`);
      }
      m = { ...m, parts: [...have, ...m.parts], streamed: 0 };
    }
    win.slices.set(m.member, m);
    this.poke();
  }

  /** A streamed part; one dealt for other owners than the sender's earlier parts of the window replaces them. */
  addPart(m: PartMessage): void {
    if (m.window < this.floor) return;
    const win = this.window(m.window);
    let got = win.parts.get(m.member);
    if (got === undefined || !sameMembers(got.owners, m.owners)) { got = { owners: [...m.owners], parts: [] }; win.parts.set(m.member, got); }
    got.parts[m.index] = m.part;
  }

  addPushed(m: PushedMessage): void { if (m.window >= this.floor) { this.window(m.window).pushed.set(m.member, m); this.poke(); } }
  addOwn(member: string, window: number): void { if (window >= this.floor) { this.window(window).own.add(member); this.poke(); } }

  /**
   * `member` pushes window `w` or a later one alone: either way it takes no
   * part in a round of `w` (it ended its window `w` without this member, in a
   * round among the others or alone, before it began a later one).
   */
  aloneFrom(member: string, w: number): boolean {
    for (const [k, win] of this.windows) if (k >= w && win.own.has(member)) return true;
    return false;
  }

  /** Forgets windows up to `w`. */
  finish(w: number): void {
    this.floor = Math.max(this.floor, w + 1);
    for (const k of this.windows.keys()) if (k <= w) this.windows.delete(k);
  }

  /** Resolves on the next arrival or poke, or after `ms`. */
  changed(clock: Clock, ms: number): Promise<void> { return this.wakeup.changed(clock, ms); }

  /** Wakes every waiter (something they wait on changed). */
  poke(): void { this.wakeup.wake(); }
}

/** What the member's mailbox hands to the member (after the run check). */
export interface GroupMailboxSink {
  slice(m: SliceMessage): void;
  part(m: PartMessage): void;
  pushed(m: PushedMessage): void;
  progress(member: string, steps: number): void;
  close(member: string, window: number): void;
  own(member: string, window: number): void;
  join(member: string): void;
}

/** The member's mailbox actor (kind `group`, id `<group>@<member>`): hands what arrives to the member. */
export function createGroupMemberActor(o: { group: string; member: string; runId: string; sink: GroupMailboxSink }): ActorDefinition<GroupSyncMessages> {
  // A message of another membership (run id `<run>/g<version>`) is refused, not dropped with an answer: while a
  // member re-forms, its old and new mailboxes share one address, and a sender told "taken" by the wrong one would
  // never send it again (its peer then waits for it for ever). Refused, the sender retries until the right one takes it.
  const ours = (m: { run_id: string }, ctx: ActorContext) => {
    if (m.run_id === o.runId) return true;
    ctx.log.debug({ run_id: m.run_id }, 'group message of another membership refused');
    throw new ActorStoppedError(`group member ${o.member} of ${o.group} serves membership ${o.runId}, not ${m.run_id}: it is re-forming; send again`);
  };
  return {
    kind: 'group',
    id: groupMemberId(o.group, o.member),
    messages: groupSyncMessages,
    idempotent: true,
    idempotentTypes: ['slice', 'part', 'pushed', 'own'],
    handlers: {
      slice: (m, ctx) => { if (ours(m, ctx)) o.sink.slice(m); return {}; },
      part: (m, ctx) => { if (ours(m, ctx)) o.sink.part(m); return {}; },
      pushed: (m, ctx) => { if (ours(m, ctx)) o.sink.pushed(m); return {}; },
      progress: (m, ctx) => { if (ours(m, ctx)) o.sink.progress(m.member, m.steps); return {}; },
      close: (m, ctx) => { if (ours(m, ctx)) o.sink.close(m.member, m.window); return {}; },
      own: (m, ctx) => { if (ours(m, ctx)) o.sink.own(m.member, m.window); return {}; },
      join: (m, ctx) => { if (ours(m, ctx)) o.sink.join(m.member); return {}; },
    },
  };
}

// ---------------------------------------------------------------- the member

/** Where a window's batches come from. */
export interface WindowSource {
  /** The next batch, or null when none is there now (the window closes). */
  next(): Promise<Batch | null>;
  /** Asked when the window took no batch: true when the job has no batch left anywhere (none waiting, none in flight). */
  drained(): Promise<boolean>;
  /** Optional: start fetching the next window's first batch now (called when this window's steps are done, before its exchange). */
  prefetch?(): void;
  /** Optional: told after each step of the window, in order (a training script gets its loss at once, not at the window's end). */
  stepped?(step: WindowStep): void;
}

export interface WindowStep {
  loss: number;
  samples: number;
  computeMs: number;
  stepMs: number;
}

export interface WindowOutcome {
  window: number;
  /** In the order the source handed out the batches. */
  steps: WindowStep[];
  /** Part of the window's (group's) update was refused as too stale and dropped. */
  droppedStale: boolean;
  /** Some shard applied the update without its dense blocks or its rows, past that kind's max_staleness. */
  partDropped: boolean;
  /** Largest staleness of the update's pushes (the group's, for the reducing modes). */
  staleness: number;
  /** No window follows: the job has no batch left (reducing modes: every member saw that, together). */
  done: boolean;
  /**
   * The newest groups_version seen (reducing modes: the largest over the
   * window's slices only, so the same at every member): above the member's
   * own, the worker pauses for a regroup after this window.
   */
  groupsVersion: number;
  /** Members of the round that reduced this window (reducing modes; [member] otherwise). */
  members: string[];
  /** Shards whose part of this window's update was lost with a member dropped while it held it. */
  lostShards: string[];
  /** Where the window's time went, ms (see `WindowPhases`). */
  phases: WindowPhases;
  /**
   * Batches this member took in the window and then dropped untrained
   * (`discardOnPause`): `steps` is empty, nothing of them reached a shard,
   * and the caller gives every batch the window took back to the queue.
   */
  discarded: number;
  /** Leading parts of this member's slices that went out as its steps completed (training.stream_slices); 0 when none did or they were not used (dealt anew, dropped). */
  streamed: number;
}

/**
 * A window's wall time by phase: `steps` (batches fetched and stepped), of
 * which `inputs` is waiting for the next step's inputs once the step before
 * was done (a batch from the queue and its rows pulled, fetched while the
 * step before ran; the window's first also pulls the dense parameters),
 * `slices` (this member's slices sent), `round` (waiting for the machine to
 * start the round: the slowest member), `gather` (the round's slices in),
 * `push` (reduce + push of this member's shards), `reports` (waiting for
 * every member's push report). Async members: `steps` and `push` only.
 */
export interface WindowPhases { steps: number; inputs: number; slices: number; round: number; gather: number; push: number; reports: number }

export interface GroupMemberOptions {
  system: ActorSystem;
  /** The member's group (members in `nodes`, in rank order). */
  group: WorkerGroupConfig;
  /** This member (a node of `group.nodes`). */
  member: string;
  runId: string;
  plan: ShardPlan;
  stepper: WorkerStepper;
  log: Logger;
  shouldStop: () => boolean;
  /** Per attempt of a slice / pushed message. Default 10 s. */
  requestTimeoutMs?: number;
  /** How often a member waiting for the others says so. Default 10 s. */
  stallNoteMs?: number;
  /** The newest job-info groups_version this worker has seen (regrouping); default: always 0. */
  groupsVersionSeen?: () => number;
  /**
   * True while the window in progress should end after the step in progress
   * (a pause or regroup is pending: a checkpoint's cut waits for it): the
   * window is exchanged and pushed with the steps it has, weighted by their
   * samples like any short window. Default: never.
   */
  closeEarly?: () => boolean;
  /**
   * Resolves when what `closeEarly` reads may have changed, or after `ms`:
   * a member stepping waits on it instead of polling `closeEarly` every
   * few ms. Absent: polled.
   */
  closeEarlyChanged?: (ms: number) => Promise<void>;
  /**
   * With `closeEarly`: a pause pending while this member is still stepping
   * (its slices not sent) drops the window's steps instead of exchanging
   * them — the member takes part in the round with nothing (an idle slice),
   * reports them as `discarded`, and the caller gives their batches back. A
   * round whose members all dropped theirs pushes nothing, so the pause (a
   * checkpoint's cut) waits for the step in progress only, not for the
   * window's exchange and pushes; the dropped steps are trained again after
   * the resume. Default false (an API worker has handed its script the
   * steps' losses already).
   */
  discardOnPause?: boolean;
  /** The learning-rate rule for the group's updates (training.group_lr_scaling); null or absent: every update at ×1. */
  groupLr?: GroupLrRule | null;
  /** forming: how long to wait for every member before going on with those that joined. Default 30 s. */
  formingTimeoutMs?: number;
  /** degraded: how long a lost member may take to come back before the group goes on without it (fault_tolerance.worker_recovery_timeout). Default 30 s. */
  recoveryTimeoutMs?: number;
  /** A member the group waits for that stays silent this long is reported lost. Default 10 s. */
  lostAfterMs?: number;
  /** Every change of the lifecycle state (telemetry). */
  onState?: (state: GroupState) => void;
  /**
   * The health actor's verdicts: a member is reported lost when it is dead by
   * them, never for being slow. null or absent: no verdicts reach this member
   * (unit tests, a job without a health actor); then silence for lostAfterMs counts.
   */
  health?: HealthView | null;
  /**
   * Polled while the window waits (and between its steps): a reason ends the
   * window with WindowAbandonedError, its batches not acknowledged. The
   * driver takes this member back after its group dropped it (job info
   * `rejoining`): the peers no longer wait for it, so its window cannot end.
   */
  abandon?: () => string | null;
  /**
   * training.stream_slices (groups in `sync` and `adaptive`): each step's
   * part of this member's slices goes to its owners as soon as the step is
   * done, while the next step runs, so little is left to send when the
   * window closes. What the owners reduce is the same. Default false.
   */
  streamSlices?: boolean;
  /**
   * training.group_update `direct` (groups in `sync` and `adaptive`): this
   * member pushes its own window to the shards (each step an update of its
   * own, at ×1) before the round, whose slices then carry no gradients, only
   * the round's bookkeeping: the round still ends once every member has
   * pushed, so the next window starts from the whole group's window. Default
   * false (`reduce`).
   */
  directPush?: boolean;
}

/** A window's parts streamed so far (training.stream_slices): under which owners, how many, and their sends. */
interface Stream { owners: string[]; sent: number; sends: Promise<void>[] }

/** The window was given up (`GroupMemberOptions.abandon`): nothing of it was acknowledged; its batches go back to the queue. */
export class WindowAbandonedError extends HetpsError {}

const sameMembers = (a: readonly string[], b: readonly string[]) => a.length === b.length && a.every((x, i) => x === b[i]);

/**
 * One worker's part of its group: the group's lifecycle machine (a replica
 * per member, fed by the group's messages) decides when a round starts and
 * who is in it; the member does the steps, the reduce-scatter and the pushes.
 */
export class GroupMember {
  readonly inbox = new GroupInbox();
  /** The reducer's sums per step index, reused round after round. */
  private readonly reduceSums: ShardedSums[] = [];
  /** The window whose slices all said drained: the group's last round (its members leave once they pushed their part). */
  private endingWindow: number | null = null;
  /** Every member pushed its part of the last round: the group is over. */
  private ended = false;
  private readonly acc: GradientAccumulator;
  private readonly stepLimit: number;
  private readonly reduces: boolean;
  private readonly adaptive: boolean;
  /** Local updates between a window's steps (the stepper has a local optimizer, and the window's steps are pushed as consecutive updates). */
  private readonly localSteps: boolean;
  private readonly refs = new Map<string, ActorRef>();
  private windowValue = 0;
  private readonly clock: Clock;
  private mailbox: Actor<GroupSyncMessages> | null = null;
  private readonly machine: GroupActor;
  /** Rounds the machine started (`sync.due`), with their members. */
  private readonly dues = new Map<number, string[]>();
  /** This member's step counter over the run (its `step.completed`). */
  private stepCounter = 0;
  /** The batch ids trained in the current window. */
  private windowBatches: string[] = [];
  /** When each peer was last heard from (monotonic ms). */
  private readonly heardAt = new Map<string, number>();
  /** Peers reported lost and not heard from since. */
  private readonly reportedLost = new Set<string>();
  private stopped = false;
  /** The last window was pushed alone (to say so once when it starts). */
  private wasAlone = false;
  private unwatchHealth: (() => void) | null = null;
  /** training.stream_slices applies: a reducing group that pushes per step. */
  private readonly streams: boolean;
  /** training.group_update `direct` applies: a group that pushes per step, each member its own window. */
  private readonly direct: boolean;

  constructor(private readonly o: GroupMemberOptions) {
    const g = o.group;
    if (!g.nodes.includes(o.member)) throw new HetpsError(`${o.member} is not a member of group ${g.name} (${g.nodes.join(', ')})`);
    this.reduces = reducesInGroup(g.sync_mode);
    this.adaptive = g.sync_mode === 'adaptive';
    this.acc = new GradientAccumulator(o.plan, pushesPerStep(g.sync_mode));
    this.stepLimit = windowStepLimit(g);
    this.localSteps = o.stepper.localUpdates && pushesPerStep(g.sync_mode) && this.stepLimit > 1;
    this.direct = (o.directPush ?? false) && this.reduces && pushesPerStep(g.sync_mode);
    this.streams = (o.streamSlices ?? false) && this.reduces && pushesPerStep(g.sync_mode) && !this.direct;
    this.clock = o.system.clock;
    const policy: SyncPolicy = { ...syncPolicyFromConfig(g), adaptiveMaxSteps: this.adaptive ? this.stepLimit : null };
    // An async member pushes on its own: its replica's group is itself.
    this.machine = createGroupActor({
      group: g.name, members: this.reduces ? [...g.nodes] : [o.member], policy,
      formingTimeoutMs: o.formingTimeoutMs ?? 30_000, recoveryTimeoutMs: o.recoveryTimeoutMs ?? 30_000,
    }, { clock: this.clock });
    this.machine.on('sync.due', (e) => { this.dues.set(e.round, [...e.members]); this.inbox.poke(); });
    // Every member pulls at the start of its next window: a resync is done as soon as it is asked for.
    this.machine.on('resync.due', (e) => { queueMicrotask(() => this.machine.send(groupEvents.resyncCompleted(e.version))); });
    this.machine.on('members.dropped', (e) => {
      this.o.log.warn({ group: g.name, dropped: e.members, reason: e.reason },
        e.reason === 'forming-timeout'
          ? `group ${g.name}: ${e.members.join(', ')} did not join in time; the group goes on without them`
          : e.reason === 'dead'
            ? `group ${g.name}: ${e.members.join(', ')} left the group (dead by the health actor's verdict); the group goes on without them (their batches return to the queue)`
            : `group ${g.name}: ${e.members.join(', ')} did not come back within the recovery timeout; the group goes on without them (their batches return to the queue)`);
      this.inbox.poke();
    });
    this.machine.on('forming.stalled', (e) => { this.o.log.warn({ group: g.name, expected: e.expected }, `group ${g.name}: no member joined yet`); });
    let last: GroupState | null = null;
    this.machine.subscribe((snap) => {
      const st = groupStateOf(snap);
      if (st !== last) { last = st; this.o.onState?.(st); this.inbox.poke(); }
    });
  }

  get window(): number { return this.windowValue; }
  get syncMode(): WorkerGroupConfig['sync_mode'] { return this.o.group.sync_mode; }
  /** The group's lifecycle state as this member's replica sees it. */
  get state(): GroupState { return groupStateOf(this.machine.getSnapshot()); }
  /** The membership as this member's replica sees it (lost members included). */
  get members(): string[] { return [...this.machine.getSnapshot().context.members]; }

  /**
   * `work`'s result, or null as soon as `dropping()` holds: checked whenever
   * `closeEarlyChanged` says it may have changed (and at least every
   * DROP_RECHECK_MS), or without it every DROP_CHECK_MS while `work` runs.
   */
  private unlessDropping<T>(work: Promise<T>, dropping: () => boolean): Promise<T | null> {
    const changed = this.o.closeEarlyChanged;
    if (changed === undefined) {
      return new Promise<T | null>((resolve, reject) => {
        const timer = this.clock.setInterval(() => { if (dropping()) { timer.cancel(); resolve(null); } }, DROP_CHECK_MS);
        work.then((v) => { timer.cancel(); resolve(v); }, (e: unknown) => { timer.cancel(); reject(e); });
      });
    }
    if (dropping()) return Promise.resolve(null);
    return new Promise<T | null>((resolve, reject) => {
      let settled = false;
      work.then((v) => { settled = true; resolve(v); }, (e: unknown) => { settled = true; reject(e); });
      void (async () => {
        while (!settled) {
          await changed(DROP_RECHECK_MS);
          if (!settled && dropping()) { settled = true; resolve(null); }
        }
      })();
    });
  }

  /** Starts the replica and (reducing modes) the mailbox, and joins the peers. */
  async start(): Promise<void> {
    this.machine.start();
    this.unwatchHealth = this.o.health?.onChange((node, state) => this.onHealth(node, state)) ?? null;
    this.machine.send(groupEvents.memberJoined(this.o.member));
    if (!this.reduces) return;
    const me = this.o.member;
    this.mailbox = await this.o.system.spawn(createGroupMemberActor({
      group: this.o.group.name, member: me, runId: this.o.runId,
      sink: {
        slice: (m) => {
          this.heard(m.member);
          this.inbox.addSlice(m);
          this.machine.send(groupEvents.stepCompleted(m.member, m.total_steps));
          this.machine.send(groupEvents.memberReady(m.member, m.window + 1));
        },
        part: (m) => { this.heard(m.member); this.inbox.addPart(m); },
        pushed: (m) => { this.heard(m.member); this.inbox.addPushed(m); },
        progress: (member, steps) => { this.heard(member); this.machine.send(groupEvents.stepCompleted(member, steps)); },
        close: (member, window) => { this.heard(member); this.machine.send(groupEvents.syncRequested(member, window + 1)); },
        own: (member, window) => { this.heard(member); this.inbox.addOwn(member, window); },
        join: (member) => { this.heard(member); },
      },
    }));
    for (const peer of this.o.group.nodes) if (peer !== me) void this.join(peer);
    // Dead already (a re-form after the driver's recovery timeout): not waited for.
    for (const peer of this.o.group.nodes) if (peer !== me && this.o.health?.stateOf(peer) === 'dead') this.onHealth(peer, 'dead');
  }

  /** The group is degraded by a member dead by the verdicts: windows that start now are pushed alone (see `own`). */
  get alone(): boolean {
    const snap = this.machine.getSnapshot();
    return this.reduces && snap.status === 'active' && groupStateOf(snap) === 'degraded' && snap.context.cut.length > 0;
  }

  /** A regroup pauses this member: its replica shows `regrouping` until `stop`. */
  regroup(reason: string): void { this.machine.send(groupEvents.regroup(reason)); }

  /** Stops the replica and removes the mailbox (before a regroup re-forms the member, or at the end). */
  async stop(reason = 'stopped'): Promise<void> {
    this.stopped = true;
    this.unwatchHealth?.();
    this.unwatchHealth = null;
    this.machine.send(groupEvents.stop(reason));
    this.machine.stop();
    const m = this.mailbox;
    this.mailbox = null;
    if (m !== null) await this.o.system.despawn(m);
  }

  /** A message from `member`: it is there (forming: joined; lost: back). */
  private heard(member: string): void {
    this.heardAt.set(member, this.clock.monotonic());
    this.machine.send(groupEvents.memberJoined(member));
    if (this.reportedLost.delete(member)) {
      this.o.log.info({ group: this.o.group.name, member }, `group ${this.o.group.name}: ${member} is back`);
      this.machine.send(groupEvents.memberRejoined(member));
    }
  }

  /** True while this replica is forming and still waits for `peer`. */
  private awaitsJoin(peer: string): boolean {
    const snap = this.machine.getSnapshot();
    return snap.status === 'active' && groupStateOf(snap) === 'forming' && snap.context.members.includes(peer) && !snap.context.joined.includes(peer);
  }

  /** Asks `peer`'s mailbox until it answers (it is up): then the peer joined. Gives up once the group formed without it. */
  private async join(peer: string): Promise<void> {
    for (let attempt = 0; !this.stopped && !this.o.shouldStop() && this.awaitsJoin(peer); attempt++) {
      try {
        await this.ref(peer).request('join', { run_id: this.o.runId, member: this.o.member }, { timeoutMs: 2_000, retries: 0 });
        if (!this.stopped) this.heard(peer);
        return;
      } catch (e) {
        if (!isRetryable(e)) { this.o.log.warn({ peer, err: (e as Error).message }, `group ${this.o.group.name}: cannot join ${peer}`); return; }
        await this.clock.sleep(Math.min(1_000, 50 * 2 ** Math.min(attempt, 5)));
      }
    }
  }

  private seenVersion(): number { return this.o.groupsVersionSeen?.() ?? 0; }

  /** Members in the round sense: the membership minus the lost ones. */
  private active(): string[] {
    const c = this.machine.getSnapshot().context;
    return c.members.filter((m) => !c.lost.includes(m));
  }

  /**
   * Who is told a window is pushed alone: the active members, and a cut one
   * alive again by this member's verdicts. A verdict that came and went
   * leaves it cut here until the driver re-forms the group, while it never
   * heard it was dead (a member ignores verdicts about itself) and waits in
   * sync for rounds nobody here will start: the notice lets it push alone
   * too. It is sent once to a cut member (`send` does not retry for one).
   */
  private ownNoticeTo(): string[] {
    const c = this.machine.getSnapshot().context;
    const health = this.o.health ?? null;
    return c.members.filter((m) => m !== this.o.member && (!c.lost.includes(m) || (c.cut.includes(m) && health !== null && health.stateOf(m) !== 'dead')));
  }

  /** Who reduces what, as this member sees the group now: the active members and itself. */
  private deal(): string[] {
    const owners = this.active();
    return owners.includes(this.o.member) ? owners : [...owners, this.o.member].sort();
  }

  /**
   * training.stream_slices: sends part `k` of this window (its k-th step) to
   * every other owner under the stream's deal that reduces a shard, each
   * over the member's link like a slice. Not waited for here: `exchange`
   * waits for them before the window's slices say they came.
   */
  private streamPart(st: Stream, w: number, k: number): void {
    const part = this.acc.parts()[k];
    if (part === undefined || st.sent !== k) return;
    for (const to of st.owners) {
      if (to === this.o.member) continue;
      const shards = ownedBy(this.o.plan.shards, st.owners, to);
      if (shards.size === 0) continue;
      const tensors = this.o.stepper.wireTensors(mergeShardTensors(part.sums.byShard(shards).values()));
      const send = this.o.stepper.sendOverLink(wireTensorBytes(tensors), () => this.send(to, 'part', {
        run_id: this.o.runId, window: w, member: this.o.member, index: k, owners: [...st.owners], part: { weight: part.weight, ...tensors },
      }));
      // Failures surface where exchange() waits for the sends (a window given up never does).
      send.catch(() => undefined);
      st.sends.push(send);
    }
    st.sent = k + 1;
  }

  /** One window: steps from `source`, then the group's update of them (see the module comment). */
  async runWindow(source: WindowSource): Promise<WindowOutcome> {
    const w = this.windowValue;
    const round = w + 1;
    // Decided once, here: a member either sends its slices of a window or pushes it alone, never both.
    const alone = this.alone;
    if (alone && !this.wasAlone) {
      const c = this.machine.getSnapshot().context;
      this.o.log.warn({ group: this.o.group.name, window: w, dead: c.cut },
        `group ${this.o.group.name}: degraded to async while ${c.cut.join(', ')} ${c.cut.length > 1 ? 'are' : 'is'} dead: ${this.o.member} pushes its windows on its own until the group is re-formed (it comes back, or the recovery timeout passes)`);
    }
    this.wasAlone = alone;
    const acc = this.acc;
    acc.reset();
    const st: Stream | null = this.streams && !alone ? { owners: this.deal(), sent: 0, sends: [] } : null;
    const steps: WindowStep[] = [];
    const phases: WindowPhases = { steps: 0, inputs: 0, slices: 0, round: 0, gather: 0, push: 0, reports: 0 };
    const t0 = this.clock.monotonic();
    const stepper = this.o.stepper;
    // The next batch is fetched and its rows pulled while the current step runs (the window's dense parameters are pulled once, by its first).
    const fetch = async (reuseDense: boolean): Promise<PreparedStep | null> => {
      const batch = await source.next();
      return batch === null ? null : stepper.prepare(batch, { reuseDense });
    };
    let ahead: Promise<PreparedStep | null> | null = null;
    this.windowBatches = [];
    /** Steps `p` into the window; false when a pause made this member drop the window while the step ran (its result is not waited for). */
    const take = async (p: PreparedStep): Promise<boolean> => {
      const computing = stepper.computePrepared(p);
      const c = this.o.discardOnPause ? await this.unlessDropping(computing, dropping) : await computing;
      if (c === null) {
        // The step runs to its end in the background, unused (the stepper runs one step at a time on its session).
        computing.catch(() => undefined);
        return false;
      }
      acc.add(c);
      // Local SGD: the window's next step computes from this member's parameters after this step, at the rate the shards will apply the group's update.
      if (this.localSteps) stepper.stepLocally(p, c, alone || this.direct ? 1 : groupLrMultiplier(this.o.groupLr ?? null, this.active().length, w));
      this.windowBatches.push(p.batch.batchId);
      if (st !== null) this.streamPart(st, w, acc.steps - 1);
      const step: WindowStep = { loss: c.loss, samples: c.samples, computeMs: c.computeMs, stepMs: c.stepMs };
      steps.push(step);
      source.stepped?.(step);
      this.stepCounter++;
      this.machine.send(groupEvents.stepCompleted(this.o.member, this.stepCounter));
      if (this.adaptive && !alone) this.announce('progress', { window: w, steps: this.stepCounter });
      return true;
    };
    let discarded = 0;
    const closing = () => this.o.closeEarly?.() ?? false;
    const dropping = () => this.o.discardOnPause === true && closing();
    // Nor does a pause wait for a batch still to come (a drained queue holds a fetch for up to a second at the end of
    // training): the window ends without it, counted as dropped, and the source gives the batch back if one comes.
    const awaitStep = async (f: Promise<PreparedStep | null>): Promise<PreparedStep | null | 'dropped'> => {
      const t = this.clock.monotonic();
      try {
        return await awaitInputs(f);
      } finally {
        phases.inputs += this.clock.monotonic() - t;
      }
    };
    const awaitInputs = async (f: Promise<PreparedStep | null>): Promise<PreparedStep | null | 'dropped'> => {
      if (this.o.discardOnPause !== true) return f;
      const p = await this.unlessDropping(f, dropping);
      if (p !== null || !dropping()) return p;
      f.catch(() => undefined);
      return 'dropped';
    };
    try {
      for (;;) {
        this.checkStop(w);
        if (steps.length >= this.stepLimit) break;
        // adaptive: the machine started this window's round (a gap, a peer's close); the others never start one before this member is ready.
        if (this.dues.has(round)) break;
        // A pause is pending: the window ends here rather than after stepLimit steps (never empty: idle means no batch).
        if (steps.length > 0 && closing()) break;
        // Dropping on a pause: no step is started either.
        if (dropping()) break;
        const p = await awaitStep(ahead ?? fetch(steps.length > 0));
        ahead = null;
        if (p === 'dropped') { discarded++; break; }
        if (p === null) break;
        if (steps.length + 1 < this.stepLimit && !closing()) ahead = fetch(true);
        if (!(await take(p))) { discarded++; break; }
      }
      // A batch fetched ahead is trained in this window: its batch is held by it (adaptive, when the round started meanwhile).
      const left = ahead === null ? null : await awaitStep(ahead);
      ahead = null;
      if (left === 'dropped') discarded++;
      else if (left !== null && (dropping() || !(await take(left)))) discarded++;
    } finally {
      // On a stop the batch fetched ahead is given back with the window's others.
      if (ahead !== null) await (ahead as Promise<PreparedStep | null>).catch(() => null);
    }
    if (this.adaptive && !alone) {
      this.announce('close', { window: w });
      this.machine.send(groupEvents.syncRequested(this.o.member, round));
    }
    if (steps.length > 0 && dropping()) {
      // The pause is pending and this member's slices are not out: the window's steps are dropped, not exchanged.
      discarded += steps.length;
      steps.length = 0;
      acc.reset();
      this.windowBatches = [];
    }
    const idle = steps.length === 0;
    // Batches dropped go back to the queue: the job is not drained.
    const drained = idle && discarded === 0 ? await source.drained() : false;
    if (!idle) source.prefetch?.();
    phases.steps = this.clock.monotonic() - t0;
    const out = !this.reduces ? await this.ownWindow(idle, drained, phases)
      : alone ? await this.aloneWindow(w, idle, drained, phases)
        : await this.exchange(w, steps.length, idle, drained, phases, st);
    this.windowValue++;
    return { window: w, steps, phases, discarded, ...out };
  }

  /** A window pushed by this member alone (async groups; a degraded group's member). */
  private async ownWindow(idle: boolean, drained: boolean, phases: WindowPhases): Promise<Omit<WindowOutcome, 'window' | 'steps' | 'phases' | 'discarded'>> {
    return this.aloneOutcome(await this.pushOwn(idle, drained, phases));
  }

  private aloneOutcome(pushed: Awaited<ReturnType<GroupMember['pushOwn']>>): Omit<WindowOutcome, 'window' | 'steps' | 'phases' | 'discarded'> {
    const { version: _version, ...r } = pushed;
    return { ...r, groupsVersion: this.seenVersion(), members: [this.o.member], lostShards: [], streamed: 0 };
  }

  /**
   * degraded by a dead member: tell the others this window is pushed alone
   * (a member that began it in sync stops waiting for its round), push it,
   * and close the window here (the machine's round of it, should a peer's
   * request have started one, ends).
   */
  private async aloneWindow(w: number, idle: boolean, drained: boolean, phases: WindowPhases): Promise<Omit<WindowOutcome, 'window' | 'steps' | 'phases' | 'discarded'>> {
    // Not waited for: only a peer still in a window it began in sync needs it (its mailbox is up then); one that
    // went on alone, paused or re-formed meanwhile never takes it, and this member must not wait for that.
    this.noticeAlone(w, this.ownNoticeTo());
    return this.closeAlone(w, await this.pushOwn(idle, drained, phases));
  }

  /** Tells `to` that this member takes no part in a round of window `w` with them (an `own` notice; not waited for). */
  private noticeAlone(w: number, to: readonly string[]): void {
    for (const m of to) {
      void this.send(m, 'own', { run_id: this.o.runId, window: w, member: this.o.member }, OWN_NOTICE_MS).catch((e: unknown) => {
        this.o.log.debug({ group: this.o.group.name, to: m, window: w, err: (e as Error).message }, 'own notice not delivered');
      });
    }
  }

  private closeAlone(w: number, pushed: Awaited<ReturnType<GroupMember['pushOwn']>>): Omit<WindowOutcome, 'window' | 'steps' | 'phases' | 'discarded'> {
    this.inbox.finish(w);
    this.machine.send(groupEvents.syncCompleted(w + 1, pushed.version));
    return this.aloneOutcome(pushed);
  }

  /** This member's gradient to every shard it touched. */
  private async pushOwn(idle: boolean, drained: boolean, phases: WindowPhases): Promise<Pick<WindowOutcome, 'droppedStale' | 'partDropped' | 'staleness' | 'done'> & { version: number }> {
    if (idle) return { droppedStale: false, partDropped: false, staleness: 0, done: drained, version: 0 };
    const t0 = this.clock.monotonic();
    const acc = this.acc;
    const parts = acc.parts().map((p) => ({ tensors: p.sums.byShard(new Set(this.o.plan.shards), 1 / p.weight) }));
    const results = await Promise.all(this.o.plan.shards.flatMap((shard) => {
      const body = this.pushBody(shard, parts.map((p) => p.tensors.get(shard) ?? null), acc.weight, acc.baseVersion(shard), this.windowBatches);
      return body === null ? [] : [this.o.stepper.push(shard, body)];
    }));
    phases.push += this.clock.monotonic() - t0;
    return {
      droppedStale: results.some((r) => r.refused), partDropped: anyPartDropped(results), staleness: maxPushStaleness(results), done: false,
      version: Math.max(0, ...results.flatMap((r) => (r.refused ? [] : [r.reply.version]))),
    };
  }

  /** This window's slices for `to` under `owners`, from part `from` on (the ones before were streamed). */
  private slice(w: number, owners: readonly string[], to: string, steps: number, idle: boolean, drained: boolean, from = 0): SliceMessage {
    const acc = this.acc;
    const shards = ownedBy(this.o.plan.shards, owners, to);
    // direct: this member pushed its window itself; its slices carry the round's bookkeeping only.
    const parts = this.direct ? [] : acc.parts().slice(from).map((p) => ({ weight: p.weight, ...mergeShardTensors(p.sums.byShard(shards).values()) }));
    const base_versions: SliceMessage['base_versions'] = [];
    for (const shard of shards) {
      const v = acc.baseVersion(shard);
      if (v !== null) base_versions.push({ shard, version: v });
    }
    return {
      run_id: this.o.runId, window: w, member: this.o.member, weight: acc.weight, steps, total_steps: this.stepCounter,
      owners: [...owners], idle, drained, groups_version: this.seenVersion(), base_versions, parts, batches: [...this.windowBatches], streamed: from,
    };
  }

  /** The window's slices to every owner; `streamed` leading parts went out as `part` messages under these owners (to those that reduce a shard). */
  private async sendSlices(w: number, owners: readonly string[], steps: number, idle: boolean, drained: boolean, streamed = 0): Promise<void> {
    await Promise.all(owners.map(async (to) => {
      const from = to !== this.o.member && ownedBy(this.o.plan.shards, owners, to).size > 0 ? streamed : 0;
      const msg = this.slice(w, owners, to, steps, idle, drained, from);
      if (to === this.o.member) { this.inbox.addSlice(msg); return; }
      try {
        await this.sendSlice(to, msg);
      } catch (e) {
        // The owner lacks a streamed part (its mailbox lost it): the whole slice instead.
        if (from === 0 || !(e instanceof ValidationError)) throw e;
        this.o.log.warn({ group: this.o.group.name, window: w, to, err: e.message }, `group ${this.o.group.name} window ${w}: ${to} lacks streamed parts; sending the whole slice`);
        await this.sendSlice(to, this.slice(w, owners, to, steps, idle, drained, 0));
      }
    }));
  }

  private async sendSlice(to: string, msg: SliceMessage): Promise<void> {
    // Compressed for the wire (communication.compression; adaptive: while the link is busy); the receiver's schema decodes it to float32.
    const parts = msg.parts.map((p) => ({ weight: p.weight, ...this.o.stepper.wireTensors(p) }));
    let bytes = 0;
    for (const p of parts) bytes += wireTensorBytes(p);
    await this.o.stepper.sendOverLink(bytes, () => this.send(to, 'slice', { ...msg, parts }));
  }

  /**
   * Reducing modes: slices out (this member is then ready), wait for the
   * machine to start the round, reduce this member's shards over the
   * round's members, push, and wait until every member of the round has.
   */
  private async exchange(w: number, steps: number, idle: boolean, drained: boolean, phases: WindowPhases, st: Stream | null): Promise<Omit<WindowOutcome, 'window' | 'steps' | 'phases' | 'discarded'>> {
    const { member } = this.o;
    const round = w + 1;
    let owners = this.deal();
    let mark = this.clock.monotonic();
    const lap = (phase: keyof WindowPhases) => { const now = this.clock.monotonic(); phases[phase] += now - mark; mark = now; };
    // Streamed parts count only when all of them went out under the owners the window is dealt to now (not for an idle window: its steps were dropped).
    if (st !== null) await Promise.all(st.sends);
    let streamed = st !== null && !idle && sameMembers(st.owners, owners) ? st.sent : 0;
    // direct: this member's own window goes to the shards first; the round below ends once every member's has.
    const own = this.direct && !idle ? await this.pushOwn(idle, drained, phases) : null;
    if (own !== null) mark = this.clock.monotonic();
    await this.sendSlices(w, owners, steps, idle, drained, streamed);
    this.machine.send(groupEvents.memberReady(member, round));
    lap('slices');

    // A member that pushes this window (or a later one) alone takes no part in its round: no round of it can start, so this one
    // pushes alone too. A later one: a member cut by a verdict it never heard of may still be in a window its mates ended without it.
    const aloneOwners = () => owners.filter((m) => m !== member && this.inbox.aloneFrom(m, w));
    const anyAlone = () => aloneOwners().length > 0;
    const fallBack = async (phase: 'round' | 'gather') => {
      lap(phase);
      this.o.log.info({ group: this.o.group.name, window: w, alone: aloneOwners() },
        `group ${this.o.group.name} window ${w}: a member pushes this window alone (the group is degraded by a dead member); ${member} pushes its own gradient too`);
      return this.closeAlone(w, own ?? await this.pushOwn(idle, drained, phases));
    };
    const roundMembers = await this.waitUntil(w, 'the group to start its round', () => this.dues.get(round) ?? (anyAlone() ? 'alone' as const : null),
      () => owners.filter((m) => !this.inbox.window(w).slices.has(m)));
    if (roundMembers === 'alone') return fallBack('round');
    lap('round');
    if (!sameMembers(roundMembers, owners)) {
      // The round has other members than this member assumed (one was dropped, or joined late): the shards are dealt anew.
      // One left out that is alive by the verdicts (cut by a verdict that came and went, which it never heard of) holds this
      // member's slice of the window: told, it pushes the window alone instead of reducing that slice a second time.
      const notice = this.ownNoticeTo();
      this.noticeAlone(w, owners.filter((m) => !roundMembers.includes(m) && notice.includes(m)));
      owners = roundMembers;
      streamed = 0;
      await this.sendSlices(w, owners, steps, idle, drained);
      lap('slices');
    }
    const slices = await this.waitUntil(w, 'the gradient slices', (): SliceMessage[] | 'alone' | null => {
      if (anyAlone()) return 'alone';
      const got = this.inbox.window(w).slices;
      const out: SliceMessage[] = [];
      for (const m of owners) {
        const s = got.get(m);
        if (s === undefined || !sameMembers(s.owners, owners)) {
          // A member dropped meanwhile (recovery timeout) takes no part: reduce without it.
          if (!this.active().includes(m) && m !== member) continue;
          return null;
        }
        out.push(s);
      }
      return out;
    }, () => owners.filter((m) => !sameMembers(this.inbox.window(w).slices.get(m)?.owners ?? [], owners)));
    if (slices === 'alone') return fallBack('gather');
    // Every member said it is drained: the group ends with this round, and a member that has its last `pushed` leaves.
    if (slices.every((x) => x.drained)) this.endingWindow = w;

    lap('gather');
    // Reduce this member's shards: per part, Σ over members of Σ samples·grad, divided by the part's samples.
    // direct: the members pushed their own windows; nobody reduces.
    const mine = this.direct ? new Set<string>() : ownedBy(this.o.plan.shards, owners, member);
    let results: { shard: string; r: PushResult }[] = [];
    if (mine.size > 0) {
      const nParts = Math.max(0, ...slices.map((s) => s.parts.length));
      const parts: Map<string, ShardTensors>[] = [];
      for (let k = 0; k < nParts; k++) {
        // Kept between rounds (byShard copies out what the pushes carry).
        const sums = this.reduceSums[k] ??= new ShardedSums(this.o.plan);
        sums.clear();
        let weight = 0;
        for (const s of slices) {
          const p = s.parts[k];
          if (p === undefined || p.weight === 0) continue;
          sums.addTensors(p, 1);
          weight += p.weight;
        }
        parts.push(weight > 0 ? sums.byShard(mine, 1 / weight) : new Map());
      }
      const base = new Map<string, number>();
      for (const s of slices) {
        for (const b of s.base_versions) {
          const v = base.get(b.shard);
          if (v === undefined || b.version < v) base.set(b.shard, v === undefined ? b.version : Math.min(v, b.version));
        }
      }
      const total = slices.reduce((n, s) => n + s.weight, 0);
      // The group's learning-rate rule: this update averages the batches of every member that trained in the window.
      const lrMult = groupLrMultiplier(this.o.groupLr ?? null, slices.filter((s) => s.weight > 0).length, w);
      results = await Promise.all([...mine].flatMap((shard) => {
        const body = this.pushBody(shard, parts.map((p) => p.get(shard) ?? null), total, base.get(shard) ?? null, slices.flatMap((s) => s.batches), lrMult);
        return body === null ? [] : [this.o.stepper.push(shard, body).then((r) => ({ shard, r }))];
      }));
    }
    const pushed: PushedMessage = {
      run_id: this.o.runId, window: w, member,
      applied: results.filter((x) => !x.r.refused).map((x) => x.shard),
      refused: results.filter((x) => x.r.refused).map((x) => x.shard),
      part_dropped: results.filter((x) => anyPartDropped([x.r])).map((x) => x.shard),
      staleness: maxPushStaleness(results.map((x) => x.r)),
      groups_version: this.seenVersion(),
    };
    lap('push');
    await Promise.all(owners.map((to) => (to === member ? (this.inbox.addPushed(pushed), undefined) : this.send(to, 'pushed', pushed))));
    const reports = await this.waitUntil(w, 'the push reports', () => {
      const got = this.inbox.window(w).pushed;
      const out: PushedMessage[] = [];
      for (const m of owners) {
        const p = got.get(m);
        if (p === undefined) {
          // Dropped, or it ended the window without this member (its notice came after this member had reduced): no report comes.
          if (!this.active().includes(m) || (m !== member && this.inbox.aloneFrom(m, w))) continue;
          return null;
        }
        out.push(p);
      }
      return out;
    }, () => owners.filter((m) => !this.inbox.window(w).pushed.has(m)));
    lap('reports');
    // The group's last round is pushed by everyone: its members leave now.
    if (this.endingWindow === w) this.ended = true;
    const reported = new Set(reports.map((r) => r.member));
    // direct: nobody pushes for another member, so a dropped member takes no shard's update with it.
    const lostShards = this.direct ? [] : [...reduceOwners(this.o.plan.shards, owners)].filter(([, m]) => !reported.has(m)).map(([s]) => s);
    if (lostShards.length > 0) {
      const alone = aloneOwners().filter((m) => !reported.has(m));
      this.o.log.warn({ group: this.o.group.name, window: w, shards: lostShards, alone },
        alone.length > 0
          ? `group ${this.o.group.name} window ${w}: ${alone.join(', ')} ended the window without this member (a dead verdict for it that it never heard of) after this member had reduced their slices: their gradient reached this member's shards twice, and this member's gradient missed shard(s) ${lostShards.join(', ')}`
          : `group ${this.o.group.name} window ${w}: the update of shard(s) ${lostShards.join(', ')} was lost with a dropped member (it may or may not have been pushed)`);
    }
    this.inbox.finish(w);
    const version = Math.max(own?.version ?? 0, ...results.flatMap((x) => (x.r.refused ? [] : [x.r.reply.version])));
    this.machine.send(groupEvents.syncCompleted(round, version));
    if (reports.some((p) => p.refused.length > 0)) {
      this.o.log.info({ group: this.o.group.name, window: w, refused: reports.flatMap((p) => p.refused) }, 'part of the group\'s update was refused as too stale and dropped; the next window pulls fresh parameters');
    }
    return {
      // direct: what the shards did with this member's own pushes (the reports carry none).
      droppedStale: (own?.droppedStale ?? false) || reports.some((p) => p.refused.length > 0),
      partDropped: (own?.partDropped ?? false) || reports.some((p) => p.part_dropped.length > 0),
      staleness: Math.max(own?.staleness ?? 0, ...reports.map((p) => p.staleness)),
      done: slices.every((s) => s.drained),
      // Only what the round's slices and push reports say (this member's own among them): every member of the round
      // waits for the same reports, so all decide on the same value and pause after the same window. A pause noticed
      // while the round pushes is in the reports, so the group pauses after this window rather than the next (an idle
      // one). A version seen here after this member's report went out waits for the next window; deciding on it alone
      // would pause this member while the others go on.
      groupsVersion: Math.max(0, ...slices.map((s) => s.groups_version), ...reports.map((p) => p.groups_version)),
      members: [...owners],
      lostShards,
      streamed,
    };
  }

  /** One push of `shard`'s parts (the first now, the rest as `later_steps`); null when no part touches the shard. */
  private pushBody(shard: string, parts: readonly (ShardTensors | null)[], weight: number, baseVersion: number | null, batches: readonly string[], lrMult = 1): PushRequest | null {
    const steps = parts.filter((p): p is ShardTensors => p !== null && (p.dense.length > 0 || p.sparse.length > 0));
    if (steps.length === 0) return null;
    if (baseVersion === null) throw new HetpsError(`group ${this.o.group.name}: gradient for shard ${shard} but no member reported the version it pulled`);
    const [first, ...later] = steps;
    return {
      plan_version: this.o.plan.version, round: null, expected: null, weight, base_version: baseVersion,
      dense: first!.dense, sparse: first!.sparse, later_steps: later.map((t) => ({ dense: t.dense, sparse: t.sparse })), lr_mult: lrMult,
      batches: [...batches],
    };
  }

  private ref(member: string): ActorRef {
    let r = this.refs.get(member);
    if (r === undefined) { r = this.o.system.ref('group', groupMemberId(this.o.group.name, member)); this.refs.set(member, r); }
    return r;
  }

  /** A slice, pushed or own message, re-sent (same seq: applied once) until the member's mailbox takes it, or the member is dropped or dead. */
  private async send(to: string, type: 'slice' | 'part' | 'pushed' | 'own', fields: SliceWire | PartWire | PushedMessage | { run_id: string; window: number; member: string }, giveUpAfterMs: number | null = null): Promise<void> {
    const seq = this.o.system.nextSeq();
    const started = this.clock.monotonic();
    let lastNote = started;
    // A request in flight when its member died is never answered: the member leaving the group ends the wait.
    let onDropped!: () => void;
    const dropped = new Promise<'dropped'>((resolve) => { onDropped = () => resolve('dropped'); });
    const watch = this.machine.on('members.dropped', (e) => { if (e.members.includes(to)) onDropped(); });
    // Dead by the verdicts (the group degrades to async): nobody waits for what it would have sent.
    const cut = this.machine.subscribe((snap) => { if (snap.context.cut.includes(to)) onDropped(); });
    if (this.machine.getSnapshot().context.cut.includes(to)) onDropped();
    try {
      for (let attempt = 0; ; attempt++) {
        try {
          // Long enough for what is under way on this member's link to cross it: a slice slower than a fixed attempt would be re-sent behind itself.
          const timeoutMs = this.o.stepper.peerAttemptMs(Math.min(this.o.requestTimeoutMs ?? 10_000, SEND_ATTEMPT_MS));
          const request = this.ref(to).request(type, fields as unknown as Record<string, unknown>, { timeoutMs, seq });
          request.catch(() => undefined);
          await Promise.race([request, dropped]); // 'dropped': nobody waits for it any more
          return;
        } catch (e) {
          if (!isRetryable(e)) throw e;
          if (this.o.shouldStop()) throw new StopRequestedError(`stopped while sending ${type} to ${to}`, { cause: e });
          this.checkStop(fields.window);
          if (!this.machine.getSnapshot().context.members.includes(to)) return; // dropped from the group: nobody waits for it
          if (this.stopped) return; // this member re-forms or ends: its messages are of a membership that is over
          // It ended this window (or a later one) without this member (its `own` notice): nobody there waits for it. Its
          // mailbox may already serve a new membership, refusing this one's messages until this member re-forms too.
          if (this.inbox.aloneFrom(to, fields.window)) return;
          const now = this.clock.monotonic();
          if (giveUpAfterMs !== null && now - started >= giveUpAfterMs) return;
          this.checkSilent(to, started, now);
          if (now - lastNote >= (this.o.stallNoteMs ?? 10_000)) {
            lastNote = now;
            this.o.log.warn({ group: this.o.group.name, to, type, waited_s: Math.round((now - started) / 1000), err: (e as Error).message },
              `group ${this.o.group.name}: ${to} does not take its ${type} yet (not started, or gone: it is dropped after the recovery timeout)`);
          }
          if (await Promise.race([this.clock.sleep(Math.min(1_000, 50 * 2 ** Math.min(attempt, 5))), dropped]) === 'dropped') return;
        }
      }
    } finally {
      watch.unsubscribe();
      cut.unsubscribe();
    }
  }

  /** Fire-and-forget (adaptive progress and close). */
  private announce(type: 'progress' | 'close', fields: { window: number; steps?: number }): void {
    for (const to of this.active()) {
      if (to === this.o.member) continue;
      try {
        this.ref(to).tell(type, { run_id: this.o.runId, member: this.o.member, ...fields });
      } catch (e) {
        this.o.log.debug({ to, type, err: (e as Error).message }, 'group announcement not sent');
      }
    }
  }

  /**
   * Waits until `ready()` gives a value. Members in `missing()` that stay
   * silent for `lostAfterMs` are reported lost to the machine (degraded; the
   * recovery timeout then drops them); a note every `stallNoteMs`.
   */
  private async waitUntil<T>(w: number, what: string, ready: () => T | null, missing: () => string[]): Promise<T> {
    const started = this.clock.monotonic();
    let lastNote = started;
    const note = this.o.stallNoteMs ?? 10_000;
    const lostAfter = this.o.lostAfterMs ?? 10_000;
    for (;;) {
      const v = ready();
      if (v !== null) return v;
      this.checkStop(w);
      const now = this.clock.monotonic();
      const absent = missing().filter((m) => m !== this.o.member);
      for (const m of absent) this.checkSilent(m, started, now);
      if (now - lastNote >= note) {
        lastNote = now;
        this.o.log.warn({ group: this.o.group.name, window: w, waiting_for: absent, state: this.state, waited_s: Math.round((now - started) / 1000) },
          `group ${this.o.group.name} window ${w}: still waiting for ${what}${absent.length ? ` of ${absent.join(', ')}` : ''} (${this.state})`);
      }
      await this.inbox.changed(this.clock, Math.min(250, note, lostAfter));
    }
  }

  /**
   * Reports `m` lost to the machine: with health verdicts, once the health
   * actor says it is dead (a member that is alive but blocked — on a stalled
   * shard, say — is waited for, never dropped); without them, once it has
   * been silent for lostAfterMs (counted from `since` at the earliest).
   */
  private checkSilent(m: string, since: number, now: number): void {
    if (m === this.o.member || this.reportedLost.has(m) || !this.active().includes(m)) return;
    const health = this.o.health ?? null;
    if (health !== null) {
      if (health.stateOf(m) !== 'dead' || this.reportedLost.has(m)) return;
      this.onHealth(m, 'dead');
      return;
    }
    const lostAfter = this.o.lostAfterMs ?? 10_000;
    if (now - Math.max(since, this.heardAt.get(m) ?? 0) < lostAfter) return;
    this.reportLost(m, `it has been silent for ${(lostAfter / 1000).toFixed(1)} s`);
  }

  private reportLost(m: string, why: string): void {
    this.reportedLost.add(m);
    this.o.log.warn({ group: this.o.group.name, member: m, why },
      `group ${this.o.group.name}: ${m} reported lost (${why}); the group waits for it up to the recovery timeout`);
    this.machine.send(groupEvents.memberLost(m));
  }

  /** Health verdicts: a dead member is reported lost at once, wherever the group is; one alive again rejoins. */
  private onHealth(node: string, state: HealthState): void {
    if (this.stopped || node === this.o.member || !this.machine.getSnapshot().context.members.includes(node)) return;
    // The group's last round (every slice drained): a member whose part of it is pushed has finished and leaves; nobody
    // waits for it any more. One that died before pushing its part is lost as in any round.
    if (state === 'dead' && (this.ended || (this.endingWindow !== null && this.inbox.window(this.endingWindow).pushed.has(node)))) {
      this.o.log.debug({ group: this.o.group.name, member: node }, `group ${this.o.group.name}: ${node} left after the group's last round`);
      return;
    }
    if (state === 'dead') {
      // The verdict is the decision: the member leaves now, and the round goes on without it.
      this.reportedLost.add(node);
      this.o.log.warn({ group: this.o.group.name, member: node }, `group ${this.o.group.name}: ${node} is dead by the health actor's verdict; the group goes on without it`
        + (groupStateOf(this.machine.getSnapshot()) === 'forming' ? '' : ' (async: each member pushes its own windows until the driver re-forms the group)'));
      this.machine.send(groupEvents.memberDead(node));
      this.inbox.poke();
    } else if (state === 'alive' && this.reportedLost.delete(node)) {
      this.o.log.info({ group: this.o.group.name, member: node }, `group ${this.o.group.name}: ${node} is alive again`);
      this.machine.send(groupEvents.memberRejoined(node));
      this.inbox.poke();
    }
  }

  private checkStop(w: number): void {
    if (this.o.shouldStop()) throw new StopRequestedError(`stopped in window ${w} of group ${this.o.group.name}`);
    const why = this.o.abandon?.() ?? null;
    if (why !== null) throw new WindowAbandonedError(`window ${w} of group ${this.o.group.name} given up: ${why}`);
  }
}

/**
 * One attempt of a slice or pushed message (re-sent with the same seq until taken, or the member is dropped),
 * longer where the bytes under way on the member's link take longer than this to cross it (WorkerStepper.peerAttemptMs).
 */
const SEND_ATTEMPT_MS = 2_000;
/** How long an `own` notice is offered to a peer that does not take it (it went on alone, paused or re-formed). */
const OWN_NOTICE_MS = 30_000;
