/**
 * One training step of a parameter-server worker: the batch's unique ids,
 * pulls from the shards that own them (and every dense block), the step
 * graph, and one push per shard — all shards in parallel. Used by the worker
 * actor's loop and by the API's wrapped optimizer (`run`), and by hps group
 * members (`compute`: pull and step, the gradients go to the group's sync
 * strategy instead of straight to the shards).
 *
 * Emulation (`emulate.speed`, `emulate.bandwidth_mbps`) is applied here: the
 * step graph is paced to the emulated step time, pulls and pushes are held on
 * the emulated link (see emulation.ts). So is gradient compression
 * (communication.compression): fp16 always, or adaptive — the stepper
 * measures its link utilisation (link-usage.ts) and asks the policy
 * (topology/compression.ts) before each push and slice, and with
 * communication.compress_pulls before each pull, whose reply then comes as
 * halves.
 */
import {
  InvalidTensorError, ValidationError, transferAttemptMs, type Clock, type Logger,
} from '../../runtime/mod.ts';
import {
  DEFAULT_COMPRESSION_THRESHOLD, DEFAULT_EMULATION_REFERENCE_STEP_MS, INITIAL_ADAPTIVE_COMPRESSION_STATE, adaptiveCompression, checkCompressionThreshold,
  compressionOffBelow, type AdaptiveCompressionState, type CompressionChoice, type GradientCompressionMode, type ShardPlan,
} from '../../topology/mod.ts';
import {
  CtrModel, buildCtrFeeds, buildMlpFeeds, bucketCtrIds, ctrBagIndex, hashedBagOfIds, headOfBatch, runTrainingStep, streamOptions,
  type Batch, type CtrBagIndex, type DataSource, type MlpModel, type StepSession,
} from '../../native-bridge/mod.ts';
import type { BatchDescriptor } from '../store/batch-queue.ts';
import { EMB_TABLE, WIDE_TABLE, type SparseLayout } from '../node/config-bridge.ts';
import { compressPush, compressTensors, type GradientTensors, type PullReply, type PullRequest, type PushReply, type PushRequest, type WireGradientTensors } from '../shard/shard.messages.ts';
import { StaleUpdateError } from '../shard/shard.errors.ts';
import { ComputePacer, EmulatedLink, pullBytes, pushBytes } from './emulation.ts';
import { LinkUsage } from './link-usage.ts';
import { allocateDense, assemblePull, planExchange, pullRequest, pushRequest, type ShardExchange } from './param-exchange.ts';
import type { ShardClient } from './shard-client.ts';
import { LocalUpdates, type LocalOptimizers } from './local-updates.ts';

/** The batch a descriptor names, regenerated from the (deterministic) data source. */
export function batchFromDescriptor(source: DataSource, desc: BatchDescriptor): Batch {
  const it = source.batchesSync(streamOptions(desc.split, desc.batch_size, { epoch: desc.epoch, skipBatches: desc.index }));
  const first = it.next();
  it.return?.();
  if (first.done) throw new ValidationError(`batch ${desc.batch_id} does not exist: the ${desc.split} split of epoch ${desc.epoch} has fewer than ${desc.index + 1} batches of ${desc.batch_size}`);
  const batch = first.value;
  if (batch.batchId !== desc.batch_id) {
    throw new ValidationError(`descriptor ${desc.batch_id} regenerates as ${batch.batchId}: this node's data settings differ from the driver's (same config file?)`);
  }
  return headOfBatch(batch, desc.samples);
}

export interface SyncRound {
  round: number;
  /** Contributions the round needs (one per worker). */
  expected: number;
}

export interface StepOutcome {
  /** null for an empty contribution. */
  loss: number | null;
  samples: number;
  /** Largest staleness the shards reported for this step's pushes. */
  staleness: number;
  /** Real compute time of the step graph. */
  computeMs: number;
  /** The step as the (emulated) device took it; = computeMs when not emulated. */
  stepMs: number;
  /** Some shard refused its push as too stale (hps policy): that part of the gradient was dropped. */
  droppedStale: boolean;
  /** Some shard applied its push without its dense blocks or its rows, past that kind's max_staleness. */
  partDropped: boolean;
}

/** A step's gradients before they go anywhere (hps group members hand them to their sync strategy). */
export interface ComputedStep {
  loss: number;
  samples: number;
  /** The batch's unique (bucketed) ids, the rows of `rowGrads`; null for mlp. */
  uniqueIds: Int32Array | null;
  /** Mean gradient over the batch of every dense parameter, by name. */
  denseGrads: ReadonlyMap<string, Float32Array>;
  /** Per sparse table, `[U, dim]` row gradients in `uniqueIds` order; null for mlp. */
  rowGrads: ReadonlyMap<string, Float32Array> | null;
  /** Version each shard answered this step's pulls with. */
  versions: ReadonlyMap<string, number>;
  computeMs: number;
  stepMs: number;
}

