/**
 * Random, well-formed feeds for the step graphs: for tests, benchmarks and
 * `hetps profile`. Not a data pipeline.
 */
import { SeededRandom } from '../../runtime/random.ts';
import { f32, i32, type HostTensor } from '../native.ts';
import type { CtrModel } from './ctr.ts';
import type { MlpModel } from './mlp.ts';

function denseFeeds(params: ReadonlyMap<string, Float32Array>, specs: readonly { name: string; dims: readonly number[] }[]): Record<string, HostTensor> {
  const out: Record<string, HostTensor> = {};
  for (const p of specs) {
    const data = params.get(p.name);
    if (data === undefined) throw new Error(`no value for dense parameter ${p.name}`);
    out[p.name] = f32(data, p.dims);
  }
  return out;
}

export function syntheticMlpFeeds(model: MlpModel, params: ReadonlyMap<string, Float32Array>, batch: number, seed: number): Record<string, HostTensor> {
  const rng = new SeededRandom(seed);
  const x = Float32Array.from({ length: batch * model.inputWidth }, () => rng.normal());
  const labels = Int32Array.from({ length: batch }, () => rng.int(model.classes));
  return { ...denseFeeds(params, model.denseParams), x: f32(x, [batch, model.inputWidth]), labels: i32(labels, [batch]) };
}

export interface SyntheticCtrShape {
  readonly batch: number;
  /** Distinct gathered rows U; ids are drawn from them, so rows repeat across samples and slots. */
  readonly uniqueRows: number;
  /** Bag sizes are uniform in [0, 2·meanBagSize] (or [1, …] when emptyBags is false). */
  readonly meanBagSize: number;
  readonly emptyBags: boolean;
}

export function syntheticCtrFeeds(
  model: CtrModel, params: ReadonlyMap<string, Float32Array>, shape: SyntheticCtrShape, seed: number,
): Record<string, HostTensor> {
  const rng = new SeededRandom(seed);
  const { slots: S, embeddingDim: D, denseFeatures: F } = model.config;
  const { batch: B, uniqueRows: U } = shape;
  const counts = new Int32Array(B * S);
  const lo = shape.emptyBags ? 0 : 1;
  for (let i = 0; i < counts.length; i++) counts[i] = lo + rng.int(Math.max(1, 2 * shape.meanBagSize - lo + 1));
  const n = counts.reduce((a, b) => a + b, 0);
  const rows = Int32Array.from({ length: n }, () => rng.int(U));
  const feeds: Record<string, HostTensor> = {
    ...denseFeeds(params, model.denseParams),
    emb_rows: f32(Float32Array.from({ length: U * D }, () => 0.1 * rng.normal()), [U, D]),
    wide_rows: f32(Float32Array.from({ length: U }, () => 0.1 * rng.normal()), [U, 1]),
    bag_rows: i32(rows, [n]),
    bag_counts: i32(counts, [B, S]),
    labels: f32(Float32Array.from({ length: B }, () => (rng.next() < 0.3 ? 1 : 0)), [B]),
  };
  if (F > 0) feeds['dense_features'] = f32(Float32Array.from({ length: B * F }, () => rng.normal()), [B, F]);
  return feeds;
}
