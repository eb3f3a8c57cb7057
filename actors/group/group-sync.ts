/**
 * hps: synchronous inside a worker group, asynchronous between groups. One
 * `GroupMember` per worker runs its group's sync strategy in windows:
 *
 * - `sync` (sync_steps N): every member takes N steps, accumulating
 *   Σ samples·gradient locally with the parameters fixed for the window
 *   (dense parameters are pulled once at the window's start, each batch's
 *   rows when it needs them; the group's own update only lands at the sync).
 *   Then the group reduces without a leader — reduce-scatter over NATS: shard
 *   i of the plan is reduced by member i mod M; every member sends each
 *   member its slice, each member sums the slices it receives, divides by the
 *   group's samples and pushes that mean gradient to its shards (one push per
 *   shard per sync, `base_version` = the oldest version the group computed
 *   from); once every member reports its pushes done, all go on and pull
 *   fresh parameters. So one sync equals one optimizer step on the union of
 *   the group's batches of the window (gradient accumulation semantics).
 * - `adaptive` (adaptive_threshold T): the same exchange, but members step
 *   freely and the window closes when the fastest member leads the slowest by
 *   T steps (`shouldSync`), or at the latest after 2·T steps of a member.
 * - `accumulation` (accumulation_steps K): each member accumulates K steps
 *   and pushes its own mean gradient; no barrier inside the group.
 * - `async`: a member pushes after every step (K = 1).
 *
 * Between groups nothing waits: the shards scale a push by 1/(1 + staleness)
 * and refuse one beyond training.max_staleness. A refused part is dropped:
 * the window's batches are still acknowledged (counted as dropped stale) and
 * the next window pulls fresh parameters.
 *
 * Batches are acknowledged by the caller after `runWindow` returns, i.e. once
 * every shard took (or refused) the group's update of them.
 */
import {
  HetpsError, groupMemberId, isRetryable, type Actor, type ActorContext, type ActorDefinition, type ActorRef, type ActorSystem, type Clock, type Logger,
} from '../../runtime/mod.ts';
import { splitIdsByShard, type ShardPlan, type WorkerGroupConfig } from '../../topology/mod.ts';
import type { Batch } from '../../native-bridge/mod.ts';
import type { PushRequest } from '../shard/shard.messages.ts';
import { StopRequestedError } from '../worker/shard-client.ts';
import { maxPushStaleness, type ComputedStep, type PushResult, type WorkerStepper } from '../worker/step.ts';
import { groupSyncMessages, type GroupSyncMessages, type PushedMessage, type SliceMessage } from './group-sync.messages.ts';
import { shouldSync, syncPolicyFromConfig, type SyncPolicy } from './sync-policy.ts';

/** adaptive: a member closes its window after this many times adaptive_threshold steps even when nobody drifted apart. */
export const ADAPTIVE_MAX_STEPS_FACTOR = 2;

/** Steps a member takes in one window at most. */
export function windowStepLimit(group: Pick<WorkerGroupConfig, 'sync_mode' | 'sync_steps' | 'accumulation_steps' | 'adaptive_threshold'>): number {
  switch (group.sync_mode) {
    case 'sync': return group.sync_steps ?? 1;
    case 'accumulation': return group.accumulation_steps ?? 1;
    case 'adaptive': return ADAPTIVE_MAX_STEPS_FACTOR * (group.adaptive_threshold ?? 1);
    case 'async': return 1;
  }
}

/** The modes whose members reduce together (the others push on their own). */
export function reducesInGroup(mode: WorkerGroupConfig['sync_mode']): boolean {
  return mode === 'sync' || mode === 'adaptive';
}

/** Reduce-scatter ownership: shard i of the plan is reduced (and pushed) by member i mod M. */
export function reduceOwners(shards: readonly string[], members: readonly string[]): Map<string, string> {
  return new Map(shards.map((s, i) => [s, members[i % members.length]!]));
}

// ---------------------------------------------------------------- gradient sums

