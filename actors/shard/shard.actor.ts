/**
 * The shard actor: owns the dense blocks and sparse partitions the shard plan
 * gives it, serves pulls, applies pushed gradients with the server-side
 * optimizers, and runs synchronous rounds (weighted mean of `expected`
 * contributions, applied once).
 *
 * `ShardState` holds the state and does the work as plain method calls (tests
 * and an embedded job can use it directly); `createShardActor` wraps it as an
 * idempotent actor, so a retried push `(from, seq)` is applied once.
 *
 * Hot-path choices: pull replies are built from live views (dense blocks) and
 * reused scratch arrays (sparse rows). That is safe because the runtime encodes
 * a reply synchronously when the handler returns or a deferred reply is
 * resolved; nothing here holds on to the reply object afterwards. No closures
 * or per-row objects are created per message (tsx wraps named closures).
 */
import { createHash } from 'node:crypto';
import { stat } from 'node:fs/promises';
import { z } from 'zod';
import {
  ActorStoppedError, ConfigError, DeferredReply, InvalidTensorError, ValidationError, zf32, zu32,
  type ActorDefinition, type Clock,
} from '../../runtime/mod.ts';
import { RecentStaleness, decideStaleness, describeMaxStaleness, rowsMaxStaleness, partitionOf, type DenseBlock, type PushContent, type ShardPlan, type StalenessPolicy } from '../../topology/mod.ts';
import {
  createOptimizer, firstNonFinite, ROW_CHUNK, SparseTable, type Optimizer, type OptimizerConfigInput, type SparseTableSnapshot,
} from '../../native-bridge/mod.ts';
import {
  compressPullReply, dedupWindowSchema, shardMessages, type DenseBlockSnapshot, type PullReply, type PullReplyWire, type PullRequest, type PushReply, type PushRequest,
  type RestoreReply, type RestoreRequest, type ShardMessages, type ShardSnapshot, type ShardStats, type StalenessHistogram,
} from './shard.messages.ts';
import { IncomingSnapshot, OutgoingSnapshot, snapshotFields, type SnapshotHead, type SnapshotSegment } from './snapshot-segments.ts';
import { StalePlanError, StaleUpdateError, SyncRoundError } from './shard.errors.ts';
import { primaryReplicaId } from './replica.ts';
import { readShardFromCheckpoint, shardFiles, writeCheckpointFile, type CheckpointFile } from '../store/checkpoint.ts';
import { deltaOf, rowSteps, type RowSteps } from '../store/checkpoint-delta.ts';

/** What a shard wrote of a checkpoint (`write_frozen`): its files, the sparse rows written of those it holds, and whether a delta. */
export interface WrittenShard {
  files: CheckpointFile[]; kind: 'full' | 'delta'; rows: number; rows_held: number; dense_optimizer: string; sparse_optimizer: string;
}

/** Where a shard's checkpoint chain stands: the last checkpoint it wrote in it, and each row's update count as of then. */
interface CheckpointBase { name: string; steps: RowSteps }

export interface ShardStateOptions {
  /** This shard's name in the plan (also the actor id). */
  shard: string;
  plan: ShardPlan;
  /** Initial values of every dense parameter (e.g. `initDenseParams(model, seed)`); the shard copies its own blocks. */
  initialDense: Map<string, Float32Array>;
  denseOptimizer: OptimizerConfigInput;
  sparseOptimizer: OptimizerConfigInput;
  /** Sparse rows start uniform in ±`sparseInitScale`. */
  sparseInitScale: number;
  /** Per-table override of `sparseInitScale` (train-local starts `wide` at 0); null or absent = none. */
  sparseInitScaleByTable?: Record<string, number> | null;
  /** Seeds the deterministic row initialiser of (seed, table, id): every shard and replica agrees on a new row. */
  seed: number;
  clock: Clock;
  /**
   * How asynchronous pushes are judged by their staleness (hps: lr/(1+s),
   * refused beyond max_staleness). Null or absent: measured only, every push
   * applied at full rate (asp, bsp).
   */
  staleness?: StalenessPolicy | null;
}

export type ShardActorDefinition = ActorDefinition<ShardMessages> & { readonly state: ShardState };

/** The shard actor (kind `shard`, id = shard name); `definition.state` is its `ShardState`. */
export function createShardActor(opts: ShardStateOptions | ShardState): ShardActorDefinition {
  const state = opts instanceof ShardState ? opts : new ShardState(opts);
  return {
    kind: 'shard',
    // The address of the shard's primary under its plan (`<shard>@<node>`): a single replica, standing alone.
    id: primaryReplicaId(state.plan, state.shard),
    messages: shardMessages,
    idempotent: true,
    // Pulls, snapshots and stats are reads: repeating one is harmless, and
    // remembering their (large) replies for retries would cost memory.
    idempotentTypes: ['push', 'restore'],
    state,
    handlers: {
      pull: (m) => state.pull(m),
      push: (m) => state.push(m),
      snapshot: () => state.snapshot(false),
      freeze: (m) => state.freeze(m.token),
      take_frozen: (m) => (m.segment_bytes === undefined ? state.takeFrozen(m.token) : state.takeFrozenSegments(m.token, m.segment_bytes)),
      take_frozen_part: (m) => state.takeFrozenPart(m.token, m.index),
      write_frozen: (m) => state.writeFrozen(m.token, m.dir, m.part_bytes, {}, { ...(m.name === undefined ? {} : { name: m.name }), ...(m.base === undefined ? {} : { base: m.base }) }),
      restore_begin: (m) => state.restoreBegin(m.transfer, m.head, m.segments),
      restore_part: (m) => state.restorePart(m.transfer, m.index, m.segment),
      restore: (m) => state.restore(state.restoreInput(m)),
      restore_files: async (m) => state.restore(await readShardFromCheckpoint(m.path, state.shard)),
      stats: (_m, ctx) => state.stats(ctx.stats.duplicates),
      round_expected: (m) => state.lowerRoundExpected(m.plan_version, m.round, m.expected),
    },
    // Pulls still waiting for a round would otherwise only time out; ActorStoppedError is retryable.
    onStop: () => state.rejectWaitingPulls(new ActorStoppedError(`shard ${state.shard} stopped while the pull waited for a synchronous round`)),
  };
}

// ---------------------------------------------------------------- state

