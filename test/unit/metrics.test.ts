import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  argmaxRows, auc, binaryAccuracy, binaryLogLoss, binaryLogLossFromLogits, multiclassAccuracy,
  sigmoid, softmax, softmaxCrossEntropy, softmaxCrossEntropyGradient,
} from '../../native-bridge/metrics.ts';
import { InvalidTensorError } from '../../runtime/errors.ts';

const close = (a: number, b: number, tol = 1e-9, msg?: string) => assert.ok(Math.abs(a - b) <= tol, msg ?? `${a} vs ${b}`);

test('binary log loss matches hand computation and clips confident mistakes', () => {
  close(binaryLogLoss([1, 0], [0.8, 0.3]), (-Math.log(0.8) - Math.log(0.7)) / 2);
  close(binaryLogLoss([0.25], [0.5]), Math.log(2)); // soft label
  close(binaryLogLoss([1], [0]), -Math.log(1e-7)); // clipped, finite
  close(binaryLogLoss([0], [1]), -Math.log(1e-7));
  close(binaryLogLoss([1], [0], 1e-3), -Math.log(1e-3));
  assert.ok(binaryLogLoss([1], [1]) < 1e-6);
  assert.throws(() => binaryLogLoss([1, 0], [0.5]), InvalidTensorError);
  assert.throws(() => binaryLogLoss([1], [NaN]), InvalidTensorError);
});

test('log loss from logits equals log loss of the sigmoid and survives huge logits', () => {
  const labels = [1, 0, 1, 0, 1];
  const logits = [2.5, -1, 0, 3, -4];
  close(binaryLogLossFromLogits(labels, logits), binaryLogLoss(labels, logits.map(sigmoid), 0), 1e-12);
  close(binaryLogLossFromLogits([1, 0], [-1000, 1000]), 1000);
  close(sigmoid(-800), 0);
  close(sigmoid(0), 0.5);
});

test('AUC: textbook example, ties counted as one half, single class gives NaN', () => {
  close(auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]), 0.75);
  // positives {0.5, 0.9}, negatives {0.5, 0.1}: pairs 0.5 + 1 + 1 + 1 out of 4
  close(auc([1, 0, 1, 0], [0.5, 0.5, 0.9, 0.1]), 0.875);
  close(auc([1, 0, 1, 0], [0.3, 0.3, 0.3, 0.3]), 0.5);
  close(auc([1, 1, 0], [0.1, 0.2, 0.9]), 0);
  assert.ok(Number.isNaN(auc([1, 1], [0.2, 0.4])));
  assert.throws(() => auc([1, 2], [0.2, 0.4]), InvalidTensorError);
  assert.throws(() => auc([1, 0], [NaN, 0.4]), InvalidTensorError);
});

test('AUC equals the pairwise definition on data with many ties', () => {
  let s = 99;
  const rnd = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296);
  const n = 600;
  const labels = new Float32Array(n);
  const scores = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    labels[i] = rnd() < 0.3 ? 1 : 0;
    scores[i] = Math.floor((rnd() + labels[i]! * 0.3) * 10) / 10; // coarse → ties
  }
  let wins = 0;
  let pairs = 0;
  for (let i = 0; i < n; i++) {
    if (labels[i] !== 1) continue;
    for (let j = 0; j < n; j++) {
      if (labels[j] !== 0) continue;
      pairs++;
      wins += scores[i]! > scores[j]! ? 1 : scores[i] === scores[j] ? 0.5 : 0;
    }
  }
  close(auc(labels, scores), wins / pairs, 1e-12);
});

test('accuracy: binary threshold and multiclass argmax', () => {
  close(binaryAccuracy([1, 0, 1, 0], [0.9, 0.2, 0.4, 0.5]), 0.5);
  close(binaryAccuracy([1, 0], [0.3, 0.1], 0.25), 1);
  const logits = [0.1, 2, 0.3, /**/ 5, 1, 1, /**/ 0, 0, 0];
  assert.deepEqual([...argmaxRows(logits, 3)], [1, 0, 0]);
  close(multiclassAccuracy([1, 2, 0], logits, 3), 2 / 3);
  assert.throws(() => multiclassAccuracy([1, 3, 0], logits, 3), InvalidTensorError);
  assert.throws(() => multiclassAccuracy([1, 2], logits, 3), InvalidTensorError);
});

test('softmax cross-entropy and its gradient match hand computation', () => {
  const logits = [1, 2, 3, /**/ 1000, 0, -1000];
  const labels = [2, 0];
  const ce0 = Math.log(Math.exp(1) + Math.exp(2) + Math.exp(3)) - 3;
  close(softmaxCrossEntropy(logits, labels, 3), (ce0 + 0) / 2, 1e-12);
  const p = softmax(logits, 3);
  const z = Math.exp(1) + Math.exp(2) + Math.exp(3);
  close(p[0]!, Math.exp(1) / z, 1e-7);
  close(p[2]!, Math.exp(3) / z, 1e-7);
  close(p[3]!, 1);
  close(p[5]!, 0);
  const g = softmaxCrossEntropyGradient(logits, labels, 3);
  close(g[0]!, Math.exp(1) / z / 2, 1e-7);
  close(g[2]!, (Math.exp(3) / z - 1) / 2, 1e-7);
  close(g[3]!, 0, 1e-7);
  // each row of the gradient sums to zero
  close(g[0]! + g[1]! + g[2]!, 0, 1e-7);
  assert.throws(() => softmaxCrossEntropy([1, 2, 3], [0, 1], 3), InvalidTensorError);
});
