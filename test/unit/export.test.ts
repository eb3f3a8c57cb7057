/**
 * `hetps export`'s graphs against the graphs training evaluates with: the
 * same parameters and rows give the same predictions, an id never seen
 * scores with a zero row, and a checkpoint (a delta with its chain, two
 * shards, dense parameters cut into blocks) becomes one inference graph that
 * plain onnxruntime-node loads. Bad checkpoints are refused naming what is
 * missing.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import {
  bucketCtrIds, createSyntheticCtrSource, createSyntheticMlpSource, ctrBagIndex, ctrModel, exportedCtrFeeds, evaluateExported, initDenseParams,
  mlpModel, onnxMetadata, streamOptions, useBucketTable, LABEL_ENCODER_BYTES_PER_ROW, type CtrBatch, type CtrModel, type MlpBatch, type TableRows,
} from '../../native-bridge/mod.ts';
import { encode } from '../../runtime/mod.ts';
import { MAX_INLINE_MAP_BYTES } from '../../native-bridge/models/ctr.ts';
import type { ShardSnapshot } from '../../actors/shard/shard.messages.ts';
import { writeCheckpoint } from '../../actors/store/checkpoint.ts';
import { exportCheckpoint } from '../../actors/store/checkpoint-export.ts';

const SLOTS = 3; const DIM = 4; const DENSE = 2;

function ctrBatch(seed: number): CtrBatch {
  const src = createSyntheticCtrSource({ seed, slots: SLOTS, vocabularyPerSlot: 50, zipfExponent: 1.1, denseDim: DENSE, trainSize: 64, testSize: 64 });
  const b = src.batchesSync(streamOptions('test', 64, { shuffle: false })).next().value!;
  assert.equal(b.kind, 'ctr');
  return b as CtrBatch;
}

/** Rows for every other bucketed id of the batch (the rest are "never seen"), deterministic values. */
function someRows(keys: Int32Array, dim: number, salt: number): TableRows {
  const seen = [...new Set(keys)].filter((_, i) => i % 2 === 0);
  return {
    ids: Uint32Array.from(seen),
    values: Float32Array.from({ length: seen.length * dim }, (_, k) => Math.sin(salt + k * 0.37) * 0.3),
  };
}

async function run(bytes: Uint8Array, feeds: Record<string, ort.Tensor>): Promise<Float32Array> {
  const s = await ort.InferenceSession.create(bytes);
  try { return (await s.run(feeds))['predictions']!.data as Float32Array; } finally { await s.release(); }
}

/** What the eval graph gives with the rows the shards would serve: the table's row, or zeros for an id not in it. */
async function reference(model: CtrModel, batch: CtrBatch, dense: Map<string, Float32Array>, emb: TableRows, wide: TableRows | null, buckets: number | number[] | null): Promise<Float32Array> {
  const keys = buckets === null ? batch.ids : bucketCtrIds(batch.offsets, batch.ids, SLOTS, buckets);
  const index = ctrBagIndex(batch.offsets, keys);
  const U = index.uniqueIds.length;
  const gather = (t: TableRows | null, d: number) => {
    const out = new Float32Array(U * d);
    if (t === null) return out;
    const at = new Map([...t.ids].map((id, r) => [id, r]));
    index.uniqueIds.forEach((id, u) => { const r = at.get(id >>> 0); if (r !== undefined) out.set(t.values.subarray(r * d, r * d + d), u * d); });
    return out;
  };
  const feeds: Record<string, ort.Tensor> = {
    emb_rows: new ort.Tensor('float32', gather(emb, DIM), [U, DIM]),
    wide_rows: new ort.Tensor('float32', gather(wide, 1), [U, 1]),
    bag_rows: new ort.Tensor('int32', index.bagRows, [index.bagRows.length]),
    bag_counts: new ort.Tensor('int32', index.bagCounts, [batch.size, SLOTS]),
    dense_features: new ort.Tensor('float32', batch.dense!, [batch.size, DENSE]),
  };
  for (const p of model.denseParams) feeds[p.name] = new ort.Tensor('float32', dense.get(p.name)!, [...p.dims]);
  return run(model.graph('eval').bytes, feeds);
}

