/**
 * `ctr`: Wide & Deep over S slots of hashed sparse ids plus optional dense
 * features, with a log loss.
 *
 * Sparse input layout. A worker pulls the batch's unique rows once:
 * `emb_rows [U, D]` and `wide_rows [U, 1]`. Every id occurrence of the batch,
 * ordered by sample then slot, is an index into those rows (`bag_rows [N]`),
 * and `bag_counts [B, S]` says how many ids each (sample, slot) bag holds
 * (CSR lengths; 0 = empty bag). The graph derives each occurrence's bag
 * (segment) from the counts: scatter-add a 1 at every bag start, cumulative
 * sum, minus one — so the two inputs cannot disagree beyond sum(counts) = N,
 * which the session checks.
 *
 * Why Gather + ScatterND(reduction=add) for pooling: it costs O(N·D) in both
 * directions and its gradient is the same two operators swapped
 * (Gather ↔ ScatterND-add). The alternative, a dense [B·S, U] pooling matrix
 * fed to MatMul, costs O(B·S·U·D) FLOPs and B·S·U floats of memory — at
 * B=1024, S=26, U≈20k that is 2 GB per step. Padding bags to a fixed width
 * would still need a scatter-add for the row gradients.
 *
 * Empty bags are supported: a sum over nothing is 0, and mean pooling divides
 * by max(count, 1), so an empty bag pools to the zero vector.
 */
import { ConfigError, InvalidTensorError } from '../../runtime/errors.ts';
import type { DenseParamSpec, ExternalDataOptions, GraphKind, HostTensor, ModelGraph, StepFeeds } from '../native.ts';
import { GraphBuilder, scalarTensor } from '../onnx-builder.ts';
import type { Model } from './model.ts';
import { denseParam, dimOf, exportedParam, inverseDimOf, towerBackward, towerForward, type TowerLayer } from './tower.ts';

export type BagPooling = 'sum' | 'mean';

export interface CtrConfig {
  /** Number of sparse slots S. */
  readonly slots: number;
  /** Embedding width D. */
  readonly embeddingDim: number;
  /** Dense features F per sample; 0 = no `dense_features` input. */
  readonly denseFeatures: number;
  /** Hidden widths of the deep tower (ReLU); the output layer (→ 1) is added. */
  readonly hidden: readonly number[];
  /** How a bag of ids in one slot becomes one vector. The wide part always sums. */
  readonly pooling: BagPooling;
}

/** Criteo-like: 26 categorical slots, 13 dense features. */
export const DEFAULT_CTR_CONFIG: CtrConfig = { slots: 26, embeddingDim: 16, denseFeatures: 13, hidden: [256, 128], pooling: 'sum' };

export const CTR_BATCH = 'batch';
export const CTR_UNIQUE_ROWS = 'unique_rows';
export const CTR_BAG_IDS = 'bag_ids';

export class CtrModel implements Model {
  readonly family = 'ctr';
  readonly config: CtrConfig;
  readonly denseParams: readonly DenseParamSpec[];
  private readonly graphs = new Map<GraphKind, ModelGraph>();

  constructor(config: CtrConfig) {
    const positive = (name: string, v: number, min: number) => {
      if (!Number.isInteger(v) || v < min) throw new ConfigError(`ctr.${name} must be an integer ≥ ${min}, got ${v}`);
    };
    positive('slots', config.slots, 1);
    positive('embeddingDim', config.embeddingDim, 1);
    positive('denseFeatures', config.denseFeatures, 0);
    if (!Array.isArray(config.hidden)) throw new ConfigError('ctr.hidden must be an array of widths');
    config.hidden.forEach((h, i) => positive(`hidden[${i}]`, h, 1));
    if (config.pooling !== 'sum' && config.pooling !== 'mean') throw new ConfigError(`ctr.pooling must be 'sum' or 'mean', got ${String(config.pooling)}`);
    this.config = { ...config, hidden: [...config.hidden] };

    const widths = [this.deepInputWidth, ...config.hidden, 1];
    const params: DenseParamSpec[] = [];
    for (let i = 1; i < widths.length; i++) {
      params.push(denseParam(`W${i}`, [widths[i - 1]!, widths[i]!]));
      // The output layer has no bias of its own: the global `bias` is the logit's intercept.
      if (i < widths.length - 1) params.push(denseParam(`b${i}`, [widths[i]!]));
    }
    params.push(denseParam('bias', [1]));
    this.denseParams = params;
  }

