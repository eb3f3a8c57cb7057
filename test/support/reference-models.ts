/**
 * Plain-TypeScript float64 forward passes of the native-bridge models, to
 * check the ONNX graphs against. Slow and obvious on purpose.
 */
import type { CtrModel, MlpModel } from '../../native-bridge/mod.ts';
import type { HostTensor } from '../../native-bridge/native.ts';

export interface ReferenceForward {
  readonly loss: number;
  readonly predictions: Float64Array;
  /** One char per hidden pre-activation: '1' if > 0. Equal signatures = same ReLU branch everywhere. */
  readonly reluSignature: string;
}

type Feeds = Readonly<Record<string, HostTensor>>;

function get(feeds: Feeds, name: string): HostTensor {
  const t = feeds[name];
  if (t === undefined) throw new Error(`reference: missing ${name}`);
  return t;
}
const num = (feeds: Feeds, name: string) => get(feeds, name).data as Float32Array | Int32Array;

/** Dense layers with ReLU between them; returns the last layer's output [B, out]. */
function tower(
  input: Float64Array, batch: number, widths: readonly number[],
  weight: (i: number) => Float32Array, bias: (i: number) => Float32Array | null, sig: string[],
): Float64Array {
  let h = input;
  for (let l = 1; l < widths.length; l++) {
    const nIn = widths[l - 1]!; const nOut = widths[l]!;
    const W = weight(l); const b = bias(l);
    const z = new Float64Array(batch * nOut);
    for (let r = 0; r < batch; r++) {
      for (let o = 0; o < nOut; o++) {
        let acc = b === null ? 0 : b[o]!;
        for (let k = 0; k < nIn; k++) acc += h[r * nIn + k]! * W[k * nOut + o]!;
        z[r * nOut + o] = acc;
      }
    }
    if (l < widths.length - 1) {
      for (let i = 0; i < z.length; i++) { sig.push(z[i]! > 0 ? '1' : '0'); z[i] = Math.max(0, z[i]!); }
    }
    h = z;
  }
  return h;
}

export function mlpReference(model: MlpModel, feeds: Feeds): ReferenceForward {
  const widths = model.config.layers;
  const x = get(feeds, 'x');
  const B = x.dims[0]!; const C = model.classes;
  const sig: string[] = [];
  const logits = tower(Float64Array.from(x.data as Float32Array), B, widths,
    (i) => num(feeds, `W${i}`) as Float32Array, (i) => num(feeds, `b${i}`) as Float32Array, sig);
  const labels = feeds['labels'] === undefined ? null : num(feeds, 'labels');
  const probs = new Float64Array(B * C);
  let loss = 0;
  for (let r = 0; r < B; r++) {
    let m = -Infinity;
    for (let c = 0; c < C; c++) m = Math.max(m, logits[r * C + c]!);
    let s = 0;
    for (let c = 0; c < C; c++) s += Math.exp(logits[r * C + c]! - m);
    const lse = m + Math.log(s);
    for (let c = 0; c < C; c++) probs[r * C + c] = Math.exp(logits[r * C + c]! - lse);
    if (labels !== null) loss += lse - logits[r * C + labels[r]!]!;
  }
  return { loss: loss / B, predictions: probs, reluSignature: sig.join('') };
}

export function ctrReference(model: CtrModel, feeds: Feeds): ReferenceForward {
  const { slots: S, embeddingDim: D, denseFeatures: F, hidden, pooling } = model.config;
  const counts = num(feeds, 'bag_counts'); const rows = num(feeds, 'bag_rows');
  const emb = num(feeds, 'emb_rows'); const wide = num(feeds, 'wide_rows');
  const B = get(feeds, 'bag_counts').dims[0]!;
  const width = model.deepInputWidth;
  const deepIn = new Float64Array(B * width);
  const wideSum = new Float64Array(B);
  let id = 0;
  for (let b = 0; b < B; b++) {
    for (let s = 0; s < S; s++) {
      const n = counts[b * S + s]!;
      for (let j = 0; j < n; j++, id++) {
        const row = rows[id]!;
        for (let d = 0; d < D; d++) deepIn[b * width + s * D + d]! += emb[row * D + d]! / (pooling === 'mean' ? n : 1);
        wideSum[b]! += wide[row]!;
      }
    }
    for (let f = 0; f < F; f++) deepIn[b * width + S * D + f] = num(feeds, 'dense_features')[b * F + f]!;
  }
  const sig: string[] = [];
  const depth = hidden.length + 1;
  const deep = tower(deepIn, B, [width, ...hidden, 1],
    (i) => num(feeds, `W${i}`) as Float32Array, (i) => (i < depth ? num(feeds, `b${i}`) as Float32Array : null), sig);
  const bias = num(feeds, 'bias')[0]!;
  const labels = feeds['labels'] === undefined ? null : num(feeds, 'labels');
  const predictions = new Float64Array(B);
  let loss = 0;
  for (let b = 0; b < B; b++) {
    const x = deep[b]! + wideSum[b]! + bias;
    predictions[b] = 1 / (1 + Math.exp(-x));
    if (labels !== null) loss += Math.max(x, 0) - x * labels[b]! + Math.log1p(Math.exp(-Math.abs(x)));
  }
  return { loss: loss / B, predictions, reluSignature: sig.join('') };
}
