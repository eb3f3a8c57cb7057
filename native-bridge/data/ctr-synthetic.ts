/**
 * Synthetic click-through data: Zipf-distributed ids in several slots, a few
 * dense features, and labels from a hidden logistic model.
 *
 * Nothing is stored per sample or per id. Sample i's randomness is a function
 * of (seed, i) alone, so any range, shard or shuffle of the stream can be
 * regenerated independently; the hidden model's weight for (slot, id) is a
 * hash of (seed, slot, id), so the "ground truth table" costs no memory even
 * for millions of ids.
 *
 * Train is sample indices [0, trainSize), test is [trainSize + testOffset,
 * trainSize + testOffset + testSize): `testOffset` holds out a second set
 * (a validation set for tuning) disjoint from the test split of a run with
 * offset 0.
 */
import { ConfigError } from '../../runtime/errors.ts';
import type { BatchStreamOptions, CtrBatch, CtrDataDescription, CtrDataSource, SlotRange } from './batch.ts';
import { countPlannedBatches, splitSize, hash2, hash3, planBatches, resolveStreamOptions, SampleRandom, toAsync } from './stream.ts';

export interface SyntheticCtrConfig {
  seed: number;
  /** Number of sparse slots (bags) per sample. */
  slots: number;
  /** Ids per slot; slot s owns global ids [s·V, (s + 1)·V). */
  vocabularyPerSlot: number;
  /** s in P(rank k) ∝ 1 / k^s; 0 is uniform, ~1 is typical of real click logs. */
  zipfExponent: number;
  /** Bag length range per slot, inclusive. */
  minIdsPerSlot: number;
  maxIdsPerSlot: number;
  /** F dense features, standard normal; 0 for none. */
  denseDim: number;
  trainSize: number;
  testSize: number;
  /** Held-out samples start this many after the training ones (0: right after). */
  testOffset: number;
  /** Target fraction of positive labels (the hidden model's bias is calibrated to it). */
  positiveRate: number;
  /** Std of the hidden model's id-weight contribution to the logit. */
  idWeightScale: number;
  /** Std of the dense features' contribution to the logit. */
  denseWeightScale: number;
  /** Std of a pairwise cross term between slot 0 and slot 1 ids (needs ≥ 2 slots). */
  interactionScale: number;
  /** Std of Gaussian noise added to the logit before sampling the label. */
  logitNoise: number;
  /**
   * Spread each slot's popular ids over its range (an affine bijection of the
   * rank), instead of the hottest id being the first of the range. Real ids
   * carry no popularity order, and range-based sharding should not get all hot
   * ids on one shard by accident.
   */
  scatterIds: boolean;
}

export const DEFAULT_SYNTHETIC_CTR_CONFIG: SyntheticCtrConfig = {
  seed: 0,
  slots: 8,
  vocabularyPerSlot: 100_000,
  zipfExponent: 1.1,
  minIdsPerSlot: 1,
  maxIdsPerSlot: 3,
  denseDim: 8,
  trainSize: 1_000_000,
  testSize: 100_000,
  testOffset: 0,
  positiveRate: 0.25,
  idWeightScale: 1.5,
  denseWeightScale: 0.5,
  interactionScale: 0.5,
  logitNoise: 0.3,
  scatterIds: true,
};

/**
 * Zipf sampler by rejection-inversion (Hörmann & Derflinger 1996, as in Apache
 * Commons RNG): O(1) memory and a handful of exp/log per draw, for any
 * vocabulary size. Returns ranks in [1, n].
 */
export class ZipfSampler {
  private readonly hIntegralX1: number;
  private readonly hIntegralN: number;
  private readonly s: number;

  constructor(readonly n: number, readonly exponent: number) {
    if (!(exponent >= 0)) throw new RangeError(`Zipf exponent must be ≥ 0, got ${exponent}`);
    this.hIntegralX1 = this.hIntegral(1.5) - 1;
    this.hIntegralN = this.hIntegral(n + 0.5);
    this.s = 2 - this.hIntegralInverse(this.hIntegral(2.5) - this.h(2));
  }