/** A batch with its parameters pulled (`WorkerStepper.prepare`). */
export interface PreparedStep {
  batch: Batch;
  index: CtrBagIndex | null;
  rows: Map<string, Float32Array>;
  versions: ReadonlyMap<string, number>;
}

/** Outcome of one push through the stepper: the shard's reply, or refused as too stale (the gradient is dropped). */
export type PushResult = { refused: false; reply: PushReply } | { refused: true; error: StaleUpdateError };

export interface WorkerStepperOptions {
  client: ShardClient;
  plan: ShardPlan;
  model: CtrModel | MlpModel;
  layout: SparseLayout;
  session: StepSession;
  clock: Clock;
  log: Logger;
  /** nodes.<name>.emulate.speed: a step takes referenceStepMs / speed; null = not emulated. */
  emulateSpeed: number | null;
  /** training.emulation_reference_step_ms (default DEFAULT_EMULATION_REFERENCE_STEP_MS). */
  referenceStepMs?: number;
  /** nodes.<name>.emulate.bandwidth_mbps; null or absent = not limited. */
  bandwidthMbps?: number | null;
  /**
   * The bandwidth of the worker's link to its NATS server as its profile
   * measured it (adaptive compression's link utilisation is then the bytes
   * at that rate; link-usage.ts); null or absent: not measured.
   */
  measuredBandwidthMbps?: number | null;
  /** For log lines; default "worker". */
  node?: string;
  /**
   * hps local updates (training.local_updates, local-updates.ts): the job's
   * optimizers, applied by the member to its own copy of the parameters
   * after each step of a window (`stepLocally`); null or absent: the
   * window's steps all compute from the parameters pulled at its start.
   */
  localOptimizers?: LocalOptimizers | null;
  /**
   * communication.compression: `fp16` sends every gradient (pushes and group
   * slices) as scaled halves (native-bridge/fp16.ts, compressGradient);
   * `adaptive` does so while the link's utilisation is above
   * `compressionThreshold` (topology/compression.ts); null or absent: float32.
   */
  compression?: GradientCompressionMode;
  /** communication.compression_threshold, for `adaptive` (default 0.5). */
  compressionThreshold?: number;
  /**
   * communication.compress_pulls: pulls ask for scaled halves while the
   * gradients go as fp16 (`compression`); default false.
   */
  compressPulls?: boolean;
}

export class WorkerStepper {
  private readonly dense: Map<string, Float32Array>;
  private steps = 0;
  /** `dense` holds pulled values (compute may reuse them within a window). */
  private densePulled = false;
  readonly pacer: ComputePacer;
  readonly link: EmulatedLink;
  /** When (clock.monotonic) the first step graph began; null before it. */
  firstStepAt: number | null = null;
  /** Local updates inside a window (local-updates.ts); null: none. */
  private readonly local: LocalUpdates | null;
  /** How busy the link has been lately (adaptive compression decides on it). */
  readonly linkUsage: LinkUsage;
  readonly compressionThreshold: number;
  private compression: AdaptiveCompressionState;
  /** Bytes of the group messages under way on the link (sendOverLink), for their attempts' length. */
  private bytesInFlight = 0;

  constructor(private readonly o: WorkerStepperOptions) {
    this.dense = allocateDense(o.plan);
    this.pacer = new ComputePacer({
      clock: o.clock, log: o.log, node: o.node ?? 'worker', speed: o.emulateSpeed, referenceStepMs: o.referenceStepMs ?? DEFAULT_EMULATION_REFERENCE_STEP_MS,
    });
    this.link = new EmulatedLink(o.clock, o.bandwidthMbps ?? null);
    this.linkUsage = new LinkUsage(o.clock, this.link, { network: o.client.system.transport.kind === 'nats', measuredMbps: o.measuredBandwidthMbps ?? null });
    this.local = o.localOptimizers ? new LocalUpdates(o.localOptimizers) : null;
    this.compressionThreshold = o.compressionThreshold ?? DEFAULT_COMPRESSION_THRESHOLD;
    if (o.compression === 'adaptive') checkCompressionThreshold(this.compressionThreshold);
    this.compression = o.compression === 'fp16' ? { choice: 'fp16', sinceMs: null } : INITIAL_ADAPTIVE_COMPRESSION_STATE;
  }

