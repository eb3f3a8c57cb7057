/**
 * Synthetic classification data for the MLP: `featureDim`-dimensional inputs
 * (1024 by default), `numClasses` classes (10).
 *
 * Each class is a mixture of `clustersPerClass` Gaussian clusters whose
 * centres lie in a random `latentDim`-dimensional subspace of the input
 * space; inputs are the latent point mapped into the input space plus
 * isotropic noise. Classes made of several clusters are not linearly
 * separable in general, so the hidden layers have work to do, while the
 * Bayes-optimal accuracy stays high (≈ 99 % with the defaults), leaving room
 * for a 1024→512→256→10 MLP to reach ≥ 95 %.
 *
 * Only the subspace basis and the cluster centres are stored (featureDim ×
 * latentDim floats); sample i is a function of (seed, i). Train is sample
 * indices [0, trainSize), test is [trainSize + testOffset, trainSize +
 * testOffset + testSize) (`testOffset`: a held-out set disjoint from the
 * test split of a run with offset 0, for tuning).
 */
import { ConfigError } from '../../runtime/errors.ts';
import type { BatchStreamOptions, MlpBatch, MlpDataDescription, MlpDataSource } from './batch.ts';
import { countPlannedBatches, splitSize, hash2, planBatches, resolveStreamOptions, SampleRandom, toAsync } from './stream.ts';

export interface SyntheticMlpConfig {
  seed: number;
  featureDim: number;
  numClasses: number;
  /** Dimension of the subspace holding the cluster centres. */
  latentDim: number;
  clustersPerClass: number;
  /** Std of the cluster centres' coordinates in the latent space (in units of latentNoise's scale). */
  classSeparation: number;
  /** Std of a sample around its cluster centre, in the latent space. */
  latentNoise: number;
  /** Std of isotropic noise added to each input feature (features have ≈ unit signal variance). */
  featureNoise: number;
  trainSize: number;
  testSize: number;
  /** Held-out samples start this many after the training ones (0: right after). */
  testOffset: number;
}

export const DEFAULT_SYNTHETIC_MLP_CONFIG: SyntheticMlpConfig = {
  seed: 0,
  featureDim: 1024,
  numClasses: 10,
  latentDim: 16,
  clustersPerClass: 2,
  classSeparation: 1.5,
  latentNoise: 1,
  featureNoise: 1,
  trainSize: 60_000,
  testSize: 10_000,
  testOffset: 0,
};

function configFail(field: string, rule: string, value: unknown): never {
  throw new ConfigError(`data.${field} must be ${rule}, got ${JSON.stringify(value)}`, { data: { field: `data.${field}`, value: value as never } });
}

function resolveConfig(options: Partial<SyntheticMlpConfig>): SyntheticMlpConfig {
  const c = { ...DEFAULT_SYNTHETIC_MLP_CONFIG, ...options };
  const int = (field: keyof SyntheticMlpConfig, lo: number, hi: number) => {
    const v = c[field];
    if (typeof v !== 'number' || !Number.isInteger(v) || v < lo || v > hi) configFail(field, `an integer in [${lo}, ${hi}]`, v);
  };
  const real = (field: keyof SyntheticMlpConfig) => {
    const v = c[field];
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) configFail(field, 'a number ≥ 0', v);
  };
  int('seed', 0, 0xffffffff);
  int('featureDim', 1, 1 << 20);
  int('numClasses', 2, 1 << 16);
  int('latentDim', 1, c.featureDim);
  int('clustersPerClass', 1, 1024);
  int('trainSize', 0, 2 ** 52);
  int('testSize', 0, 2 ** 52);
  int('testOffset', 0, 2 ** 52);
  real('classSeparation');
  real('latentNoise');
  real('featureNoise');
  return c;
}

/** Seeds of the stored structure, far from any sample index. */
const BASIS_STREAM = 0x1000_0001;
const CENTRE_STREAM = 0x1000_0002;

export interface SyntheticMlpSource extends MlpDataSource {
  readonly config: SyntheticMlpConfig;
  /**
   * Class of the nearest cluster centre (mapped into the input space) to each
   * row of `features`: a near-Bayes-optimal reference classifier for tests.
   */
  nearestCentreClass(features: Float32Array): Int32Array;
}

class SyntheticMlp implements SyntheticMlpSource {
  private readonly name: string;
  private readonly rng = new SampleRandom();
  /** `[featureDim, latentDim]`, scaled so each feature's signal has unit variance. */
  private readonly basis: Float32Array;
  /** `[numClasses · clustersPerClass, latentDim]` */
  private readonly centres: Float32Array;
  private readonly latent: Float64Array;