  sample(rng: SampleRandom): number {
    if (this.exponent === 0) return 1 + rng.int(this.n);
    for (;;) {
      const u = this.hIntegralN + rng.next() * (this.hIntegralX1 - this.hIntegralN);
      const x = this.hIntegralInverse(u);
      let k = Math.floor(x + 0.5);
      if (k < 1) k = 1; else if (k > this.n) k = this.n;
      if (k - x <= this.s || u >= this.hIntegral(k + 0.5) - this.h(k)) return k;
    }
  }

  private h(x: number): number {
    return Math.exp(-this.exponent * Math.log(x));
  }

  private hIntegral(x: number): number {
    const logX = Math.log(x);
    return helper2((1 - this.exponent) * logX) * logX;
  }

  private hIntegralInverse(x: number): number {
    let t = x * (1 - this.exponent);
    if (t < -1) t = -1; // numerical guard, as in the reference
    return Math.exp(helper1(t) * x);
  }
}

/** log(1 + x) / x, stable near 0. */
function helper1(x: number): number {
  return Math.abs(x) > 1e-8 ? Math.log1p(x) / x : 1 - x * (0.5 - x * (1 / 3 - 0.25 * x));
}

/** (e^x − 1) / x, stable near 0. */
function helper2(x: number): number {
  return Math.abs(x) > 1e-8 ? Math.expm1(x) / x : 1 + x * 0.5 * (1 + (x / 3) * (1 + 0.25 * x));
}

/** A roughly standard normal from a 32-bit hash: Irwin–Hall of its four bytes (cheap, no logs). */
function gaussianFromHash(h: number): number {
  const sum = (h & 0xff) + ((h >>> 8) & 0xff) + ((h >>> 16) & 0xff) + (h >>> 24);
  // four uniform bytes: mean 510, variance 4·(256² − 1)/12
  return (sum - 510) / 147.80138;
}

function gcd(a: number, b: number): number {
  while (b !== 0) [a, b] = [b, a % b];
  return a;
}

function configFail(field: string, rule: string, value: unknown): never {
  throw new ConfigError(`data.${field} must be ${rule}, got ${JSON.stringify(value)}`, { data: { field: `data.${field}`, value: value as never } });
}

function resolveConfig(options: Partial<SyntheticCtrConfig>): SyntheticCtrConfig {
  const c = { ...DEFAULT_SYNTHETIC_CTR_CONFIG, ...options };
  const int = (field: keyof SyntheticCtrConfig, lo: number, hi = Number.MAX_SAFE_INTEGER) => {
    const v = c[field];
    if (typeof v !== 'number' || !Number.isInteger(v) || v < lo || v > hi) configFail(field, `an integer in [${lo}, ${hi}]`, v);
  };
  const real = (field: keyof SyntheticCtrConfig, ok: (v: number) => boolean, rule: string) => {
    const v = c[field];
    if (typeof v !== 'number' || !Number.isFinite(v) || !ok(v)) configFail(field, rule, v);
  };
  int('seed', 0, 0xffffffff);
  int('slots', 1, 4096);
  int('vocabularyPerSlot', 1);
  if (c.slots * c.vocabularyPerSlot > 0x7fffffff) configFail('vocabularyPerSlot', `such that slots × vocabularyPerSlot ≤ 2^31 − 1 (ids are int32; slots = ${c.slots})`, c.vocabularyPerSlot);
  int('minIdsPerSlot', 0, 10_000);
  int('maxIdsPerSlot', c.minIdsPerSlot, 10_000);
  int('denseDim', 0, 100_000);
  int('trainSize', 0, 2 ** 52);
  int('testSize', 0, 2 ** 52);
  int('testOffset', 0, 2 ** 52);
  real('zipfExponent', (v) => v >= 0, 'a number ≥ 0');
  real('positiveRate', (v) => v > 0 && v < 1, 'in (0, 1)');
  real('idWeightScale', (v) => v >= 0, 'a number ≥ 0');
  real('denseWeightScale', (v) => v >= 0, 'a number ≥ 0');
  real('interactionScale', (v) => v >= 0, 'a number ≥ 0');
  real('logitNoise', (v) => v >= 0, 'a number ≥ 0');
  if (typeof c.scatterIds !== 'boolean') configFail('scatterIds', 'true or false', c.scatterIds);
  return c;
}