// The lookup of an id's row: a row-of-bucket table where the buckets are few (32, [7, 20, 33]), the LabelEncoder where the
// buckets far outnumber the seen rows (5000 a slot) and for raw ids (null).
for (const [pooling, wideOn, buckets, lookup] of [['sum', true, 32, 'table'], ['mean', true, [7, 20, 33], 'table'], ['sum', true, 5000, 'map'], ['mean', false, null, 'map']] as const) {
  test(`ctr export (${pooling} pooling, wide ${wideOn}, hash buckets ${JSON.stringify(buckets)}, ${lookup} lookup): the eval graph's predictions with the seen rows baked in, unseen ids scoring zero rows`, async () => {
    const model = ctrModel({ slots: SLOTS, embeddingDim: DIM, denseFeatures: DENSE, hidden: [8], pooling });
    const batch = ctrBatch(3);
    const dense = initDenseParams(model, 11);
    const keys = buckets === null ? batch.ids : bucketCtrIds(batch.offsets, batch.ids, SLOTS, buckets as number | number[]);
    const emb = someRows(keys, DIM, 1);
    const wide = wideOn ? someRows(keys, 1, 2) : null;
    const want = await reference(model, batch, dense, emb, wide, buckets as number | number[] | null);
    const g = model.exportGraph({ dense, emb, wide, hashBuckets: buckets as number | number[] | null, metadata: { 'hetps.job': 'j' } });
    assert.deepEqual(g.inputs.map((i) => i.name), ['ids', 'bag_counts', 'dense_features']);
    assert.equal(onnxMetadata(g.bytes)['hetps.job'], 'j');
    const text = Buffer.from(g.bytes).toString('latin1');
    assert.equal(text.includes('row_of_bucket'), lookup === 'table');
    assert.equal(text.includes('LabelEncoder'), lookup === 'map');
    const got = await run(g.bytes, exportedCtrFeeds(batch, true));
    assert.equal(got.length, batch.size);
    for (let i = 0; i < got.length; i++) assert.ok(Math.abs(got[i]! - want[i]!) < 1e-5, `sample ${i}: ${got[i]} vs ${want[i]}`);
    // And not by accident: other rows give other scores.
    const other = await run(model.exportGraph({ dense, emb: { ids: emb.ids, values: emb.values.map((v) => v + 0.5) }, wide, hashBuckets: buckets as number | null }).bytes, exportedCtrFeeds(batch, true));
    assert.ok(other.some((v, i) => Math.abs(v - got[i]!) > 1e-4));
  });
}

test('the id lookup: a row-of-bucket table when it is no bigger than the seen ids\' map (16 B a row) or the map would not fit in the model file', () => {
  assert.equal(useBucketTable(400, 100), true);
  assert.equal(useBucketTable(401, 100), false);
  // 36 M seen rows (a 2.3 GB embedding) under 40 M buckets: the map would be 576 MB of protobuf attributes.
  assert.equal(useBucketTable(4e8, 36e6), true);
  assert.ok(MAX_INLINE_MAP_BYTES / LABEL_ENCODER_BYTES_PER_ROW < 36e6);
});

test('ctr export with no rows seen scores every id with the zero row; a wrong parameter size is refused by name', async () => {
  const model = ctrModel({ slots: SLOTS, embeddingDim: DIM, denseFeatures: DENSE, hidden: [8], pooling: 'sum' });
  const batch = ctrBatch(5);
  const dense = initDenseParams(model, 2);
  const none = { ids: new Uint32Array(0), values: new Float32Array(0) };
  const got = await run(model.exportGraph({ dense, emb: none, wide: none, hashBuckets: 64 }).bytes, exportedCtrFeeds(batch, true));
  const want = await reference(model, batch, dense, none, none, 64);
  for (let i = 0; i < got.length; i++) assert.ok(Math.abs(got[i]! - want[i]!) < 1e-5);
  const bad = new Map(dense); bad.set('W1', new Float32Array(3));
  assert.throws(() => model.exportGraph({ dense: bad, emb: none, wide: null, hashBuckets: 64 }), /dense parameter W1 has 3 values, the model 112 \(14×8\)/);
  const missing = new Map(dense); missing.delete('bias');
  assert.throws(() => model.exportGraph({ dense: missing, emb: none, wide: null, hashBuckets: 64 }), /dense parameter bias is missing/);
});

