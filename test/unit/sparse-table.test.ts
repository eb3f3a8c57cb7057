import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createOptimizer, type OptimizerConfigInput } from '../../native-bridge/optimizers.ts';
import { SparseTable, type SparseTableOptions } from '../../native-bridge/sparse-table.ts';
import { InvalidTensorError } from '../../runtime/errors.ts';

function table(overrides: Partial<SparseTableOptions> = {}): SparseTable {
  return new SparseTable({ table: 'emb', dim: 3, stateSlots: 2, seed: 7, initScale: 0.1, initialCapacity: 4, ...overrides });
}

test('rows are found again after the table grows many times', () => {
  const t = table();
  const ids = Array.from({ length: 2000 }, (_, i) => (i * 2654435761) >>> 0);
  const before = t.bytes;
  for (const id of ids) t.slotOf(id);
  assert.equal(t.size, ids.length);
  assert.ok(t.bytes > before, 'grew');
  for (const id of ids) {
    const s = t.find(id);
    assert.ok(s >= 0, `id ${id} found`);
    assert.deepEqual(t.values.subarray(s * 3, s * 3 + 3), t.initialRow(id));
  }
  assert.equal(t.find(12345), -1);
  assert.deepEqual([...t.ids()].sort((a, b) => a - b), [...ids].sort((a, b) => a - b));
});

test('a row never moves: its slot, trained values, optimizer state and step survive every growth; ids() lists rows in creation order', () => {
  const opt = createOptimizer({ type: 'adam', learningRate: 0.1 });
  const t = table();
  const first = Uint32Array.from([4_000_000_001, 5, 77]);
  t.applyGradients(first, Float32Array.from({ length: 9 }, (_, i) => i - 4), opt, 1);
  const slots = [...first].map((id) => t.find(id));
  assert.deepEqual(slots, [0, 1, 2], 'rows take the next place in creation order');
  const kept = [...first].map((id) => { const s = t.find(id); return { v: t.values.slice(s * 3, s * 3 + 3), st: t.state.slice(s * 6, s * 6 + 6), step: t.steps[s] }; });
  // Many growths of the index and the row arrays (initial capacity 4).
  const more = Uint32Array.from({ length: 5000 }, (_, i) => 1000 + i * 7);
  const out = new Int32Array(more.length);
  t.slotsOf(more, out);
  assert.deepEqual([...out].slice(0, 3), [3, 4, 5]);
  assert.deepEqual([...first].map((id) => t.find(id)), slots, 'the trained rows kept their slots');
  for (let k = 0; k < first.length; k++) {
    const s = slots[k]!;
    assert.deepEqual(t.values.slice(s * 3, s * 3 + 3), kept[k]!.v);
    assert.deepEqual(t.state.slice(s * 6, s * 6 + 6), kept[k]!.st);
    assert.equal(t.steps[s], 1);
    assert.equal(kept[k]!.step, 1);
  }
  assert.deepEqual([...t.ids()], [...first, ...more]);
  // Removing rows re-packs the others (a restore of what is kept), which are found again and grow on.
  assert.equal(t.remove((id) => id >= 1000 && id % 2 === 0), 2500);
  assert.equal(t.size, 2503);
  for (const id of first) assert.deepEqual(t.lookup([id]), kept[[...first].indexOf(id)]!.v);
  for (const id of more) assert.equal(t.find(id) >= 0, id % 2 !== 0, `id ${id}`);
  t.slotsOf(Uint32Array.from({ length: 3000 }, (_, i) => 900_000 + i), new Int32Array(3000));
  assert.equal(t.size, 5503);
  for (const id of first) assert.deepEqual(t.lookup([id]), kept[[...first].indexOf(id)]!.v);
});

test('initial rows depend only on (seed, table, id): equal across instances and pull orders', () => {
  const ids = Uint32Array.from([3, 99, 0, 4_000_000_000, 17]);
  const a = table().pull(ids);
  const b = table({ initialCapacity: 1000 });
  b.pull(Uint32Array.from([500, 17, 3]));
  assert.deepEqual(b.pull(ids), a);
  for (const v of a) assert.ok(Math.abs(v) <= 0.1);
  assert.notDeepEqual(table({ seed: 8 }).pull(ids), a, 'another seed, other rows');
  assert.notDeepEqual(table({ table: 'wide' }).pull(ids), a, 'another table, other rows');
  assert.deepEqual(table({ initScale: 0 }).pull(ids), new Float32Array(ids.length * 3), 'scale 0 starts at zero');
});

test('pull creates rows; lookup reads the same values without storing anything', () => {
  const t = table();
  const ids = Uint32Array.from([1, 2, 3]);
  const looked = t.lookup(ids);
  assert.equal(t.size, 0);
  assert.equal(t.has(2), false);
  assert.deepEqual(t.pull(ids), looked);
  assert.equal(t.size, 3);
  assert.ok(t.has(2));
  // an Int32Array id is its unsigned value: -1 and 2^32 − 1 are one row
  t.pull(Int32Array.from([-1]));
  assert.ok(t.has(0xffffffff));
  assert.equal(t.size, 4);
});