/** Samples drawn to calibrate the hidden model's bias to `positiveRate`. */
const CALIBRATION_SAMPLES = 4096;

export interface SyntheticCtrSource extends CtrDataSource {
  readonly config: SyntheticCtrConfig;
  /** The hidden model's logit for a sample (without noise), for tests and for the Bayes-optimal baseline. */
  trueLogit(split: 'train' | 'test', index: number): number;
}

class SyntheticCtr implements SyntheticCtrSource {
  private readonly name: string;
  private readonly zipf: ZipfSampler;
  private readonly rng = new SampleRandom();
  private readonly idSeed: number;
  private readonly crossSeed: number;
  private readonly denseWeights: Float64Array;
  private readonly scatterMultiplier: number;
  private readonly scatterOffset: number;
  private readonly bias: number;

  constructor(readonly config: SyntheticCtrConfig) {
    const c = config;
    this.name = `ctr-synthetic-s${c.seed}`;
    this.zipf = new ZipfSampler(c.vocabularyPerSlot, c.zipfExponent);
    this.idSeed = hash2(c.seed, 0x1d5eed);
    this.crossSeed = hash2(c.seed, 0xc105);
    this.denseWeights = Float64Array.from({ length: c.denseDim }, (_, j) => gaussianFromHash(hash3(c.seed, 0xde45e, j)));
    // rank → id bijection a·rank + b mod V with gcd(a, V) = 1; a < 2^21 keeps a·rank exact in doubles
    const v = c.vocabularyPerSlot;
    let a = c.scatterIds && v > 1 ? (hash2(c.seed, 0x5ca7) % Math.min(v, 1 << 21)) | 1 : 1;
    while (gcd(a, v) !== 1) a += 2;
    this.scatterMultiplier = a;
    this.scatterOffset = c.scatterIds ? hash2(c.seed, 0x0ff5e7) % v : 0;
    this.bias = 0;
    this.bias = this.calibrateBias();
  }

  /**
   * The noiseless logit of global sample `index` (with the current bias); when
   * `out` is given, also writes the sample's ids, bag ends and dense features.
   */
  private logitOf(index: number, out: { ids: Int32Array; at: number; bagEnds: Int32Array | null; dense: Float32Array | null; denseAt: number } | null): number {
    const c = this.config;
    const rng = this.rng.reseed(c.seed, index);
    const span = c.maxIdsPerSlot - c.minIdsPerSlot + 1;
    let idPart = 0;
    let firstWeight0 = 0;
    let firstWeight1 = 0;
    for (let s = 0; s < c.slots; s++) {
      const bag = c.minIdsPerSlot + (span > 1 ? rng.int(span) : 0);
      let bagSum = 0;
      for (let k = 0; k < bag; k++) {
        const rank = this.zipf.sample(rng) - 1;
        bagSum += gaussianFromHash(hash3(this.idSeed, s, rank));
        if (k === 0 && s < 2) {
          const cross = gaussianFromHash(hash3(this.crossSeed, s, rank));
          if (s === 0) firstWeight0 = cross; else firstWeight1 = cross;
        }
        if (out !== null) out.ids[out.at++] = s * c.vocabularyPerSlot + (this.scatterMultiplier * rank + this.scatterOffset) % c.vocabularyPerSlot;
      }
      if (bag > 0) idPart += bagSum / Math.sqrt(bag);
      if (out !== null && out.bagEnds !== null) out.bagEnds[s] = out.at;
    }
    let densePart = 0;
    for (let j = 0; j < c.denseDim; j++) {
      const x = rng.normal();
      densePart += x * this.denseWeights[j]!;
      if (out !== null && out.dense !== null) out.dense[out.denseAt + j] = x;
    }
    const logit = this.bias
      + c.idWeightScale * idPart / Math.sqrt(c.slots)
      + (c.denseDim > 0 ? c.denseWeightScale * densePart / Math.sqrt(c.denseDim) : 0)
      + c.interactionScale * firstWeight0 * firstWeight1;
    return logit;
  }

