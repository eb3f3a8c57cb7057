/**
 * Batch types and the `DataSource` contract shared by every dataset.
 *
 * Sources are deterministic (same config + seed → same batches, bit for bit)
 * and streaming: a batch is built when the consumer asks for it, from a
 * per-sample derivation or a small per-process cache, never from a
 * materialised copy of the whole dataset.
 */

export type Split = 'train' | 'test';

/**
 * A batch for embedding models (CTR, spam): per sample, one bag of sparse ids
 * per slot, plus optional dense features.
 *
 * Ids are `Int32Array` keys in `[0, vocabularySize)` of ONE global id space
 * (see `CtrDataDescription.slotRanges` for how slots share it), not BigInt64:
 * keys fit in 31 bits, are half the bytes on the wire, BigInt arithmetic is
 * slow in JS, and ONNX Runtime's Gather takes int32 indices as they are.
 */
export interface CtrBatch {
  kind: 'ctr';
  /** Unique within a job and stable across runs: `<source>/<split>/e<epoch>/b<index>`. */
  batchId: string;
  /** B, the number of samples. */
  size: number;
  /** S, the number of slots (bags) per sample. */
  slots: number;
  /**
   * CSR offsets, length B·S + 1, non-decreasing, `offsets[0] = 0`,
   * `offsets[B·S] = ids.length`. The bag of sample b, slot s is
   * `ids[offsets[b·S + s] .. offsets[b·S + s + 1])`; bags may be empty.
   */
  offsets: Int32Array;
  /** Global ids, each in `[0, vocabularySize)`; repeats within a bag are allowed (bag-of-words counts). */
  ids: Int32Array;
  /** F dense features per sample, row-major `[B, F]`; null when the source has none (F = 0). */
  dense: Float32Array | null;
  /** F */
  denseDim: number;
  /** 0 or 1 per sample, `[B]`. */
  labels: Float32Array;
}

/** A batch for the classifier MLP: dense features and class labels. */
export interface MlpBatch {
  kind: 'mlp';
  /** Unique within a job and stable across runs: `<source>/<split>/e<epoch>/b<index>`. */
  batchId: string;
  /** B */
  size: number;
  /** Row-major `[B, featureDim]` (featureDim = 1024 for the default synthetic set). */
  features: Float32Array;
  featureDim: number;
  /** Class index per sample in `[0, numClasses)`, `[B]`. */
  labels: Int32Array;
}

export type Batch = CtrBatch | MlpBatch;

/** A contiguous block of the global id space that one slot owns. */
export interface SlotRange {
  /** First global id of the slot. */
  start: number;
  /** Number of ids the slot may use. */
  size: number;
}

export interface CtrDataDescription {
  kind: 'ctr';
  /** Source name, the first part of every batch id. */
  name: string;
  seed: number;
  /** S */
  slots: number;
  /** One name per slot, e.g. `subject`, `body`, `slot3`. */
  slotNames: readonly string[];
  /** Every id is `< vocabularySize`: the rows of one embedding table keyed by global id. */
  vocabularySize: number;
  /**
   * Per slot, the id range it owns; null when slots share the whole space
   * through salted hashing (different slots may then collide, rarely).
   */
  slotRanges: readonly SlotRange[] | null;
  /** F; 0 means `dense` is null. */
  denseDim: number;
  denseNames: readonly string[];
  trainSize: number;
  testSize: number;
  /** Fraction of label-1 samples in the train split (exact when known, else an estimate). */
  positiveRate: number;
}

export interface MlpDataDescription {
  kind: 'mlp';
  name: string;
  seed: number;
  featureDim: number;
  numClasses: number;
  trainSize: number;
  testSize: number;
}

export type DataDescription = CtrDataDescription | MlpDataDescription;

/** Which share of the batch stream a consumer takes: batches j with j mod count = index. */
export interface StreamPartition {
  index: number;
  count: number;
}

/** How to read one pass (epoch) of a split. Wire type: every field present, null for defaults. */
export interface BatchStreamOptions {
  split: Split;
  batchSize: number;
  /** Seeds the shuffle, so every epoch has its own order; null = 0. */
  epoch: number | null;
  /** null = shuffle the train split, keep the test split in order. */
  shuffle: boolean | null;
  /** null = the whole stream. */
  partition: StreamPartition | null;
  /** Drop a final partial batch; null = false. */
  dropLast: boolean | null;
  /** Skip this many of this partition's batches first (resume); null = 0. */
  skipBatches: number | null;
}

/** Options with defaults filled in, e.g. `streamOptions('train', 256, { epoch: 3 })`. */
export function streamOptions(split: Split, batchSize: number, overrides: Partial<BatchStreamOptions> = {}): BatchStreamOptions {
  return { split, batchSize, epoch: null, shuffle: null, partition: null, dropLast: null, skipBatches: null, ...overrides };
}

/**
 * A dataset as a deterministic stream of batches. Batches are built lazily as
 * the iterator is pulled; iterating the same options twice gives the same
 * batches, and partitions of one stream are disjoint and cover it.
 */
export interface DataSource<TBatch extends Batch = Batch, TDescription extends DataDescription = DataDescription> {
  describe(): TDescription;
  /** Number of batches `batches(options)` yields. */
  countBatches(options: BatchStreamOptions): number;
  /** One pass over the split. */
  batches(options: BatchStreamOptions): AsyncIterableIterator<TBatch>;
  /** The same stream without the async wrapper (all sources here are CPU-bound, no I/O per batch). */
  batchesSync(options: BatchStreamOptions): IterableIterator<TBatch>;
}

export type CtrDataSource = DataSource<CtrBatch, CtrDataDescription>;
export type MlpDataSource = DataSource<MlpBatch, MlpDataDescription>;