/** Σ scale·row per id, in float64, ids in first-seen order. */
class RowSums {
  private readonly rowOf = new Map<number, number>();
  private idList: number[] = [];
  private sums: Float64Array;
  constructor(readonly dim: number) { this.sums = new Float64Array(dim * 64); }
  get size(): number { return this.idList.length; }

  /** Adds scale·grads[k] to the row of ids[k]. */
  add(ids: ArrayLike<number>, grads: Float32Array, scale: number): void {
    const d = this.dim;
    for (let k = 0; k < ids.length; k++) {
      const id = ids[k]!;
      let row = this.rowOf.get(id);
      if (row === undefined) {
        row = this.idList.length;
        this.rowOf.set(id, row);
        this.idList.push(id);
        if ((row + 1) * d > this.sums.length) {
          const grown = new Float64Array(this.sums.length * 2);
          grown.set(this.sums);
          this.sums = grown;
        }
      }
      const to = row * d;
      const from = k * d;
      for (let c = 0; c < d; c++) this.sums[to + c] = this.sums[to + c]! + scale * grads[from + c]!;
    }
  }

  ids(): Int32Array { return Int32Array.from(this.idList); }

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
    this.rowOf.clear();
    this.idList = [];
    this.sums.fill(0);
  }
}

/** Gradient tensors of some shards, as pushes and slices carry them. */
export interface ShardTensors {
  dense: { block: number; grad: Float32Array<ArrayBuffer> }[];
  sparse: { table: string; ids: Int32Array<ArrayBuffer>; grads: Float32Array<ArrayBuffer> }[];
}

/**
 * Dense blocks and sparse rows summed in float64, cut by shard. Holds one
 * member's window (Σ samples·grad of its steps) or, at the reducer, the sum
 * of the members' slices.
 */
export class ShardedSums {
  /** By plan block id; null until something is added. */
  private readonly blocks: (Float64Array | null)[];
  private readonly tables = new Map<string, RowSums>();

  constructor(private readonly plan: ShardPlan) {
    this.blocks = plan.dense.map(() => null);
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
    for (let i = 0; i < acc.length; i++) acc[i] = acc[i]! + scale * g[i]!;
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
      if (!shards.has(b.shard) || acc === null || acc === undefined) continue;
      const grad = new Float32Array(acc.length);
      for (let i = 0; i < acc.length; i++) grad[i] = acc[i]! * scale;
      of(b.shard).dense.push({ block: b.id, grad });
    }
    for (const [table, sums] of this.tables) {
      if (sums.size === 0) continue;
      for (const [shard, part] of splitIdsByShard(this.plan, sums.ids())) {
        if (!shards.has(shard)) continue;
        of(shard).sparse.push({ table, ids: part.ids as Int32Array<ArrayBuffer>, grads: sums.rows(part.positions, scale) });
      }
    }
    return out;
  }

  clear(): void {
    this.blocks.fill(null);
    for (const t of this.tables.values()) t.clear();
  }
}

/** Several shards' tensors as one (a slice message covers every shard its receiver owns). */
export function mergeShardTensors(parts: Iterable<ShardTensors>): ShardTensors {
  const out: ShardTensors = { dense: [], sparse: [] };
  for (const p of parts) { out.dense.push(...p.dense); out.sparse.push(...p.sparse); }
  return out;
}

/** One member's window: Σ samples·gradient of its steps and the oldest shard versions they were computed from. */
export class GradientAccumulator {
  readonly sums: ShardedSums;
  weight = 0;
  steps = 0;
  private readonly bases = new Map<string, number>();

  constructor(plan: ShardPlan) { this.sums = new ShardedSums(plan); }

  add(step: ComputedStep): void {
    this.sums.addStep(step.denseGrads, step.rowGrads, step.uniqueIds, step.samples);
    this.weight += step.samples;
    this.steps++;
    for (const [shard, v] of step.versions) {
      const b = this.bases.get(shard);
      if (b === undefined || v < b) this.bases.set(shard, v);
    }
  }

  baseVersion(shard: string): number | null { return this.bases.get(shard) ?? null; }

