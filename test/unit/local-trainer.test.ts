import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  bucketCtrIds, buildCtrFeeds, buildMlpFeeds, checkFeedShapes, createDenseParameters, createOptimizer, createSyntheticCtrSource,
  createSyntheticMlpSource, ctrBagIndex, ctrModel, gatherCtrRows, hashedBagOfIds, headOfBatch, LocalTrainer, mlpModel, SparseTable,
  streamOptions, type CtrBatch, type MlpBatch,
} from '../../native-bridge/mod.ts';
import { InvalidTensorError } from '../../runtime/errors.ts';

/** 2 samples × 3 slots, one empty bag, a repeated id, 2 dense features. */
function smallCtrBatch(): CtrBatch {
  return {
    kind: 'ctr', batchId: 'test/train/e0/b0', size: 2, slots: 3,
    offsets: Int32Array.from([0, 2, 2, 3, 4, 6, 7]),
    ids: Int32Array.from([10, 11, 12, 10, 13, 14, 11]),
    dense: Float32Array.from([0.5, -1, 2, 0]), denseDim: 2,
    labels: Float32Array.from([1, 0]),
  };
}

function tables(dim: number): { embedding: SparseTable; wide: SparseTable } {
  const t = (table: string, d: number, initScale: number) => new SparseTable({ table, dim: d, stateSlots: 2, seed: 1, initScale, initialCapacity: 16 });
  return { embedding: t('emb', dim, 0.05), wide: t('wide', 1, 0) };
}

test('buildCtrFeeds gives the step and eval graphs every input in its shape', () => {
  const model = ctrModel({ slots: 3, embeddingDim: 4, denseFeatures: 2, hidden: [8], pooling: 'mean' });
  const opt = createOptimizer({ type: 'adam', learningRate: 0.01 });
  const dense = createDenseParameters(model, opt, 3);
  const batch = smallCtrBatch();
  const index = ctrBagIndex(batch.offsets, batch.ids);
  const rows = gatherCtrRows(tables(4), index, true);
  const U = index.uniqueIds.length;
  assert.equal(U, 5);

  const step = buildCtrFeeds(model, batch, rows, dense.values, 'step');
  assert.deepEqual(step['emb_rows']!.dims, [U, 4]);
  assert.deepEqual(step['wide_rows']!.dims, [U, 1]);
  assert.deepEqual(step['bag_rows']!.dims, [7]);
  assert.equal(step['bag_rows']!.dtype, 'int32');
  assert.deepEqual(step['bag_counts']!.dims, [2, 3]);
  assert.deepEqual([...step['bag_counts']!.data as Int32Array], [2, 0, 1, 1, 2, 1]);
  assert.deepEqual(step['dense_features']!.dims, [2, 2]);
  assert.deepEqual(step['labels']!.dims, [2]);
  assert.equal(step['labels']!.dtype, 'float32');
  for (const p of model.denseParams) assert.deepEqual(step[p.name]!.dims, p.dims);
  assert.deepEqual(checkFeedShapes(model.graph('step'), step).get('unique_rows'), U);

  const evalFeeds = buildCtrFeeds(model, batch, rows, dense.values, 'eval');
  assert.equal(evalFeeds['labels'], undefined);
  checkFeedShapes(model.graph('eval'), evalFeeds);
});

test('buildCtrFeeds leaves dense_features out when the model has none, and rejects a batch of another shape', () => {
  const model = ctrModel({ slots: 3, embeddingDim: 2, denseFeatures: 0, hidden: [4], pooling: 'sum' });
  const dense = createDenseParameters(model, createOptimizer({ type: 'sgd', learningRate: 0.1 }), 1);
  const batch = { ...smallCtrBatch(), dense: null, denseDim: 0 };
  const rows = gatherCtrRows(tables(2), ctrBagIndex(batch.offsets, batch.ids), false);
  const feeds = buildCtrFeeds(model, batch, rows, dense.values, 'step');
  assert.equal(feeds['dense_features'], undefined);
  checkFeedShapes(model.graph('step'), feeds);
  assert.throws(() => buildCtrFeeds(model, smallCtrBatch(), rows, dense.values, 'step'), /dense features/);
  const fourSlots = ctrModel({ slots: 4, embeddingDim: 2, denseFeatures: 0, hidden: [4], pooling: 'sum' });
  assert.throws(() => buildCtrFeeds(fourSlots, batch, rows, createDenseParameters(fourSlots, createOptimizer({ type: 'sgd', learningRate: 0.1 }), 1).values, 'step'), InvalidTensorError);
});

test('gathering rows for evaluation stores no rows; for training it does', () => {
  const t = tables(4);
  const batch = smallCtrBatch();
  const index = ctrBagIndex(batch.offsets, batch.ids);
  const evalRows = gatherCtrRows(t, index, false);
  assert.equal(t.embedding.size, 0);
  const trainRows = gatherCtrRows(t, index, true);
  assert.equal(t.embedding.size, 5);
  assert.deepEqual(trainRows.embRows, evalRows.embRows);
  assert.deepEqual(trainRows.wideRows, new Float32Array(5));
});