  /** How this worker's gradients leave it now: fp16 (always with `fp16`, while the link is busy with `adaptive`) or float32. */
  get compressionChoice(): CompressionChoice { return this.compression.choice; }

  /** The link's utilisation over the recent window (link-usage.ts); null until it has been in use for a second. */
  get linkUtilisation(): number | null { return this.linkUsage.utilisation(); }

  /**
   * Whether the gradients about to be sent go as fp16. With `adaptive`, asks
   * the policy on the link's current utilisation and says so when the
   * choice changes.
   */
  private compressNow(): boolean {
    if (this.o.compression !== 'adaptive') return this.o.compression === 'fp16';
    const now = this.o.clock.monotonic();
    const utilisation = this.linkUsage.utilisation(now);
    const threshold = this.compressionThreshold;
    const next = adaptiveCompression({ utilisation, threshold, nowMs: now }, this.compression);
    if (next.choice !== this.compression.choice) {
      const node = this.o.node ?? 'worker';
      const u = utilisation!.toFixed(2);
      const fields = { link_utilisation: utilisation, compression_threshold: threshold, measured_by: this.linkUsage.measure, compression: next.choice };
      this.o.log.info(fields, next.choice === 'fp16'
        ? `node ${node}: link utilisation ${u} > compression_threshold ${threshold}: gradients now sent as fp16`
        : `node ${node}: link utilisation ${u} < ${compressionOffBelow(threshold).toFixed(2)} (0.8 × compression_threshold ${threshold}): gradients now sent as float32`);
    }
    this.compression = next;
    return next.choice === 'fp16';
  }

  /** The worker's copy of the dense parameters: the last pull, plus local updates since (read-only). */
  get denseParams(): ReadonlyMap<string, Float32Array> { return this.dense; }

  /** Whether `stepLocally` updates anything (the stepper was given a local optimizer). */
  get localUpdates(): boolean { return this.local !== null; }

  /**
   * Local SGD inside a window (local-updates.ts): applies step `c` of batch
   * `p` to this member's own copy — the dense parameters the next step
   * computes from, and the window's deltas of the batch's rows, added to
   * every later pull of them in the window. The shards are not touched (the
   * gradients still go to the group's exchange); the next window's first
   * pull starts afresh. `lrScale`: the group's learning-rate multiplier, as
   * the shards apply the group's update with it. A gradient with NaN or Inf
   * is not applied (the shards refuse it and say so).
   */
  stepLocally(p: PreparedStep, c: ComputedStep, lrScale = 1): void {
    if (this.local === null || !this.densePulled) return;
    this.local.step(this.dense, c.denseGrads, p.index?.uniqueIds ?? null, p.rows, c.rowGrads, lrScale);
  }

  /** Rows the member keeps local optimizer state for, per table (local updates; {} without). */
  get localRowsKept(): Record<string, number> { return this.local?.rowsKept ?? {}; }

  get plan(): ShardPlan { return this.o.plan; }
  get client(): ShardClient { return this.o.client; }

  /**
   * One step on `batch` (null: an empty contribution to a bsp round). With
   * `sync`, pulls wait until the round's predecessor is applied and pushes
   * are contributions to the round; without, both are immediate (asp).
   */
  async run(batch: Batch | null, sync: SyncRound | null): Promise<StepOutcome> {
    const { plan, layout } = this.o;
    const tables = layout.tables;
    const index = this.indexOf(batch);
    const exchanges = planExchange(plan, index?.uniqueIds ?? null, { dense: batch !== null, allShards: sync !== null });
    const minRound = sync?.round ?? null;
    const replies = await Promise.all(exchanges.map((ex) => this.pull(ex.shard, pullRequest(plan, ex, tables, minRound), sync?.expected ?? null)));
    const versions = new Map(exchanges.map((ex, s) => [ex.shard, replies[s]!.version]));

    if (batch === null) {
      const pushes = await Promise.all(exchanges.map((ex) => this.push(ex.shard, pushRequest(plan, ex, tables, null, null, {
        round: sync?.round ?? null, expected: sync?.expected ?? null, weight: 0, baseVersion: versions.get(ex.shard)!,
      }))));
      return { loss: null, samples: 0, staleness: maxPushStaleness(pushes), computeMs: 0, stepMs: 0, droppedStale: pushes.some((p) => p.refused), partDropped: anyPartDropped(pushes) };
    }

    const U = index?.uniqueIds.length ?? 0;
    const rows = assemblePull(exchanges, replies, tables, this.dense, U);
    this.densePulled = true;
    const { result, timing } = await this.graph(batch, index, rows, U);
    const rowGrads = result.rowGrads === null ? null : new Map([[EMB_TABLE, result.rowGrads.emb], [WIDE_TABLE, result.rowGrads.wide]]);
    const pushes = await Promise.all(exchanges.map((ex) => this.push(ex.shard, pushRequest(plan, ex, tables, result.denseGrads, rowGrads, {
      round: sync?.round ?? null, expected: sync?.expected ?? null, weight: batch.size, baseVersion: versions.get(ex.shard)!, batches: [batch.batchId],
    }))));
    return {
      loss: result.loss, samples: batch.size, staleness: maxPushStaleness(pushes), computeMs: timing.computeMs, stepMs: timing.stepMs,
      droppedStale: pushes.some((p) => p.refused), partDropped: anyPartDropped(pushes),
    };
  }