interface OwnedBlock {
  readonly id: number;
  readonly param: string;
  readonly offset: number;
  readonly length: number;
  /** For error messages: `param[offset..end)`. */
  readonly name: string;
  readonly values: Float32Array;
  readonly state: Float32Array[];
  /** Updates applied (1-based step of the next update = step + 1). */
  step: number;
  /** Σ weight·grad of the open synchronous round of each parity; allocated on first use and kept. */
  readonly accum: [Float64Array | null, Float64Array | null];
  /** The round whose sums `accum[parity]` holds, or -1 when it is all zeros. */
  readonly accumRound: [number, number];
  /** Scratch for the weighted mean handed to the optimizer. */
  mean: Float32Array | null;
}

interface OwnedTable {
  readonly name: string;
  readonly dim: number;
  table: SparseTable;
}

interface SparseContributions {
  ids: Int32Array[];
  /** weight·grads, one array per contribution. */
  grads: Float32Array[];
  rows: number;
}

interface RoundBuffer {
  readonly round: number;
  expected: number;
  contributions: number;
  totalWeight: number;
  /** Block ids with a non-zero contribution this round. */
  readonly touched: number[];
  readonly sparse: Map<string, SparseContributions>;
}

interface WaitingPull {
  minRound: number;
  dense: Int32Array;
  sparse: PullRequest['sparse'];
  compression: PullRequest['compression'];
  reply: DeferredReply;
}

/** The gradients of a push were checked whole before any of it is applied (checkPushTensors). */
const VALIDATED = Object.freeze({ validated: true });

/** Power-of-two bucket bounds for staleness. */
const STALENESS_LE = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

const EMPTY_F32: Float32Array[] = [];

export class ShardState {
  readonly shard: string;
  readonly plan: ShardPlan;
  readonly denseOptimizer: Optimizer;
  readonly sparseOptimizer: Optimizer;
  private readonly clock: Clock;
  private readonly seed: number;
  private readonly stalenessPolicy: StalenessPolicy | null;
  private readonly initScaleOf: (table: string) => number;
  /** By plan block id; undefined where another shard owns the block. */
  private readonly blocks: (OwnedBlock | undefined)[];
  private readonly ownedBlocks: OwnedBlock[];
  private readonly tables = new Map<string, OwnedTable>();
  /** 1 where this shard owns the sparse partition. */
  private readonly ownsPartition: Uint8Array;
  /** Per-push marker of blocks seen (duplicate check without allocating). */
  private readonly blockSeen: Uint32Array;
  private pushStamp = 0;
  /** Pull scratch per position in the request's `sparse` list (reused; see the module comment). */
  private readonly pullScratch: Float32Array[] = [];
  private slots = new Int32Array(0);
  /** Open synchronous rounds by parity: the current one and the next. */
  private readonly rounds: [RoundBuffer | null, RoundBuffer | null] = [null, null];
  private waiting: WaitingPull[] = [];

  private versionValue = 0;
  private roundValue = 0;
  /** The copy of a checkpoint's cut (`freeze`), until it is taken. */
  private frozen: { token: string; snap: () => ShardSnapshot } | null = null;
  /** checkpoint.written_by shards: the last checkpoint of the chain this shard wrote, for the next delta. */
  private checkpointBase: CheckpointBase | null = null;
  /** The copy taken in segments (`take_frozen` with `segment_bytes`), until its last is taken. */
  private readonly frozenOut: OutgoingSnapshot;
  /** A state arriving in segments for a restore (`restore_begin` … `restore`). */
  private readonly restoring: IncomingSnapshot;
  /** The plan version (epoch) requests must name; moves forward with failovers while the layout stays. */
  private epochValue: number;
  private pushes = 0;
  private pulls = 0;
  /** Floats pulls returned, and gradient floats pushes (or the replicated stream) brought: the replica's traffic, for load balancing. */
  private pulledFloats = 0;
  private pushedFloats = 0;
  private applyMs = 0;
  private readonly stalenessCounts = new Array<number>(STALENESS_LE.length + 1).fill(0);
  private stalenessCount = 0;
  private stalenessSum = 0;
  private stalenessMax = 0;
  private staleRefused = 0;
  private staleScaled = 0;
  /** Admitted async pushes whose dense part, or rows, were dropped as beyond that kind's bound. */
  private staleDenseDropped = 0;
  private staleSparseDropped = 0;
  /** Staleness of recent async pushes (the `auto` tolerance). */
  private readonly recentStaleness = new RecentStaleness();

  constructor(opts: ShardStateOptions) {
    const { plan, shard } = opts;
    if (!plan.shards.includes(shard)) throw new ConfigError(`shard ${shard} is not in shard plan v${plan.version} (shards: ${plan.shards.join(', ')})`);
    this.shard = shard;
    this.plan = plan;
    this.frozenOut = new OutgoingSnapshot(`shard ${shard}: take_frozen_part`);
    this.restoring = new IncomingSnapshot(`shard ${shard}: restore`);
    this.epochValue = plan.version;
    this.clock = opts.clock;
    this.seed = opts.seed;
    this.stalenessPolicy = opts.staleness ?? null;
    this.denseOptimizer = createOptimizer(opts.denseOptimizer);
    this.sparseOptimizer = createOptimizer(opts.sparseOptimizer);
    const byTable = opts.sparseInitScaleByTable ?? null;
    const scale = opts.sparseInitScale;
    this.initScaleOf = (table) => (byTable !== null && byTable[table] !== undefined ? byTable[table]! : scale);

    const sizes = new Map(plan.denseParams.map((p) => [p.name, p.size]));
    this.blocks = new Array<OwnedBlock | undefined>(plan.dense.length);
    this.ownedBlocks = [];
    for (const b of plan.dense) {
      if (b.shard !== shard) continue;
      const full = opts.initialDense.get(b.param);
      if (full === undefined) throw new ConfigError(`shard ${shard}: no initial values for dense parameter ${b.param}`);
      if (full.length !== sizes.get(b.param)) {
        throw new ConfigError(`shard ${shard}: initial values of ${b.param} have ${full.length} elements, the plan says ${sizes.get(b.param)}`);
      }
      const owned = this.newBlock(b);
      owned.values.set(full.subarray(b.offset, b.offset + b.length));
      this.blocks[b.id] = owned;
      this.ownedBlocks.push(owned);
    }
    this.blockSeen = new Uint32Array(plan.dense.length);
    this.ownsPartition = new Uint8Array(plan.partitions);
    for (let p = 0; p < plan.partitions; p++) if (plan.partitionOwner[p] === shard) this.ownsPartition[p] = 1;
    for (const t of plan.sparseTables) this.tables.set(t.name, { name: t.name, dim: t.dim, table: this.newTable(t.name, t.dim) });
  }

  get version(): number { return this.versionValue; }
  /** Synchronous rounds applied so far (= the round now open). */
  get round(): number { return this.roundValue; }
  get planVersion(): number { return this.epochValue; }
  /** Serve requests of plan version `epoch` from now on (a newer plan with the same layout: failover, re-replication). */
  setEpoch(epoch: number): void { this.epochValue = epoch; }

