/**
 * Determinism and streaming helpers shared by the data sources: integer
 * hashing, a per-sample random stream derived from (seed, index), a keyed
 * permutation for shuffling without materialising an index array, and the
 * batch plan of one epoch (shuffle, partition, skip).
 */
import { ConfigError } from '../../runtime/errors.ts';
import type { BatchStreamOptions, Split, StreamPartition } from './batch.ts';

/** murmur3's finaliser: a well-mixed 32-bit hash of a 32-bit value. */
export function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** Hash of two 32-bit values (order matters). */
export function hash2(a: number, b: number): number {
  return fmix32((a ^ Math.imul(fmix32(b) + 0x9e3779b9, 0x27d4eb2f)) >>> 0);
}

/** Hash of three 32-bit values (order matters). */
export function hash3(a: number, b: number, c: number): number {
  return hash2(hash2(a, b), c);
}

/** A uniform [0, 1) number from a 32-bit hash. */
export function unitFromHash(h: number): number {
  return (h >>> 0) / 4294967296;
}

/**
 * A small reseedable xoshiro128** stream. `reseed(seed, i)` makes sample i's
 * randomness a function of (seed, i) alone, so any slice or shard of a stream
 * can be regenerated independently, and one instance serves every sample
 * without allocating.
 */
export class SampleRandom {
  private a = 1;
  private b = 0;
  private c = 0;
  private d = 0;
  private spare = 0;
  private hasSpare = false;

  constructor(seed = 0, index = 0) {
    this.reseed(seed, index);
  }

  /** Restart as the stream of sample `index` (an integer below 2^53) under `seed`. */
  reseed(seed: number, index: number): this {
    const lo = index >>> 0;
    const hi = Math.floor(index / 4294967296) >>> 0;
    let s = hash3(seed >>> 0, lo, hi);
    // splitmix-style expansion of one hash into four state words
    s = (s + 0x9e3779b9) | 0; this.a = fmix32(s);
    s = (s + 0x9e3779b9) | 0; this.b = fmix32(s);
    s = (s + 0x9e3779b9) | 0; this.c = fmix32(s);
    s = (s + 0x9e3779b9) | 0; this.d = fmix32(s);
    if ((this.a | this.b | this.c | this.d) === 0) this.a = 1;
    this.hasSpare = false;
    return this;
  }

  nextU32(): number {
    const b = this.b;
    const x = Math.imul(b, 5);
    const r = Math.imul((x << 7) | (x >>> 25), 9) >>> 0;
    const t = b << 9;
    this.c ^= this.a;
    this.d ^= b;
    this.b = b ^ this.c;
    this.a ^= this.d;
    this.c ^= t;
    this.d = (this.d << 11) | (this.d >>> 21);
    return r;
  }

  /** Uniform in [0, 1). */
  next(): number {
    return this.nextU32() / 4294967296;
  }

  /** Uniform integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  /** Standard normal (Box–Muller, pairs cached). */
  normal(): number {
    if (this.hasSpare) { this.hasSpare = false; return this.spare; }
    let u = 0;
    while (u === 0) u = this.next();
    const v = this.next();
    const m = Math.sqrt(-2 * Math.log(u));
    this.spare = m * Math.sin(2 * Math.PI * v);
    this.hasSpare = true;
    return m * Math.cos(2 * Math.PI * v);
  }
}

/**
 * A keyed pseudo-random permutation of [0, size): a 4-round Feistel network
 * on the smallest even-bit domain ≥ size, with cycle walking back into range.
 * O(1) memory, so shuffling tens of millions of synthetic samples costs no
 * index array; expected < 4 rounds of walking per lookup.
 */
export class IndexPermutation {
  private readonly halfBits: number;
  private readonly mask: number;
  private readonly keys: Uint32Array;

  constructor(readonly size: number, seed: number) {
    if (!Number.isInteger(size) || size < 0 || size > 2 ** 32) throw new RangeError(`permutation size must be an integer in [0, 2^32], got ${size}`);
    let bits = 2;
    while (2 ** bits < size) bits += 2;
    this.halfBits = bits / 2;
    this.mask = 2 ** this.halfBits - 1;
    this.keys = Uint32Array.from([0, 1, 2, 3], (r) => hash2(seed >>> 0, r));
  }

  /** The element at position i of the shuffled order. */
  at(i: number): number {
    let x = i;
    do x = this.encrypt(x); while (x >= this.size);
    return x;
  }