test('snapshot and restore round-trip values, optimizer state and row steps', () => {
  const opt = createOptimizer({ type: 'adam', learningRate: 0.1 });
  const t = table();
  const ids = Uint32Array.from([10, 20, 30, 40]);
  t.pull(ids);
  t.applyGradients(Uint32Array.from([10, 30]), Float32Array.from([1, 2, 3, 4, 5, 6]), opt, 1);
  t.applyGradients(Uint32Array.from([10]), Float32Array.from([-1, 0.5, 2]), opt, 2);
  const snap = t.snapshot();
  const copy = table({ initialCapacity: 1 });
  copy.restore(snap);
  assert.equal(copy.size, 4);
  assert.deepEqual(copy.snapshot(), snap);
  assert.deepEqual(copy.pull(ids), t.pull(ids));
  assert.equal(copy.steps[copy.find(10)], 2);
  assert.equal(copy.steps[copy.find(20)], 0);

  const even = t.snapshot((id) => id % 20 === 0);
  assert.deepEqual([...even.ids].sort((a, b) => a - b), [20, 40]);
  assert.throws(() => table({ dim: 4 }).restore(snap), RangeError);
});

/** A snapshot's rows in id order (a frozen copy lists them in the table's slot order of the moment it is built). */
function byId(snap: ReturnType<SparseTable['snapshot']>): ReturnType<SparseTable['snapshot']> {
  const d = snap.dim, sd = d * snap.stateSlots;
  const order = [...snap.ids.keys()].sort((a, b) => snap.ids[a]! - snap.ids[b]!);
  return {
    ...snap,
    ids: Uint32Array.from(order, (k) => snap.ids[k]!),
    values: Float32Array.from(order.flatMap((k) => [...snap.values.subarray(k * d, k * d + d)])),
    state: Float32Array.from(order.flatMap((k) => [...snap.state.subarray(k * sd, k * sd + sd)])),
    steps: Uint32Array.from(order, (k) => snap.steps[k]!),
  };
}

test('freezeCopy (copy-on-write): built later, it equals the snapshot of the moment it was taken — rows updated (twice), rows created and the table\'s growth after it change nothing', () => {
  const opt = createOptimizer({ type: 'adam', learningRate: 0.1 });
  const t = table();
  t.pull(Uint32Array.from([10, 20, 30, 40]));
  t.applyGradients(Uint32Array.from([10, 30]), Float32Array.from([1, 2, 3, 4, 5, 6]), opt, 1);
  const at = t.snapshot();
  const frozen = t.freezeCopy();
  t.applyGradients(Uint32Array.from([10, 20, 77]), Float32Array.from([9, 9, 9, -9, -9, -9, 1, 1, 1]), opt, 2);
  t.applyGradients(Uint32Array.from([10]), Float32Array.from([3, 3, 3]), opt, 3);
  t.pull(Uint32Array.from(Array.from({ length: 100 }, (_, i) => 1_000 + i)));
  assert.notDeepEqual(byId(t.snapshot((id) => id < 100)), byId(at), 'the table moved on');
  assert.deepEqual(byId(frozen()), byId(at));
  assert.deepEqual(byId(frozen()), byId(at), 'the same copy when asked again');
  // Once built, updates are no longer copied.
  t.applyGradients(Uint32Array.from([40]), Float32Array.from([1, 1, 1]), opt, 4);
  assert.deepEqual(byId(frozen()), byId(at));
});

test('freezeCopy: a remove, a restore or another freeze builds the pending copy first', () => {
  const opt = createOptimizer({ type: 'adagrad', learningRate: 0.1 });
  const t = table({ stateSlots: 1 });
  t.pull(Uint32Array.from([1, 2, 3]));
  const at = t.snapshot();
  const first = t.freezeCopy();
  t.applyGradients(Uint32Array.from([1]), Float32Array.from([1, 1, 1]), opt, 1);
  const second = t.freezeCopy();
  const at2 = t.snapshot();
  t.remove((id) => id === 2);
  t.applyGradients(Uint32Array.from([3]), Float32Array.from([1, 1, 1]), opt, 2);
  assert.deepEqual(byId(first()), byId(at));
  assert.deepEqual(byId(second()), byId(at2));
});

test('remove drops the selected rows and keeps the others intact', () => {
  const opt = createOptimizer({ type: 'adam', learningRate: 0.1 });
  const t = table();
  const ids = Uint32Array.from(Array.from({ length: 50 }, (_, i) => i));
  t.pull(ids);
  t.applyGradients(ids, Float32Array.from({ length: 150 }, (_, i) => Math.sin(i)), opt, 1);
  const before = t.snapshot((id) => id % 2 === 1);
  assert.equal(t.remove((id) => id % 2 === 0), 25);
  assert.equal(t.size, 25);
  assert.equal(t.has(4), false);
  assert.ok(t.has(5));
  assert.deepEqual(t.snapshot(), before);
  assert.equal(t.remove(() => false), 0);
});