  /** S·D pooled embedding features plus F dense features. */
  get deepInputWidth(): number { return this.config.slots * this.config.embeddingDim + this.config.denseFeatures; }

  graph(kind: GraphKind): ModelGraph {
    let g = this.graphs.get(kind);
    if (g === undefined) { g = this.build(kind); this.graphs.set(kind, g); }
    return g;
  }

  checkFeeds(feeds: StepFeeds, kind: GraphKind): void {
    const rows = feeds['bag_rows']; const counts = feeds['bag_counts']; const emb = feeds['emb_rows'];
    // Wrong dtypes or missing inputs are the shape check's to report.
    if (rows?.dtype !== 'int32' || counts?.dtype !== 'int32' || emb === undefined) return;
    const u = emb.dims[0] ?? 0;
    const r = rows.data as Int32Array;
    for (let i = 0; i < r.length; i++) {
      const v = r[i]!;
      if (v < 0 || v >= u) throw bad('bag_rows', `bag_rows[${i}] = ${v} is outside the ${u} gathered rows [0, ${u})`, { index: i, value: v });
    }
    const c = counts.data as Int32Array;
    let total = 0;
    for (let i = 0; i < c.length; i++) {
      const v = c[i]!;
      if (v < 0) throw bad('bag_counts', `bag_counts[${i}] = ${v} is negative`, { index: i, value: v });
      total += v;
    }
    if (total !== r.length) throw bad('bag_counts', `bag_counts sum to ${total} but bag_rows holds ${r.length} ids`, { expected: r.length, actual: total });
    if (kind === 'step') checkLabels(feeds['labels']);
  }

  /** The tower's layers and the global bias, each parameter read through `param` (a graph input, or an initializer in an export). */
  private towerParams(g: GraphBuilder, param: (p: DenseParamSpec) => string): { layers: TowerLayer[]; grads: { weight: string; bias: string | null }[]; bias: string } {
    const layers: TowerLayer[] = [];
    const grads: { weight: string; bias: string | null }[] = [];
    const depth = this.config.hidden.length + 1;
    for (let i = 1; i <= depth; i++) {
      const w = this.denseParams.find((p) => p.name === `W${i}`)!;
      const b = this.denseParams.find((p) => p.name === `b${i}`) ?? null;
      layers.push({ weight: param(w), bias: b === null ? null : param(b) });
      grads.push({ weight: w.gradName, bias: b === null ? null : b.gradName });
    }
    return { layers, grads, bias: param(this.denseParams.find((p) => p.name === 'bias')!) };
  }