  // ---------------------------------------------------------------- pull

  /**
   * Dense blocks and sparse rows (rows are created on first pull). With
   * `min_round` above the rounds applied, a DeferredReply answered when that
   * many rounds are applied. The returned arrays are views on the shard's
   * state and scratch, valid until the next call: copy them to keep them.
   */
  pull(m: PullRequest): PullReply | PullReplyWire | DeferredReply {
    this.checkPlanVersion(m.plan_version, 'pull');
    this.checkPullTargets(m.dense, m.sparse);
    this.pulls++;
    if (m.min_round !== null && this.roundValue < m.min_round) {
      const reply = new DeferredReply();
      this.waiting.push({ minRound: m.min_round, dense: m.dense, sparse: m.sparse, compression: m.compression, reply });
      return reply;
    }
    return this.answerPull(m.dense, m.sparse, m.compression);
  }

  /** The pull's reply, as scaled halves where it asked for `compression` (the shard keeps float32). */
  private answerPull(dense: Int32Array, sparse: PullRequest['sparse'], compression: PullRequest['compression']): PullReply | PullReplyWire {
    const reply = this.readPull(dense, sparse);
    return compression === 'fp16' ? compressPullReply(reply) : reply;
  }

  private checkPullTargets(dense: Int32Array, sparse: PullRequest['sparse']): void {
    for (let k = 0; k < dense.length; k++) this.ownedBlock(dense[k]!, `dense[${k}]`);
    for (let k = 0; k < sparse.length; k++) {
      const e = sparse[k]!;
      this.checkOwnedIds(this.ownedTable(e.table, `sparse[${k}]`), e.ids, `sparse[${k}]`);
    }
  }

  private readPull(dense: Int32Array, sparse: PullRequest['sparse']): PullReply {
    const denseOut: Float32Array[] = dense.length ? new Array<Float32Array>(dense.length) : EMPTY_F32;
    let floats = 0;
    for (let k = 0; k < dense.length; k++) { denseOut[k] = this.blocks[dense[k]!]!.values; floats += denseOut[k]!.length; }
    const sparseOut: Float32Array[] = sparse.length ? new Array<Float32Array>(sparse.length) : EMPTY_F32;
    for (let k = 0; k < sparse.length; k++) {
      const e = sparse[k]!;
      const t = this.tables.get(e.table)!.table;
      const d = t.dim;
      const n = e.ids.length * d;
      let scratch = this.pullScratch[k];
      if (scratch === undefined || scratch.length < n) {
        scratch = new Float32Array(Math.max(n, scratch ? scratch.length * 2 : 0));
        this.pullScratch[k] = scratch;
      }
      const out = scratch.subarray(0, n);
      const ids = e.ids;
      // Slots first (rows created, the table grown at most once), then each
      // chunk of rows touched and copied: on a large table the cache misses of
      // a chunk's rows overlap (~20% faster than one row at a time), and a
      // plain loop instead of SparseTable.pull makes no subarray per row.
      const slots = this.slotScratch(ids.length);
      t.slotsOf(ids, slots);
      const values = t.values;
      for (let c = 0; c < ids.length; c += ROW_CHUNK) {
        const end = Math.min(ids.length, c + ROW_CHUNK);
        t.touchRows(slots.subarray(c, end), end - c);
        for (let i = c; i < end; i++) {
          const base = slots[i]! * d;
          const o = i * d;
          for (let j = 0; j < d; j++) out[o + j] = values[base + j]!;
        }
      }
      sparseOut[k] = out;
      floats += n;
    }
    this.pulledFloats += floats;
    return { version: this.versionValue, round: this.roundValue, dense: denseOut, sparse: sparseOut };
  }

  // ---------------------------------------------------------------- push

  /**
   * Validates the whole push (nothing changes on any error), then applies it
   * (async) or adds it to its round (sync). Under a staleness policy an
   * async push is applied at lr·lrScale (1/(1+staleness)), or refused with
   * StaleUpdateError beyond the bound.
   */
  push(m: PushRequest): PushReply {
    this.checkPlanVersion(m.plan_version, 'push');
    if (m.round !== null) this.checkRound(m.round, m.expected);
    else if (m.expected !== null) throw new ValidationError(`shard ${this.shard}: push has expected = ${m.expected} but no round; expected is only for synchronous rounds`);
    if (m.round !== null && m.later_steps.length > 0) throw new ValidationError(`shard ${this.shard}: a contribution to synchronous round ${m.round} cannot carry further steps (later_steps); only async pushes can`);
    if (m.round !== null && m.lr_mult !== 1) throw new ValidationError(`shard ${this.shard}: a contribution to synchronous round ${m.round} cannot carry a learning-rate multiplier (lr_mult ${m.lr_mult}); only a group's async push can`);
    this.checkPushTensors(m.dense, m.sparse, '');
    for (let k = 0; k < m.later_steps.length; k++) this.checkPushTensors(m.later_steps[k]!.dense, m.later_steps[k]!.sparse, `later_steps[${k}].`);
    const staleness = Math.max(0, this.versionValue - m.base_version);
    this.recordStaleness(staleness);
    this.pushes++;
    this.pushedFloats += pushFloats(m);
    if (m.round === null) {
      let lrScale = 1;
      let sparseLrScale = 1;
      let dropped: 'dense' | 'sparse' | null = null;
      const policy = this.stalenessPolicy;
      if (policy !== null) {
        const d = decideStaleness(this.versionValue, m.base_version, policy, this.recentStaleness.median(), pushContent(m));
        this.recentStaleness.add(d.staleness);
        if (!d.admit) {
          this.staleRefused++;
          throw new StaleUpdateError(
            `shard ${this.shard}: push is ${d.staleness} updates stale (computed from version ${m.base_version}, the shard is at ${this.versionValue}); `
            + `training.max_staleness is ${describeMaxStaleness(policy.maxStaleness, rowsMaxStaleness(policy))}: nothing was applied — pull fresh parameters`,
            { data: { shard: this.shard, staleness: d.staleness, max_staleness: policy.maxStaleness, ...sparseBound(policy), version: this.versionValue, base_version: m.base_version } },
          );
        }
        lrScale = d.lrScale;
        sparseLrScale = d.sparseLrScale;
        if (d.dropped !== null) this.noteDropped(d.dropped);
        dropped = d.dropped;
        if (lrScale < 1 || sparseLrScale < 1) this.staleScaled++;
      }
      // A group's update at its learning-rate rule (1 for one worker's push).
      lrScale *= m.lr_mult;
      sparseLrScale *= m.lr_mult;
      this.applyAsync(m, lrScale, sparseLrScale);
      // sparse_lr_scale only where rows got a rate of their own (training.staleness_tolerance { dense, sparse }),
      // dropped only where a part was left out (training.max_staleness { dense, sparse }).
      const reply: PushReply = sparseLrScale === lrScale
        ? { version: this.versionValue, applied: true, staleness, lr_scale: lrScale }
        : { version: this.versionValue, applied: true, staleness, lr_scale: lrScale, sparse_lr_scale: sparseLrScale };
      if (dropped !== null) reply.dropped = dropped;
      return reply;
    }
    const applied = this.contribute(m);
    return { version: this.versionValue, applied, staleness, lr_scale: 1 };
  }

