/**
 * One model trained in one process, no NATS: the reference the parameter
 * server is compared against. A distributed step is the same four pieces
 * spread over actors, so each piece is a plain exported function:
 *
 * (a) `buildCtrFeeds` / `buildMlpFeeds`: a batch + dense params + gathered rows → step feeds;
 * (b) `runTrainingStep`: one step graph run → loss, dense grads, row grads (NaN loss rejected);
 * (c) `applyDenseGradients` / `applyRowGradients`: optimizer updates (dense per param
 *     with its own state; embedding and wide rows lazily through `SparseTable`);
 * (d) `LocalTrainer.evaluate`: a test stream through the eval graph → AUC + log loss
 *     (ctr) or accuracy + cross-entropy (mlp).
 *
 * `LocalTrainer` wires them together with one step session and one eval
 * session, created once and reused for every batch.
 */
import { InvalidTensorError } from '../runtime/errors.ts';
import { streamOptions, type Batch, type CtrBatch, type DataSource, type MlpBatch } from './data/batch.ts';
import { auc, binaryLogLoss, DEFAULT_LOG_LOSS_EPSILON, multiclassAccuracy } from './metrics.ts';
import { ctrBagIndex, type CtrBagIndex, CtrModel } from './models/ctr.ts';
import { MlpModel } from './models/mlp.ts';
import { initDenseParams, type Model } from './models/model.ts';
import { f32, i32, type ExecutionProvider, type GraphKind, type StepFeeds } from './native.ts';
import type { Optimizer } from './optimizers.ts';
import { StepSession } from './session.ts';
import { SparseTable } from './sparse-table.ts';

// ---------------------------------------------------------------- dense parameters

/** A model's dense parameters with their optimizer state. */
export interface DenseParameters {
  /** By parameter name, in the model's `denseParams` order. */
  readonly values: ReadonlyMap<string, Float32Array>;
  /** `optimizer.stateSlots()` arrays per parameter, each as long as it. */
  readonly state: ReadonlyMap<string, readonly Float32Array[]>;
  /** Updates applied so far; the next update is step `steps + 1` (1-based). */
  steps: number;
}

/** He-initialised dense parameters (`initDenseParams`) and fresh optimizer state. */
export function createDenseParameters(model: Model, optimizer: Optimizer, seed: number): DenseParameters {
  const values = initDenseParams(model, seed);
  const state = new Map<string, Float32Array[]>();
  for (const [name, v] of values) state.set(name, optimizer.allocateState(v.length));
  return { values, state, steps: 0 };
}

// ---------------------------------------------------------------- (a) feeds

/**
 * Maps each id occurrence to its bucket: slot s's ids go to
 * `base_s + (id mod buckets_s)`, where base_s is the sum of the earlier slots'
 * bucket counts — one table of `buckets_s` rows per slot, laid end to end in
 * one id space. A single number means that many rows for every slot.
 * `offsets` is the batch's CSR (bags ordered by sample then slot).
 */
export function bucketCtrIds(offsets: Int32Array, ids: Int32Array, slots: number, buckets: number | readonly number[]): Int32Array {
  const perSlot = typeof buckets === 'number' ? Array.from({ length: slots }, () => buckets) : [...buckets];
  if (perSlot.length !== slots) throw new InvalidTensorError(`hash buckets list ${perSlot.length} slots, batch has ${slots}`, { data: { input: 'ids' } });
  const base = new Array<number>(slots);
  let total = 0;
  for (let s = 0; s < slots; s++) {
    const b = perSlot[s]!;
    if (!Number.isInteger(b) || b < 1) throw new InvalidTensorError(`hash buckets of slot ${s} must be a positive integer, got ${b}`, { data: { input: 'ids' } });
    base[s] = total;
    total += b;
  }
  if (total > 0x7fffffff) throw new InvalidTensorError(`hash buckets add up to ${total} rows, more than int32 ids can address`, { data: { input: 'ids' } });
  const out = new Int32Array(ids.length);
  const bags = offsets.length - 1;
  for (let bag = 0; bag < bags; bag++) {
    const s = bag % slots;
    const b = perSlot[s]!;
    const start = base[s]!;
    for (let k = offsets[bag]!; k < offsets[bag + 1]!; k++) out[k] = start + ((ids[k]! >>> 0) % b);
  }
  return out;
}

