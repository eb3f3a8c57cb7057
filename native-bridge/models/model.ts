import { SeededRandom } from '../../runtime/random.ts';
import type { DenseParamSpec, GraphKind, ModelGraph, StepFeeds } from '../native.ts';

/** What a session needs from a model: its graphs, its dense parameters and its own feed checks. */
export interface Model {
  /** Model family: `mlp` or `ctr`. */
  readonly family: string;
  /** Dense parameters in gradient-output order. */
  readonly denseParams: readonly DenseParamSpec[];
  /** The serialized graph of one kind (built once, cached). */
  graph(kind: GraphKind): ModelGraph;
  /**
   * Checks what shapes cannot: index ranges, label ranges, bag counts.
   * Throws InvalidTensorError naming the input.
   */
  checkFeeds(feeds: StepFeeds, kind: GraphKind): void;
}

/**
 * He-normal weights (std √(2/fan_in)), zero biases, seeded. Every parameter
 * with rank 2 is a weight [in, out]; everything else starts at 0.
 */
export function initDenseParams(model: Model, seed: number): Map<string, Float32Array> {
  const rng = new SeededRandom(seed);
  const out = new Map<string, Float32Array>();
  for (const p of model.denseParams) {
    const size = p.dims.reduce((a, b) => a * b, 1);
    const data = new Float32Array(size);
    if (p.dims.length === 2) {
      const std = Math.sqrt(2 / p.dims[0]!);
      for (let i = 0; i < size; i++) data[i] = rng.normal() * std;
    }
    out.set(p.name, data);
  }
  return out;
}

export function product(dims: readonly number[]): number {
  return dims.reduce((a, b) => a * b, 1);
}
