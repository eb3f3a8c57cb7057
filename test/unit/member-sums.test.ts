/**
 * An hps member's per-step arithmetic, against plain references: the
 * window's sums (ShardedSums, reused window after window) and the local
 * updates of the rows a member trained (LocalUpdates, rows updated in one
 * batch), which both keep their typed arrays between calls.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { buildShardPlan, partitionOf, type ShardPlan } from '../../topology/mod.ts';
import { ShardedSums } from '../../actors/group/group-sync.ts';
import { LocalUpdates } from '../../actors/worker/local-updates.ts';
import { IdIndex, createOptimizer } from '../../native-bridge/mod.ts';
import { SeededRandom } from '../../runtime/mod.ts';

const plan: ShardPlan = buildShardPlan({
  version: 1, shards: ['s0', 's1', 's2'], partitions: 16, maxBlockBytes: 40,
  denseParams: [{ name: 'w', size: 25 }], sparseTables: [{ name: 'emb', dim: 3 }, { name: 'wide', dim: 1 }],
});
const ownerOf = (id: number) => plan.partitionOwner[partitionOf(id, plan.partitions)]!;

interface Step { dense: Float32Array<ArrayBuffer>; ids: Int32Array<ArrayBuffer>; emb: Float32Array<ArrayBuffer>; wide: Float32Array<ArrayBuffer>; scale: number }

function randomStep(rng: SeededRandom, idRange: number, n: number, scale: number): Step {
  const ids = Int32Array.from({ length: n }, () => Math.floor(rng.next() * idRange) - (idRange >> 3)); // some negative ids too
  return {
    dense: Float32Array.from({ length: 25 }, () => rng.normal()), ids, scale,
    emb: Float32Array.from({ length: n * 3 }, () => rng.normal()), wide: Float32Array.from({ length: n }, () => rng.normal()),
  };
}

/** Σ scale·g per dense element and per (table, id), in float64, the obvious way. */
function reference(steps: Step[]) {
  const dense = new Float64Array(25);
  const rows = new Map<string, Map<number, number[]>>([['emb', new Map()], ['wide', new Map()]]);
  for (const s of steps) {
    for (let i = 0; i < 25; i++) dense[i] = dense[i]! + s.scale * s.dense[i]!;
    for (const [table, g, d] of [['emb', s.emb, 3], ['wide', s.wide, 1]] as const) {
      for (let k = 0; k < s.ids.length; k++) {
        const m = rows.get(table)!;
        const row = m.get(s.ids[k]!) ?? new Array<number>(d).fill(0);
        for (let c = 0; c < d; c++) row[c] = row[c]! + s.scale * g[k * d + c]!;
        m.set(s.ids[k]!, row);
      }
    }
  }
  return { dense, rows };
}

function checkAgainst(sums: ShardedSums, steps: Step[], scale: number): void {
  const ref = reference(steps);
  const out = sums.byShard(new Set(plan.shards), scale);
  const seenBlocks = new Set<number>();
  for (const [shard, t] of out) {
    for (const b of t.dense) {
      const block = plan.dense[b.block]!;
      assert.equal(block.shard, shard, `block ${b.block} under its own shard`);
      seenBlocks.add(b.block);
      for (let i = 0; i < block.length; i++) {
        assert.ok(Math.abs(b.grad[i]! - Math.fround(ref.dense[block.offset + i]! * scale)) < 1e-5, `block ${b.block}[${i}]`);
      }
    }
    for (const e of t.sparse) {
      const d = e.table === 'emb' ? 3 : 1;
      const want = ref.rows.get(e.table)!;
      for (let k = 0; k < e.ids.length; k++) {
        const id = e.ids[k]!;
        assert.equal(ownerOf(id), shard, `id ${id} of ${e.table} sent to its owner`);
        const row = want.get(id);
        assert.ok(row !== undefined, `id ${id} of ${e.table} was never added`);
        for (let c = 0; c < d; c++) assert.ok(Math.abs(e.grads[k * d + c]! - row[c]! * scale) < 1e-4, `${e.table} id ${id}[${c}]`);
        want.delete(id);
      }
    }
  }
  assert.equal(seenBlocks.size, steps.length > 0 ? plan.dense.length : 0, 'every block added is out, none other');
  for (const [table, left] of ref.rows) assert.equal(left.size, 0, `${table}: ids added but not in any shard's part: ${[...left.keys()].slice(0, 5).join(', ')}`);
}

