import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { encode } from '../../runtime/mod.ts';
import { SparseTable } from '../../native-bridge/mod.ts';
import { createOptimizer } from '../../native-bridge/optimizers.ts';
import type { ShardSnapshot } from '../../actors/shard/shard.messages.ts';
import { deltaOf, overlay, rowSteps } from '../../actors/store/checkpoint-delta.ts';
import { listCheckpoints, loadResumePoint, pruneCheckpoints, writeCheckpoint } from '../../actors/store/checkpoint.ts';

const DIM = 4;
const table = () => new SparseTable({ table: 'emb', dim: DIM, stateSlots: 1, seed: 7, initScale: 0.1, initialCapacity: 64 });
const adagrad = () => createOptimizer({ type: 'adagrad', learningRate: 0.1 });
const grad = (n: number, v: number) => new Float32Array(n * DIM).fill(v);

function snapOf(t: SparseTable, version: number, dense: number): ShardSnapshot {
  return {
    format: 1, shard: 's1', plan_version: 1, version, round: 0, dense_optimizer: 'adam', sparse_optimizer: 'adagrad',
    dense: [{ id: 0, param: 'w', offset: 0, length: 2, values: new Float32Array([dense, dense]), state: [], step: version }],
    sparse: [t.snapshot()],
  };
}

/** Rows by id → [values, steps], for comparing snapshots whatever their row order. */
function rowsOf(s: ShardSnapshot): Map<number, [number[], number]> {
  const t = s.sparse[0]!;
  return new Map([...t.ids].map((id, k) => [id, [[...t.values.subarray(k * DIM, k * DIM + DIM)], t.steps[k]!]]));
}

test('a delta holds only the rows updated since the previous checkpoint; full + deltas applied in order give the last state', () => {
  const t = table();
  const opt = adagrad();
  t.applyGradients(Int32Array.from([1, 2, 3]), grad(3, 0.5), opt, 1);
  t.pull([40]); // a full checkpoint holds every stored row, this one too
  const full = snapOf(t, 1, 1);
  const steps = rowSteps(full);
  t.applyGradients(Int32Array.from([2, 9]), grad(2, -0.25), opt, 2);
  t.pull([41]); // created by a pull after it, never updated: a delta leaves it to its deterministic initialiser
  const second = snapOf(t, 2, 2);
  const d1 = deltaOf(second, steps);
  assert.deepEqual([d1.rows, d1.of], [2, 6]);
  assert.deepEqual([...d1.delta.sparse[0]!.ids].sort((a, b) => a - b), [2, 9]);
  assert.deepEqual(d1.delta.dense, second.dense, 'dense blocks always go whole');
  t.applyGradients(Int32Array.from([3]), grad(1, 1), opt, 3);
  const third = snapOf(t, 3, 3);
  const d2 = deltaOf(third, steps);
  assert.deepEqual([...d2.delta.sparse[0]!.ids], [3], 'only what changed since the second');
  const back = overlay([full, d1.delta, d2.delta]);
  assert.equal(back.version, 3);
  assert.deepEqual(back.dense, third.dense);
  const want = rowsOf(third);
  want.delete(41);
  assert.deepEqual(rowsOf(back), want, 'every row as it is now, but the one never updated since the full checkpoint');
  assert.throws(() => overlay([]), /empty chain/);
  assert.throws(() => overlay([full, { ...d1.delta, shard: 's2' }]), /shard s1 in a chain of s2/);
});