  /** The noise and the label's coin come after the features in the sample's stream. */
  private labelOf(logit: number): number {
    const noisy = logit + this.config.logitNoise * this.rng.normal();
    return this.rng.next() < 1 / (1 + Math.exp(-noisy)) ? 1 : 0;
  }

  private calibrateBias(): number {
    // A fixed probe (sample indices 0..n-1, whatever the split sizes), so a
    // sample's label does not change when trainSize does.
    const n = CALIBRATION_SAMPLES;
    const logits = Float64Array.from({ length: n }, (_, i) => this.logitOf(i, null));
    const noise = this.config.logitNoise;
    // E[sigmoid(z + σε)] ≈ sigmoid(z / sqrt(1 + πσ²/8)); solve mean = positiveRate by bisection on the bias
    const shrink = 1 / Math.sqrt(1 + (Math.PI * noise * noise) / 8);
    const rateAt = (bias: number) => logits.reduce((sum, z) => sum + 1 / (1 + Math.exp(-(z + bias) * shrink)), 0) / n;
    let lo = -50;
    let hi = 50;
    for (let it = 0; it < 100; it++) {
      const mid = (lo + hi) / 2;
      if (rateAt(mid) < this.config.positiveRate) lo = mid; else hi = mid;
    }
    return (lo + hi) / 2;
  }

  private globalIndex(split: 'train' | 'test', index: number): number {
    return split === 'train' ? index : this.config.trainSize + this.config.testOffset + index;
  }

  trueLogit(split: 'train' | 'test', index: number): number {
    return this.logitOf(this.globalIndex(split, index), null);
  }

  describe(): CtrDataDescription {
    const c = this.config;
    const slotRanges: SlotRange[] = Array.from({ length: c.slots }, (_, s) => ({ start: s * c.vocabularyPerSlot, size: c.vocabularyPerSlot }));
    return {
      kind: 'ctr',
      name: this.name,
      seed: c.seed,
      slots: c.slots,
      slotNames: Array.from({ length: c.slots }, (_, s) => `slot${s}`),
      vocabularySize: c.slots * c.vocabularyPerSlot,
      slotRanges,
      denseDim: c.denseDim,
      denseNames: Array.from({ length: c.denseDim }, (_, j) => `dense${j}`),
      trainSize: c.trainSize,
      testSize: c.testSize,
      positiveRate: c.positiveRate,
    };
  }

  countBatches(options: BatchStreamOptions): number {
    const o = resolveStreamOptions(options);
    return countPlannedBatches(splitSize(o.split, this.config), o);
  }

  *batchesSync(options: BatchStreamOptions): IterableIterator<CtrBatch> {
    const o = resolveStreamOptions(options);
    const c = this.config;
    const total = splitSize(o.split, c);
    const S = c.slots;
    for (const plan of planBatches(this.name, total, o, hash2(c.seed, 0x5bf1e))) {
      const size = plan.indices.length;
      const ids = new Int32Array(size * S * c.maxIdsPerSlot);
      const offsets = new Int32Array(size * S + 1);
      const labels = new Float32Array(size);
      const dense = c.denseDim > 0 ? new Float32Array(size * c.denseDim) : null;
      const out = { ids, at: 0, bagEnds: new Int32Array(S), dense, denseAt: 0 };
      for (let b = 0; b < size; b++) {
        out.denseAt = b * c.denseDim;
        const logit = this.logitOf(this.globalIndex(o.split, plan.indices[b]!), out);
        offsets.set(out.bagEnds, b * S + 1);
        labels[b] = this.labelOf(logit);
      }
      yield { kind: 'ctr', batchId: plan.batchId, size, slots: S, offsets, ids: ids.slice(0, out.at), dense, denseDim: c.denseDim, labels };
    }
  }

  batches(options: BatchStreamOptions): AsyncIterableIterator<CtrBatch> {
    return toAsync(this.batchesSync(options));
  }
}

/** A synthetic CTR stream; unspecified fields take `DEFAULT_SYNTHETIC_CTR_CONFIG`. */
export function createSyntheticCtrSource(options: Partial<SyntheticCtrConfig> = {}): SyntheticCtrSource {
  return new SyntheticCtr(resolveConfig(options));
}