  reset(): void {
    this.sums.clear();
    this.weight = 0;
    this.steps = 0;
    this.bases.clear();
  }
}

// ---------------------------------------------------------------- mailbox

interface WindowInbox {
  slices: Map<string, SliceMessage>;
  pushed: Map<string, PushedMessage>;
  progress: Map<string, number>;
  closed: boolean;
}

/** What a member's mailbox has received, by window; waiters are woken on every arrival. */
export class GroupInbox {
  private readonly windows = new Map<number, WindowInbox>();
  private wakers: (() => void)[] = [];
  /** Windows below this are finished: late (retried) messages for them are dropped. */
  private floor = 0;

  window(w: number): WindowInbox {
    let x = this.windows.get(w);
    if (x === undefined) { x = { slices: new Map(), pushed: new Map(), progress: new Map(), closed: false }; this.windows.set(w, x); }
    return x;
  }

  addSlice(m: SliceMessage): void { if (m.window >= this.floor) { this.window(m.window).slices.set(m.member, m); this.wake(); } }
  addPushed(m: PushedMessage): void { if (m.window >= this.floor) { this.window(m.window).pushed.set(m.member, m); this.wake(); } }
  addProgress(window: number, member: string, steps: number): void {
    if (window < this.floor) return;
    const p = this.window(window).progress;
    if ((p.get(member) ?? -1) < steps) p.set(member, steps);
    this.wake();
  }
  close(window: number): void { if (window >= this.floor) { this.window(window).closed = true; this.wake(); } }

  /** Forgets windows up to `w`. */
  finish(w: number): void {
    this.floor = Math.max(this.floor, w + 1);
    for (const k of this.windows.keys()) if (k <= w) this.windows.delete(k);
  }

  /** Resolves on the next arrival, or after `ms`. */
  changed(clock: Clock, ms: number): Promise<void> {
    return new Promise((resolve) => {
      const t = clock.setTimeout(() => { this.wakers = this.wakers.filter((f) => f !== done); resolve(); }, ms);
      const done = () => { t.cancel(); resolve(); };
      this.wakers.push(done);
    });
  }

  private wake(): void {
    const w = this.wakers;
    this.wakers = [];
    for (const f of w) f();
  }
}

