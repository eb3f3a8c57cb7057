import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ActorSystem, InProcessBroker, SeededRandom, Transport, isRetryable, systemClock } from '../../runtime/mod.ts';
import { buildShardPlan, shardOfSparseId, type ShardPlan, type StalenessPolicy } from '../../topology/mod.ts';
import { StaleUpdateError, createShardActor, type PullReply, type PushReply, type ShardStats } from '../../actors/mod.ts';

const LR = 0.1;

function plan(): ShardPlan {
  return buildShardPlan({
    version: 1, shards: ['s0'], partitions: 4, maxBlockBytes: 16,
    denseParams: [{ name: 'w', size: 4 }], sparseTables: [{ name: 'emb', dim: 2 }],
  });
}

async function shard(staleness: StalenessPolicy | null, optimizer: { type: 'sgd' | 'adam'; learningRate: number } = { type: 'sgd', learningRate: LR }) {
  const p = plan();
  const broker = new InProcessBroker();
  const mk = (node: string) => new ActorSystem({
    transport: new Transport(broker.client(), { clientId: node, clock: systemClock }), job: 'stale', node, clock: systemClock, random: new SeededRandom(1),
  });
  const server = mk('server');
  const client = mk('client');
  await server.spawn(createShardActor({
    shard: 's0', plan: p, initialDense: new Map([['w', Float32Array.from([1, 2, 3, 4])]]),
    denseOptimizer: optimizer, sparseOptimizer: optimizer,
    sparseInitScale: 0.1, seed: 3, clock: systemClock, staleness,
  }));
  const ref = client.ref('shard', 's0@s0');
  const id = 7;
  assert.equal(shardOfSparseId(p, id), 's0');
  const ids = Int32Array.from([id]);
  return {
    pull: () => ref.request<PullReply & Record<string, unknown>>('pull', { plan_version: 1, dense: Int32Array.from([0]), sparse: [{ table: 'emb', ids }], min_round: null }),
    push: (baseVersion: number, g: number, later: number[] = []) => ref.request<PushReply & Record<string, unknown>>('push', {
      plan_version: 1, round: null, expected: null, weight: 16, base_version: baseVersion,
      dense: [{ block: 0, grad: Float32Array.from([g, -g, 2 * g, 0]) }],
      sparse: [{ table: 'emb', ids, grads: Float32Array.from([g, 2 * g]) }],
      later_steps: later.map((h) => ({ dense: [{ block: 0, grad: Float32Array.from([h, -h, 2 * h, 0]) }], sparse: [{ table: 'emb', ids, grads: Float32Array.from([h, 2 * h]) }] })),
    }),
    rawPush: (body: Record<string, unknown>) => ref.request<PushReply & Record<string, unknown>>('push', body),
    stats: () => ref.request<ShardStats & Record<string, unknown>>('stats', {}),
    stop: async () => { await client.stop(); await server.stop(); },
  };
}

/** One SGD step as the optimizer computes it (float64, stored as float32) at lr·lrScale. */
const sgd = (w: number, g: number, lrScale: number) => Math.fround(w - LR * lrScale * g);

function expectStep(before: PullReply, after: PullReply, g: number, lrScale: number): void {
  const dg = [g, -g, 2 * g, 0];
  assert.deepEqual([...after.dense[0]!], [...before.dense[0]!].map((w, i) => sgd(w, dg[i]!, lrScale)));
  assert.deepEqual([...after.sparse[0]!], [...before.sparse[0]!].map((w, i) => sgd(w, [g, 2 * g][i]!, lrScale)));
}