/** Rows gathered for one ctr batch: `index` from `ctrBagIndex`, rows in `index.uniqueIds` order. */
export interface CtrGatheredRows {
  readonly index: CtrBagIndex;
  /** `[U, D]` */
  readonly embRows: Float32Array;
  /** `[U]` (the graph's `[U, 1]`) */
  readonly wideRows: Float32Array;
}

function denseFeeds(model: Model, dense: ReadonlyMap<string, Float32Array>): Record<string, ReturnType<typeof f32>> {
  const out: Record<string, ReturnType<typeof f32>> = {};
  for (const p of model.denseParams) {
    const v = dense.get(p.name);
    if (v === undefined) throw new InvalidTensorError(`dense parameter ${p.name} is missing`, { data: { input: p.name } });
    out[p.name] = f32(v, p.dims);
  }
  return out;
}

/**
 * Feeds of the ctr `step` graph (with labels) or `eval` graph (without):
 * emb_rows [U,D], wide_rows [U,1], bag_rows [N], bag_counts [B,S],
 * dense_features [B,F] when the model has F > 0, labels [B] for `step`, and
 * every dense parameter.
 */
export function buildCtrFeeds(model: CtrModel, batch: CtrBatch, rows: CtrGatheredRows, dense: ReadonlyMap<string, Float32Array>, kind: GraphKind): StepFeeds {
  const { slots: S, embeddingDim: D, denseFeatures: F } = model.config;
  const B = batch.size;
  const U = rows.index.uniqueIds.length;
  if (batch.slots !== S) throw new InvalidTensorError(`batch ${batch.batchId} has ${batch.slots} slots, the model ${S}`, { data: { input: 'bag_counts', expected: S, actual: batch.slots } });
  if (batch.denseDim !== F) throw new InvalidTensorError(`batch ${batch.batchId} has ${batch.denseDim} dense features, the model ${F}`, { data: { input: 'dense_features', expected: F, actual: batch.denseDim } });
  const feeds: Record<string, ReturnType<typeof f32> | ReturnType<typeof i32>> = {
    ...denseFeeds(model, dense),
    emb_rows: f32(rows.embRows, [U, D]),
    wide_rows: f32(rows.wideRows, [U, 1]),
    bag_rows: i32(rows.index.bagRows, [rows.index.bagRows.length]),
    bag_counts: i32(rows.index.bagCounts, [B, S]),
  };
  if (F > 0) {
    if (batch.dense === null) throw new InvalidTensorError(`batch ${batch.batchId} has no dense features`, { data: { input: 'dense_features' } });
    feeds['dense_features'] = f32(batch.dense, [B, F]);
  }
  if (kind === 'step') feeds['labels'] = f32(batch.labels, [B]);
  return feeds;
}

/** Feeds of the mlp `step` graph (x, labels, params) or `eval` graph (x, params). */
export function buildMlpFeeds(model: MlpModel, batch: MlpBatch, dense: ReadonlyMap<string, Float32Array>, kind: GraphKind): StepFeeds {
  if (batch.featureDim !== model.inputWidth) {
    throw new InvalidTensorError(`batch ${batch.batchId} has ${batch.featureDim} features, the model takes ${model.inputWidth}`, { data: { input: 'x', expected: model.inputWidth, actual: batch.featureDim } });
  }
  const feeds: Record<string, ReturnType<typeof f32> | ReturnType<typeof i32>> = {
    ...denseFeeds(model, dense),
    x: f32(batch.features, [batch.size, batch.featureDim]),
  };
  if (kind === 'step') feeds['labels'] = i32(batch.labels, [batch.size]);
  return feeds;
}

/**
 * A ctr batch (e.g. Spam Assassin) as mlp input: a hashed bag of ids —
 * log(1 + count of ids with id mod inputDim = j) — and its 0/1 labels as classes.
 */