  /**
   * The forward pass shared by the step, eval and exported graphs, up to
   * `predictions`. `bagRowsOf(seg)` gives the row of every id occurrence
   * (the `bag_rows` input, or in an export the seen-row lookup of the ids,
   * which needs each occurrence's bag `seg` to know its slot).
   */
  private forward(g: GraphBuilder, io: {
    layers: readonly TowerLayer[]; bias: string; embRows: string; wideRows: string | null;
    bagCounts: string; dense: string | null; nIds: string; bagRowsOf: (seg: string) => string;
  }): CtrForward {
    const { slots: S, embeddingDim: D, pooling } = this.config;
    const { bagCounts, nIds } = io;
    // --- segments: bag index (sample·S + slot) of every id occurrence ---
    const flatCounts = g.op('Reshape', [g.op('Cast', [bagCounts], { to: 7 }), g.constI64([-1])]); // [B·S] int64
    const starts = g.op('Sub', [g.op('CumSum', [flatCounts, g.constI64([0], [])]), flatCounts]); // exclusive prefix sum
    const marksZero = g.op('ConstantOfShape', [g.op('Add', [nIds, g.constI64([1])])], { value: scalarTensor('int64', 0) }); // [N+1]
    const ones = g.op('Expand', [g.constI64([1], []), g.op('Shape', [flatCounts])]); // [B·S] int64
    // A 1 at every bag start (empty bags share their start with the next bag, add makes that 2); slot N catches trailing empty bags.
    const marks = g.op('ScatterND', [marksZero, g.op('Unsqueeze', [starts, g.constI64([1])]), ones], { reduction: 'add' });
    const segFull = g.op('CumSum', [marks, g.constI64([0], [])]);
    const seg = g.op('Sub', [g.op('Slice', [segFull, g.constI64([0]), nIds, g.constI64([0])]), g.constI64([1], [])]); // [N] int64
    const seg2 = g.op('Unsqueeze', [seg, g.constI64([1])]); // [N,1] ScatterND index
    const sample = g.op('Div', [seg, g.constI64([S], [])]); // [N] sample of every id occurrence
    const sample2 = g.op('Unsqueeze', [sample, g.constI64([1])]); // [N,1]
    const bagRows = io.bagRowsOf(seg);

    // --- bag pooling ---
    let bagWeight: string | null = null; // [N,1] 1/len(bag) for mean pooling
    if (pooling === 'mean') {
      const inv = g.op('Reciprocal', [g.op('Max', [g.op('Cast', [flatCounts], { to: 1 }), g.constF32([1], [])])]);
      bagWeight = g.op('Unsqueeze', [g.op('Gather', [inv, seg]), g.constI64([1])]);
    }
    let picked = g.op('Gather', [io.embRows, bagRows], { axis: 0 }); // [N,D]
    if (bagWeight !== null) picked = g.op('Mul', [picked, bagWeight]);
    const bagsShape = g.op('Concat', [g.op('Shape', [flatCounts]), g.constI64([D])], { axis: 0 }); // [B·S, D]
    const pooledFlat = g.op('ScatterND', [g.op('ConstantOfShape', [bagsShape]), seg2, picked], { reduction: 'add' });
    const pooled = g.op('Reshape', [pooledFlat, g.constI64([-1, S * D])]); // [B, S·D]

    // --- deep ---
    const deepIn = io.dense === null ? pooled : g.op('Concat', [pooled, io.dense], { axis: 1 });
    const tower = towerForward(g, deepIn, io.layers); // [B,1]

    // --- wide: sum of the wide weights of every id of the sample ---
    let deepAndWide = tower.out; // [B,1]
    if (io.wideRows !== null) {
      const wideShape = g.op('Concat', [dimOf(g, bagCounts, 0), g.constI64([1])], { axis: 0 }); // [B,1]
      const wideSum = g.op('ScatterND', [g.op('ConstantOfShape', [wideShape]), sample2, g.op('Gather', [io.wideRows, bagRows], { axis: 0 })], { reduction: 'add' });
      deepAndWide = g.op('Add', [deepAndWide, wideSum]);
    }
    const logit2 = g.op('Add', [deepAndWide, io.bias]); // [B,1]
    const logit = g.op('Reshape', [logit2, g.constI64([-1])]);
    g.op('Sigmoid', [logit], {}, 'predictions');
    return { seg, sample, bagRows, bagWeight, tower, logit };
  }

