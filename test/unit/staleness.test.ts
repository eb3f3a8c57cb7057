import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RecentStaleness, decideStaleness, stalenessScaledLearningRate, stalenessOf } from '../../topology/mod.ts';

test('staleness scales the learning rate by 1/(1+s) and refuses beyond the bound', () => {
  assert.equal(stalenessOf(10, 10), 0);
  assert.equal(stalenessOf(10, 12), 0, 'a push from a newer version than the shard is not negatively stale');
  assert.deepEqual(decideStaleness(10, 10, { maxStaleness: 4, scaling: 'inverse' }), { admit: true, lrScale: 1, sparseLrScale: 1, staleness: 0, dropped: null });
  assert.deepEqual(decideStaleness(13, 10, { maxStaleness: 4, scaling: 'inverse' }), { admit: true, lrScale: 0.25, sparseLrScale: 0.25, staleness: 3, dropped: null });
  assert.deepEqual(decideStaleness(14, 10, { maxStaleness: 4, scaling: 'inverse' }), { admit: true, lrScale: 0.2, sparseLrScale: 0.2, staleness: 4, dropped: null });
  assert.deepEqual(decideStaleness(15, 10, { maxStaleness: 4, scaling: 'inverse' }), { admit: false, lrScale: 0, sparseLrScale: 0, staleness: 5, dropped: null });
  assert.deepEqual(decideStaleness(1000, 10, { maxStaleness: null, scaling: 'none' }), { admit: true, lrScale: 1, sparseLrScale: 1, staleness: 990, dropped: null });
  assert.throws(() => stalenessScaledLearningRate(-1), RangeError);
});

test('a tolerance t applies staleness up to t at full rate and scales beyond it by (1 + t)/(1 + s)', () => {
  assert.equal(stalenessScaledLearningRate(3, 'inverse', 3), 1);
  assert.equal(stalenessScaledLearningRate(7, 'inverse', 3), 0.5);
  assert.equal(stalenessScaledLearningRate(7, 'none', 3), 1);
  assert.deepEqual(decideStaleness(20, 12, { maxStaleness: 10, scaling: 'inverse', tolerance: 3 }), { admit: true, lrScale: 4 / 9, sparseLrScale: 4 / 9, staleness: 8, dropped: null });
  assert.deepEqual(decideStaleness(20, 12, { maxStaleness: 10, scaling: 'inverse', tolerance: 'auto' }, 8), { admit: true, lrScale: 1, sparseLrScale: 1, staleness: 8, dropped: null }, 'auto: the typical staleness given');
  assert.deepEqual(decideStaleness(20, 12, { maxStaleness: 10, scaling: 'inverse', tolerance: 'auto' }), { admit: true, lrScale: 1 / 9, sparseLrScale: 1 / 9, staleness: 8, dropped: null }, 'auto with nothing seen yet: 0');
  assert.equal(decideStaleness(30, 12, { maxStaleness: 10, scaling: 'inverse', tolerance: 100 }).admit, false, 'the tolerance never lifts the refusal bound');
  assert.throws(() => stalenessScaledLearningRate(1, 'inverse', -1), RangeError);
});

test('dense blocks and embedding rows may each have their own tolerance; one refusal bound serves both unless each has its own', () => {
  const policy = { maxStaleness: 10, scaling: 'inverse', tolerance: 0, sparseTolerance: 'auto' } as const;
  assert.deepEqual(decideStaleness(20, 14, policy, 6), { admit: true, lrScale: 1 / 7, sparseLrScale: 1, staleness: 6, dropped: null }, 'rows as stale as usual: full rate; dense: strict');
  assert.deepEqual(decideStaleness(20, 12, policy, 3), { admit: true, lrScale: 1 / 9, sparseLrScale: 4 / 9, staleness: 8, dropped: null });
  assert.deepEqual(decideStaleness(20, 12, { ...policy, tolerance: 'auto', sparseTolerance: 2 }, 8), { admit: true, lrScale: 1, sparseLrScale: 3 / 9, staleness: 8, dropped: null });
  assert.deepEqual(decideStaleness(30, 12, policy, 100), { admit: false, lrScale: 0, sparseLrScale: 0, staleness: 18, dropped: null });
});

test('each kind its own bound: a push beyond the dense bound but within the rows\' has its rows applied and its dense part dropped, and the other way round', () => {
  const policy = { maxStaleness: 4, sparseMaxStaleness: 32, scaling: 'inverse', tolerance: 0, sparseTolerance: 'auto' } as const;
  assert.deepEqual(decideStaleness(14, 10, policy, 2), { admit: true, lrScale: 1 / 5, sparseLrScale: 3 / 5, staleness: 4, dropped: null }, 'at the dense bound: both applied');
  assert.deepEqual(decideStaleness(15, 10, policy, 2), { admit: true, lrScale: 0, sparseLrScale: 3 / 6, staleness: 5, dropped: 'dense' }, 'past it: rows only');
  assert.deepEqual(decideStaleness(42, 10, policy, 2), { admit: true, lrScale: 0, sparseLrScale: 3 / 33, staleness: 32, dropped: 'dense' });
  assert.deepEqual(decideStaleness(43, 10, policy, 2), { admit: false, lrScale: 0, sparseLrScale: 0, staleness: 33, dropped: null }, 'past both: refused');
  // A push that carries only the kind beyond its bound applies nothing, so it is refused.
  assert.deepEqual(decideStaleness(15, 10, policy, 2, { dense: true, sparse: false }), { admit: false, lrScale: 0, sparseLrScale: 0, staleness: 5, dropped: null });
  assert.deepEqual(decideStaleness(15, 10, policy, 2, { dense: false, sparse: true }), { admit: true, lrScale: 0, sparseLrScale: 3 / 6, staleness: 5, dropped: null }, 'no dense part to drop');
  // The other way round, and a null bound never refuses its kind.
  const rowsStrict = { maxStaleness: null, sparseMaxStaleness: 2, scaling: 'inverse' } as const;
  assert.deepEqual(decideStaleness(13, 10, rowsStrict), { admit: true, lrScale: 1 / 4, sparseLrScale: 0, staleness: 3, dropped: 'sparse' });
  assert.deepEqual(decideStaleness(1000, 10, rowsStrict, 0, { dense: false, sparse: true }).admit, false);
  assert.deepEqual(decideStaleness(1000, 10, { maxStaleness: 2, sparseMaxStaleness: null, scaling: 'inverse' }).dropped, 'dense');
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