test('resume from a delta reads its chain; a broken link makes it unusable and latest falls back; prune keeps the chains of what it keeps', async () => {
  const root = await mkdtemp(join(tmpdir(), 'hetps-delta-'));
  try {
    const t = table();
    const opt = adagrad();
    const meta = (acked: string[], kind: 'full' | 'delta', chain: string[]) => ({
      kind, chain, job: 'j', run_id: 'r', trigger: 'periodic' as const, plan: { version: 1, shards: ['s1'], placement: null }, groups: null,
      optimizer: { dense: 'adam', sparse: 'adagrad' }, data: { total_batches: 9, acked },
    });
    t.applyGradients(Int32Array.from([1, 2]), grad(2, 0.5), opt, 1);
    const s1 = snapOf(t, 1, 1);
    const steps = rowSteps(s1);
    const full = await writeCheckpoint(root, { files: [{ name: 's1.msgpack', bytes: encode(s1), shard: 's1' }], manifest: meta(['b1'], 'full', []) });
    t.applyGradients(Int32Array.from([2, 5]), grad(2, 0.5), opt, 2);
    const s2 = snapOf(t, 2, 2);
    const d1 = await writeCheckpoint(root, { files: [{ name: 's1.msgpack', bytes: encode(deltaOf(s2, steps).delta), shard: 's1' }], manifest: meta(['b1', 'b2'], 'delta', [full.manifest.name]) });
    t.applyGradients(Int32Array.from([1]), grad(1, 0.5), opt, 3);
    const s3 = snapOf(t, 3, 3);
    const d2 = await writeCheckpoint(root, {
      files: [{ name: 's1.msgpack', bytes: encode(deltaOf(s3, steps).delta), shard: 's1' }], manifest: meta(['b1', 'b2', 'b3'], 'delta', [full.manifest.name, d1.manifest.name]),
    });
    const r = await loadResumePoint('latest', root, 'j');
    assert.equal(r.path, d2.path);
    assert.deepEqual([...r.done], ['b1', 'b2', 'b3']);
    assert.deepEqual(r.shards, ['s1']);
    const read = await r.readShard('s1');
    assert.deepEqual(rowsOf(read), rowsOf(s3));
    assert.equal(read.version, 3);

    // Prune to 1: the newest delta needs its full one and the delta before it.
    assert.deepEqual(await pruneCheckpoints(root, 1), []);
    // The middle delta corrupted: the newest is unusable (its chain breaks), and so is the middle one; the full one is used.
    const f = join(d1.path, 's1.msgpack');
    const bytes = await readFile(f);
    bytes[3] = bytes[3]! ^ 1;
    await writeFile(f, bytes);
    const back = await loadResumePoint('latest', root, 'j');
    assert.equal(back.path, full.path);
    assert.deepEqual(back.refused.map((x) => x.path), [d2.path, d1.path]);
    assert.match(back.refused[0]!.reason, new RegExp(`is a delta on ${d1.manifest.name}, which cannot be used: .*s1\\.msgpack: SHA-256`));
    assert.deepEqual(rowsOf(await back.readShard('s1')), rowsOf(s1));
    await assert.rejects(loadResumePoint(d2.path, root, 'other'), /is of job j, not other/);
    assert.equal((await listCheckpoints(root)).length, 3);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test('a table of more rows than a JS Map holds (2^24): deltas and the overlay of a chain keep every row', () => {
  const n = 2 ** 24 + 1000;
  const ids = new Uint32Array(n);
  for (let k = 0; k < n; k++) ids[k] = (k * 2654435761) >>> 0; // distinct, spread over uint32
  const big = (steps: Uint32Array, value: number): ShardSnapshot => ({
    format: 1, shard: 's1', plan_version: 1, version: 1, round: 0, dense_optimizer: 'adam', sparse_optimizer: 'sgd', dense: [],
    sparse: [{ table: 'emb', dim: 1, stateSlots: 0, ids, values: new Float32Array(n).fill(value), state: new Float32Array(0), steps }],
  });
  const full = big(new Uint32Array(n).fill(1), 1);
  const before = rowSteps(full);
  assert.equal(before.get('emb')!.size, n);
  // The last 1000 rows were updated since: the delta holds exactly them.
  const later = new Uint32Array(n).fill(1);
  later.fill(2, n - 1000);
  const { delta, rows, of } = deltaOf(big(later, 5), before);
  assert.equal(rows, 1000);
  assert.equal(of, n);
  assert.deepEqual([...delta.sparse[0]!.ids], [...ids.subarray(n - 1000)]);
  const merged = overlay([full, delta]).sparse[0]!;
  assert.equal(merged.ids.length, n);
  assert.equal(merged.values[0], 1);
  assert.equal(merged.values[n - 1], 5);
  assert.equal(merged.steps[n - 1], 2);
});