test('buildMlpFeeds: x [B, F] float32, labels [B] int32 for step only', () => {
  const model = mlpModel({ layers: [6, 5, 3] });
  const dense = createDenseParameters(model, createOptimizer({ type: 'adam', learningRate: 0.01 }), 1);
  const batch: MlpBatch = { kind: 'mlp', batchId: 'b', size: 4, features: new Float32Array(24), featureDim: 6, labels: Int32Array.from([0, 1, 2, 1]) };
  const step = buildMlpFeeds(model, batch, dense.values, 'step');
  assert.deepEqual(step['x']!.dims, [4, 6]);
  assert.deepEqual(step['labels']!.dims, [4]);
  assert.equal(step['labels']!.dtype, 'int32');
  checkFeedShapes(model.graph('step'), step);
  const evalFeeds = buildMlpFeeds(model, batch, dense.values, 'eval');
  assert.equal(evalFeeds['labels'], undefined);
  checkFeedShapes(model.graph('eval'), evalFeeds);
  assert.throws(() => buildMlpFeeds(mlpModel({ layers: [7, 3] }), batch, dense.values, 'step'), /6 features, the model takes 7/);
});

test('bucketCtrIds folds each slot into its own block of rows', () => {
  const b = smallCtrBatch();
  // slots of the 7 ids: 0 0 | 2 | 0 | 1 1 | 2
  assert.deepEqual([...bucketCtrIds(b.offsets, b.ids, 3, [4, 5, 6])], [10 % 4, 11 % 4, 9 + 12 % 6, 10 % 4, 4 + 13 % 5, 4 + 14 % 5, 9 + 11 % 6]);
  assert.deepEqual([...bucketCtrIds(b.offsets, b.ids, 3, 100)], [10, 11, 212, 10, 113, 114, 211]);
  assert.throws(() => bucketCtrIds(b.offsets, b.ids, 3, [4, 5]), /2 slots/);
});

test('headOfBatch keeps the first samples; hashedBagOfIds turns a ctr batch into mlp input', () => {
  const b = smallCtrBatch();
  const head = headOfBatch(b, 1);
  assert.equal(head.size, 1);
  assert.deepEqual([...head.offsets], [0, 2, 2, 3]);
  assert.deepEqual([...head.ids], [10, 11, 12]);
  assert.deepEqual([...head.labels], [1]);
  assert.deepEqual([...head.dense!], [0.5, -1]);
  assert.equal(headOfBatch(b, 5), b);

  const m = hashedBagOfIds(b, 4);
  assert.equal(m.featureDim, 4);
  assert.deepEqual([...m.labels], [1, 0]);
  // sample 0: ids 10, 11, 12 → buckets 2, 3, 0; sample 1: 10, 13, 14, 11 → 2, 1, 2, 3
  const l = Math.log1p;
  assert.deepEqual([...m.features], [l(1), 0, l(1), l(1), 0, l(1), l(2), l(1)].map((x) => Math.fround(x)));
});

test('LocalTrainer learns a small synthetic ctr task; evaluation does not grow the tables', async () => {
  const source = createSyntheticCtrSource({ seed: 3, slots: 3, vocabularyPerSlot: 200, denseDim: 2, trainSize: 3000, testSize: 1000 });
  const d = source.describe();
  const model = ctrModel({ slots: d.slots, embeddingDim: 4, denseFeatures: d.denseDim, hidden: [8], pooling: 'sum' });
  const trainer = await LocalTrainer.create({
    model, denseOptimizer: createOptimizer({ type: 'adam', learningRate: 0.01 }), sparseOptimizer: createOptimizer({ type: 'adagrad', learningRate: 0.1 }),
    seed: 1, provider: 'cpu', intraOpNumThreads: 1, embeddingInitScale: 0.05, wide: true, hashBuckets: null,
  });
  try {
    const before = await trainer.evaluate(source, 500);
    const rows = trainer.tables!.embedding.size;
    assert.equal(rows, 0);
    let calls = 0;
    const summary = await trainer.trainEpoch(source, { epoch: 0, batchSize: 100, maxSamples: 2500, onBatch: () => { calls++; } });
    assert.equal(summary.samples, 2500);
    assert.equal(summary.batches, 25);
    assert.equal(calls, 25);
    assert.equal(trainer.step, 25);
    const size = trainer.tables!.embedding.size;
    assert.ok(size > 0);
    const after = await trainer.evaluate(source, 500);
    assert.equal(trainer.tables!.embedding.size, size, 'evaluation stored no rows');
    assert.equal(after.kind, 'ctr');
    assert.equal(after.samples, 1000);
    if (after.kind === 'ctr' && before.kind === 'ctr') {
      assert.ok(after.auc > before.auc && after.auc > 0.6, `AUC ${before.auc} → ${after.auc}`);
      assert.ok(after.logloss < before.logloss, `logloss ${before.logloss} → ${after.logloss}`);
    }
  } finally {
    await trainer.dispose();
  }
});

test('a diverging run stops with InvalidTensorError telling to lower the learning rate', async () => {
  const source = createSyntheticMlpSource({ seed: 1, featureDim: 16, numClasses: 3, latentDim: 4, trainSize: 2000, testSize: 10 });
  const trainer = await LocalTrainer.create({
    model: mlpModel({ layers: [16, 16, 3] }), denseOptimizer: createOptimizer({ type: 'sgd', learningRate: 1e6 }), sparseOptimizer: null,
    seed: 1, provider: 'cpu', intraOpNumThreads: 1, embeddingInitScale: 0, wide: false, hashBuckets: null,
  });
  try {
    await assert.rejects(
      async () => { for (const b of source.batchesSync(streamOptions('train', 50))) await trainer.trainBatch(b); },
      (e: unknown) => e instanceof InvalidTensorError && /lower the learning rate/.test(e.message),
    );
  } finally {
    await trainer.dispose();
  }
});