  private build(kind: GraphKind): ModelGraph {
    const { slots: S, embeddingDim: D, denseFeatures: F } = this.config;
    const B = CTR_BATCH; const U = CTR_UNIQUE_ROWS; const N = CTR_BAG_IDS;
    const g = new GraphBuilder(`hetps_ctr_${kind}`);

    const { layers, grads, bias } = this.towerParams(g, (p) => g.input(p.name, 'float32', p.dims, p.name === 'bias' ? 'global logit intercept' : null));
    const embRows = g.input('emb_rows', 'float32', [U, D], 'embedding rows gathered for this batch, one per distinct id');
    const wideRows = g.input('wide_rows', 'float32', [U, 1], 'wide (linear) weights of the same rows');
    const bagRows = g.input('bag_rows', 'int32', [N], 'row of emb_rows for every id occurrence, ordered by sample then slot');
    const bagCounts = g.input('bag_counts', 'int32', [B, S], 'ids per (sample, slot) bag; 0 = empty bag');
    const dense = F > 0 ? g.input('dense_features', 'float32', [B, F]) : null;
    const labels = kind === 'step' ? g.input('labels', 'float32', [B], 'click label in [0, 1]') : null;

    const f = this.forward(g, { layers, bias, embRows, wideRows, bagCounts, dense, nIds: dimOf(g, bagRows, 0), bagRowsOf: () => bagRows });
    const { seg, sample, bagWeight, logit } = f;

    if (labels !== null) {
      // log(1+e^x) − x·y written as max(x,0) − x·y + log(1+e^−|x|): no overflow for large |x|.
      const softplusNegAbs = g.op('Softplus', [g.op('Neg', [g.op('Abs', [logit])])]);
      const perSample = g.op('Add', [g.op('Sub', [g.op('Relu', [logit]), g.op('Mul', [logit, labels])]), softplusNegAbs]);
      g.op('ReduceMean', [perSample], { keepdims: 0 }, 'loss');

      // dloss/dlogit = (σ(x) − y) / B
      const dLogit = g.op('Mul', [g.op('Sub', ['predictions', labels]), inverseDimOf(g, labels, 0)]);
      const dLogit2 = g.op('Unsqueeze', [dLogit, g.constI64([1])]); // [B,1]
      g.op('ReduceSum', [dLogit, g.constI64([0])], { keepdims: 1 }, 'bias_grad');
      const { dzFirst } = towerBackward(g, f.tower, layers, dLogit2, grads);
      // Only the pooled columns of the first layer need an input gradient; dense features have none.
      const w1 = layers[0]!.weight;
      const w1Emb = F > 0 ? g.op('Slice', [w1, g.constI64([0]), g.constI64([S * D]), g.constI64([0])]) : w1;
      const dPooled = g.op('Reshape', [g.op('Gemm', [dzFirst, w1Emb], { transB: 1 }), g.constI64([-1, D])]); // [B·S, D]
      const rows2 = g.op('Unsqueeze', [g.op('Cast', [bagRows], { to: 7 }), g.constI64([1])]); // [N,1] int64, as ScatterND wants
      let dPicked = g.op('Gather', [dPooled, seg], { axis: 0 }); // [N,D]
      if (bagWeight !== null) dPicked = g.op('Mul', [dPicked, bagWeight]);
      g.op('ScatterND', [g.op('ConstantOfShape', [g.op('Shape', [embRows])]), rows2, dPicked], { reduction: 'add' }, 'emb_rows_grad');
      const dWide = g.op('Gather', [dLogit2, sample], { axis: 0 }); // [N,1]
      g.op('ScatterND', [g.op('ConstantOfShape', [g.op('Shape', [wideRows])]), rows2, dWide], { reduction: 'add' }, 'wide_rows_grad');

      g.output('loss', 'float32', [], 'mean log loss over the batch');
      g.output('predictions', 'float32', [B], 'click probability σ(logit)');
      for (const p of this.denseParams) g.output(p.gradName, 'float32', p.dims, `dloss/d${p.name}`);
      g.output('emb_rows_grad', 'float32', [U, D], 'dloss/demb_rows, one row per gathered row');
      g.output('wide_rows_grad', 'float32', [U, 1], 'dloss/dwide_rows');
    } else {
      g.output('predictions', 'float32', [B], 'click probability σ(logit)');
    }
    return { model: this.family, kind, inputs: g.inputSpecs, outputs: g.outputSpecs, bytes: g.serialize() };
  }