export function hashedBagOfIds(batch: CtrBatch, inputDim: number): MlpBatch {
  const B = batch.size;
  const features = new Float32Array(B * inputDim);
  const S = batch.slots;
  for (let b = 0; b < B; b++) {
    for (let k = batch.offsets[b * S]!; k < batch.offsets[(b + 1) * S]!; k++) {
      const j = b * inputDim + ((batch.ids[k]! >>> 0) % inputDim);
      features[j] = features[j]! + 1;
    }
  }
  for (let i = 0; i < features.length; i++) if (features[i] !== 0) features[i] = Math.log1p(features[i]!);
  const labels = Int32Array.from(batch.labels, (y) => (y >= 0.5 ? 1 : 0));
  return { kind: 'mlp', batchId: batch.batchId, size: B, features, featureDim: inputDim, labels };
}

/** The first `n` samples of a batch (views, no copies). */
export function headOfBatch<T extends Batch>(batch: T, n: number): T {
  if (n >= batch.size) return batch;
  if (batch.kind === 'mlp') {
    return { ...batch, size: n, features: batch.features.subarray(0, n * batch.featureDim), labels: batch.labels.subarray(0, n) };
  }
  const S = batch.slots;
  return {
    ...batch,
    size: n,
    offsets: batch.offsets.subarray(0, n * S + 1),
    ids: batch.ids.subarray(0, batch.offsets[n * S]!),
    dense: batch.dense === null ? null : batch.dense.subarray(0, n * batch.denseDim),
    labels: batch.labels.subarray(0, n),
  };
}

// ---------------------------------------------------------------- (b) step

export interface StepResult {
  /** Mean loss over the batch, before this step's update. */
  readonly loss: number;
  /** ctr: `[B]` probabilities; mlp: `[B, C]` class probabilities. */
  readonly predictions: Float32Array;
  /** Gradient of every dense parameter, by parameter name. */
  readonly denseGrads: ReadonlyMap<string, Float32Array>;
  /** ctr: `emb_rows_grad [U, D]` and `wide_rows_grad [U]`; null for mlp. */
  readonly rowGrads: { readonly emb: Float32Array; readonly wide: Float32Array } | null;
}

/** Throws InvalidTensorError when a step's loss is NaN or infinite: the run has diverged. */
export function assertFiniteLoss(loss: number, step: number): void {
  if (!Number.isFinite(loss)) {
    throw new InvalidTensorError(`training diverged: loss is ${loss} at step ${step}; lower the learning rate (optimizer.learning_rate)`, { data: { tensor: 'loss', step, value: String(loss) } });
  }
}

function assertFiniteGradient(name: string, grad: Float32Array, step: number): void {
  for (let i = 0; i < grad.length; i++) {
    const x = grad[i]!;
    // x - x is NaN for NaN and ±Infinity alike
    if (x - x !== 0) {
      throw new InvalidTensorError(`training diverged: gradient ${name} has ${x} at index ${i} at step ${step}; lower the learning rate (optimizer.learning_rate)`, { data: { tensor: name, index: i, step, value: String(x) } });
    }
  }
}

/**
 * Runs one step graph; `step` (1-based) only names the step in errors. A NaN
 * or infinite loss or gradient throws InvalidTensorError before anything is
 * applied, so a diverged step leaves the model as it was.
 */
export async function runTrainingStep(session: StepSession, model: Model, feeds: StepFeeds, step: number): Promise<StepResult> {
  const out = await session.run(feeds);
  const loss = out.scalar('loss');
  assertFiniteLoss(loss, step);
  const denseGrads = new Map<string, Float32Array>();
  for (const p of model.denseParams) {
    const g = out.f32(p.gradName);
    assertFiniteGradient(p.gradName, g, step);
    denseGrads.set(p.name, g);
  }
  let rowGrads: StepResult['rowGrads'] = null;
  if (out.has('emb_rows_grad')) {
    rowGrads = { emb: out.f32('emb_rows_grad'), wide: out.f32('wide_rows_grad') };
    assertFiniteGradient('emb_rows_grad', rowGrads.emb, step);
    assertFiniteGradient('wide_rows_grad', rowGrads.wide, step);
  }
  return { loss, predictions: out.f32('predictions'), denseGrads, rowGrads };
}

// ---------------------------------------------------------------- (c) updates

/**
 * One optimizer update of every dense parameter (step `dense.steps + 1`).
 * All gradients are checked before any parameter changes, so a NaN leaves the
 * model as it was.
 */