  /**
   * Pulls what `batch` needs and runs the step graph; pushes nothing.
   * `reuseDense`: keep the dense parameters of the previous pull (a window of
   * accumulated steps computes every step from the same parameters); the
   * batch's rows are always pulled (each batch needs other ids).
   */
  async compute(batch: Batch, opts: { reuseDense: boolean }): Promise<ComputedStep> {
    return this.computePrepared(await this.prepare(batch, opts));
  }

  /**
   * The pulls of `compute`: the batch's rows, and the dense parameters
   * unless `reuseDense` (then they must be pulled by an earlier prepare of
   * the window). Lets a member fetch the next batch's rows while the
   * current step runs; `computePrepared` runs the graph on them.
   */
  async prepare(batch: Batch, opts: { reuseDense: boolean }): Promise<PreparedStep> {
    const { plan, layout } = this.o;
    const tables = layout.tables;
    const index = this.indexOf(batch);
    const pullDense = !(opts.reuseDense && this.densePulled);
    const exchanges = planExchange(plan, index?.uniqueIds ?? null, { dense: pullDense, allShards: false });
    const replies = await Promise.all(exchanges.map((ex) => this.pull(ex.shard, pullRequest(plan, ex, tables, null))));
    const versions = new Map(exchanges.map((ex, s) => [ex.shard, replies[s]!.version]));
    const U = index?.uniqueIds.length ?? 0;
    // A new window: the rows' local deltas of the last one are on the shards now (its group's update).
    if (pullDense) this.local?.newWindow();
    // Dense values go straight into the stepper's buffer; a prepare that reuses them never overwrites them.
    const rows = assemblePull(exchanges, replies, tables, this.dense, U);
    if (pullDense) this.densePulled = true;
    return { batch, index, rows, versions };
  }

  /** Runs the step graph on a prepared batch (see `prepare`). */
  async computePrepared(p: PreparedStep): Promise<ComputedStep> {
    const { batch, index, rows, versions } = p;
    const U = index?.uniqueIds.length ?? 0;
    // Local updates: the rows as this member's window has changed them so far.
    if (index !== null) this.local?.overlayRows(index.uniqueIds, rows);
    const { result, timing } = await this.graph(batch, index, rows, U);
    return {
      loss: result.loss, samples: batch.size, uniqueIds: index?.uniqueIds ?? null, denseGrads: result.denseGrads,
      rowGrads: result.rowGrads === null ? null : new Map([[EMB_TABLE, result.rowGrads.emb], [WIDE_TABLE, result.rowGrads.wide]]),
      versions, computeMs: timing.computeMs, stepMs: timing.stepMs,
    };
  }

  /** Gradient tensors as this worker sends them (group slices): compressed while the compression choice is fp16. */
  wireTensors(t: GradientTensors): WireGradientTensors {
    return this.compressNow() ? compressTensors(t) : t;
  }

  /**
   * Sends `bytes` of gradients to a group peer: held on the emulated link
   * and counted in the link's utilisation, then `send` (whose time in
   * flight is the utilisation where waits are the measure; link-usage.ts).
   */
  async sendOverLink<T>(bytes: number, send: () => Promise<T>): Promise<T> {
    this.bytesInFlight += bytes;
    try {
      await this.overLink(bytes);
      return await this.linkUsage.waitOn(send);
    } finally {
      this.bytesInFlight -= bytes;
    }
  }

  /**
   * The worker's link rate: emulate.bandwidth_mbps, else the bandwidth its
   * profile measured over NATS; null where neither is known.
   */
  get linkMbps(): number | null {
    return this.o.bandwidthMbps ?? this.o.measuredBandwidthMbps ?? null;
  }