  /**
   * A self-contained inference graph: the trained dense parameters and the
   * rows of the embedding (and wide) table that were seen are initializers,
   * so plain ONNX Runtime scores raw samples. Inputs: `ids` int64 [N] (the
   * data's sparse ids, unsigned 32-bit values, every occurrence ordered by
   * sample then slot; the low 32 bits are used, as the trainer reads its
   * int32 ids), `bag_counts` int32 [B, S] and, with dense features,
   * `dense_features` float32 [B, F]. Output: `predictions` float32 [B].
   *
   * Ids are hash-bucketed as the trainer does (`bucketCtrIds`: slot base +
   * id mod buckets) and looked up among the seen rows: with hash buckets,
   * through a row-of-bucket table (an int32 initializer, Gather), when that
   * is no bigger than a map of the seen ids or the seen ids are too many to
   * sit in the model file; otherwise (and for raw ids) with ai.onnx.ml
   * LabelEncoder, whose keys are attributes. An id never seen in training
   * gets a zero embedding and a zero wide weight.
   */
  exportGraph(w: CtrExportWeights): ModelGraph {
    const { slots: S, embeddingDim: D, denseFeatures: F } = this.config;
    const B = CTR_BATCH; const N = CTR_BAG_IDS;
    const g = new GraphBuilder('hetps_ctr_inference', w.externalData ?? null);
    const { layers, bias } = this.towerParams(g, (p) => g.initializer(p.name, 'float32', p.dims, exportedParam(w.dense, p)));
    const ids = g.input('ids', 'int64', [N], 'sparse ids of every occurrence, ordered by sample then slot (unsigned 32-bit values)');
    const bagCounts = g.input('bag_counts', 'int32', [B, S], 'ids per (sample, slot) bag; 0 = empty bag');
    const dense = F > 0 ? g.input('dense_features', 'float32', [B, F]) : null;

    const seen = seenRows(w.emb, D, w.wide);
    const n = seen.keys.length;
    const embRows = g.initializer('embedding', 'float32', [n + 1, D], seen.emb);
    const wideRows = seen.wide === null ? null : g.initializer('wide', 'float32', [n + 1, 1], seen.wide);
    const perSlot = w.hashBuckets === null ? null : bucketsPerSlot(w.hashBuckets, S);
    const bases: number[] = [];
    let totalBuckets = 0;
    for (const b of perSlot ?? []) { bases.push(totalBuckets); totalBuckets += b; }
    const table = perSlot !== null && n > 0 && useBucketTable(totalBuckets, n) ? bucketTable(g, seen.keys, totalBuckets) : null;
    const bagRowsOf = (seg: string): string => {
      let key = g.op('BitwiseAnd', [ids, g.constI64([0xffffffff], [])]);
      if (perSlot !== null) {
        const slot = g.op('Mod', [seg, g.constI64([S], [])]);
        key = g.op('Add', [g.op('Gather', [g.constI64(bases), slot]), g.op('Mod', [key, g.op('Gather', [g.constI64(perSlot), slot])])]);
      }
      if (n === 0) return g.op('Mul', [key, g.constI64([0], [])]); // nothing seen: every id → the zero row
      if (table !== null) return g.op('Cast', [g.op('Gather', [table, key])], { to: 7 });
      if (n * LABEL_ENCODER_BYTES_PER_ROW > MAX_INLINE_MAP_BYTES) {
        throw new InvalidTensorError(`export: ${n} seen rows of raw (unbucketed) ids: their id → row map (${LABEL_ENCODER_BYTES_PER_ROW} bytes a row, the attributes of an ONNX-ML LabelEncoder) `
          + `must sit in the model file, and at most ${Math.floor(MAX_INLINE_MAP_BYTES / LABEL_ENCODER_BYTES_PER_ROW)} rows fit; hash the ids (model.ctr.hash_buckets) to export more`, { data: { input: 'ids' } });
      }
      return g.domainOp('ai.onnx.ml', 2, 'LabelEncoder', [key], {
        keys_int64s: Array.from(seen.keys), values_int64s: Array.from(seen.keys, (_, i) => i), default_int64: n,
      });
    };
    this.forward(g, { layers, bias, embRows, wideRows, bagCounts, dense, nIds: dimOf(g, ids, 0), bagRowsOf });
    g.output('predictions', 'float32', [B], 'click probability σ(logit)');
    for (const [k, v] of Object.entries(w.metadata ?? {})) g.meta(k, v);
    return { model: this.family, kind: 'eval', inputs: g.inputSpecs, outputs: g.outputSpecs, bytes: g.serialize(), external: g.externalData };
  }
}

/** What `forward` leaves for the backward pass. */
interface CtrForward {
  seg: string; sample: string; bagRows: string; bagWeight: string | null; tower: ReturnType<typeof towerForward>; logit: string;
}

/** Rows of one sparse table: ids (hash-bucketed, as the shards key them) and their values, row-major. */
export interface TableRows {
  readonly ids: Uint32Array;
  readonly values: Float32Array;
}