  /**
   * A push its primary already validated and applied, applied the same way
   * here (a backup): the primary's staleness decision (`lrScale`, and the part
   * it left out, `dropped`) is taken as it is, so primary and backup stay
   * bit-identical.
   */
  applyReplicated(m: PushRequest, lrScale: number, sparseLrScale = lrScale, dropped: 'dense' | 'sparse' | null = null): void {
    this.recordStaleness(Math.max(0, this.versionValue - m.base_version));
    this.pushes++;
    this.pushedFloats += pushFloats(m);
    if (m.round === null) {
      if (this.stalenessPolicy !== null) this.recentStaleness.add(Math.max(0, this.versionValue - m.base_version));
      // Scaled down for staleness by the primary (lr_scale is that scale times the group's lr_mult; 0: that kind dropped,
      // which the primary's reply names as `dropped`).
      if (lrScale < m.lr_mult || sparseLrScale < m.lr_mult) this.staleScaled++;
      if (dropped !== null) this.noteDropped(dropped);
      this.applyAsync(m, lrScale, sparseLrScale);
    } else {
      this.contribute(m);
    }
  }

  /**
   * Synchronous round `round` waits for `expected` contributions from now on
   * when that is fewer than it did (a worker declared dead); a round already
   * applied, or too far ahead, is left alone. Applies the rounds that are
   * complete now.
   */
  lowerRoundExpected(version: number, round: number, expected: number): { round: number; expected: number | null } {
    this.checkPlanVersion(version, 'round_expected');
    if (round < this.roundValue || round > this.roundValue + 1) return { round: this.roundValue, expected: null };
    const parity = parityOf(round);
    let buf = this.rounds[parity];
    if (buf === null || buf.round !== round) {
      buf = { round, expected, contributions: 0, totalWeight: 0, touched: [], sparse: new Map() };
      this.rounds[parity] = buf;
    } else if (expected < buf.expected) {
      buf.expected = expected;
    }
    if (round === this.roundValue) this.completeRounds();
    return { round: this.roundValue, expected: buf.expected };
  }

  /** Counts a push its primary refused as too stale (a backup keeps the same counters). */
  noteRefused(m: PushRequest): void {
    const staleness = Math.max(0, this.versionValue - m.base_version);
    this.recordStaleness(staleness);
    if (this.stalenessPolicy !== null) this.recentStaleness.add(staleness);
    this.pushes++;
    this.pushedFloats += pushFloats(m);
    this.staleRefused++;
  }

  private noteDropped(kind: 'dense' | 'sparse'): void {
    if (kind === 'dense') this.staleDenseDropped++;
    else this.staleSparseDropped++;
  }

  private applyAsync(m: PushRequest, lrScale: number, sparseLrScale: number): void {
    const t0 = this.clock.monotonic();
    this.applyGradients(m.dense, m.sparse, lrScale, sparseLrScale);
    this.versionValue++;
    for (let k = 0; k < m.later_steps.length; k++) {
      this.applyGradients(m.later_steps[k]!.dense, m.later_steps[k]!.sparse, lrScale, sparseLrScale);
      this.versionValue++;
    }
    this.applyMs += this.clock.monotonic() - t0;
  }

  /**
   * SHA-256 over everything an update changes: version, round, every owned
   * dense block (values, optimizer state, step) and every sparse row an
   * update touched (by id). Equal on a primary and its caught-up backups.
   */
  stateHash(): string {
    const h = createHash('sha256');
    h.update(`${this.versionValue}/${this.roundValue}`);
    const bytes = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
    for (const b of this.ownedBlocks) {
      h.update(`b${b.id}:${b.step}`);
      h.update(bytes(b.values));
      for (const st of b.state) h.update(bytes(st));
    }
    for (const t of [...this.tables.values()].sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const snap = t.table.snapshot();
      // Rows a pull created but no update touched still hold their deterministic initial values: a
      // backup, which sees no pulls, has not created them; they are left out on both sides.
      const order = Array.from(snap.ids.keys()).filter((k) => snap.steps[k]! > 0).sort((a, b) => snap.ids[a]! - snap.ids[b]!);
      const d = snap.dim;
      const slots = snap.stateSlots;
      h.update(`t${t.name}:${order.length}`);
      for (const k of order) {
        h.update(`${snap.ids[k]}:${snap.steps[k]}`);
        h.update(bytes(snap.values.subarray(k * d, (k + 1) * d)));
        h.update(bytes(snap.state.subarray(k * d * slots, (k + 1) * d * slots)));
      }
    }
    return h.digest('hex');
  }

  private checkRound(round: number, expected: number | null): void {
    if (expected === null) throw new ValidationError(`shard ${this.shard}: a contribution to synchronous round ${round} needs \`expected\` (the number of contributions of the round)`);
    const data = { shard: this.shard, round, current_round: this.roundValue };
    if (round < this.roundValue) {
      throw new SyncRoundError(`shard ${this.shard}: round ${round} was already applied (${this.roundValue} rounds applied); a late contribution is not counted`, { data });
    }
    if (round > this.roundValue + 1) {
      throw new SyncRoundError(`shard ${this.shard}: round ${round} is too far ahead: round ${this.roundValue} is open, contributions are taken for it and the next one only`, { data });
    }
    // Contributions may disagree on `expected` while a worker is being declared dead: the
    // lowest count a contributor names holds for the round (see contribute).
  }

