/**
 * Evaluation metrics and softmax helpers over flat arrays (row-major `[B, C]`
 * for per-class values). Computed in float64; inputs may be any numeric array.
 */
import { InvalidTensorError } from '../runtime/errors.ts';

/** Probabilities are clipped to [ε, 1 − ε] so one confident mistake costs a large but finite loss. */
export const DEFAULT_LOG_LOSS_EPSILON = 1e-7;

function assertSameLength(what: string, a: ArrayLike<number>, b: ArrayLike<number>): void {
  if (a.length !== b.length) {
    throw new InvalidTensorError(`${what}: labels have ${a.length} entries, predictions ${b.length}`, { data: { labels: a.length, predictions: b.length } });
  }
}

function assertRows(what: string, values: ArrayLike<number>, numClasses: number, rows: number | null): number {
  if (!Number.isInteger(numClasses) || numClasses < 1) throw new InvalidTensorError(`${what}: numClasses must be a positive integer, got ${numClasses}`);
  if (values.length % numClasses !== 0) throw new InvalidTensorError(`${what}: ${values.length} values are not a multiple of ${numClasses} classes`);
  const n = values.length / numClasses;
  if (rows !== null && rows !== n) throw new InvalidTensorError(`${what}: ${rows} labels for ${n} rows of logits`, { data: { labels: rows, rows: n } });
  return n;
}

function assertClassLabel(what: string, label: number, numClasses: number, index: number): void {
  if (!Number.isInteger(label) || label < 0 || label >= numClasses) {
    throw new InvalidTensorError(`${what}: label ${label} at index ${index} is not a class in [0, ${numClasses})`, { data: { tensor: 'labels', index, value: label } });
  }
}

/** Logistic function, stable for large |z|. */
export function sigmoid(z: number): number {
  if (z >= 0) return 1 / (1 + Math.exp(-z));
  const e = Math.exp(z);
  return e / (1 + e);
}

/**
 * Mean binary cross-entropy −[y log p + (1 − y) log(1 − p)] with p clipped to
 * [ε, 1 − ε]. Labels may be soft (any value in [0, 1]). NaN for empty input.
 */
export function binaryLogLoss(labels: ArrayLike<number>, probabilities: ArrayLike<number>, epsilon = DEFAULT_LOG_LOSS_EPSILON): number {
  assertSameLength('binaryLogLoss', labels, probabilities);
  const n = labels.length;
  let sum = 0;
  for (let i = 0; i < n; i++) {
    const y = labels[i]!;
    let p = probabilities[i]!;
    if (Number.isNaN(p)) throw new InvalidTensorError(`binaryLogLoss: probability at index ${i} is NaN`, { data: { tensor: 'probabilities', index: i } });
    if (p < epsilon) p = epsilon; else if (p > 1 - epsilon) p = 1 - epsilon;
    sum -= y * Math.log(p) + (1 - y) * Math.log(1 - p);
  }
  return sum / n;
}

/**
 * Mean binary cross-entropy from logits, computed as
 * max(z, 0) − z·y + log(1 + e^−|z|), which never overflows and needs no clipping.
 */
export function binaryLogLossFromLogits(labels: ArrayLike<number>, logits: ArrayLike<number>): number {
  assertSameLength('binaryLogLossFromLogits', labels, logits);
  const n = labels.length;
  let sum = 0;
  for (let i = 0; i < n; i++) {
    const z = logits[i]!;
    sum += Math.max(z, 0) - z * labels[i]! + Math.log1p(Math.exp(-Math.abs(z)));
  }
  return sum / n;
}

/**
 * Area under the ROC curve, exact: the Mann–Whitney statistic with tied scores
 * given their average rank (a tie between a positive and a negative counts ½).
 * O(n log n). Labels must be 0 or 1. NaN when only one class is present.
 */
export function auc(labels: ArrayLike<number>, scores: ArrayLike<number>): number {
  assertSameLength('auc', labels, scores);
  const n = labels.length;
  const order = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    const y = labels[i]!;
    if (y !== 0 && y !== 1) throw new InvalidTensorError(`auc: label at index ${i} is ${y}, expected 0 or 1`, { data: { tensor: 'labels', index: i, value: y } });
    if (Number.isNaN(scores[i]!)) throw new InvalidTensorError(`auc: score at index ${i} is NaN`, { data: { tensor: 'scores', index: i } });
    order[i] = i;
  }
  order.sort((a, b) => scores[a]! - scores[b]!);
  let positives = 0;
  let positiveRankSum = 0;
  for (let i = 0; i < n;) {
    const s = scores[order[i]!]!;
    let j = i + 1;
    while (j < n && scores[order[j]!]! === s) j++;
    // ranks i+1 .. j share their mean
    const rank = (i + 1 + j) / 2;
    for (let k = i; k < j; k++) {
      if (labels[order[k]!]! === 1) { positives++; positiveRankSum += rank; }
    }
    i = j;
  }
  const negatives = n - positives;
  if (positives === 0 || negatives === 0) return NaN;
  return (positiveRankSum - (positives * (positives + 1)) / 2) / (positives * negatives);
}