/** What `CtrModel.exportGraph` bakes into the graph. */
export interface CtrExportWeights {
  readonly dense: ReadonlyMap<string, Float32Array>;
  readonly emb: TableRows;
  /** null: the model has no wide part. */
  readonly wide: TableRows | null;
  /** `model.ctr.hash_buckets` (null: ids are the rows' keys as they are). */
  readonly hashBuckets: number | readonly number[] | null;
  /** `metadata_props` of the model (job, checkpoint, …). */
  readonly metadata?: Readonly<Record<string, string>>;
  /** Large initializers to an external data file (models over 2 GiB); absent: everything in the model. */
  readonly externalData?: ExternalDataOptions | null;
}

/**
 * The union of the ids of both tables, sorted, and each table laid out over
 * it with one zero row after the last (the row of an id never seen). An id
 * in one table only gets zeros in the other.
 */
function seenRows(emb: TableRows, D: number, wide: TableRows | null): { keys: Uint32Array; emb: Float32Array; wide: Float32Array | null } {
  if (emb.values.length !== emb.ids.length * D) throw new InvalidTensorError(`export: the embedding table holds ${emb.values.length} values for ${emb.ids.length} rows of ${D}`, { data: { tensor: 'emb' } });
  if (wide !== null && wide.values.length !== wide.ids.length) throw new InvalidTensorError(`export: the wide table holds ${wide.values.length} values for ${wide.ids.length} rows of 1`, { data: { tensor: 'wide' } });
  // Typed arrays, sorted and searched: a JS Set or Map holds at most 2^24 entries, fewer than a real table's rows.
  const all = new Uint32Array(emb.ids.length + (wide?.ids.length ?? 0));
  all.set(emb.ids);
  if (wide !== null) all.set(wide.ids, emb.ids.length);
  all.sort();
  let n = 0;
  for (let i = 0; i < all.length; i++) if (i === 0 || all[i] !== all[i - 1]) all[n++] = all[i]!;
  const sorted = all.subarray(0, n);
  const rowOf = (id: number): number => {
    let lo = 0;
    let hi = n - 1;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (sorted[mid]! < id) lo = mid + 1; else hi = mid;
    }
    return lo;
  };
  const e = new Float32Array((n + 1) * D);
  for (let r = 0; r < emb.ids.length; r++) e.set(emb.values.subarray(r * D, r * D + D), rowOf(emb.ids[r]! >>> 0) * D);
  let wv: Float32Array | null = null;
  if (wide !== null) {
    wv = new Float32Array(n + 1);
    for (let r = 0; r < wide.ids.length; r++) wv[rowOf(wide.ids[r]! >>> 0)] = wide.values[r]!;
  }
  return { keys: sorted, emb: e, wide: wv };
}

/** A LabelEncoder's map costs an int64 key and value per seen id, encoded in the model file (protobuf, 2 GiB). */
export const LABEL_ENCODER_BYTES_PER_ROW = 16;
/** The most of it a model file takes: protobufjs builds the attributes in memory, which is slow far below 2 GiB. */
export const MAX_INLINE_MAP_BYTES = 256 * 2 ** 20;

/** `model.ctr.hash_buckets` as one count per slot. */
function bucketsPerSlot(buckets: number | readonly number[], slots: number): number[] {
  const perSlot = typeof buckets === 'number' ? Array.from({ length: slots }, () => buckets) : [...buckets];
  if (perSlot.length !== slots) throw new InvalidTensorError(`export: hash buckets list ${perSlot.length} slots, the model ${slots}`, { data: { input: 'ids' } });
  return perSlot;
}

/** Bytes of the id → row lookup an export of `seenRows` rows writes: the row-of-bucket table or the LabelEncoder's map (see `useBucketTable`). */
export function idLookupBytes(hashBuckets: number | readonly number[] | null, slots: number, seenRows: number): number {
  const total = hashBuckets === null ? null : bucketsPerSlot(hashBuckets, slots).reduce((a, b) => a + b, 0);
  return total !== null && useBucketTable(total, seenRows) ? total * 4 : seenRows * LABEL_ENCODER_BYTES_PER_ROW;
}