export function applyDenseGradients(dense: DenseParameters, grads: ReadonlyMap<string, Float32Array>, optimizer: Optimizer, lrScale = 1): void {
  for (const [name, v] of dense.values) {
    const g = grads.get(name);
    if (g === undefined) throw new InvalidTensorError(`no gradient for dense parameter ${name}`, { data: { tensor: name } });
    if (g.length !== v.length) throw new InvalidTensorError(`gradient '${name}' has ${g.length} elements, parameter has ${v.length}`, { data: { tensor: name } });
    for (let i = 0; i < g.length; i++) {
      const x = g[i]!;
      if (x - x !== 0) throw new InvalidTensorError(`gradient '${name}' has ${x} at index ${i}; lower the learning rate (optimizer.learning_rate); nothing was updated`, { data: { tensor: name, index: i } });
    }
  }
  const step = dense.steps + 1;
  for (const [name, v] of dense.values) optimizer.updateDense(v, grads.get(name)!, dense.state.get(name)!, step, lrScale, name);
  dense.steps = step;
}

/** The sparse tables of a ctr model: embedding rows `[D]` and wide weights `[1]`, keyed by (bucketed) id. */
export interface CtrTables {
  readonly embedding: SparseTable;
  /** null when the model's wide part is off (wide rows are fed as zeros and never learn). */
  readonly wide: SparseTable | null;
}

/** Gathers a batch's rows; `training` creates missing rows, otherwise initial values are read without storing them. */
export function gatherCtrRows(tables: CtrTables, index: CtrBagIndex, training: boolean): CtrGatheredRows {
  const ids = index.uniqueIds;
  const embRows = training ? tables.embedding.pull(ids) : tables.embedding.lookup(ids);
  const wideRows = tables.wide === null ? new Float32Array(ids.length) : training ? tables.wide.pull(ids) : tables.wide.lookup(ids);
  return { index, embRows, wideRows };
}

/** Applies a step's row gradients to the tables, lazily (only the batch's rows change). */
export function applyRowGradients(tables: CtrTables, uniqueIds: Int32Array, rowGrads: NonNullable<StepResult['rowGrads']>, optimizer: Optimizer, scheduleStep: number, lrScale = 1): void {
  tables.embedding.applyGradients(uniqueIds, rowGrads.emb, optimizer, scheduleStep, lrScale);
  tables.wide?.applyGradients(uniqueIds, rowGrads.wide, optimizer, scheduleStep, lrScale);
}

// ---------------------------------------------------------------- (d) evaluation

export type Evaluation =
  | { readonly kind: 'ctr'; readonly auc: number; readonly logloss: number; readonly samples: number }
  /** `logloss` is the mean softmax cross-entropy. */
  | { readonly kind: 'mlp'; readonly accuracy: number; readonly logloss: number; readonly samples: number };

/** Mean −log p[label] over `[B, C]` class probabilities, p clipped below at ε. */
/** Accuracy and cross-entropy over many batches, weighted by batch size (the mlp evaluation). */
/** Click labels and predicted probabilities over a test split, batch by batch: AUC and log loss at the end. */
export class BinaryTally {
  private readonly labels: number[] = [];
  private readonly scores: number[] = [];
  get samples(): number { return this.labels.length; }
  add(labels: ArrayLike<number>, scores: ArrayLike<number>, size: number): void {
    for (let i = 0; i < size; i++) { this.labels.push(labels[i]!); this.scores.push(scores[i]!); }
  }
  result(): { kind: 'ctr'; auc: number; logloss: number; samples: number } {
    return { kind: 'ctr', auc: auc(this.labels, this.scores), logloss: binaryLogLoss(this.labels, this.scores), samples: this.labels.length };
  }
}

export class MulticlassTally {
  private correct = 0;
  private ceSum = 0;
  private n = 0;
  constructor(private readonly numClasses: number) {}
  add(labels: ArrayLike<number>, probabilities: ArrayLike<number>, size: number): void {
    this.correct += multiclassAccuracy(labels, probabilities, this.numClasses) * size;
    this.ceSum += crossEntropyFromProbabilities(probabilities, labels, this.numClasses) * size;
    this.n += size;
  }
  result(): { kind: 'mlp'; accuracy: number; logloss: number; samples: number } {
    return { kind: 'mlp', accuracy: this.correct / this.n, logloss: this.ceSum / this.n, samples: this.n };
  }
}

