import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import onnxProto from 'onnx-proto';
import { ConfigError, InvalidTensorError } from '../../runtime/errors.ts';
import {
  ctrBagIndex, ctrModel, f32, GraphBuilder, i32, initDenseParams, measureMatmulGflops, mlpModel, OPSET, providerListed,
  StepSession, syntheticCtrFeeds, syntheticMlpFeeds, type HostTensor, type ModelGraph,
} from '../../native-bridge/mod.ts';
import { ctrReference } from '../support/reference-models.ts';

const { onnx } = onnxProto;

function addGraph(): ModelGraph {
  const g = new GraphBuilder('add');
  const a = g.input('a', 'float32', ['n', 2]);
  const b = g.input('b', 'float32', [1, 2]);
  g.op('Add', [a, g.op('Mul', [b, g.constF32([2], [])])], {}, 'sum');
  g.output('sum', 'float32', ['n', 2]);
  return { model: 'add', kind: 'eval', inputs: g.inputSpecs, outputs: g.outputSpecs, bytes: g.serialize() };
}

async function rejects(p: Promise<unknown>, cls: new (...a: never[]) => Error, ...fragments: string[]): Promise<void> {
  await assert.rejects(p, (err: unknown) => {
    assert.ok(err instanceof cls, `expected ${cls.name}, got ${String(err)}`);
    for (const f of fragments) assert.ok(err.message.includes(f), `message "${err.message}" should mention "${f}"`);
    return true;
  });
}

describe('GraphBuilder', () => {
  it('serializes a ModelProto with the default-domain opset and symbolic dims', () => {
    const m = onnx.ModelProto.decode(addGraph().bytes);
    assert.equal(m.opsetImport[0]?.domain, '');
    assert.equal(Number(m.opsetImport[0]?.version), OPSET);
    const dims = m.graph?.input?.[0]?.type?.tensorType?.shape?.dim ?? [];
    assert.equal(dims[0]?.dimParam, 'n');
    assert.equal(Number(dims[1]?.dimValue), 2);
    assert.deepEqual(m.graph?.node?.map((n) => n.opType), ['Mul', 'Add']);
  });

  it('runs in ONNX Runtime', async () => {
    const s = await StepSession.create(addGraph(), { graph: 'eval' });
    const out = await s.run({ a: f32(Float32Array.of(1, 2, 3, 4), [2, 2]), b: f32(Float32Array.of(10, 20), [1, 2]) });
    assert.deepEqual([...out.f32('sum')], [21, 42, 23, 44]);
    await s.dispose();
  });

  it('rejects reading an undefined value, defining one twice and fractional int attributes', () => {
    const g = new GraphBuilder('bad');
    g.input('x', 'float32', [1]);
    assert.throws(() => g.op('Relu', ['y']), /undefined value y/);
    assert.throws(() => g.input('x', 'float32', [1]), /defined twice/);
    assert.throws(() => g.op('Gemm', ['x', 'x'], { alpha: 0.5 }), /not an integer/);
    assert.throws(() => g.output('nowhere', 'float32', [1]), /never produced/);
  });
});