  /** Checks one update's tensors (`at`: where they sit in the push, for messages). */
  private checkPushTensors(dense: PushRequest['dense'], sparse: PushRequest['sparse'], at: string): void {
    const stamp = this.nextPushStamp();
    for (let k = 0; k < dense.length; k++) {
      const e = dense[k]!;
      const b = this.ownedBlock(e.block, `${at}dense[${k}]`);
      if (this.blockSeen[b.id] === stamp) throw new ValidationError(`shard ${this.shard}: dense block ${b.id} appears twice in one push`, { data: { block: b.id } });
      this.blockSeen[b.id] = stamp;
      if (e.grad.length !== b.length) {
        throw new InvalidTensorError(`gradient of dense block ${b.id} (${b.name}) has ${e.grad.length} elements, the block has ${b.length}; nothing was applied`, { data: { tensor: b.name, block: b.id } });
      }
      const bad = firstNonFinite(e.grad);
      if (bad >= 0) {
        throw new InvalidTensorError(`gradient of dense block ${b.id} (${b.name}) has ${describeNonFinite(e.grad[bad]!)} at index ${bad}; nothing was applied`, { data: { tensor: b.name, block: b.id, index: bad } });
      }
    }
    for (let k = 0; k < sparse.length; k++) {
      const e = sparse[k]!;
      const t = this.ownedTable(e.table, `${at}sparse[${k}]`);
      for (let j = 0; j < k; j++) {
        if (sparse[j]!.table === e.table) throw new ValidationError(`shard ${this.shard}: sparse table ${e.table} appears twice in one push`, { data: { table: e.table } });
      }
      if (e.grads.length !== e.ids.length * t.dim) {
        throw new InvalidTensorError(`gradient of sparse table ${e.table} has ${e.grads.length} floats for ${e.ids.length} ids of dim ${t.dim}; nothing was applied`, { data: { tensor: e.table } });
      }
      this.checkOwnedIds(t, e.ids, `${at}sparse[${k}]`);
      const bad = firstNonFinite(e.grads);
      if (bad >= 0) {
        const entry = Math.floor(bad / t.dim);
        throw new InvalidTensorError(
          `gradient of sparse table ${e.table} has ${describeNonFinite(e.grads[bad]!)} at index ${bad} (id ${e.ids[entry]}, entry ${entry}, element ${bad % t.dim}); nothing was applied`,
          { data: { tensor: e.table, index: bad, id: e.ids[entry]! } },
        );
      }
    }
  }

  /** The optimizer step of one async push or one completed round (already validated). */
  /** Applies a push checked whole by checkPushTensors (on a backup: by its primary), so no optimizer or table checks the gradients again. */
  private applyGradients(dense: PushRequest['dense'], sparse: PushRequest['sparse'], lrScale: number, sparseLrScale = lrScale): void {
    // The schedule of sparse rows follows the shard's update count (one per push or round).
    const scheduleStep = this.versionValue + 1;
    // A multiplier of 0 is a part dropped as beyond its kind's max_staleness: the
    // optimizer is not run at all (Adam's moments and step would move at lr 0).
    if (lrScale !== 0) for (let k = 0; k < dense.length; k++) {
      const e = dense[k]!;
      const b = this.blocks[e.block]!;
      b.step++;
      // Checked by checkPushTensors already: skip the optimizer's own pass over the gradient.
      this.denseOptimizer.updateDenseChecked(b.values, e.grad, b.state, b.step, lrScale, b.name);
    }
    if (sparseLrScale !== 0) for (let k = 0; k < sparse.length; k++) {
      const e = sparse[k]!;
      this.tables.get(e.table)!.table.applyGradients(e.ids, e.grads, this.sparseOptimizer, scheduleStep, sparseLrScale, VALIDATED);
    }
  }

  /**
   * Adds a validated contribution to its round; applies every round that is
   * complete. True when this push applied a round. A round's `expected` is
   * the lowest any of its contributions names: bsp workers lower it for the
   * rounds after a worker's dead verdict, and a contribution naming more is
   * counted towards the lower number.
   */
  private contribute(m: PushRequest): boolean {
    const round = m.round!;
    const parity = parityOf(round);
    let buf = this.rounds[parity];
    if (buf === null || buf.round !== round) {
      buf = { round, expected: m.expected!, contributions: 0, totalWeight: 0, touched: [], sparse: new Map() };
      this.rounds[parity] = buf;
    } else if (m.expected! < buf.expected) {
      // A contributor knows of a worker declared dead: the round completes without it.
      buf.expected = m.expected!;
    }
    const w = m.weight;
    if (w > 0) {
      for (let k = 0; k < m.dense.length; k++) {
        const e = m.dense[k]!;
        const b = this.blocks[e.block]!;
        let acc = b.accum[parity];
        if (acc === null) { acc = new Float64Array(b.length); b.accum[parity] = acc; }
        if (b.accumRound[parity] !== round) { b.accumRound[parity] = round; buf.touched.push(b.id); }
        const g = e.grad;
        for (let i = 0; i < acc.length; i++) acc[i] = acc[i]! + w * g[i]!;
      }
      for (let k = 0; k < m.sparse.length; k++) {
        const e = m.sparse[k]!;
        if (e.ids.length === 0) continue;
        let c = buf.sparse.get(e.table);
        if (c === undefined) { c = { ids: [], grads: [], rows: 0 }; buf.sparse.set(e.table, c); }
        const scaled = new Float32Array(e.grads.length);
        for (let i = 0; i < scaled.length; i++) scaled[i] = w * e.grads[i]!;
        // Copies: the decoded arrays are views on the whole message, which should not stay alive for a round.
        c.ids.push(e.ids.slice());
        c.grads.push(scaled);
        c.rows += e.ids.length;
      }
    }
    buf.contributions++;
    buf.totalWeight += w;
    if (round !== this.roundValue || buf.contributions < buf.expected) return false;
    this.completeRounds();
    return true;
  }

  /** Applies the open round while it is complete (then the next one, if that completed first). */
  private completeRounds(): void {
    for (;;) {
      const parity = parityOf(this.roundValue);
      const buf = this.rounds[parity];
      if (buf === null || buf.round !== this.roundValue || buf.contributions < buf.expected) break;
      const t0 = this.clock.monotonic();
      this.applyRound(buf, parity);
      this.rounds[parity] = null;
      this.roundValue++;
      this.versionValue++;
      this.applyMs += this.clock.monotonic() - t0;
    }
    this.releaseWaitingPulls();
  }