test('mlp export: the eval graph\'s class probabilities, the parameters baked in; evaluateExported scores a source with them', async () => {
  const model = mlpModel({ layers: [16, 5, 3] });
  const dense = initDenseParams(model, 4);
  const src = createSyntheticMlpSource({ seed: 1, featureDim: 16, numClasses: 3, trainSize: 32, testSize: 40 });
  const batch = src.batchesSync(streamOptions('test', 40, { shuffle: false })).next().value as MlpBatch;
  const feeds: Record<string, ort.Tensor> = { x: new ort.Tensor('float32', batch.features, [batch.size, 16]) };
  const want = await run(model.graph('eval').bytes, { ...feeds, ...Object.fromEntries(model.denseParams.map((p) => [p.name, new ort.Tensor('float32', dense.get(p.name)!, [...p.dims])])) });
  const g = model.exportGraph({ dense });
  const got = await run(g.bytes, feeds);
  assert.deepEqual([...got].map((v) => v.toFixed(5)), [...want].map((v) => v.toFixed(5)));
  const ev = await evaluateExported(g.bytes, src, { batchSize: 16, threads: 1, inputWidth: 16 });
  assert.equal(ev.kind, 'mlp');
  assert.equal(ev.samples, 40);
});

/** A shard's snapshot holding the given dense blocks and emb/wide rows. */
function shardSnap(shard: string, blocks: ShardSnapshot['dense'], emb: TableRows, wide: TableRows, version: number): ShardSnapshot {
  const table = (name: string, dim: number, t: TableRows) => ({
    table: name, dim, stateSlots: 1, ids: t.ids, values: t.values, state: new Float32Array(t.values.length), steps: new Uint32Array(t.ids.length).fill(version),
  });
  return {
    format: 1, shard, plan_version: 1, version, round: 0, dense_optimizer: 'adam', sparse_optimizer: 'adagrad',
    dense: blocks, sparse: [table('emb', DIM, emb), table('wide', 1, wide)],
  };
}