describe('model graphs', () => {
  it('mlp step graph: inputs, outputs and dense parameters', () => {
    const m = mlpModel();
    const g = m.graph('step');
    assert.deepEqual(m.config.layers, [1024, 512, 256, 10]);
    assert.deepEqual(g.inputs.map((s) => [s.name, s.dtype, s.dims]), [
      ['x', 'float32', ['batch', 1024]], ['labels', 'int32', ['batch']],
      ['W1', 'float32', [1024, 512]], ['b1', 'float32', [512]],
      ['W2', 'float32', [512, 256]], ['b2', 'float32', [256]],
      ['W3', 'float32', [256, 10]], ['b3', 'float32', [10]],
    ]);
    assert.deepEqual(g.outputs.map((s) => [s.name, s.dims]), [
      ['loss', []], ['predictions', ['batch', 10]],
      ['W1_grad', [1024, 512]], ['b1_grad', [512]], ['W2_grad', [512, 256]], ['b2_grad', [256]], ['W3_grad', [256, 10]], ['b3_grad', [10]],
    ]);
    assert.deepEqual(m.graph('eval').outputs.map((s) => s.name), ['predictions']);
    assert.ok(!m.graph('eval').inputs.some((s) => s.name === 'labels'));
  });

  it('ctr step graph: inputs, outputs and dense parameters', () => {
    const m = ctrModel({ slots: 3, embeddingDim: 4, denseFeatures: 2, hidden: [6, 5] });
    const g = m.graph('step');
    assert.deepEqual(g.inputs.map((s) => [s.name, s.dtype, s.dims]), [
      ['W1', 'float32', [14, 6]], ['b1', 'float32', [6]], ['W2', 'float32', [6, 5]], ['b2', 'float32', [5]], ['W3', 'float32', [5, 1]],
      ['bias', 'float32', [1]],
      ['emb_rows', 'float32', ['unique_rows', 4]], ['wide_rows', 'float32', ['unique_rows', 1]],
      ['bag_rows', 'int32', ['bag_ids']], ['bag_counts', 'int32', ['batch', 3]],
      ['dense_features', 'float32', ['batch', 2]], ['labels', 'float32', ['batch']],
    ]);
    assert.deepEqual(g.outputs.map((s) => [s.name, s.dims]), [
      ['loss', []], ['predictions', ['batch']],
      ['W1_grad', [14, 6]], ['b1_grad', [6]], ['W2_grad', [6, 5]], ['b2_grad', [5]], ['W3_grad', [5, 1]], ['bias_grad', [1]],
      ['emb_rows_grad', ['unique_rows', 4]], ['wide_rows_grad', ['unique_rows', 1]],
    ]);
    const noDense = ctrModel({ slots: 2, embeddingDim: 3, denseFeatures: 0, hidden: [] });
    assert.ok(!noDense.graph('step').inputs.some((s) => s.name === 'dense_features'));
    assert.deepEqual(noDense.denseParams.map((p) => [p.name, p.dims]), [['W1', [6, 1]], ['bias', [1]]]);
  });

  it('rejects bad configs with ConfigError', () => {
    assert.throws(() => mlpModel({ layers: [5] }), ConfigError);
    assert.throws(() => mlpModel({ layers: [5, 0, 3] }), ConfigError);
    assert.throws(() => ctrModel({ pooling: 'max' as never }), ConfigError);
    assert.throws(() => ctrModel({ slots: 0 }), ConfigError);
    assert.throws(() => ctrModel({ hidden: [4, 2.5] }), ConfigError);
  });
});