  /** The weighted mean Σ w·g / Σ w of the round, applied once; total weight 0 applies nothing. */
  private applyRound(buf: RoundBuffer, parity: 0 | 1): void {
    const total = buf.totalWeight;
    const scheduleStep = this.versionValue + 1;
    for (const id of buf.touched) {
      const b = this.blocks[id]!;
      const acc = b.accum[parity]!;
      let mean = b.mean;
      if (mean === null) { mean = new Float32Array(b.length); b.mean = mean; }
      for (let i = 0; i < acc.length; i++) mean[i] = acc[i]! / total;
      acc.fill(0);
      b.accumRound[parity] = -1;
      b.step++;
      this.denseOptimizer.updateDenseChecked(b.values, mean, b.state, b.step, 1, b.name);
    }
    for (const [name, c] of buf.sparse) {
      const t = this.tables.get(name)!;
      const ids = new Int32Array(c.rows);
      const grads = new Float32Array(c.rows * t.dim);
      let row = 0;
      for (let k = 0; k < c.ids.length; k++) {
        ids.set(c.ids[k]!, row);
        grads.set(c.grads[k]!, row * t.dim);
        row += c.ids[k]!.length;
      }
      for (let i = 0; i < grads.length; i++) grads[i] = grads[i]! / total;
      // Duplicate ids (rows touched by several contributions) are summed by applyGradients.
      t.table.applyGradients(ids, grads, this.sparseOptimizer, scheduleStep, 1);
    }
  }

  private releaseWaitingPulls(): void {
    if (this.waiting.length === 0) return;
    const still: WaitingPull[] = [];
    for (const w of this.waiting) {
      if (w.minRound > this.roundValue) { still.push(w); continue; }
      try {
        // resolve() encodes the reply at once, so the scratch can serve the next one.
        w.reply.resolve(this.answerPull(w.dense, w.sparse, w.compression));
      } catch (e) {
        w.reply.reject(e);
      }
    }
    this.waiting = still;
  }

  /** Answers every pull still waiting for a round with `error` (the shard is stopping). */
  rejectWaitingPulls(error: Error): void {
    const waiting = this.waiting;
    this.waiting = [];
    for (const w of waiting) w.reply.reject(error);
  }

  // ---------------------------------------------------------------- snapshot / restore

  /**
   * Everything the shard holds, as plain data. `copy` false returns views on
   * the dense blocks (for a reply encoded at once); the default copies.
   */
  snapshot(copy = true, sparse: SparseTableSnapshot[] = [...this.tables.values()].map((t) => t.table.snapshot())): ShardSnapshot {
    const dense: DenseBlockSnapshot[] = this.ownedBlocks.map((b) => ({
      id: b.id, param: b.param, offset: b.offset, length: b.length,
      values: copy ? b.values.slice() : b.values,
      state: b.state.map((s) => (copy ? s.slice() : s)),
      step: b.step,
    }));
    return {
      format: 1, shard: this.shard, plan_version: this.epochValue, version: this.versionValue, round: this.roundValue,
      dense_optimizer: this.denseOptimizer.config.type, sparse_optimizer: this.sparseOptimizer.config.type,
      dense, sparse,
    };
  }

  /** A checkpoint's cut: a copy of everything held now, kept under `token` until `takeFrozen` (a later freeze replaces it). */
  freeze(token: string): { version: number; round: number } {
    // Copied whole now (training stands still for the cut); the sparse tables are compacted when taken, after it resumed.
    const sparse = [...this.tables.values()].map((t) => t.table.freezeCopy());
    const head = this.snapshot(true, []);
    this.frozen = { token, snap: () => ({ ...head, sparse: sparse.map((f) => f()) }) };
    return { version: this.versionValue, round: this.roundValue };
  }

  /** The copy `freeze(token)` made, handed over once; a ValidationError when there is none under that token. */
  takeFrozen(token: string): ShardSnapshot {
    const f = this.frozen;
    if (f === null || f.token !== token) {
      throw new ValidationError(`shard ${this.shard}: no copy frozen under ${token}${f === null ? '' : ` (the one held is ${f.token})`}: `
        + 'a later cut replaced it, it was taken already, or another replica became primary since; take the checkpoint again');
    }
    this.frozen = null;
    return f.snap();
  }

  /**
   * The copy `freeze(token)` made, to be taken in segments of at most
   * `budget` bytes (`takeFrozenPart`, in order): its head and how many.
   * Replaces segments held for an earlier cut.
   */
  takeFrozenSegments(token: string, budget: number): { head: SnapshotHead; segments: number } {
    return this.frozenOut.hold(token, this.takeFrozen(token), budget);
  }

  takeFrozenPart(token: string, index: number): { segment: SnapshotSegment } {
    return { segment: this.frozenOut.take(token, index) };
  }

  /**
   * The copy `freeze(token)` made (with `logs`, a replica's of the same
   * moment), written by this process as the shard's checkpoint files into
   * `dir` — a checkpoint's temporary directory the driver made, on storage
   * both see at the same path — and handed over once: what the manifest
   * lists of each file, and the rows and optimizers the driver reports.
   */
  async writeFrozen(
    token: string, dir: string, partBytes: number | undefined, logs: Pick<ShardSnapshot, 'dedup' | 'applied' | 'refused'> = {},
    chain: { name?: string; base?: string | null } = {},
  ): Promise<WrittenShard> {
    const st = await stat(dir).catch(() => null);
    if (st === null || !st.isDirectory()) {
      throw new ValidationError(`shard ${this.shard}: cannot write its checkpoint files into ${dir}: no such directory here; `
        + 'checkpoint.written_by: shards needs checkpoint.dir on storage every server node reaches at the same path (or checkpoint.written_by: driver)');
    }
    const snap = { ...this.takeFrozen(token), ...logs };
    const held = snap.sparse.reduce((n, t) => n + t.ids.length, 0);
    // A delta on the chain's last checkpoint, when this shard wrote it (another replica may have, before a failover): full otherwise.
    const base = this.checkpointBase;
    const asDelta = chain.base != null && base !== null && base.name === chain.base;
    // Until this write is done the chain stands nowhere: a failed one leaves the next checkpoint to be full.
    this.checkpointBase = null;
    const d = asDelta ? deltaOf(snap, base.steps) : null;
    const files: CheckpointFile[] = [];
    for (const f of shardFiles(this.shard, d?.delta ?? snap, partBytes)) files.push(await writeCheckpointFile(dir, f));
    if (chain.name !== undefined) this.checkpointBase = { name: chain.name, steps: d !== null ? base!.steps : rowSteps(snap) };
    else this.checkpointBase = base;
    return {
      files, kind: d !== null ? 'delta' : 'full', rows: d?.rows ?? held, rows_held: held, dense_optimizer: snap.dense_optimizer, sparse_optimizer: snap.sparse_optimizer,
    };
  }

  /** A restore in segments begins: the state's layout; `segments` parts follow (`restorePart`), then `restore` with the transfer. */
  restoreBegin(transfer: string, head: SnapshotHead, segments: number): Record<string, never> {
    this.restoring.begin(transfer, head, segments, this.shard, 'the restoring client');
    return {};
  }

  restorePart(transfer: string, index: number, segment: SnapshotSegment): { received: number } {
    return { received: this.restoring.part(transfer, index, segment) };
  }