/** Fraction of rows where (score ≥ threshold) matches the 0/1 label. NaN for empty input. */
export function binaryAccuracy(labels: ArrayLike<number>, scores: ArrayLike<number>, threshold = 0.5): number {
  assertSameLength('binaryAccuracy', labels, scores);
  let correct = 0;
  for (let i = 0; i < labels.length; i++) {
    if ((scores[i]! >= threshold ? 1 : 0) === labels[i]!) correct++;
  }
  return correct / labels.length;
}

/** Index of the largest value in each row of `[B, C]` values (first one on ties). */
export function argmaxRows(values: ArrayLike<number>, numClasses: number, dst?: Int32Array): Int32Array {
  const n = assertRows('argmaxRows', values, numClasses, null);
  const out = dst ?? new Int32Array(n);
  if (out.length !== n) throw new InvalidTensorError(`argmaxRows: dst has ${out.length} entries, want ${n}`);
  for (let r = 0; r < n; r++) {
    const base = r * numClasses;
    let best = 0;
    let bestValue = values[base]!;
    for (let c = 1; c < numClasses; c++) {
      const v = values[base + c]!;
      if (v > bestValue) { bestValue = v; best = c; }
    }
    out[r] = best;
  }
  return out;
}

/** Fraction of rows whose argmax over `[B, C]` logits (or probabilities) equals the class label. */
export function multiclassAccuracy(labels: ArrayLike<number>, logits: ArrayLike<number>, numClasses: number): number {
  const n = assertRows('multiclassAccuracy', logits, numClasses, labels.length);
  const predicted = argmaxRows(logits, numClasses);
  let correct = 0;
  for (let i = 0; i < n; i++) {
    assertClassLabel('multiclassAccuracy', labels[i]!, numClasses, i);
    if (predicted[i] === labels[i]) correct++;
  }
  return correct / n;
}

/** Row-wise softmax of `[B, C]` logits (max-subtracted, so large logits are safe). */
export function softmax(logits: ArrayLike<number>, numClasses: number, dst?: Float32Array): Float32Array {
  const n = assertRows('softmax', logits, numClasses, null);
  const out = dst ?? new Float32Array(logits.length);
  if (out.length !== logits.length) throw new InvalidTensorError(`softmax: dst has ${out.length} entries, want ${logits.length}`);
  for (let r = 0; r < n; r++) {
    const base = r * numClasses;
    let max = -Infinity;
    for (let c = 0; c < numClasses; c++) max = Math.max(max, logits[base + c]!);
    let sum = 0;
    for (let c = 0; c < numClasses; c++) sum += Math.exp(logits[base + c]! - max);
    for (let c = 0; c < numClasses; c++) out[base + c] = Math.exp(logits[base + c]! - max) / sum;
  }
  return out;
}

/** log Σ exp over one row, stable. */
function logSumExpRow(logits: ArrayLike<number>, base: number, numClasses: number): number {
  let max = -Infinity;
  for (let c = 0; c < numClasses; c++) max = Math.max(max, logits[base + c]!);
  let sum = 0;
  for (let c = 0; c < numClasses; c++) sum += Math.exp(logits[base + c]! - max);
  return max + Math.log(sum);
}

/** Mean softmax cross-entropy −log softmax(z)[y] over `[B, C]` logits and integer labels. */
export function softmaxCrossEntropy(logits: ArrayLike<number>, labels: ArrayLike<number>, numClasses: number): number {
  const n = assertRows('softmaxCrossEntropy', logits, numClasses, labels.length);
  let sum = 0;
  for (let r = 0; r < n; r++) {
    const y = labels[r]!;
    assertClassLabel('softmaxCrossEntropy', y, numClasses, r);
    const base = r * numClasses;
    sum += logSumExpRow(logits, base, numClasses) - logits[base + y]!;
  }
  return sum / n;
}

/** Gradient of the mean softmax cross-entropy w.r.t. the logits: (softmax(z) − onehot(y)) / B. */
export function softmaxCrossEntropyGradient(logits: ArrayLike<number>, labels: ArrayLike<number>, numClasses: number, dst?: Float32Array): Float32Array {
  const n = assertRows('softmaxCrossEntropyGradient', logits, numClasses, labels.length);
  const out = softmax(logits, numClasses, dst);
  for (let r = 0; r < n; r++) {
    const y = labels[r]!;
    assertClassLabel('softmaxCrossEntropyGradient', y, numClasses, r);
    const base = r * numClasses;
    out[base + y] = out[base + y]! - 1;
    for (let c = 0; c < numClasses; c++) out[base + c] = out[base + c]! / n;
  }
  return out;
}