/** The row-of-bucket table (4 bytes a bucket, an initializer that external data can hold) when it is no bigger than the seen ids' map, or the map would not fit. */
export function useBucketTable(totalBuckets: number, seenRows: number): boolean {
  return totalBuckets * 4 <= seenRows * LABEL_ENCODER_BYTES_PER_ROW || seenRows * LABEL_ENCODER_BYTES_PER_ROW > MAX_INLINE_MAP_BYTES;
}

/** `row_of_bucket[k]`: the row of bucketed id k among the sorted seen `keys`, or the zero row (keys.length) for a bucket never seen. */
function bucketTable(g: GraphBuilder, keys: Uint32Array, totalBuckets: number): string {
  const rows = new Int32Array(totalBuckets).fill(keys.length);
  for (let r = 0; r < keys.length; r++) {
    const k = keys[r]!;
    if (k >= totalBuckets) throw new InvalidTensorError(`export: seen id ${k} is outside the ${totalBuckets} hash buckets of the model`, { data: { input: 'ids' } });
    rows[k] = r;
  }
  return g.initializer('row_of_bucket', 'int32', [totalBuckets], rows);
}

function bad(input: string, what: string, data: Record<string, unknown>): InvalidTensorError {
  return new InvalidTensorError(`ctr input ${input}: ${what}`, { data: { input, ...data } });
}

function checkLabels(labels: HostTensor | undefined): void {
  if (labels?.dtype !== 'float32') return;
  const y = labels.data as Float32Array;
  for (let i = 0; i < y.length; i++) {
    const v = y[i]!;
    if (!(v >= 0 && v <= 1)) throw bad('labels', `labels[${i}] = ${v} is outside [0, 1]`, { index: i, value: v });
  }
}

/** The sparse index inputs of one batch, plus which ids the worker must pull. */
export interface CtrBagIndex {
  /** Distinct ids in first-seen order: row u of `emb_rows`/`wide_rows` is the row of `uniqueIds[u]`. */
  readonly uniqueIds: Int32Array;
  /** `bag_rows`: for every id occurrence, its position in `uniqueIds`. */
  readonly bagRows: Int32Array;
  /** `bag_counts`, row-major [B, S]. */
  readonly bagCounts: Int32Array;
}

/**
 * Turns a CSR batch (`offsets` of length B·S + 1 over `ids`, bags ordered by
 * sample then slot) into the step graph's index inputs. Deduplication uses an
 * open-addressing table on typed arrays: a JS Map costs several times more at
 * 50k ids per batch, which is the order of a whole CPU step.
 */
export function ctrBagIndex(offsets: Int32Array, ids: Int32Array): CtrBagIndex {
  const bags = offsets.length - 1;
  if (bags < 0 || offsets[0] !== 0 || offsets[bags] !== ids.length) {
    throw new InvalidTensorError(`ctr offsets must start at 0 and end at ids.length (${ids.length})`, { data: { input: 'offsets' } });
  }
  const bagCounts = new Int32Array(bags);
  for (let i = 0; i < bags; i++) {
    const c = offsets[i + 1]! - offsets[i]!;
    if (c < 0) throw new InvalidTensorError(`ctr offsets decrease at bag ${i}`, { data: { input: 'offsets', index: i } });
    bagCounts[i] = c;
  }
  let bits = 4;
  while (1 << bits < ids.length * 2) bits++;
  const cap = 1 << bits;
  const mask = cap - 1;
  const keys = new Int32Array(cap);
  const slots = new Int32Array(cap).fill(-1); // position in uniqueIds, -1 = free
  const unique = new Int32Array(ids.length);
  const bagRows = new Int32Array(ids.length);
  let u = 0;
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i]!;
    let h = Math.imul(id, 0x9e3779b1) >>> (32 - bits); // Fibonacci hashing: the product's top bits
    while (slots[h] !== -1 && keys[h] !== id) h = (h + 1) & mask;
    if (slots[h] === -1) { keys[h] = id; slots[h] = u; unique[u++] = id; }
    bagRows[i] = slots[h]!;
  }
  return { uniqueIds: unique.slice(0, u), bagRows, bagCounts };
}

/** A Wide & Deep model sized from a plain config; missing fields take `DEFAULT_CTR_CONFIG`. */
export function ctrModel(config: Partial<CtrConfig> = {}): CtrModel {
  return new CtrModel({ ...DEFAULT_CTR_CONFIG, ...config });
}