  /**
   * What a `restore` message restores: its `state`, or the state its
   * `transfer` brought in segments with the message's logs.
   */
  restoreInput(m: RestoreRequest): Record<string, unknown> {
    if (m.transfer === undefined) return m.state!;
    return { ...this.restoring.finish(m.transfer), dedup: m.dedup ?? [], applied: m.applied ?? [], refused: m.refused ?? [] };
  }

  /**
   * Replaces the whole state with a snapshot of the same layout (the blocks
   * this shard owns, the plan's tables and dims, the same optimizer types).
   * All-or-nothing: a ValidationError naming the mismatch changes nothing.
   * Open synchronous rounds are dropped; waiting pulls whose round the
   * snapshot has reached are answered.
   */
  restore(raw: unknown): RestoreReply {
    const snap = parseShardSnapshot(raw, `shard ${this.shard}: restore`);
    const fail = (what: string): never => { throw new ValidationError(`shard ${this.shard}: restore: ${what}; nothing was restored`); };
    if (snap.dense_optimizer !== this.denseOptimizer.config.type) fail(`snapshot's dense optimizer is ${snap.dense_optimizer}, this shard's is ${this.denseOptimizer.config.type}`);
    if (snap.sparse_optimizer !== this.sparseOptimizer.config.type) fail(`snapshot's sparse optimizer is ${snap.sparse_optimizer}, this shard's is ${this.sparseOptimizer.config.type}`);
    const denseSlots = this.denseOptimizer.stateSlots();
    const seen = new Set<number>();
    for (const d of snap.dense) {
      const b = this.blocks[d.id];
      if (b === undefined) fail(`dense block ${d.id} is not owned by this shard in plan v${this.plan.version}`);
      if (b!.param !== d.param || b!.offset !== d.offset || b!.length !== d.length) {
        fail(`dense block ${d.id} is ${d.param}[${d.offset}..${d.offset + d.length}) in the snapshot, ${b!.name} in plan v${this.plan.version}`);
      }
      if (seen.has(d.id)) fail(`dense block ${d.id} appears twice`);
      seen.add(d.id);
      if (d.values.length !== b!.length) fail(`dense block ${d.id} has ${d.values.length} values for ${b!.length} elements`);
      if (d.state.length !== denseSlots) fail(`dense block ${d.id} has ${d.state.length} optimizer state slots, ${this.denseOptimizer.config.type} keeps ${denseSlots}`);
      for (const s of d.state) if (s.length !== b!.length) fail(`dense block ${d.id} has a state slot of ${s.length} elements for ${b!.length}`);
    }
    if (seen.size !== this.ownedBlocks.length) {
      const missing = this.ownedBlocks.filter((b) => !seen.has(b.id)).map((b) => b.id);
      fail(`the snapshot lacks dense block(s) ${missing.slice(0, 10).join(', ')}${missing.length > 10 ? ', …' : ''}`);
    }
    const sparseSlots = this.sparseOptimizer.stateSlots();
    const seenTables = new Set<string>();
    for (const s of snap.sparse) {
      const t = this.tables.get(s.table);
      if (t === undefined) fail(`sparse table ${s.table} is not in plan v${this.plan.version}`);
      if (seenTables.has(s.table)) fail(`sparse table ${s.table} appears twice`);
      seenTables.add(s.table);
      if (s.dim !== t!.dim) fail(`sparse table ${s.table} has dim ${s.dim}, the plan says ${t!.dim}`);
      if (s.stateSlots !== sparseSlots) fail(`sparse table ${s.table} has ${s.stateSlots} state slots, ${this.sparseOptimizer.config.type} keeps ${sparseSlots}`);
      const n = s.ids.length;
      if (s.values.length !== n * s.dim || s.state.length !== n * s.dim * s.stateSlots || s.steps.length !== n) {
        fail(`sparse table ${s.table}: ${n} ids with ${s.values.length} values, ${s.state.length} state floats and ${s.steps.length} steps do not match dim ${s.dim}`);
      }
      for (let k = 0; k < n; k++) {
        const id = s.ids[k]!;
        if (this.ownsPartition[partitionOf(id, this.plan.partitions)] !== 1) fail(`sparse table ${s.table}: id ${id} is in a partition this shard does not own`);
      }
    }

    for (const d of snap.dense) {
      const b = this.blocks[d.id]!;
      b.values.set(d.values);
      for (let k = 0; k < denseSlots; k++) b.state[k]!.set(d.state[k]!);
      b.step = d.step;
      for (const p of [0, 1] as const) {
        if (b.accumRound[p] !== -1) { b.accum[p]!.fill(0); b.accumRound[p] = -1; }
      }
    }
    for (const t of this.tables.values()) t.table = this.newTable(t.name, t.dim);
    for (const s of snap.sparse) this.tables.get(s.table)!.table.restore(s as SparseTableSnapshot);
    this.rounds[0] = null;
    this.rounds[1] = null;
    this.versionValue = snap.version;
    this.roundValue = snap.round;
    this.releaseWaitingPulls();
    return { version: this.versionValue, round: this.roundValue };
  }

  // ---------------------------------------------------------------- stats

  stats(duplicates = 0): ShardStats {
    let bytes = 0;
    for (const b of this.ownedBlocks) {
      bytes += b.values.byteLength + (b.mean?.byteLength ?? 0);
      for (const s of b.state) bytes += s.byteLength;
      for (const a of b.accum) bytes += a?.byteLength ?? 0;
    }
    const sparseRows: Record<string, number> = {};
    for (const t of this.tables.values()) {
      sparseRows[t.name] = t.table.size;
      bytes += t.table.bytes;
    }
    let pending = 0;
    for (const r of this.rounds) pending += r?.contributions ?? 0;
    const staleness: StalenessHistogram = {
      le: [...STALENESS_LE], counts: [...this.stalenessCounts], count: this.stalenessCount, sum: this.stalenessSum, max: this.stalenessMax,
    };
    return {
      shard: this.shard, plan_version: this.epochValue, version: this.versionValue, round: this.roundValue,
      pushes: this.pushes, pulls: this.pulls, pulled_floats: this.pulledFloats, pushed_floats: this.pushedFloats, duplicates, sparse_rows: sparseRows, dense_blocks: this.ownedBlocks.length, bytes,
      waiting_pulls: this.waiting.length, pending_contributions: pending, staleness,
      max_staleness: this.stalenessPolicy?.maxStaleness ?? null,
      sparse_max_staleness: this.stalenessPolicy === null ? null : rowsMaxStaleness(this.stalenessPolicy),
      stale_refused: this.staleRefused, stale_scaled: this.staleScaled,
      stale_dense_dropped: this.staleDenseDropped, stale_sparse_dropped: this.staleSparseDropped, apply_ms: this.applyMs,
    };
  }

