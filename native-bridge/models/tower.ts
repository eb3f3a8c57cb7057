/**
 * Graph fragments shared by the models: a ReLU tower of dense layers with its
 * hand-written backward pass, and a few shape helpers.
 */
import { InvalidTensorError } from '../../runtime/errors.ts';
import type { DenseParamSpec } from '../native.ts';
import type { GraphBuilder } from '../onnx-builder.ts';

/** `[1]` int64 holding dimension `axis` of `value` (Shape with start/end, opset 15+). */
export function dimOf(g: GraphBuilder, value: string, axis: number): string {
  return g.op('Shape', [value], { start: axis, end: axis + 1 });
}

/** `[1]` float32 holding 1 / (dimension `axis` of `value`), for mean-over-batch gradients. */
export function inverseDimOf(g: GraphBuilder, value: string, axis: number): string {
  return g.op('Reciprocal', [g.op('Cast', [dimOf(g, value, axis)], { to: 1 })]);
}

export interface TowerLayer {
  readonly weight: string;
  /** null: the layer has no bias (the CTR output layer, whose bias is the global one). */
  readonly bias: string | null;
}

export interface TowerForward {
  /** Inputs of each layer (h0 = tower input, h1 .. h_{L-1} ReLU outputs). */
  readonly layerInputs: readonly string[];
  /** Output of the last layer, before any activation. */
  readonly out: string;
}

/** Dense layers `z = h·W + b`, ReLU between them, none after the last. Weights are [in, out]. */
export function towerForward(g: GraphBuilder, input: string, layers: readonly TowerLayer[]): TowerForward {
  const layerInputs: string[] = [];
  let h = input;
  layers.forEach((layer, i) => {
    layerInputs.push(h);
    // Gemm maps straight onto one MLAS sgemm with the bias folded in.
    const z = g.op('Gemm', layer.bias === null ? [h, layer.weight] : [h, layer.weight, layer.bias]);
    h = i === layers.length - 1 ? z : g.op('Relu', [z]);
  });
  return { layerInputs, out: h };
}

/**
 * Backward through the tower from dL/d(out). Writes each layer's gradients
 * under the names in `grads` and returns, when asked, dL/dz of the first
 * layer so the caller can push the gradient into the tower input.
 *
 * Per layer: dW = hᵀ·dz (Gemm transA), db = Σ_batch dz, dh = dz·Wᵀ (Gemm
 * transB), and ReLU's gradient masks dh where the forward output was 0. The
 * transposes are Gemm flags, so MLAS reads the operands in place: no
 * Transpose node, no copy.
 */
export function towerBackward(
  g: GraphBuilder,
  forward: TowerForward,
  layers: readonly TowerLayer[],
  dOut: string,
  grads: readonly { weight: string; bias: string | null }[],
): { dzFirst: string } {
  let dz = dOut;
  for (let i = layers.length - 1; i >= 0; i--) {
    const h = forward.layerInputs[i]!;
    const names = grads[i]!;
    g.op('Gemm', [h, dz], { transA: 1 }, names.weight);
    if (names.bias !== null) g.op('ReduceSum', [dz, g.constI64([0])], { keepdims: 0 }, names.bias);
    if (i === 0) break;
    const dh = g.op('Gemm', [dz, layers[i]!.weight], { transB: 1 });
    const zero = g.constF32([0], []);
    dz = g.op('Where', [g.op('Greater', [h, zero]), dh, zero]);
  }
  return { dzFirst: dz };
}

/** The spec of a dense parameter with the repo-wide gradient naming (`<name>_grad`). */
export function denseParam(name: string, dims: readonly number[]): DenseParamSpec {
  return { name, dims, gradName: `${name}_grad` };
}

/** A trained dense parameter for an exported graph, checked against its spec. */
export function exportedParam(dense: ReadonlyMap<string, Float32Array>, p: DenseParamSpec): Float32Array {
  const v = dense.get(p.name);
  const size = p.dims.reduce((a, b) => a * b, 1);
  if (v === undefined) throw new InvalidTensorError(`export: dense parameter ${p.name} is missing`, { data: { tensor: p.name } });
  if (v.length !== size) throw new InvalidTensorError(`export: dense parameter ${p.name} has ${v.length} values, the model ${size} (${p.dims.join('×')})`, { data: { tensor: p.name, expected: size, actual: v.length } });
  return v;
}