test('hps staleness policy at the shard: a push s updates stale is applied at lr/(1+s); beyond max_staleness it is refused with StaleUpdateError and changes nothing', async () => {
  const s = await shard({ maxStaleness: 2, scaling: 'inverse' });
  try {
    let before = await s.pull();
    assert.deepEqual(await s.push(0, 1), { version: 1, applied: true, staleness: 0, lr_scale: 1 });
    let after = await s.pull();
    expectStep(before, after, 1, 1);

    // Computed from version 0, the shard is at 1: one update stale → half the learning rate.
    before = after;
    assert.deepEqual(await s.push(0, 0.5), { version: 2, applied: true, staleness: 1, lr_scale: 0.5 });
    after = await s.pull();
    expectStep(before, after, 0.5, 0.5);

    // Two stale: still admitted (max_staleness 2), at a third.
    before = after;
    const r = await s.push(0, 0.25);
    assert.equal(r.staleness, 2);
    assert.equal(r.lr_scale, 1 / 3);
    after = await s.pull();
    expectStep(before, after, 0.25, 1 / 3);

    // Three stale: refused, not retryable, nothing applied.
    before = after;
    await assert.rejects(s.push(0, 9), (e: unknown) => {
      assert.ok(e instanceof StaleUpdateError, `got ${(e as Error).name}`);
      assert.equal(isRetryable(e), false);
      assert.deepEqual(e.data, { shard: 's0', staleness: 3, max_staleness: 2, version: 3, base_version: 0 });
      assert.match(e.message, /3 updates stale.*max_staleness is 2/);
      return true;
    });
    after = await s.pull();
    assert.equal(after.version, 3, 'a refused push is no update');
    assert.deepEqual(after.dense, before.dense);
    assert.deepEqual(after.sparse, before.sparse);

    // A fresh push after the refusal goes through at full rate.
    assert.equal((await s.push(3, 1)).lr_scale, 1);

    const st = await s.stats();
    assert.equal(st.max_staleness, 2);
    assert.equal(st.stale_refused, 1);
    assert.equal(st.stale_scaled, 2);
    assert.equal(st.staleness.count, 5, 'every push is measured, the refused one too');
    assert.equal(st.staleness.max, 3);
    assert.equal(st.staleness.sum, 0 + 1 + 2 + 3 + 0);
    assert.deepEqual(st.staleness.counts.slice(0, 4), [2, 1, 1, 1], 'buckets ≤0, ≤1, ≤2, ≤4');
  } finally {
    await s.stop();
  }
});

test('without a staleness policy (asp, bsp) a stale push is applied at full rate and only measured', async () => {
  const s = await shard(null);
  try {
    for (let i = 0; i < 5; i++) await s.push(i, 0.1);
    const before = await s.pull();
    const r = await s.push(0, 1);
    assert.deepEqual(r, { version: 6, applied: true, staleness: 5, lr_scale: 1 });
    expectStep(before, await s.pull(), 1, 1);
    const st = await s.stats();
    assert.equal(st.max_staleness, null);
    assert.equal(st.stale_refused, 0);
    assert.equal(st.stale_scaled, 0);
    assert.equal(st.staleness.max, 5);
  } finally {
    await s.stop();
  }
});

test('auto tolerance: pushes as stale as the shard\'s recent median go at full rate, staler ones at lr·(1 + t)/(1 + s)', async () => {
  const s = await shard({ maxStaleness: 10, scaling: 'inverse', tolerance: 'auto' });
  try {
    // Ten pushes each 2 updates stale (the first ones less: there is no version 2 back yet) make 2 the normal staleness.
    for (let i = 0; i < 10; i++) await s.push(Math.max(0, i - 2), 0.01);
    let before = await s.pull();
    const normal = await s.push(before.version - 2, 0.5);
    assert.equal(normal.staleness, 2);
    assert.equal(normal.lr_scale, 1, 'as stale as usual: full rate');
    let after = await s.pull();
    expectStep(before, after, 0.5, 1);
    before = after;
    const slow = await s.push(before.version - 8, 0.5);
    assert.equal(slow.staleness, 8);
    assert.equal(slow.lr_scale, 3 / 9, '(1 + 2) / (1 + 8)');
    after = await s.pull();
    expectStep(before, after, 0.5, 3 / 9);
  } finally {
    await s.stop();
  }
});