  constructor(readonly config: SyntheticMlpConfig) {
    const c = config;
    this.name = `mlp-synthetic-s${c.seed}`;
    const structure = new SampleRandom();
    const scale = 1 / Math.sqrt(c.latentDim * (c.classSeparation ** 2 + c.latentNoise ** 2) || 1);
    structure.reseed(hash2(c.seed, BASIS_STREAM), 0);
    this.basis = Float32Array.from({ length: c.featureDim * c.latentDim }, () => structure.normal() * scale);
    structure.reseed(hash2(c.seed, CENTRE_STREAM), 0);
    this.centres = Float32Array.from({ length: c.numClasses * c.clustersPerClass * c.latentDim }, () => structure.normal() * c.classSeparation);
    this.latent = new Float64Array(c.latentDim);
  }

  /** Writes sample `index` (global) into `features` at `at`; returns its class. */
  private sample(index: number, features: Float32Array, at: number): number {
    const c = this.config;
    const rng = this.rng.reseed(c.seed, index);
    const label = rng.int(c.numClasses);
    const cluster = label * c.clustersPerClass + rng.int(c.clustersPerClass);
    const L = c.latentDim;
    const z = this.latent;
    for (let j = 0; j < L; j++) z[j] = this.centres[cluster * L + j]! + c.latentNoise * rng.normal();
    const basis = this.basis;
    for (let i = 0; i < c.featureDim; i++) {
      let x = 0;
      const row = i * L;
      for (let j = 0; j < L; j++) x += basis[row + j]! * z[j]!;
      features[at + i] = x + c.featureNoise * rng.normal();
    }
    return label;
  }

  nearestCentreClass(features: Float32Array): Int32Array {
    const c = this.config;
    const F = c.featureDim;
    const L = c.latentDim;
    const clusters = c.numClasses * c.clustersPerClass;
    const mapped = new Float64Array(clusters * F);
    for (let k = 0; k < clusters; k++) {
      for (let i = 0; i < F; i++) {
        let x = 0;
        for (let j = 0; j < L; j++) x += this.basis[i * L + j]! * this.centres[k * L + j]!;
        mapped[k * F + i] = x;
      }
    }
    const n = features.length / F;
    const out = new Int32Array(n);
    for (let r = 0; r < n; r++) {
      let best = 0;
      let bestDistance = Infinity;
      for (let k = 0; k < clusters; k++) {
        let d = 0;
        for (let i = 0; i < F; i++) { const e = features[r * F + i]! - mapped[k * F + i]!; d += e * e; }
        if (d < bestDistance) { bestDistance = d; best = k; }
      }
      out[r] = Math.floor(best / c.clustersPerClass);
    }
    return out;
  }

  describe(): MlpDataDescription {
    const c = this.config;
    return { kind: 'mlp', name: this.name, seed: c.seed, featureDim: c.featureDim, numClasses: c.numClasses, trainSize: c.trainSize, testSize: c.testSize };
  }

  countBatches(options: BatchStreamOptions): number {
    const o = resolveStreamOptions(options);
    return countPlannedBatches(splitSize(o.split, this.config), o);
  }

  *batchesSync(options: BatchStreamOptions): IterableIterator<MlpBatch> {
    const o = resolveStreamOptions(options);
    const c = this.config;
    const total = splitSize(o.split, c);
    const offset = o.split === 'train' ? 0 : c.trainSize + c.testOffset;
    for (const plan of planBatches(this.name, total, o, hash2(c.seed, 0x3a7c4))) {
      const size = plan.indices.length;
      const features = new Float32Array(size * c.featureDim);
      const labels = new Int32Array(size);
      for (let b = 0; b < size; b++) labels[b] = this.sample(offset + plan.indices[b]!, features, b * c.featureDim);
      yield { kind: 'mlp', batchId: plan.batchId, size, features, featureDim: c.featureDim, labels };
    }
  }

  batches(options: BatchStreamOptions): AsyncIterableIterator<MlpBatch> {
    return toAsync(this.batchesSync(options));
  }
}

/** A synthetic classification stream; unspecified fields take `DEFAULT_SYNTHETIC_MLP_CONFIG`. */
export function createSyntheticMlpSource(options: Partial<SyntheticMlpConfig> = {}): SyntheticMlpSource {
  return new SyntheticMlp(resolveConfig(options));
}