/** The member's mailbox actor (kind `group`, id `<group>@<member>`): files what arrives; the member's loop does the work. */
export function createGroupMemberActor(o: { group: string; member: string; runId: string; inbox: GroupInbox }): ActorDefinition<GroupSyncMessages> {
  const ours = (m: { run_id: string }, ctx: ActorContext) => {
    if (m.run_id === o.runId) return true;
    ctx.log.debug({ run_id: m.run_id }, 'group message of another run ignored');
    return false;
  };
  return {
    kind: 'group',
    id: groupMemberId(o.group, o.member),
    messages: groupSyncMessages,
    idempotent: true,
    idempotentTypes: ['slice', 'pushed'],
    handlers: {
      slice: (m, ctx) => { if (ours(m, ctx)) o.inbox.addSlice(m); return {}; },
      pushed: (m, ctx) => { if (ours(m, ctx)) o.inbox.addPushed(m); return {}; },
      progress: (m, ctx) => { if (ours(m, ctx)) o.inbox.addProgress(m.window, m.member, m.steps); return {}; },
      close: (m, ctx) => { if (ours(m, ctx)) o.inbox.close(m.window); return {}; },
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
  /** Largest staleness of the update's pushes (the group's, for sync/adaptive). */
  staleness: number;
  /** No window follows: the job has no batch left (for sync/adaptive: every member saw that, together). */
  done: boolean;
  /**
   * The newest groups_version seen (sync/adaptive: the largest over the
   * window's slices, the same at every member): above the member's own, the
   * worker pauses for a regroup after this window.
   */
  groupsVersion: number;
}

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
}

export class GroupMember {
  readonly inbox = new GroupInbox();
  private readonly acc: GradientAccumulator;
  private readonly members: readonly string[];
  private readonly policy: SyncPolicy;
  private readonly stepLimit: number;
  private readonly reduces: boolean;
  /** Shards this member reduces and pushes (reducing modes), by owner. */
  private readonly shardsOf: Map<string, Set<string>>;
  private readonly refs = new Map<string, ActorRef>();
  private windowValue = 0;
  private readonly clock: Clock;
  private mailbox: Actor<GroupSyncMessages> | null = null;

  constructor(private readonly o: GroupMemberOptions) {
    const g = o.group;
    if (!g.nodes.includes(o.member)) throw new HetpsError(`${o.member} is not a member of group ${g.name} (${g.nodes.join(', ')})`);
    this.members = [...g.nodes];
    this.acc = new GradientAccumulator(o.plan);
    this.stepLimit = windowStepLimit(g);
    this.reduces = reducesInGroup(g.sync_mode);
    this.policy = { ...syncPolicyFromConfig(g), adaptiveMaxSteps: g.sync_mode === 'adaptive' ? this.stepLimit : null };
    this.clock = o.system.clock;
    this.shardsOf = new Map(this.members.map((m) => [m, new Set<string>()]));
    if (this.reduces) for (const [shard, owner] of reduceOwners(o.plan.shards, this.members)) this.shardsOf.get(owner)!.add(shard);
    else this.shardsOf.set(o.member, new Set(o.plan.shards));
  }

  get window(): number { return this.windowValue; }
  get syncMode(): WorkerGroupConfig['sync_mode'] { return this.o.group.sync_mode; }

  /** Spawns this member's mailbox (only the reducing modes exchange messages). */
  async start(): Promise<void> {
    if (!this.reduces) return;
    this.mailbox = await this.o.system.spawn(createGroupMemberActor({ group: this.o.group.name, member: this.o.member, runId: this.o.runId, inbox: this.inbox }));
  }

  /** Removes this member's mailbox (before a regroup re-forms the member). */
  async stop(): Promise<void> {
    const m = this.mailbox;
    this.mailbox = null;
    if (m !== null) await this.o.system.despawn(m);
  }

  private seenVersion(): number { return this.o.groupsVersionSeen?.() ?? 0; }

  /** One window: steps from `source`, then the group's update of them (see the module comment). */
  async runWindow(source: WindowSource): Promise<WindowOutcome> {
    const w = this.windowValue;
    const acc = this.acc;
    acc.reset();
    const steps: WindowStep[] = [];
    const adaptive = this.o.group.sync_mode === 'adaptive';
    for (;;) {
      this.checkStop(w);
      if (steps.length >= this.stepLimit) break;
      if (adaptive && this.inbox.window(w).closed) break;
      // A peer's progress may have opened the gap while this member waited for its batch.
      if (adaptive && steps.length > 0 && this.adaptiveDue(w)) { this.announce('close', { window: w }); this.inbox.close(w); break; }
      const batch = await source.next();
      if (batch === null) {
        if (adaptive) this.announce('close', { window: w });
        break;
      }
      const c = await this.o.stepper.compute(batch, { reuseDense: steps.length > 0 });
      acc.add(c);
      steps.push({ loss: c.loss, samples: c.samples, computeMs: c.computeMs, stepMs: c.stepMs });
      if (adaptive) {
        this.inbox.addProgress(w, this.o.member, steps.length);
        this.announce('progress', { window: w, steps: steps.length });
        if (this.adaptiveDue(w)) { this.announce('close', { window: w }); this.inbox.close(w); break; }
      }
    }
    const idle = steps.length === 0;
    const drained = idle ? await source.drained() : false;
    const out = this.reduces ? await this.exchange(w, steps.length, idle, drained) : await this.pushOwn(idle, drained);
    this.windowValue++;
    return { window: w, steps, groupsVersion: this.seenVersion(), ...out };
  }

  private adaptiveDue(w: number): boolean {
    const progress = this.inbox.window(w).progress;
    return shouldSync({ policy: this.policy, members: this.members, lost: [], stepsSinceSync: Object.fromEntries(progress) });
  }

  /** accumulation / async: this member's mean gradient to every shard it touched. */
  private async pushOwn(idle: boolean, drained: boolean): Promise<Omit<WindowOutcome, 'window' | 'steps' | 'groupsVersion'>> {
    if (idle) return { droppedStale: false, staleness: 0, done: drained };
    const acc = this.acc;
    const parts = acc.sums.byShard(new Set(this.o.plan.shards), 1 / acc.weight);
    const results = await Promise.all([...parts].map(([shard, t]) => this.o.stepper.push(shard, this.pushBody(t, acc.weight, acc.baseVersion(shard)!))));
    return { droppedStale: results.some((r) => r.refused), staleness: maxPushStaleness(results), done: false };
  }

  /** sync / adaptive: reduce-scatter the window's sums, push the reduced slices, wait until every member has. */
  private async exchange(w: number, steps: number, idle: boolean, drained: boolean): Promise<Omit<WindowOutcome, 'window' | 'steps'>> {
    const seen = this.seenVersion();
    const { member, runId } = this.o;
    const acc = this.acc;
    await Promise.all(this.members.map(async (to) => {
      const shards = this.shardsOf.get(to)!;
      const tensors = mergeShardTensors(acc.sums.byShard(shards).values());
      const base_versions: SliceMessage['base_versions'] = [];
      for (const shard of shards) {
        const v = acc.baseVersion(shard);
        if (v !== null) base_versions.push({ shard, version: v });
      }
      const msg: SliceMessage = { run_id: runId, window: w, member, weight: acc.weight, steps, idle, drained, groups_version: seen, base_versions, ...tensors };
      if (to === member) this.inbox.addSlice(msg);
      else {
        await this.o.stepper.link.transfer(tensorBytes(tensors));
        await this.send(to, 'slice', msg);
      }
    }));
    const slices = await this.waitForAll(w, 'slice');

    // Reduce this member's shards: Σ over members of Σ samples·grad, divided by the group's samples.
    const total = slices.reduce((n, s) => n + s.weight, 0);
    const mine = this.shardsOf.get(member)!;
    let results: { shard: string; r: PushResult }[] = [];
    if (total > 0 && mine.size > 0) {
      const sums = new ShardedSums(this.o.plan);
      const base = new Map<string, number>();
      for (const s of slices) {
        sums.addTensors(s, 1);
        for (const b of s.base_versions) {
          const v = base.get(b.shard);
          if (v === undefined || b.version < v) base.set(b.shard, b.version);
        }
      }
      const parts = sums.byShard(mine, 1 / total);
      results = await Promise.all([...parts].map(async ([shard, t]) => {
        const b = base.get(shard);
        if (b === undefined) throw new HetpsError(`group ${this.o.group.name} window ${w}: gradient for shard ${shard} but no member reported the version it pulled`);
        return { shard, r: await this.o.stepper.push(shard, this.pushBody(t, total, b)) };
      }));
    }
    const pushed: PushedMessage = {
      run_id: runId, window: w, member,
      applied: results.filter((x) => !x.r.refused).map((x) => x.shard),
      refused: results.filter((x) => x.r.refused).map((x) => x.shard),
      staleness: maxPushStaleness(results.map((x) => x.r)),
    };
    await Promise.all(this.members.map((to) => (to === member ? (this.inbox.addPushed(pushed), undefined) : this.send(to, 'pushed', pushed))));
    const reports = await this.waitForAll(w, 'pushed');
    this.inbox.finish(w);
    if (reports.some((p) => p.refused.length > 0)) {
      this.o.log.info({ group: this.o.group.name, window: w, refused: reports.flatMap((p) => p.refused) }, 'part of the group\'s update was refused as too stale and dropped; the next window pulls fresh parameters');
    }
    return {
      droppedStale: reports.some((p) => p.refused.length > 0),
      staleness: Math.max(0, ...reports.map((p) => p.staleness)),
      done: slices.every((s) => s.drained),
      groupsVersion: Math.max(seen, ...slices.map((s) => s.groups_version)),
    };
  }

  private pushBody(t: ShardTensors, weight: number, baseVersion: number): PushRequest {
    return {
      plan_version: this.o.plan.version, round: null, expected: null, weight, base_version: baseVersion, later_steps: [],
      dense: t.dense, sparse: t.sparse,
    };
  }

  private ref(member: string): ActorRef {
    let r = this.refs.get(member);
    if (r === undefined) { r = this.o.system.ref('group', groupMemberId(this.o.group.name, member)); this.refs.set(member, r); }
    return r;
  }

  /** A slice or pushed message, re-sent (same seq: applied once) until the member's mailbox takes it. */
  private async send(to: string, type: 'slice' | 'pushed', fields: SliceMessage | PushedMessage): Promise<void> {
    const seq = this.o.system.nextSeq();
    const started = this.clock.monotonic();
    let lastNote = started;
    for (let attempt = 0; ; attempt++) {
      try {
        await this.ref(to).request(type, fields as unknown as Record<string, unknown>, { timeoutMs: this.o.requestTimeoutMs ?? 10_000, retries: 2, seq });
        return;
      } catch (e) {
        if (!isRetryable(e)) throw e;
        if (this.o.shouldStop()) throw new StopRequestedError(`stopped while sending ${type} to ${to}`, { cause: e });
        const now = this.clock.monotonic();
        if (now - lastNote >= (this.o.stallNoteMs ?? 10_000)) {
          lastNote = now;
          this.o.log.warn({ group: this.o.group.name, to, type, waited_s: Math.round((now - started) / 1000), err: (e as Error).message },
            `group ${this.o.group.name}: ${to} does not take its ${type} yet (not started, or gone: a dead member stalls its group until fault tolerance lands)`);
        }
        await this.clock.sleep(Math.min(1_000, 50 * 2 ** Math.min(attempt, 5)));
      }
    }
  }

  /** Fire-and-forget (adaptive progress and close). */
  private announce(type: 'progress' | 'close', fields: { window: number; steps?: number }): void {
    for (const to of this.members) {
      if (to === this.o.member) continue;
      try {
        this.ref(to).tell(type, { run_id: this.o.runId, member: this.o.member, ...fields });
      } catch (e) {
        this.o.log.debug({ to, type, err: (e as Error).message }, 'group announcement not sent');
      }
    }
  }

  private async waitForAll<K extends 'slice' | 'pushed'>(w: number, kind: K): Promise<(K extends 'slice' ? SliceMessage : PushedMessage)[]> {
    const started = this.clock.monotonic();
    let lastNote = started;
    const note = this.o.stallNoteMs ?? 10_000;
    for (;;) {
      const box = this.inbox.window(w);
      const got = kind === 'slice' ? box.slices : box.pushed;
      if (got.size >= this.members.length) return this.members.map((m) => got.get(m)!) as (K extends 'slice' ? SliceMessage : PushedMessage)[];
      this.checkStop(w);
      const now = this.clock.monotonic();
      if (now - lastNote >= note) {
        lastNote = now;
        const missing = this.members.filter((m) => !got.has(m));
        this.o.log.warn({ group: this.o.group.name, window: w, waiting_for: missing, waited_s: Math.round((now - started) / 1000) },
          `group ${this.o.group.name} window ${w}: still waiting for ${kind === 'slice' ? 'the gradient slices' : 'the push reports'} of ${missing.join(', ')}`
          + ' (a slower member, or a dead one: that stalls its group until fault tolerance lands)');
      }
      await this.inbox.changed(this.clock, Math.min(1_000, note));
    }
  }

  private checkStop(w: number): void {
    if (this.o.shouldStop()) throw new StopRequestedError(`stopped in window ${w} of group ${this.o.group.name}`);
  }
}

function tensorBytes(t: ShardTensors): number {
  let n = 0;
  for (const d of t.dense) n += d.grad.byteLength;
  for (const s of t.sparse) n += s.ids.byteLength + s.grads.byteLength;
  return n;
}