describe('StepSession', () => {
  const mlp = mlpModel({ layers: [8, 6, 5, 3] });
  const ctr = ctrModel({ slots: 3, embeddingDim: 4, denseFeatures: 2, hidden: [6, 5], pooling: 'mean' });

  it('serves any batch size and any number of unique rows from one session', async () => {
    const s = await StepSession.create(mlp);
    for (const batch of [1, 5, 33]) {
      const out = await s.run(syntheticMlpFeeds(mlp, initDenseParams(mlp, 1), batch, batch));
      assert.deepEqual(out.tensor('predictions').dims, [batch, 3]);
      assert.deepEqual(out.tensor('loss').dims, []);
      assert.ok(Number.isFinite(out.scalar('loss')));
    }
    const c = await StepSession.create(ctr);
    for (const [batch, uniqueRows] of [[1, 1], [2, 3], [7, 20]] as const) {
      const feeds = syntheticCtrFeeds(ctr, initDenseParams(ctr, 2), { batch, uniqueRows, meanBagSize: 2, emptyBags: true }, batch);
      const out = await c.run(feeds);
      assert.deepEqual(out.tensor('predictions').dims, [batch]);
      assert.deepEqual(out.tensor('emb_rows_grad').dims, [uniqueRows, 4]);
      assert.deepEqual(out.tensor('wide_rows_grad').dims, [uniqueRows, 1]);
    }
    await s.dispose(); await c.dispose();
  });

  it('eval graphs give the step graphs\' predictions without labels', async () => {
    const feeds = syntheticMlpFeeds(mlp, initDenseParams(mlp, 3), 6, 4);
    const step = await (await StepSession.create(mlp)).run(feeds);
    const { labels: _l, ...evalFeeds } = feeds;
    const ev = await (await StepSession.create(mlp, { graph: 'eval' })).run(evalFeeds);
    for (let i = 0; i < 18; i++) assert.ok(Math.abs(ev.f32('predictions')[i]! - step.f32('predictions')[i]!) < 1e-6);

    const cFeeds = syntheticCtrFeeds(ctr, initDenseParams(ctr, 5), { batch: 5, uniqueRows: 6, meanBagSize: 2, emptyBags: true }, 6);
    const cStep = await (await StepSession.create(ctr)).run(cFeeds);
    const { labels: _cl, ...cEvalFeeds } = cFeeds;
    const cEval = await (await StepSession.create(ctr, { graph: 'eval' })).run(cEvalFeeds);
    assert.deepEqual([...cEval.f32('predictions')], [...cStep.f32('predictions')]);
  });

  it('runs the smallest ctr: no dense features, no hidden layer', async () => {
    const m = ctrModel({ slots: 2, embeddingDim: 3, denseFeatures: 0, hidden: [], pooling: 'sum' });
    const feeds = syntheticCtrFeeds(m, initDenseParams(m, 7), { batch: 4, uniqueRows: 5, meanBagSize: 1, emptyBags: true }, 8);
    const out = await (await StepSession.create(m)).run(feeds);
    const ref = ctrReference(m, feeds);
    assert.ok(Math.abs(out.scalar('loss') - ref.loss) < 1e-5);
  });

  it('names the input and the expected vs actual shape when a feed is wrong', async () => {
    const s = await StepSession.create(mlp);
    const good = syntheticMlpFeeds(mlp, initDenseParams(mlp, 1), 4, 1);
    const w1 = good['W1']!;
    await rejects(s.run({ ...good, W1: f32(w1.data as Float32Array, [6, 8]) }), InvalidTensorError, 'input W1', 'expected [8, 6] float32', 'got [6, 8] float32');
    await rejects(s.run({ ...good, labels: i32(new Int32Array(5), [5]) }), InvalidTensorError, 'input labels', "'batch' = 5", "x set 'batch' = 4");
    await rejects(s.run({ ...good, labels: f32(new Float32Array(4), [4]) }), InvalidTensorError, 'input labels', 'expected [batch] int32', 'got [4] float32');
    await rejects(s.run({ ...good, x: f32(new Float32Array(8), [4, 8]) }), InvalidTensorError, 'input x', 'data holds 8 elements, shape needs 32');
    await rejects(s.run({ ...good, b1: f32(new Float32Array(6), [1, 6]) }), InvalidTensorError, 'input b1', 'rank differs');
    const { b2: _b2, ...missing } = good;
    await rejects(s.run(missing), InvalidTensorError, 'input b2 is missing', 'expected [5] float32');
    await rejects(s.run({ ...good, W9: f32(new Float32Array(1), [1]) }), InvalidTensorError, 'unexpected input W9');
    await rejects(s.run({ ...good, labels: i32(Int32Array.of(0, 1, 3, 2), [4]) }), InvalidTensorError, 'labels[2] = 3', '[0, 3)');
    await s.dispose();
  });

  it('rejects inconsistent bag indices and labels before running', async () => {
    const s = await StepSession.create(ctr);
    const good = syntheticCtrFeeds(ctr, initDenseParams(ctr, 1), { batch: 3, uniqueRows: 4, meanBagSize: 2, emptyBags: false }, 2) as Record<string, HostTensor>;
    const rows = Int32Array.from(good['bag_rows']!.data as Int32Array);
    rows[1] = 4;
    await rejects(s.run({ ...good, bag_rows: i32(rows, [rows.length]) }), InvalidTensorError, 'bag_rows[1] = 4', '[0, 4)');
    const counts = Int32Array.from(good['bag_counts']!.data as Int32Array);
    counts[0]! += 1;
    await rejects(s.run({ ...good, bag_counts: i32(counts, [3, 3]) }), InvalidTensorError, 'bag_counts sum to', `bag_rows holds ${rows.length} ids`);
    counts[0]! -= 1; counts[1] = -counts[1]!;
    await rejects(s.run({ ...good, bag_counts: i32(counts, [3, 3]) }), InvalidTensorError, 'bag_counts[1]', 'negative');
    await rejects(s.run({ ...good, labels: f32(Float32Array.of(0, 1, 2), [3]) }), InvalidTensorError, 'labels[2] = 2');
    await rejects(s.run({ ...good, wide_rows: f32(new Float32Array(5), [5, 1]) }), InvalidTensorError, 'input wide_rows', "'unique_rows' = 5");
    await s.dispose();
  });

  it('refuses cuda with ConfigError when this onnxruntime-node build has no CUDA provider', async (t) => {
    if (providerListed('cuda')) { t.skip('this build ships the CUDA provider'); return; }
    await rejects(StepSession.create(mlp, { provider: 'cuda' }), ConfigError,
      'execution provider cuda requested but not available in this onnxruntime-node build; use provider: cpu');
  });

  it('rejects unknown providers and thread counts', async () => {
    await rejects(StepSession.create(mlp, { provider: 'tpu' as never }), ConfigError, 'tpu');
    await rejects(StepSession.create(mlp, { intraOpNumThreads: 0 }), ConfigError, 'intraOpNumThreads');
  });
});