test('ShardedSums: the sums by shard equal plain float64 sums (repeated ids, negative ids, 5 000 ids: past the arrays\' first size), and after clear nothing of the last fill is left', () => {
  const rng = new SeededRandom(3);
  const sums = new ShardedSums(plan);
  // Fill 1: three steps over overlapping ids, a step with ids repeated in it.
  const a = [randomStep(rng, 400, 300, 256), randomStep(rng, 400, 300, 200), randomStep(rng, 40, 200, 1)];
  for (const s of a) sums.addStep(new Map([['w', s.dense]]), new Map([['emb', s.emb], ['wide', s.wide]]), s.ids, s.scale);
  checkAgainst(sums, a, 1 / 656);
  // Asked again after more was added: the split by shard follows the new ids.
  const more = randomStep(rng, 100_000, 50, 3);
  sums.addTensors({ dense: [], sparse: [{ table: 'emb', ids: more.ids, grads: more.emb }, { table: 'wide', ids: more.ids, grads: more.wide }] }, 3);
  checkAgainst(sums, [...a, { ...more, dense: new Float32Array(25) }], 0.5);
  // Fill 2 after clear: many more distinct ids (the typed arrays grow), none of fill 1 left.
  sums.clear();
  const b = [randomStep(rng, 1_000_000, 5_000, 7)];
  for (const s of b) sums.addStep(new Map([['w', s.dense]]), new Map([['emb', s.emb], ['wide', s.wide]]), s.ids, s.scale);
  checkAgainst(sums, b, 1);
  // Fill 3: rows only (a slice with no dense part): no dense block comes out.
  sums.clear();
  sums.addTensors({ dense: [], sparse: [{ table: 'wide', ids: Int32Array.of(5, 6, 5), grads: Float32Array.of(1, 2, 3) }] }, 2);
  const out = sums.byShard(new Set(plan.shards));
  const got = new Map<number, number>();
  for (const t of out.values()) {
    assert.equal(t.dense.length, 0, 'no dense block since clear');
    for (const e of t.sparse) { assert.equal(e.table, 'wide'); e.ids.forEach((id, k) => got.set(id, e.grads[k]!)); }
  }
  assert.deepEqual([...got].sort((x, y) => x[0] - y[0]), [[5, 8], [6, 4]]);
});

test('IdIndex.getOrSet and clear: a lookup-or-insert in one probe; cleared, it holds nothing and refills', () => {
  const ix = new IdIndex(4);
  assert.equal(ix.getOrSet(7, 0), 0);
  assert.equal(ix.getOrSet(7, 1), 0, 'present: its value, not the one offered');
  for (let i = 0; i < 100; i++) ix.getOrSet(1000 + i, i + 1);
  assert.equal(ix.size, 101);
  assert.equal(ix.get(1050), 51);
  ix.clear();
  assert.equal(ix.size, 0);
  assert.equal(ix.get(7), -1);
  assert.equal(ix.getOrSet(1050, 9), 9);
});

test('local updates of rows, done in one batch per step, equal the job\'s optimizer applied row by row (Adam and Adagrad; ids met again in later steps and windows, one id twice in a step)', () => {
  for (const sparse of [{ type: 'adam', learningRate: 0.01 }, { type: 'adagrad', learningRate: 0.05 }] as const) {
    const rng = new SeededRandom(11);
    const local = new LocalUpdates({ dense: { type: 'sgd', learningRate: 0.1 }, sparse });
    const ref = createOptimizer(sparse);
    const d = 4;
    // The reference: per id its state, step count and this window's delta, updated with updateRow one row at a time.
    const refRows = new Map<number, { state: Float32Array[]; steps: number; delta: Float32Array; window: number }>();
    let window = 0;
    let step = 0;
    for (let w = 0; w < 4; w++) {
      local.newWindow(); window++;
      for (let k = 0; k < 3; k++) {
        step++;
        const ids = Int32Array.from({ length: 30 }, () => Math.floor(rng.next() * 50));
        ids[1] = ids[0]!; // a repeated id
        const values = Float32Array.from({ length: ids.length * d }, () => rng.normal());
        const grads = Float32Array.from({ length: ids.length * d }, () => rng.normal());
        const applied = local.step(new Map(), new Map(), ids, new Map([['emb', values]]), new Map([['emb', grads]]), 0.5);
        assert.equal(applied, true);
        for (let u = 0; u < ids.length; u++) {
          let r = refRows.get(ids[u]!);
          if (r === undefined) { r = { state: ref.allocateState(d), steps: 0, delta: new Float32Array(d), window }; refRows.set(ids[u]!, r); }
          if (r.window !== window) { r.delta.fill(0); r.window = window; }
          const row = values.slice(u * d, u * d + d);
          r.steps++;
          ref.updateRow(row, grads.subarray(u * d, u * d + d), r.state, r.steps, step, 0.5);
          for (let c = 0; c < d; c++) r.delta[c] = r.delta[c]! + (row[c]! - values[u * d + c]!);
        }
        // What the member adds to the next pull of these rows is the reference's delta, exactly.
        const probe = Int32Array.from(new Set(ids));
        const pulled = new Float32Array(probe.length * d);
        local.overlayRows(probe, new Map([['emb', pulled]]));
        probe.forEach((id, u) => {
          for (let c = 0; c < d; c++) assert.equal(pulled[u * d + c], refRows.get(id)!.delta[c], `${sparse.type}: window ${w} step ${k} id ${id}[${c}]`);
        });
      }
    }
    assert.equal(local.rowsKept.emb, refRows.size);
  }
});
