/**
 * The benchmarks' statistics: a run that never reaches the target counts as
 * infinitely slow in the median of time to target, not as absent.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { median, stat, targetStat } from '../../bench/stats.ts';

test('median: odd and even counts, none', () => {
  assert.equal(median([3, 1, 2]), 2);
  assert.equal(median([4, 1, 3, 2]), 2.5);
  assert.equal(median([]), null);
});

test('stat: median and range of the finite values only', () => {
  assert.deepEqual(stat([2, null, 1, Number.NaN, 3], 2), { median: 2, min: 1, max: 3, n: 3 });
  assert.deepEqual(stat([null], 2), { median: null, min: null, max: null, n: 0 });
});

test('targetStat: every run reached the target', () => {
  assert.deepEqual(targetStat([52.82, 51.05, 53.63], 2), { median: 52.82, min: 51.05, max: 53.63, n: 3, reached: 3 });
});

test('targetStat: one run of three did not reach it, the median is the slower of the two that did', () => {
  assert.deepEqual(targetStat([null, 36.38, 37.99], 2), { median: 37.99, min: 36.38, max: null, n: 3, reached: 2 });
});

test('targetStat: two runs of three did not reach it, the median run did not either', () => {
  assert.deepEqual(targetStat([null, null, 34.69], 2), { median: null, min: 34.69, max: null, n: 3, reached: 1 });
  assert.deepEqual(targetStat([null, null], 2), { median: null, min: null, max: null, n: 2, reached: 0 });
  assert.deepEqual(targetStat([], 2), { median: null, min: null, max: null, n: 0, reached: 0 });
});
