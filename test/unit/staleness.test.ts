import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RecentStaleness, decideStaleness, stalenessScaledLearningRate, stalenessOf } from '../../topology/mod.ts';

test('staleness scales the learning rate by 1/(1+s) and refuses beyond the bound', () => {
  assert.equal(stalenessOf(10, 10), 0);
  assert.equal(stalenessOf(10, 12), 0, 'a push from a newer version than the shard is not negatively stale');
  assert.deepEqual(decideStaleness(10, 10, { maxStaleness: 4, scaling: 'inverse' }), { admit: true, lrScale: 1, sparseLrScale: 1, staleness: 0 });
  assert.deepEqual(decideStaleness(13, 10, { maxStaleness: 4, scaling: 'inverse' }), { admit: true, lrScale: 0.25, sparseLrScale: 0.25, staleness: 3 });
  assert.deepEqual(decideStaleness(14, 10, { maxStaleness: 4, scaling: 'inverse' }), { admit: true, lrScale: 0.2, sparseLrScale: 0.2, staleness: 4 });
  assert.deepEqual(decideStaleness(15, 10, { maxStaleness: 4, scaling: 'inverse' }), { admit: false, lrScale: 0, sparseLrScale: 0, staleness: 5 });
  assert.deepEqual(decideStaleness(1000, 10, { maxStaleness: null, scaling: 'none' }), { admit: true, lrScale: 1, sparseLrScale: 1, staleness: 990 });
  assert.throws(() => stalenessScaledLearningRate(-1), RangeError);
});

test('a tolerance t applies staleness up to t at full rate and scales beyond it by (1 + t)/(1 + s)', () => {
  assert.equal(stalenessScaledLearningRate(3, 'inverse', 3), 1);
  assert.equal(stalenessScaledLearningRate(7, 'inverse', 3), 0.5);
  assert.equal(stalenessScaledLearningRate(7, 'none', 3), 1);
  assert.deepEqual(decideStaleness(20, 12, { maxStaleness: 10, scaling: 'inverse', tolerance: 3 }), { admit: true, lrScale: 4 / 9, sparseLrScale: 4 / 9, staleness: 8 });
  assert.deepEqual(decideStaleness(20, 12, { maxStaleness: 10, scaling: 'inverse', tolerance: 'auto' }, 8), { admit: true, lrScale: 1, sparseLrScale: 1, staleness: 8 }, 'auto: the typical staleness given');
  assert.deepEqual(decideStaleness(20, 12, { maxStaleness: 10, scaling: 'inverse', tolerance: 'auto' }), { admit: true, lrScale: 1 / 9, sparseLrScale: 1 / 9, staleness: 8 }, 'auto with nothing seen yet: 0');
  assert.equal(decideStaleness(30, 12, { maxStaleness: 10, scaling: 'inverse', tolerance: 100 }).admit, false, 'the tolerance never lifts the refusal bound');
  assert.throws(() => stalenessScaledLearningRate(1, 'inverse', -1), RangeError);
});

test('dense blocks and embedding rows may each have their own tolerance; the refusal bound is shared', () => {
  const policy = { maxStaleness: 10, scaling: 'inverse', tolerance: 0, sparseTolerance: 'auto' } as const;
  assert.deepEqual(decideStaleness(20, 14, policy, 6), { admit: true, lrScale: 1 / 7, sparseLrScale: 1, staleness: 6 }, 'rows as stale as usual: full rate; dense: strict');
  assert.deepEqual(decideStaleness(20, 12, policy, 3), { admit: true, lrScale: 1 / 9, sparseLrScale: 4 / 9, staleness: 8 });
  assert.deepEqual(decideStaleness(20, 12, { ...policy, tolerance: 'auto', sparseTolerance: 2 }, 8), { admit: true, lrScale: 1, sparseLrScale: 3 / 9, staleness: 8 });
  assert.deepEqual(decideStaleness(30, 12, policy, 100), { admit: false, lrScale: 0, sparseLrScale: 0, staleness: 18 });
});

test('RecentStaleness: the lower median of the last N values', () => {
  const r = new RecentStaleness(4);
  assert.equal(r.median(), 0);
  for (const s of [9, 1, 5]) r.add(s);
  assert.equal(r.median(), 5);
  for (const s of [2, 2, 2]) r.add(s); // the last four are 5, 2, 2, 2
  assert.equal(r.median(), 2);
  assert.throws(() => new RecentStaleness(0), RangeError);
});