describe('ctrBagIndex', () => {
  it('turns CSR offsets and ids into unique ids, bag_rows and bag_counts', () => {
    // B = 2, S = 2: bags [7, 9], [], [9, 9, 3], [7]
    const idx = ctrBagIndex(Int32Array.of(0, 2, 2, 5, 6), Int32Array.of(7, 9, 9, 9, 3, 7));
    assert.deepEqual([...idx.uniqueIds], [7, 9, 3]);
    assert.deepEqual([...idx.bagRows], [0, 1, 1, 1, 2, 0]);
    assert.deepEqual([...idx.bagCounts], [2, 0, 3, 1]);
  });

  it('rejects offsets that do not cover the ids', () => {
    assert.throws(() => ctrBagIndex(Int32Array.of(0, 2), Int32Array.of(1, 2, 3)), InvalidTensorError);
    assert.throws(() => ctrBagIndex(Int32Array.of(0, 2, 1, 3), Int32Array.of(1, 2, 3)), InvalidTensorError);
  });

  it('handles many ids, including negative-hash and repeated keys', () => {
    const ids = Int32Array.from({ length: 5000 }, (_, i) => (i * 7919) % 1237 + (i % 3 === 0 ? 2 ** 30 : 0));
    const idx = ctrBagIndex(Int32Array.of(0, ids.length), ids);
    assert.equal(new Set(ids).size, idx.uniqueIds.length);
    for (let i = 0; i < ids.length; i++) assert.equal(idx.uniqueIds[idx.bagRows[i]!], ids[i]);
  });
});

describe('measureMatmulGflops', () => {
  it('reports a positive throughput for a small product', async () => {
    const r = await measureMatmulGflops(64, 0.02, { intraOpNumThreads: 1 });
    assert.equal(r.size, 64);
    assert.equal(r.provider, 'cpu');
    assert.ok(r.iterations >= 3);
    assert.ok(Number.isFinite(r.gflops) && r.gflops > 0);
  });
});