export function crossEntropyFromProbabilities(probabilities: ArrayLike<number>, labels: ArrayLike<number>, numClasses: number, epsilon = DEFAULT_LOG_LOSS_EPSILON): number {
  let sum = 0;
  for (let r = 0; r < labels.length; r++) sum -= Math.log(Math.max(epsilon, probabilities[r * numClasses + labels[r]!]!));
  return sum / labels.length;
}

// ---------------------------------------------------------------- the trainer

export interface LocalTrainerOptions {
  model: CtrModel | MlpModel;
  denseOptimizer: Optimizer;
  /** Embedding and wide rows (ctr only); null = the dense optimizer. */
  sparseOptimizer: Optimizer | null;
  /** Seeds the dense init and the rows' deterministic init. */
  seed: number;
  provider: ExecutionProvider;
  /** Threads per ONNX Runtime operator; null = every CPU. */
  intraOpNumThreads: number | null;
  /** ctr: embedding rows start uniform in [−s, s]; wide rows start at 0. */
  embeddingInitScale: number;
  /** ctr: learn the wide (per-id linear) part; false feeds zeros and never updates it. */
  wide: boolean;
  /** ctr: rows per slot table (`bucketCtrIds`); null uses the data's ids as they are. */
  hashBuckets: number | readonly number[] | null;
}

export interface EpochOptions {
  epoch: number;
  batchSize: number;
  /** Train on at most this many samples of the epoch; null = all. */
  maxSamples: number | null;
  /** Called after every batch. */
  onBatch: ((progress: EpochProgress) => void) | null;
}

export interface EpochProgress {
  epoch: number;
  batches: number;
  totalBatches: number;
  samples: number;
  totalSamples: number;
  /** Sample-weighted mean training loss of the epoch so far. */
  meanLoss: number;
}

export interface EpochSummary {
  epoch: number;
  batches: number;
  samples: number;
  /** Sample-weighted mean of the batch losses (each before its own update). */
  trainLoss: number;
}

export class LocalTrainer {
  private constructor(
    readonly options: LocalTrainerOptions,
    readonly dense: DenseParameters,
    /** null for mlp. */
    readonly tables: CtrTables | null,
    private readonly stepSession: StepSession,
    private readonly evalSession: StepSession,
  ) {}

  static async create(options: LocalTrainerOptions): Promise<LocalTrainer> {
    const { model, denseOptimizer, seed } = options;
    const dense = createDenseParameters(model, denseOptimizer, seed);
    let tables: CtrTables | null = null;
    if (model instanceof CtrModel) {
      const sparse = options.sparseOptimizer ?? denseOptimizer;
      const initialState = sparse.allocateState(1).map((a) => a[0]!);
      const table = (name: string, dim: number, initScale: number) => new SparseTable({
        table: name, dim, stateSlots: sparse.stateSlots(), seed, initScale, initialCapacity: 1 << 14, initialState,
      });
      tables = { embedding: table('emb', model.config.embeddingDim, options.embeddingInitScale), wide: options.wide ? table('wide', 1, 0) : null };
    }
    const session = { provider: options.provider, intraOpNumThreads: options.intraOpNumThreads };
    const stepSession = await StepSession.create(model, { ...session, graph: 'step' });
    const evalSession = await StepSession.create(model, { ...session, graph: 'eval' }).catch(async (e: unknown) => {
      await stepSession.dispose();
      throw e;
    });
    return new LocalTrainer(options, dense, tables, stepSession, evalSession);
  }

  get model(): CtrModel | MlpModel { return this.options.model; }
  /** Updates applied so far. */
  get step(): number { return this.dense.steps; }