for (const config of [
  { type: 'adam', learningRate: 0.05 },
  { type: 'adagrad', learningRate: 0.1, initialAccumulator: 0.1 },
  { type: 'momentum', learningRate: 0.1, momentum: 0.9 },
  { type: 'sgd', learningRate: 0.1 },
] satisfies OptimizerConfigInput[]) {
  test(`applyGradients (${config.type}) merges duplicate ids, updates rows lazily and matches updateRow`, () => {
    const opt = createOptimizer(config);
    const dim = 3;
    const initialState = opt.allocateState(1).map((a) => a[0]!);
    const t = table({ stateSlots: opt.stateSlots(), initialState });
    t.pull(Uint32Array.from([9])); // a stored row no gradient touches

    // Reference: each distinct row updated once by updateRow with the summed gradient.
    const rows = new Map<number, { w: Float32Array; state: Float32Array[]; step: number }>();
    const reference = (ids: number[], grads: number[], scheduleStep: number) => {
      const sums = new Map<number, Float32Array>();
      ids.forEach((id, k) => {
        const g = sums.get(id) ?? new Float32Array(dim);
        for (let j = 0; j < dim; j++) g[j] = g[j]! + grads[k * dim + j]!;
        sums.set(id, g);
      });
      for (const [id, g] of sums) {
        let r = rows.get(id);
        if (r === undefined) { r = { w: t.initialRow(id), state: opt.allocateState(dim), step: 0 }; rows.set(id, r); }
        r.step++;
        opt.updateRow(r.w, g, r.state, r.step, scheduleStep, 1);
      }
    };

    const row9 = t.snapshot((id) => id === 9);
    const calls: [number[], number[]][] = [
      [[5, 7, 5], [0.5, -1, 2, 0.1, 0.2, 0.3, 1.5, 1, -1]],
      [[5, 11], [1, 1, 1, -2, 0.5, 0.25]],
    ];
    calls.forEach(([ids, grads], k) => {
      const updated = t.applyGradients(Int32Array.from(ids), Float32Array.from(grads), opt, k + 1);
      assert.equal(updated, new Set(ids).size);
      reference(ids, grads, k + 1);
    });
    for (const [id, r] of rows) {
      const s = t.find(id);
      assert.deepEqual(t.values.subarray(s * dim, s * dim + dim), r.w, `row ${id}`);
      assert.equal(t.steps[s], r.step, `row ${id} steps`);
      const sd = dim * opt.stateSlots();
      for (let k = 0; k < opt.stateSlots(); k++) {
        assert.deepEqual(t.state.subarray(s * sd + k * dim, s * sd + (k + 1) * dim), r.state[k], `row ${id} state ${k}`);
      }
    }
    assert.equal(t.steps[t.find(5)], 2, 'a duplicated id counts as one update per call');
    assert.equal(t.steps[t.find(7)], 1, 'row 7 stayed at its own step');
    assert.deepEqual(t.snapshot((id) => id === 9), row9, 'untouched row unchanged, bit for bit');
  });
}

test('a NaN gradient changes nothing and creates no row', () => {
  const opt = createOptimizer({ type: 'adam', learningRate: 0.1 });
  const t = table();
  t.pull(Uint32Array.from([1]));
  const before = t.snapshot();
  assert.throws(
    () => t.applyGradients(Uint32Array.from([1, 2]), Float32Array.from([1, 1, 1, 0, NaN, 0]), opt, 1),
    (e: unknown) => e instanceof InvalidTensorError && /NaN at id 2/.test(e.message) && /nothing was updated/.test(e.message),
  );
  assert.deepEqual(t.snapshot(), before);
  assert.equal(t.has(2), false);
});

test('applyGradients rejects a gradient of the wrong size or an optimizer with other state slots', () => {
  const t = table();
  const adam = createOptimizer({ type: 'adam', learningRate: 0.1 });
  assert.throws(() => t.applyGradients(Uint32Array.from([1]), new Float32Array(2), adam, 1), InvalidTensorError);
  assert.throws(() => t.applyGradients(Uint32Array.from([1]), new Float32Array(3), createOptimizer({ type: 'sgd', learningRate: 0.1 }), 1), /state slots/);
});

test('slotsOf finds many ids at once, creating missing rows (also across a growth) like slotOf', () => {
  const t = table({ initialCapacity: 4 });
  t.pull(Uint32Array.from([5, 6, 7]));
  const ids = Int32Array.from([7, 100, 5, 100, ...Array.from({ length: 200 }, (_, i) => 1000 + i), -1]);
  const slots = new Int32Array(ids.length);
  t.slotsOf(ids, slots);
  assert.equal(t.size, 3 + 1 + 200 + 1, 'each missing id created once');
  for (let k = 0; k < ids.length; k++) {
    assert.equal(slots[k], t.find(ids[k]!), `slot of ${ids[k]} is current after growth`);
    assert.deepEqual(t.values.subarray(slots[k]! * 3, slots[k]! * 3 + 3), t.initialRow(ids[k]! >>> 0));
  }
});