  // ---------------------------------------------------------------- helpers

  private slotScratch(n: number): Int32Array {
    if (this.slots.length < n) this.slots = new Int32Array(Math.max(n, this.slots.length * 2));
    return this.slots;
  }

  private newBlock(b: DenseBlock): OwnedBlock {
    return {
      id: b.id, param: b.param, offset: b.offset, length: b.length, name: `${b.param}[${b.offset}..${b.offset + b.length})`,
      values: new Float32Array(b.length), state: this.denseOptimizer.allocateState(b.length), step: 0,
      accum: [null, null], accumRound: [-1, -1], mean: null,
    };
  }

  private newTable(name: string, dim: number): SparseTable {
    const opt = this.sparseOptimizer;
    return new SparseTable({
      table: name, dim, stateSlots: opt.stateSlots(), seed: this.seed, initScale: this.initScaleOf(name), initialCapacity: 1024,
      initialState: opt.allocateState(1).map((a) => a[0]!),
    });
  }

  private checkPlanVersion(version: number, op: string): void {
    if (version === this.epochValue) return;
    const newer = version < this.epochValue ? 'the shard has a newer plan: re-read it' : 'the shard has not received that plan yet';
    throw new StalePlanError(`shard ${this.shard}: ${op} uses shard plan v${version}, the shard serves v${this.epochValue} (${newer})`, {
      data: { shard: this.shard, shard_plan_version: this.epochValue, request_plan_version: version },
    });
  }

  private ownedBlock(id: number, where: string): OwnedBlock {
    const b = this.blocks[id];
    if (b !== undefined) return b;
    if (!Number.isInteger(id) || id < 0 || id >= this.plan.dense.length) {
      throw new ValidationError(`shard ${this.shard}: ${where}: dense block ${id} is not in shard plan v${this.plan.version} (${this.plan.dense.length} blocks)`, { data: { block: id } });
    }
    const pb = this.plan.dense[id]!;
    throw new ValidationError(`shard ${this.shard}: ${where}: dense block ${id} (${pb.param}) belongs to shard ${pb.shard}, not ${this.shard}`, { data: { block: id, owner: pb.shard } });
  }

  private ownedTable(name: string, where: string): OwnedTable {
    const t = this.tables.get(name);
    if (t !== undefined) return t;
    const known = [...this.tables.keys()].join(', ') || '(none)';
    throw new ValidationError(`shard ${this.shard}: ${where}: unknown sparse table ${JSON.stringify(name)} (plan v${this.plan.version} has ${known})`, { data: { table: name } });
  }

  private checkOwnedIds(t: OwnedTable, ids: Int32Array, where: string): void {
    const owns = this.ownsPartition;
    const partitions = this.plan.partitions;
    for (let i = 0; i < ids.length; i++) {
      const p = partitionOf(ids[i]!, partitions);
      if (owns[p] !== 1) {
        throw new ValidationError(
          `shard ${this.shard}: ${where}: id ${ids[i]} of table ${t.name} (index ${i}) is in partition ${p}, owned by shard ${this.plan.partitionOwner[p]}`,
          { data: { table: t.name, index: i, id: ids[i]!, partition: p, owner: this.plan.partitionOwner[p] ?? null } },
        );
      }
    }
  }

  private nextPushStamp(): number {
    this.pushStamp = (this.pushStamp + 1) >>> 0;
    if (this.pushStamp === 0) { this.blockSeen.fill(0); this.pushStamp = 1; }
    return this.pushStamp;
  }

  private recordStaleness(s: number): void {
    const bucket = s === 0 ? 0 : Math.min(STALENESS_LE.length, 33 - Math.clz32(s - 1));
    this.stalenessCounts[bucket]!++;
    this.stalenessCount++;
    this.stalenessSum += s;
    if (s > this.stalenessMax) this.stalenessMax = s;
  }
}

/** What an async push carries, its later steps included (a push for one shard may hold only dense blocks, or only rows). */
function pushContent(m: PushRequest): PushContent {
  let dense = m.dense.length > 0;
  let sparse = m.sparse.length > 0;
  for (const l of m.later_steps) {
    dense ||= l.dense.length > 0;
    sparse ||= l.sparse.length > 0;
  }
  return { dense, sparse };
}

/** The embedding rows' bound where the policy gives them their own (training.max_staleness { dense, sparse }). */
function sparseBound(policy: StalenessPolicy): { sparse_max_staleness?: number | null } {
  return policy.sparseMaxStaleness === undefined ? {} : { sparse_max_staleness: policy.sparseMaxStaleness };
}

function parityOf(round: number): 0 | 1 {
  return (round & 1) as 0 | 1;
}

function describeNonFinite(g: number): string {
  return Number.isNaN(g) ? 'NaN' : g > 0 ? 'Infinity' : '-Infinity';
}

/** `raw` as a shard snapshot (with a replica's logs, when it has them); a ValidationError naming the first field that is not. */
export function parseShardSnapshot(raw: unknown, what: string): z.output<typeof snapshotSchema> {
  const parsed = snapshotSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new ValidationError(`${what}: not a shard snapshot: ${issue.path.join('.') || '(root)'}: ${issue.message}`);
  }
  return parsed.data;
}

const snapshotSchema = z.object({
  ...snapshotFields,
  dense: z.array(z.object({
    id: z.number().int().nonnegative(),
    param: z.string(),
    offset: z.number().int().nonnegative(),
    length: z.number().int().positive(),
    values: zf32(),
    state: z.array(zf32()),
    step: z.number().int().nonnegative(),
  })),
  sparse: z.array(z.object({
    table: z.string(),
    dim: z.number().int().positive(),
    stateSlots: z.number().int().nonnegative(),
    ids: zu32(),
    values: zf32(),
    state: zf32(),
    steps: zu32(),
  })),
  // The replica's (replica.ts), not the state's: accepted here so a checkpoint's snapshot restores as it is.
  dedup: z.array(dedupWindowSchema).optional(),
  applied: z.array(z.tuple([z.string(), z.number().int().positive()])).optional(),
  refused: z.array(z.string()).optional(),
});

/** Gradient floats a push carries (every step of it). */
function pushFloats(m: PushRequest): number {
  let n = 0;
  for (const e of m.dense) n += e.grad.length;
  for (const e of m.sparse) n += e.grads.length;
  for (const l of m.later_steps) {
    for (const e of l.dense) n += e.grad.length;
    for (const e of l.sparse) n += e.grads.length;
  }
  return n;
}