  /** One training step on `batch`; returns its loss (before the update). */
  async trainBatch(batch: Batch): Promise<number> {
    const step = this.dense.steps + 1;
    const model = this.model;
    if (model instanceof CtrModel) {
      if (batch.kind !== 'ctr') throw new InvalidTensorError(`the ctr model cannot train on ${batch.kind} batch ${batch.batchId}`);
      const tables = this.tables!;
      const index = this.ctrIndex(batch);
      const rows = gatherCtrRows(tables, index, true);
      const result = await runTrainingStep(this.stepSession, model, buildCtrFeeds(model, batch, rows, this.dense.values, 'step'), step);
      applyDenseGradients(this.dense, result.denseGrads, this.options.denseOptimizer);
      applyRowGradients(tables, index.uniqueIds, result.rowGrads!, this.options.sparseOptimizer ?? this.options.denseOptimizer, step);
      return result.loss;
    }
    const mlpBatch = this.asMlpBatch(batch);
    const result = await runTrainingStep(this.stepSession, model, buildMlpFeeds(model, mlpBatch, this.dense.values, 'step'), step);
    applyDenseGradients(this.dense, result.denseGrads, this.options.denseOptimizer);
    return result.loss;
  }

  /** Forward pass only: ctr `[B]` probabilities, mlp `[B, C]`. Creates no rows. */
  async predict(batch: Batch): Promise<Float32Array> {
    const model = this.model;
    if (model instanceof CtrModel) {
      if (batch.kind !== 'ctr') throw new InvalidTensorError(`the ctr model cannot read ${batch.kind} batch ${batch.batchId}`);
      const rows = gatherCtrRows(this.tables!, this.ctrIndex(batch), false);
      return (await this.evalSession.run(buildCtrFeeds(model, batch, rows, this.dense.values, 'eval'))).f32('predictions');
    }
    return (await this.evalSession.run(buildMlpFeeds(model, this.asMlpBatch(batch), this.dense.values, 'eval'))).f32('predictions');
  }

  /** One pass over the train split. */
  async trainEpoch(source: DataSource, options: EpochOptions): Promise<EpochSummary> {
    const stream = streamOptions('train', options.batchSize, { epoch: options.epoch });
    const available = source.describe().trainSize;
    const totalSamples = options.maxSamples === null ? available : Math.min(available, options.maxSamples);
    const totalBatches = Math.min(source.countBatches(stream), Math.ceil(totalSamples / options.batchSize));
    let batches = 0; let samples = 0; let lossSum = 0;
    for (const full of source.batchesSync(stream)) {
      if (samples >= totalSamples) break;
      const batch = headOfBatch(full, totalSamples - samples);
      const loss = await this.trainBatch(batch);
      batches++;
      samples += batch.size;
      lossSum += loss * batch.size;
      options.onBatch?.({ epoch: options.epoch, batches, totalBatches, samples, totalSamples, meanLoss: lossSum / samples });
    }
    return { epoch: options.epoch, batches, samples, trainLoss: samples === 0 ? NaN : lossSum / samples };
  }

  /** The test split through the eval graph: AUC and log loss (ctr), accuracy and cross-entropy (mlp). */
  async evaluate(source: DataSource, batchSize: number): Promise<Evaluation> {
    const stream = streamOptions('test', batchSize, { shuffle: false });
    const model = this.model;
    if (model instanceof CtrModel) {
      const tally = new BinaryTally();
      for (const batch of source.batchesSync(stream)) {
        if (batch.kind !== 'ctr') throw new InvalidTensorError(`the ctr model cannot read ${batch.kind} batch ${batch.batchId}`);
        tally.add(batch.labels, await this.predict(batch), batch.size);
      }
      return tally.result();
    }
    const tally = new MulticlassTally(model.classes);
    for (const batch of source.batchesSync(stream)) {
      const mlpBatch = this.asMlpBatch(batch);
      tally.add(mlpBatch.labels, await this.predict(mlpBatch), mlpBatch.size);
    }
    return tally.result();
  }

  async dispose(): Promise<void> {
    await this.stepSession.dispose();
    await this.evalSession.dispose();
  }

  private ctrIndex(batch: CtrBatch): CtrBagIndex {
    const buckets = this.options.hashBuckets;
    const ids = buckets === null ? batch.ids : bucketCtrIds(batch.offsets, batch.ids, batch.slots, buckets);
    return ctrBagIndex(batch.offsets, ids);
  }

  private asMlpBatch(batch: Batch): MlpBatch {
    return batch.kind === 'mlp' ? batch : hashedBagOfIds(batch, (this.model as MlpModel).inputWidth);
  }
}