test('a checkpoint (a delta on a full one, two shards, dense blocks) exports to one graph with the delta\'s rows; a missing block is refused naming the parameter', async () => {
  const root = await mkdtemp(join(tmpdir(), 'hetps-export-'));
  try {
    const model = ctrModel({ slots: SLOTS, embeddingDim: DIM, denseFeatures: DENSE, hidden: [8], pooling: 'mean' });
    const described = { type: 'ctr' as const, slots: SLOTS, embedding_dim: DIM, dense_features: DENSE, hidden: [8], pooling: 'mean' as const, wide: true, hash_buckets: 40 };
    const dense = initDenseParams(model, 9);
    const blocks = (values: Map<string, Float32Array>, shardIndex: number): ShardSnapshot['dense'] => model.denseParams.flatMap((p, i) => {
      const v = values.get(p.name)!;
      const half = Math.ceil(v.length / 2);
      // Every parameter cut in two blocks, one on each shard.
      return [[0, half], [half, v.length - half]].flatMap(([offset, length], part) => (part === shardIndex && length! > 0
        ? [{ id: i * 2 + part, param: p.name, offset: offset!, length: length!, values: v.slice(offset!, offset! + length!), state: [], step: 1 }] : []));
    });
    const batch = ctrBatch(8);
    const keys = bucketCtrIds(batch.offsets, batch.ids, SLOTS, 40);
    const all = [...new Set(keys)].sort((a, b) => a - b);
    const rowsFor = (ids: number[], d: number, v: number): TableRows => ({ ids: Uint32Array.from(ids), values: new Float32Array(ids.length * d).fill(v) });
    const even = all.filter((id) => id % 2 === 0); const odd = all.filter((id) => id % 2 === 1);
    const meta = (kind: 'full' | 'delta', chain: string[]) => ({
      kind, chain, job: 'j', run_id: 'r', trigger: 'periodic' as const, plan: { version: 1, shards: ['a', 'b'], placement: null }, groups: null,
      optimizer: { dense: 'adam', sparse: 'adagrad' }, data: { total_batches: 4, acked: ['x'] }, model: described,
    });
    const file = (s: ShardSnapshot) => ({ name: `${s.shard}.msgpack`, bytes: encode(s), shard: s.shard, version: s.version, round: 0 });
    const full = await writeCheckpoint(root, { files: [
      file(shardSnap('a', blocks(dense, 0), rowsFor(even, DIM, 0.1), rowsFor(even, 1, 0.1), 1)),
      file(shardSnap('b', blocks(dense, 1), rowsFor(odd, DIM, 0.1), rowsFor(odd, 1, 0.1), 1)),
    ], manifest: meta('full', []) });
    // The delta: the even rows changed (and the dense parameters with them); the odd rows are as in the full one.
    const dense2 = new Map([...dense].map(([k, v]) => [k, v.map((x) => x * 0.5)]));
    const delta = await writeCheckpoint(root, { files: [
      file(shardSnap('a', blocks(dense2, 0), rowsFor(even, DIM, -0.2), rowsFor(even, 1, -0.2), 2)),
      file(shardSnap('b', blocks(dense2, 1), rowsFor([], DIM, 0), rowsFor([], 1, 0), 2)),
    ], manifest: meta('delta', [full.manifest.name]) });

    const ex = await exportCheckpoint(delta.path);
    assert.deepEqual(ex.rows, { emb: all.length, wide: all.length });
    assert.equal(ex.manifest.name, delta.manifest.name);
    const got = await run(ex.graph.bytes, exportedCtrFeeds(batch, true));
    const merged = (d: number): TableRows => ({
      ids: Uint32Array.from([...even, ...odd]), values: Float32Array.from([...even.flatMap(() => Array(d).fill(-0.2)), ...odd.flatMap(() => Array(d).fill(0.1))]),
    });
    const want = await reference(model, batch, dense2, merged(DIM), merged(1), 40);
    for (let i = 0; i < got.length; i++) assert.ok(Math.abs(got[i]! - want[i]!) < 1e-5, `sample ${i}: ${got[i]} vs ${want[i]}`);
    assert.deepEqual(JSON.parse(onnxMetadata(ex.graph.bytes)['hetps.model']!), described);

    // Shard b's file lost its blocks: the export names the parameter whose values are missing.
    const broken = await writeCheckpoint(root, { files: [
      file(shardSnap('a', blocks(dense, 0), rowsFor(even, DIM, 0.1), rowsFor(even, 1, 0.1), 1)),
      file(shardSnap('b', [], rowsFor(odd, DIM, 0.1), rowsFor(odd, 1, 0.1), 1)),
    ], manifest: meta('full', []) });
    await assert.rejects(exportCheckpoint(broken.path), /the shards hold \d+ of the \d+ values of dense parameter W1; a shard file is missing/);
    // No model recorded and none given: the error says to give the config.
    const old = await writeCheckpoint(root, { files: [file(shardSnap('a', blocks(dense, 0), rowsFor([], DIM, 0), rowsFor([], 1, 0), 1))], manifest: { ...meta('full', []), model: null } });
    await assert.rejects(exportCheckpoint(old.path), /does not record its model.*--config/);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test('ONNX external data: initializers above the threshold go to a file next to the model, which onnxruntime loads from its path to the same predictions', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'hetps-export-ext-'));
  try {
    const model = ctrModel({ slots: SLOTS, embeddingDim: DIM, denseFeatures: DENSE, hidden: [8], pooling: 'mean' });
    const dense = initDenseParams(model, 3);
    const batch = ctrBatch(5);
    const keys = [...new Set(bucketCtrIds(batch.offsets, batch.ids, SLOTS, 40))].sort((a, b) => a - b);
    const emb: TableRows = { ids: Uint32Array.from(keys), values: Float32Array.from({ length: keys.length * DIM }, (_, i) => Math.sin(i)) };
    const wide: TableRows = { ids: Uint32Array.from(keys), values: Float32Array.from(keys, (k) => k / 100) };
    const inline = model.exportGraph({ dense, emb, wide, hashBuckets: 40 });
    assert.equal(inline.external ?? null, null);
    const ext = model.exportGraph({ dense, emb, wide, hashBuckets: 40, externalData: { location: 'm.onnx.data', minBytes: 64 } });
    assert.ok(ext.external !== null && ext.external !== undefined);
    assert.ok(ext.bytes.byteLength < inline.bytes.byteLength, 'the large initializers left the model');
    const file = join(dir, 'm.onnx');
    await writeFile(file, ext.bytes);
    await writeFile(join(dir, 'm.onnx.data'), Buffer.concat(ext.external.chunks));
    const session = await ort.InferenceSession.create(file);
    const got = (await session.run(exportedCtrFeeds(batch, true)))['predictions']!.data as Float32Array;
    await session.release();
    const want = await run(inline.bytes, exportedCtrFeeds(batch, true));
    assert.deepEqual([...got], [...want]);
    assert.throws(() => model.exportGraph({ dense, emb, wide, hashBuckets: 40, externalData: { location: '../elsewhere.data', minBytes: 64 } }), /a file name next to the model/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
