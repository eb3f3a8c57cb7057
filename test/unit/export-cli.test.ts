/**
 * `hetps export` and `hetps eval` on bad input, through the command itself:
 * a model trained with another model config is refused naming each field
 * that differs, a missing file says how to make one, a file that is not ONNX
 * says so, and a checkpoint directory without a usable checkpoint is named.
 * Each exits 2 with one line on stderr and nothing on stdout.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile, mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ctrModel, initDenseParams } from '../../native-bridge/mod.ts';
import { explainExit, hetps, ROOT } from '../support/ps.ts';

const QUICKSTART = join(ROOT, 'examples', 'quickstart.yaml');

test('hetps eval refuses a model of another config naming the fields, a missing file and a file that is not ONNX; hetps export names a directory without a usable checkpoint', { timeout: 120_000 }, async () => {
  const dir = await mkdtemp(join(tmpdir(), 'hetps-export-cli-'));
  try {
    // The quick start's model is ctr with 5 slots, 5 dense features, mean pooling, 65 536 buckets; this one has 9 slots and sum pooling.
    const model = ctrModel({ slots: 9, embeddingDim: 16, denseFeatures: 5, hidden: [32, 16], pooling: 'sum' });
    const none = { ids: new Uint32Array(0), values: new Float32Array(0) };
    const described = { type: 'ctr', slots: 9, embedding_dim: 16, dense_features: 5, hidden: [32, 16], pooling: 'sum', wide: true, hash_buckets: 65536 };
    const other = join(dir, 'other.onnx');
    await writeFile(other, model.exportGraph({ dense: initDenseParams(model, 1), emb: none, wide: none, hashBuckets: 65536, metadata: { 'hetps.model': JSON.stringify(described) } }).bytes);
    const r = await hetps(['eval', '--model', other, '--config', QUICKSTART, '--json'], { timeoutMs: 60_000 }).exited;
    assert.equal(r.code, 2, explainExit(r));
    assert.equal(r.stdout, '');
    assert.match(r.stderr, /ConfigError: --model \S+other\.onnx was not trained with the model of \S+quickstart\.yaml \(slots: 9 in the model, 5 in the config; pooling: "sum" in the model, "mean" in the config\); give the config of the job it was trained by/);

    const missing = await hetps(['eval', '--model', join(dir, 'nope.onnx'), '--config', QUICKSTART], { timeoutMs: 60_000 }).exited;
    assert.equal(missing.code, 2, explainExit(missing));
    assert.match(missing.stderr, /--model \S+nope\.onnx: no such file; write one with hetps export --checkpoint DIR --out FILE/);

    const garbage = join(dir, 'garbage.onnx');
    await writeFile(garbage, 'not a model\n');
    const bad = await hetps(['eval', '--model', garbage, '--config', QUICKSTART], { timeoutMs: 60_000 }).exited;
    assert.equal(bad.code, 2, explainExit(bad));
    assert.match(bad.stderr, /--model \S+garbage\.onnx is not an ONNX model/);

    const empty = join(dir, 'no-checkpoints');
    await mkdir(empty);
    const ex = await hetps(['export', '--checkpoint', empty, '--out', join(dir, 'm.onnx')], { timeoutMs: 60_000 }).exited;
    assert.equal(ex.code, 2, explainExit(ex));
    assert.match(ex.stderr, /--checkpoint \S+no-checkpoints holds no usable checkpoint; give one checkpoint directory, or a job's checkpoint root/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