  /**
   * One attempt of a message to a group peer: `baseMs`, or twice the time
   * the bytes in flight on this worker's link (`sendOverLink`) take at its
   * rate where that is longer (runtime transferAttemptMs).
   */
  peerAttemptMs(baseMs: number): number {
    return transferAttemptMs(baseMs, this.bytesInFlight, this.linkMbps);
  }

  /** `bytes` cross the worker's link: held on the emulated link, and counted in its utilisation (link-usage.ts). */
  private async overLink(bytes: number): Promise<void> {
    this.linkUsage.carried(bytes);
    await this.link.transfer(bytes);
  }

  /**
   * A pull through the emulated link. A pull that waits for a bsp round
   * (`min_round`) is not counted as link time: its wait is the round's barrier.
   */
  async pull(shard: string, req: PullRequest, expected: number | null = null): Promise<PullReply> {
    req.compression = this.o.compressPulls === true && this.compressNow() ? 'fp16' : null;
    const request = () => this.o.client.pull(shard, req, expected);
    const reply = req.min_round === null ? await this.linkUsage.waitOn(request) : await request();
    await this.overLink(pullBytes(req, reply));
    return reply;
  }

  /** A push through the emulated link; a push the shard refuses as too stale (hps) is reported, not thrown. */
  async push(shard: string, req: PushRequest): Promise<PushResult> {
    const wire = this.compressNow() ? compressPush(req) : req;
    await this.overLink(pushBytes(wire));
    try {
      return { refused: false, reply: await this.linkUsage.waitOn(() => this.o.client.push(shard, wire)) };
    } catch (e) {
      if (e instanceof StaleUpdateError) {
        this.o.log.debug({ shard, staleness: e.data?.staleness ?? null }, 'push refused as too stale: its gradient is dropped');
        return { refused: true, error: e };
      }
      throw e;
    }
  }

  private indexOf(batch: Batch | null): CtrBagIndex | null {
    if (batch === null || !(this.o.model instanceof CtrModel)) return null;
    if (batch.kind !== 'ctr') throw new InvalidTensorError(`the ctr model cannot train on ${batch.kind} batch ${batch.batchId}`);
    const layout = this.o.layout;
    const ids = layout.hashBuckets === null ? batch.ids : bucketCtrIds(batch.offsets, batch.ids, batch.slots, layout.hashBuckets);
    return ctrBagIndex(batch.offsets, ids);
  }

  /** The step graph on the pulled parameters, paced to the emulated step time. */
  private async graph(batch: Batch, index: CtrBagIndex | null, rows: Map<string, Float32Array>, U: number) {
    const { model } = this.o;
    const step = ++this.steps;
    const t0 = this.o.clock.monotonic();
    this.firstStepAt ??= t0;
    const result = await this.onSession(() => {
      if (model instanceof CtrModel) {
        const b = batch as Extract<Batch, { kind: 'ctr' }>;
        const gathered = { index: index!, embRows: rows.get(EMB_TABLE)!, wideRows: rows.get(WIDE_TABLE) ?? new Float32Array(U) };
        return runTrainingStep(this.o.session, model, buildCtrFeeds(model, b, gathered, this.dense, 'step'), step);
      }
      const mlpBatch = batch.kind === 'mlp' ? batch : hashedBagOfIds(batch, model.inputWidth);
      return runTrainingStep(this.o.session, model, buildMlpFeeds(model, mlpBatch, this.dense, 'step'), step);
    });
    const timing = await this.pacer.finish(t0);
    return { result, timing };
  }

  /** The session runs one step at a time: a step left running (a window dropped for a pause) ends before the next starts. */
  private sessionFree: Promise<void> = Promise.resolve();
  private async onSession<T>(run: () => Promise<T>): Promise<T> {
    const before = this.sessionFree;
    let release!: () => void;
    this.sessionFree = new Promise<void>((r) => { release = r; });
    await before;
    try {
      return await run();
    } finally {
      release();
    }
  }

  /** Resolves once no step runs on the session (before it is disposed). */
  idle(): Promise<void> { return this.sessionFree; }
}

/** Some push was applied without its dense blocks or its rows (training.max_staleness { dense, sparse }). */
export function anyPartDropped(pushes: readonly PushResult[]): boolean {
  return pushes.some((p) => !p.refused && p.reply.dropped !== undefined);
}

/** The largest staleness among a step's pushes (a refused push reports it in its error). */
export function maxPushStaleness(pushes: readonly PushResult[]): number {
  let s = 0;
  for (const p of pushes) {
    const v = p.refused ? Number(p.error.data?.staleness ?? 0) : p.reply.staleness;
    if (v > s) s = v;
  }
  return s;
}

export type { ShardExchange };