test('a push with later_steps is consecutive updates at one rate; a bad later step refuses the whole push', async () => {
  const s = await shard({ maxStaleness: 10, scaling: 'inverse', tolerance: 0 });
  try {
    await s.push(0, 0.1);
    const before = await s.pull();
    // Computed from version 0 at version 1: one stale → every step at lr / 2.
    const r = await s.push(0, 1, [2, -1]);
    assert.deepEqual(r, { version: 4, applied: true, staleness: 1, lr_scale: 0.5 });
    const after = await s.pull();
    const dense = [...before.dense[0]!].map((w, i) => [[1, -1, 2, 0], [2, -2, 4, 0], [-1, 1, -2, 0]].reduce((x, g) => sgd(x, g[i]!, 0.5), w));
    assert.deepEqual([...after.dense[0]!], dense);
    const sparse = [...before.sparse[0]!].map((w, i) => [[1, 2], [2, 4], [-1, -2]].reduce((x, g) => sgd(x, g[i]!, 0.5), w));
    assert.deepEqual([...after.sparse[0]!], sparse);

    await assert.rejects(s.rawPush({
      plan_version: 1, round: null, expected: null, weight: 16, base_version: 4,
      dense: [{ block: 0, grad: Float32Array.from([1, 1, 1, 1]) }], sparse: [],
      later_steps: [{ dense: [{ block: 0, grad: Float32Array.from([1, Number.NaN, 1, 1]) }], sparse: [] }],
    }), /later_steps\[0\]|NaN/);
    assert.deepEqual([...(await s.pull()).dense[0]!], dense, 'nothing of the refused push was applied, not even its first step');
    await assert.rejects(s.rawPush({
      plan_version: 1, round: 1, expected: 1, weight: 16, base_version: 4,
      dense: [{ block: 0, grad: Float32Array.from([1, 1, 1, 1]) }], sparse: [],
      later_steps: [{ dense: [{ block: 0, grad: Float32Array.from([1, 1, 1, 1]) }], sparse: [] }],
    }), /cannot carry further steps/);
  } finally {
    await s.stop();
  }
});

test('a group update\'s lr_mult (training.group_lr_scaling) multiplies the staleness scale; a bad one, or one on a sync round, is refused and changes nothing', async () => {
  const s = await shard({ maxStaleness: 4, scaling: 'inverse', tolerance: 0 });
  try {
    const body = (baseVersion: number, g: number, extra: Record<string, unknown>) => ({
      plan_version: 1, round: null, expected: null, weight: 16, base_version: baseVersion,
      dense: [{ block: 0, grad: Float32Array.from([g, -g, 2 * g, 0]) }],
      sparse: [{ table: 'emb', ids: Int32Array.from([7]), grads: Float32Array.from([g, 2 * g]) }], ...extra,
    });
    let before = await s.pull();
    assert.deepEqual(await s.rawPush(body(0, 1, { lr_mult: 2 })), { version: 1, applied: true, staleness: 0, lr_scale: 2 });
    let after = await s.pull();
    expectStep(before, after, 1, 2);
    // One update stale: lr/(1+1) from the policy, ×2 from the group's rule.
    before = after;
    assert.deepEqual(await s.rawPush(body(0, 0.5, { lr_mult: 2 })), { version: 2, applied: true, staleness: 1, lr_scale: 1 });
    after = await s.pull();
    expectStep(before, after, 0.5, 1);
    const st = await s.stats();
    assert.equal(st.version, 2);
    for (const bad of [0, -1, Number.NaN, Number.POSITIVE_INFINITY, 2000, '2']) {
      await assert.rejects(s.rawPush(body(2, 1, { lr_mult: bad })), /lr_mult/, `lr_mult ${String(bad)} is refused by name`);
    }
    await assert.rejects(s.rawPush({ ...body(2, 1, { lr_mult: 2 }), round: 0, expected: 1 }), /cannot carry a learning-rate multiplier/);
    assert.deepEqual([...(await s.pull()).dense[0]!], [...after.dense[0]!], 'nothing of a refused push was applied');
    assert.equal((await s.stats()).version, 2);
  } finally {
    await s.stop();
  }
});