  private encrypt(x: number): number {
    const h = this.halfBits;
    const mask = this.mask;
    let left = Math.floor(x / 2 ** h);
    let right = x & mask;
    for (let r = 0; r < 4; r++) {
      const f = fmix32((right ^ this.keys[r]!) >>> 0) & mask;
      const next = (left ^ f) & mask;
      left = right;
      right = next;
    }
    return left * 2 ** h + right;
  }
}

/** Stream options with defaults applied and checked. */
export interface ResolvedStreamOptions {
  split: Split;
  batchSize: number;
  epoch: number;
  shuffle: boolean;
  partition: StreamPartition;
  dropLast: boolean;
  skipBatches: number;
}

function streamFail(field: string, rule: string, value: unknown): never {
  throw new ConfigError(`stream.${field} must be ${rule}, got ${JSON.stringify(value)}`, { data: { field: `stream.${field}`, value: value as never } });
}

const isNonNegativeInt = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v) && v >= 0;

export function resolveStreamOptions(options: BatchStreamOptions): ResolvedStreamOptions {
  const { split } = options;
  if (split !== 'train' && split !== 'test') streamFail('split', "'train' or 'test'", split);
  if (!isNonNegativeInt(options.batchSize) || options.batchSize === 0) streamFail('batchSize', 'a positive integer', options.batchSize);
  const epoch = options.epoch ?? 0;
  if (!isNonNegativeInt(epoch)) streamFail('epoch', 'an integer ≥ 0', epoch);
  const skipBatches = options.skipBatches ?? 0;
  if (!isNonNegativeInt(skipBatches)) streamFail('skipBatches', 'an integer ≥ 0', skipBatches);
  const partition = options.partition ?? { index: 0, count: 1 };
  if (!isNonNegativeInt(partition.count) || partition.count === 0) streamFail('partition.count', 'a positive integer', partition.count);
  if (!isNonNegativeInt(partition.index) || partition.index >= partition.count) streamFail('partition.index', `an integer in [0, ${partition.count})`, partition.index);
  const shuffle = options.shuffle ?? split === 'train';
  return { split, batchSize: options.batchSize, epoch, shuffle, partition, dropLast: options.dropLast ?? false, skipBatches };
}

/** Number of batches the resolved options select out of a split of `total` samples. */
/** Samples in a split of a synthetic source whose train and test parts are index ranges. */
export function splitSize(split: 'train' | 'test', sizes: { trainSize: number; testSize: number }): number {
  return split === 'train' ? sizes.trainSize : sizes.testSize;
}

export function countPlannedBatches(total: number, o: ResolvedStreamOptions): number {
  const all = o.dropLast ? Math.floor(total / o.batchSize) : Math.ceil(total / o.batchSize);
  const mine = all > o.partition.index ? Math.floor((all - 1 - o.partition.index) / o.partition.count) + 1 : 0;
  return Math.max(0, mine - o.skipBatches);
}

export interface PlannedBatch {
  batchId: string;
  /** Positions within the split (0-based sample indices of the split), in batch order. */
  indices: Float64Array;
}

/**
 * The batches of one epoch: the split's samples in (optionally shuffled) order,
 * cut into batches, of which this partition takes every count-th.
 * `shuffleSeed` should already mix the source's seed; epoch and split are mixed in here.
 */
export function* planBatches(name: string, total: number, o: ResolvedStreamOptions, shuffleSeed: number): Generator<PlannedBatch> {
  const permutation = o.shuffle ? new IndexPermutation(total, hash3(shuffleSeed >>> 0, o.epoch, o.split === 'train' ? 1 : 2)) : null;
  const all = o.dropLast ? Math.floor(total / o.batchSize) : Math.ceil(total / o.batchSize);
  let j = o.partition.index + o.skipBatches * o.partition.count;
  for (; j < all; j += o.partition.count) {
    const start = j * o.batchSize;
    const size = Math.min(o.batchSize, total - start);
    const indices = new Float64Array(size);
    for (let k = 0; k < size; k++) indices[k] = permutation === null ? start + k : permutation.at(start + k);
    yield { batchId: `${name}/${o.split}/e${o.epoch}/b${j}`, indices };
  }
}

/** Wraps a synchronous batch iterator as an async one. */
export async function* toAsync<T>(it: Iterable<T>): AsyncGenerator<T> {
  for (const x of it) yield x;
}
