import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decideStaleness, stalenessScaledLearningRate, stalenessOf } from '../../topology/mod.ts';

test('staleness scales the learning rate by 1/(1+s) and refuses beyond the bound', () => {
  assert.equal(stalenessOf(10, 10), 0);
  assert.equal(stalenessOf(10, 12), 0, 'a push from a newer version than the shard is not negatively stale');
  assert.deepEqual(decideStaleness(10, 10, { maxStaleness: 4, scaling: 'inverse' }), { admit: true, lrScale: 1, staleness: 0 });
  assert.deepEqual(decideStaleness(13, 10, { maxStaleness: 4, scaling: 'inverse' }), { admit: true, lrScale: 0.25, staleness: 3 });
  assert.deepEqual(decideStaleness(14, 10, { maxStaleness: 4, scaling: 'inverse' }), { admit: true, lrScale: 0.2, staleness: 4 });
  assert.deepEqual(decideStaleness(15, 10, { maxStaleness: 4, scaling: 'inverse' }), { admit: false, lrScale: 0, staleness: 5 });
  assert.deepEqual(decideStaleness(1000, 10, { maxStaleness: null, scaling: 'none' }), { admit: true, lrScale: 1, staleness: 990 });
  assert.throws(() => stalenessScaledLearningRate(-1), RangeError);
});