test('max_staleness { dense, sparse }: a push past the dense bound has its rows applied and its dense part dropped; past both, or carrying only the dropped kind, it is refused', async () => {
  const s = await shard({ maxStaleness: 1, sparseMaxStaleness: 3, scaling: 'inverse', tolerance: 0 });
  try {
    await s.push(0, 0.1);
    await s.push(1, 0.1);
    let before = await s.pull();
    // Two updates stale: past the dense bound (1), within the rows' (3).
    assert.deepEqual(await s.push(0, 1), { version: 3, applied: true, staleness: 2, lr_scale: 0, sparse_lr_scale: 1 / 3, dropped: 'dense' });
    let after = await s.pull();
    assert.deepEqual([...after.dense[0]!], [...before.dense[0]!], 'the dense part was dropped');
    assert.deepEqual([...after.sparse[0]!], [...before.sparse[0]!].map((w, i) => sgd(w, [1, 2][i]!, 1 / 3)), 'the rows applied at lr/(1+s)');
    // Within both: both applied.
    before = after;
    assert.deepEqual(await s.push(2, 0.5), { version: 4, applied: true, staleness: 1, lr_scale: 0.5 });
    after = await s.pull();
    expectStep(before, after, 0.5, 0.5);
    // Dense only, past the dense bound: nothing it carries may be applied, so it is refused.
    before = after;
    await assert.rejects(s.rawPush({
      plan_version: 1, round: null, expected: null, weight: 16, base_version: 1,
      dense: [{ block: 0, grad: Float32Array.from([1, 1, 1, 1]) }], sparse: [], later_steps: [],
    }), (e: unknown) => {
      assert.ok(e instanceof StaleUpdateError, `got ${(e as Error).name}`);
      assert.deepEqual(e.data, { shard: 's0', staleness: 3, max_staleness: 1, sparse_max_staleness: 3, version: 4, base_version: 1 });
      assert.match(e.message, /3 updates stale.*max_staleness is \{ dense: 1, sparse: 3 \}/);
      return true;
    });
    // Past both bounds: refused.
    await assert.rejects(s.push(0, 9), (e: unknown) => e instanceof StaleUpdateError && e.data?.staleness === 4);
    after = await s.pull();
    assert.equal(after.version, 4, 'a refused push is no update');
    assert.deepEqual(after.dense, before.dense);
    assert.deepEqual(after.sparse, before.sparse);

    const st = await s.stats();
    assert.deepEqual([st.max_staleness, st.sparse_max_staleness], [1, 3]);
    assert.deepEqual([st.stale_refused, st.stale_dense_dropped, st.stale_sparse_dropped], [2, 1, 0]);
  } finally {
    await s.stop();
  }
});

test('a dense part dropped as too stale does not run the optimizer: Adam\'s moments and step are as if the push never carried it', async () => {
  const adam = { type: 'adam', learningRate: 0.01 } as const;
  const policy = { maxStaleness: 0, sparseMaxStaleness: 8, scaling: 'inverse', tolerance: 0 } as const;
  const dropped = await shard(policy, adam);
  const clean = await shard(policy, adam);
  try {
    // Both shards take the same fresh push; one of them then a push whose dense part is dropped (one stale).
    for (const s of [dropped, clean]) await s.push(0, 1);
    assert.equal((await dropped.push(0, 5)).lr_scale, 0);
    // The same fresh dense push on both: equal results only if the dropped part left Adam's state alone.
    const fresh = (s: typeof dropped, base: number) => s.rawPush({
      plan_version: 1, round: null, expected: null, weight: 16, base_version: base,
      dense: [{ block: 0, grad: Float32Array.from([0.3, -0.2, 0.1, 0.4]) }], sparse: [], later_steps: [],
    });
    await fresh(dropped, 2);
    await fresh(clean, 1);
    assert.deepEqual([...(await dropped.pull()).dense[0]!], [...(await clean.pull()).dense[0]!]);
    const st = await dropped.stats();
    assert.equal(st.stale_dense_dropped, 1);
  } finally {
    await dropped.stop();
    await clean.stop();
  }
});
