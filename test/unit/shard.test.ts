import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  ActorStoppedError, ActorSystem, InProcessBroker, InvalidTensorError, SeededRandom, Transport, ValidationError, systemClock,
} from '../../runtime/mod.ts';
import { buildShardPlan, shardOfSparseId, type ShardPlan } from '../../topology/mod.ts';
import { SparseTable, type OptimizerConfigInput } from '../../native-bridge/mod.ts';
import {
  StalePlanError, SyncRoundError, createShardActor, type PullReply, type PushReply, type ShardSnapshot, type ShardStats,
} from '../../actors/mod.ts';

const SEED = 11;
const INIT_SCALE = 0.1;

/**
 * Two shards. Blocks of 4 floats: w[0..4) → s0, w[4..6) → s1, b[0..2) → s1
 * (least-loaded first). Sparse ids are hashed over 8 partitions, dealt s0, s1, s0, …
 */
function testPlan(version = 1, shards = ['s0', 's1']): ShardPlan {
  return buildShardPlan({
    version, shards, partitions: 8, maxBlockBytes: 16,
    denseParams: [{ name: 'w', size: 6 }, { name: 'b', size: 2 }],
    sparseTables: [{ name: 'emb', dim: 4 }, { name: 'wide', dim: 1 }],
  });
}

function initialDense(): Map<string, Float32Array> {
  return new Map([['w', Float32Array.from([1, 2, 3, 4, 5, 6])], ['b', Float32Array.from([0.5, -0.5])]]);
}

/** The first `n` ids (from 1 up) owned by `shard`. */
function idsOf(plan: ShardPlan, shard: string, n: number): Int32Array {
  const out: number[] = [];
  for (let id = 1; out.length < n; id++) if (shardOfSparseId(plan, id) === shard) out.push(id);
  return Int32Array.from(out);
}

interface Setup {
  broker: InProcessBroker;
  server: ActorSystem;
  client: ActorSystem;
  plan: ShardPlan;
  stop: () => Promise<void>;
}

function system(broker: InProcessBroker, node: string, job = 'test'): ActorSystem {
  const transport = new Transport(broker.client(), { clientId: node, clock: systemClock });
  return new ActorSystem({ transport, job, node, clock: systemClock, random: new SeededRandom(1), defaultRequestTimeoutMs: 2_000 });
}

async function startShards(opts: {
  plan?: ShardPlan; shards?: string[]; dense?: OptimizerConfigInput; sparse?: OptimizerConfigInput; job?: string; broker?: InProcessBroker;
} = {}): Promise<Setup> {
  const plan = opts.plan ?? testPlan();
  const broker = opts.broker ?? new InProcessBroker();
  const job = opts.job ?? 'test';
  const server = system(broker, 'server', job);
  const client = system(broker, 'client', job);
  for (const shard of opts.shards ?? plan.shards) {
    await server.spawn(createShardActor({
      shard, plan, initialDense: initialDense(),
      denseOptimizer: opts.dense ?? { type: 'sgd', learningRate: 0.1 },
      sparseOptimizer: opts.sparse ?? { type: 'sgd', learningRate: 0.1 },
      sparseInitScale: INIT_SCALE, seed: SEED, clock: systemClock,
    }));
  }
  return { broker, server, client, plan, stop: async () => { await server.stop(); await client.stop(); } };
}

function pull(s: Setup, shard: string, fields: { dense?: number[]; sparse?: { table: string; ids: Int32Array }[]; min_round?: number | null; plan_version?: number }): Promise<PullReply> {
  return s.client.ref('shard', `${shard}@${shard}`).request<PullReply & Record<string, unknown>>('pull', {
    plan_version: fields.plan_version ?? s.plan.version,
    dense: Int32Array.from(fields.dense ?? []),
    sparse: fields.sparse ?? [],
    min_round: fields.min_round ?? null,
  });
}

interface PushFields {
  dense?: { block: number; grad: Float32Array }[];
  sparse?: { table: string; ids: Int32Array; grads: Float32Array }[];
  round?: number | null; expected?: number | null; weight?: number; base_version?: number; plan_version?: number;
}

function push(s: Setup, shard: string, f: PushFields, seq?: number): Promise<PushReply> {
  return s.client.ref('shard', `${shard}@${shard}`).request<PushReply & Record<string, unknown>>('push', {
    plan_version: f.plan_version ?? s.plan.version,
    round: f.round ?? null, expected: f.expected ?? null, weight: f.weight ?? 1, base_version: f.base_version ?? 0,
    dense: f.dense ?? [], sparse: f.sparse ?? [],
  }, seq === undefined ? {} : { seq });
}

function stats(s: Setup, shard: string): Promise<ShardStats> {
  return s.client.ref('shard', `${shard}@${shard}`).request<ShardStats & Record<string, unknown>>('stats', {});
}

const f32 = (xs: number[]) => Float32Array.from(xs);
/** One SGD step at lr 0.1 as the optimizer computes it: float64 arithmetic, stored as float32. */
const sgd = (w: number, g: number) => Math.fround(w - 0.1 * g);

test('pull creates sparse rows deterministically: shards with the same seed agree on a new row', async () => {
  const s = await startShards();
  const solo = await startShards({ plan: testPlan(1, ['solo']), job: 'solo' });
  const ids = idsOf(s.plan, 's0', 5);
  const a = await pull(s, 's0', { sparse: [{ table: 'emb', ids }, { table: 'wide', ids }] });
  const again = await pull(s, 's0', { sparse: [{ table: 'emb', ids }] });
  const b = await pull(solo, 'solo', { sparse: [{ table: 'emb', ids }, { table: 'wide', ids }] });
  assert.equal(a.sparse.length, 2);
  assert.equal(a.sparse[0]!.length, ids.length * 4);
  assert.equal(a.sparse[1]!.length, ids.length);
  assert.deepEqual(again.sparse[0], a.sparse[0], 'a second pull reads the stored rows');
  assert.deepEqual(b.sparse, a.sparse, 'another shard (another plan) with the same seed creates the same rows');
  const expected = new SparseTable({ table: 'emb', dim: 4, stateSlots: 0, seed: SEED, initScale: INIT_SCALE, initialCapacity: 1 }).initialRow(ids[2]!);
  assert.deepEqual(a.sparse[0]!.subarray(8, 12), expected, 'the row is the (seed, table, id) initialiser');
  for (const v of a.sparse[0]!) assert.ok(Math.abs(v) <= INIT_SCALE && v !== 0);
  const st = await stats(s, 's0');
  assert.deepEqual(st.sparse_rows, { emb: 5, wide: 5 });
  assert.equal(st.pulls, 2);
  await s.stop(); await solo.stop();
});

test('pull returns the shard\'s own dense blocks in request order', async () => {
  const s = await startShards();
  const r = await pull(s, 's1', { dense: [2, 1] });
  assert.deepEqual(r.dense, [f32([0.5, -0.5]), f32([5, 6])]);
  assert.equal(r.version, 0);
  assert.equal(r.round, 0);
  await s.stop();
});

test('pulls of blocks or ids the shard does not own, or of unknown tables, are rejected naming them', async () => {
  const s = await startShards();
  await assert.rejects(pull(s, 's0', { dense: [1] }), (e: unknown) => e instanceof ValidationError && /block 1 .*belongs to shard s1/.test(e.message));
  await assert.rejects(pull(s, 's0', { dense: [9] }), (e: unknown) => e instanceof ValidationError && /block 9 is not in shard plan/.test(e.message));
  const foreign = idsOf(s.plan, 's1', 1);
  const mixed = Int32Array.from([...idsOf(s.plan, 's0', 2), foreign[0]!]);
  await assert.rejects(pull(s, 's0', { sparse: [{ table: 'emb', ids: mixed }] }),
    (e: unknown) => e instanceof ValidationError && new RegExp(`id ${foreign[0]} .*index 2.*owned by shard s1`).test(e.message));
  await assert.rejects(pull(s, 's0', { sparse: [{ table: 'nope', ids: idsOf(s.plan, 's0', 1) }] }),
    (e: unknown) => e instanceof ValidationError && /unknown sparse table "nope"/.test(e.message));
  assert.deepEqual((await stats(s, 's0')).sparse_rows, { emb: 0, wide: 0 }, 'a rejected pull creates no rows');
  await s.stop();
});

test('a stale plan version arrives as StalePlanError (retryable) for pulls and pushes', async () => {
  const s = await startShards();
  await assert.rejects(pull(s, 's0', { dense: [0], plan_version: 0 }), (e: unknown) => {
    assert.ok(e instanceof StalePlanError, `got ${(e as Error).name}`);
    assert.equal(e.retryable, true);
    assert.deepEqual(e.data, { shard: 's0', shard_plan_version: 1, request_plan_version: 0 });
    return true;
  });
  await assert.rejects(push(s, 's0', { plan_version: 2 }), StalePlanError);
  await s.stop();
});

test('an async push applies SGD exactly: w ← w − lr·g for dense blocks and sparse rows', async () => {
  const s = await startShards();
  const ids = idsOf(s.plan, 's0', 2);
  const before = await pull(s, 's0', { sparse: [{ table: 'emb', ids }] });
  const row0 = before.sparse[0]!.slice(0, 4);
  const r = await push(s, 's0', {
    dense: [{ block: 0, grad: f32([1, -2, 0.5, 0]) }],
    // the first id twice: its gradients are summed into one update
    sparse: [{ table: 'emb', ids: Int32Array.from([ids[0]!, ids[0]!]), grads: f32([1, 0, 0, 0, 1, 2, 0, 0]) }],
  });
  assert.deepEqual(r, { version: 1, applied: true, staleness: 0, lr_scale: 1 });
  const after = await pull(s, 's0', { dense: [0], sparse: [{ table: 'emb', ids }] });
  assert.deepEqual(after.dense[0], f32([sgd(1, 1), sgd(2, -2), sgd(3, 0.5), 4]));
  assert.deepEqual(after.sparse[0]!.subarray(0, 4), f32([sgd(row0[0]!, 2), sgd(row0[1]!, 2), row0[2]!, row0[3]!]));
  assert.deepEqual(after.sparse[0]!.subarray(4, 8), before.sparse[0]!.subarray(4, 8), 'an id not pushed is unchanged');
  assert.equal(after.version, 1);
  const second = await push(s, 's0', { dense: [{ block: 0, grad: f32([0, 0, 0, 0]) }], base_version: 0 });
  assert.deepEqual(second, { version: 2, applied: true, staleness: 1, lr_scale: 1 });
  const st = await stats(s, 's0');
  assert.equal(st.pushes, 2);
  assert.equal(st.staleness.count, 2);
  assert.equal(st.staleness.sum, 1);
  assert.equal(st.staleness.counts[0], 1);
  assert.equal(st.staleness.counts[1], 1);
  await s.stop();
});

test('a retried push (same from, seq) is applied once and counted as a duplicate', async () => {
  const s = await startShards();
  const fields = { dense: [{ block: 0, grad: f32([1, 1, 1, 1]) }] };
  const first = await push(s, 's0', fields, 77);
  const retry = await push(s, 's0', fields, 77);
  assert.deepEqual(retry, first, 'the retry gets the reply already sent');
  const r = await pull(s, 's0', { dense: [0] });
  assert.equal(r.version, 1);
  assert.deepEqual(r.dense[0], f32([1, 2, 3, 4].map((x) => sgd(x, 1))));
  const st = await stats(s, 's0');
  assert.equal(st.duplicates, 1);
  assert.equal(st.pushes, 1);
  await s.stop();
});

test('a NaN or Inf gradient is rejected naming tensor and index, and nothing of the push is applied', async () => {
  const s = await startShards();
  const ids = idsOf(s.plan, 's1', 2);
  const before = await pull(s, 's1', { dense: [1, 2], sparse: [{ table: 'emb', ids }] });
  const snap = { dense: before.dense.map((d) => d.slice()), sparse: before.sparse[0]!.slice() };
  await assert.rejects(push(s, 's1', {
    dense: [{ block: 1, grad: f32([1, 1]) }, { block: 2, grad: f32([0, Number.NaN]) }],
    sparse: [{ table: 'emb', ids, grads: new Float32Array(8).fill(1) }],
  }), (e: unknown) => e instanceof InvalidTensorError && /dense block 2 \(b\[0\.\.2\)\) has NaN at index 1/.test(e.message)
    && e.data?.index === 1 && e.data?.tensor === 'b[0..2)');
  const grads = new Float32Array(8);
  grads[6] = Number.POSITIVE_INFINITY;
  await assert.rejects(push(s, 's1', { dense: [{ block: 1, grad: f32([1, 1]) }], sparse: [{ table: 'emb', ids, grads }] }),
    (e: unknown) => e instanceof InvalidTensorError && new RegExp(`emb has Infinity at index 6 \\(id ${ids[1]}, entry 1, element 2\\)`).test(e.message));
  await assert.rejects(push(s, 's1', { dense: [{ block: 1, grad: f32([1, 1, 1]) }] }),
    (e: unknown) => e instanceof InvalidTensorError && /3 elements, the block has 2/.test(e.message));
  await assert.rejects(push(s, 's1', { sparse: [{ table: 'emb', ids, grads: new Float32Array(7) }] }),
    (e: unknown) => e instanceof InvalidTensorError && /7 floats for 2 ids of dim 4/.test(e.message));
  await assert.rejects(push(s, 's1', { dense: [{ block: 0, grad: f32([1, 1, 1, 1]) }] }), ValidationError);
  const after = await pull(s, 's1', { dense: [1, 2], sparse: [{ table: 'emb', ids }] });
  assert.deepEqual(after.dense, snap.dense, 'dense blocks unchanged');
  assert.deepEqual(after.sparse[0], snap.sparse, 'rows unchanged');
  assert.equal(after.version, 0, 'version unchanged');
  assert.equal((await stats(s, 's1')).pushes, 0);
  await s.stop();
});

test('a synchronous round applies the weighted mean once, and a pull with min_round waits for it', async () => {
  const s = await startShards();
  const ids = idsOf(s.plan, 's0', 2);
  const before = await pull(s, 's0', { dense: [0], sparse: [{ table: 'emb', ids }] });
  const rows = before.sparse[0]!.slice();
  const contributions = [
    { weight: 1, grad: f32([1, 0, 0, 4]), sparse: { ids: Int32Array.from([ids[0]!]), grads: f32([4, 0, 0, 0]) } },
    { weight: 2, grad: f32([2, 0, 4, 0]), sparse: { ids: Int32Array.from([ids[0]!, ids[1]!]), grads: f32([2, 0, 0, 0, 0, 8, 0, 0]) } },
    { weight: 1, grad: f32([3, 8, 0, 0]), sparse: null },
  ];
  const replies: PushReply[] = [];
  for (const c of contributions.slice(0, 2)) {
    replies.push(await push(s, 's0', {
      round: 0, expected: 3, weight: c.weight, dense: [{ block: 0, grad: c.grad }],
      sparse: c.sparse ? [{ table: 'emb', ...c.sparse }] : [],
    }));
  }
  let answered = false;
  const waiting = pull(s, 's0', { dense: [0], sparse: [{ table: 'emb', ids }], min_round: 1 }).then((r) => { answered = true; return r; });
  // A round trip through the same mailbox: the pull has been handled (deferred) by the time this returns.
  const mid = await stats(s, 's0');
  assert.equal(answered, false, 'the pull is still waiting after 2 of 3 contributions');
  assert.equal(mid.waiting_pulls, 1);
  assert.equal(mid.pending_contributions, 2);
  assert.equal(mid.version, 0);
  assert.deepEqual((await pull(s, 's0', { dense: [0] })).dense[0], f32([1, 2, 3, 4]), 'nothing applied before the round completes');
  const c3 = contributions[2]!;
  replies.push(await push(s, 's0', { round: 0, expected: 3, weight: c3.weight, dense: [{ block: 0, grad: c3.grad }] }));
  assert.deepEqual(replies.map((r) => r.applied), [false, false, true], 'only the completing push applies');
  const r = await waiting;
  assert.equal(r.round, 1);
  assert.equal(r.version, 1);
  // mean = (1·g1 + 2·g2 + 1·g3) / 4 = [2, 2, 2, 1]; w − 0.1·mean
  assert.deepEqual(r.dense[0], f32([sgd(1, 2), sgd(2, 2), sgd(3, 2), sgd(4, 1)]));
  // rows: id0 gets (1·[4,0,0,0] + 2·[2,0,0,0]) / 4 = [2,0,0,0]; id1 gets 2·[0,8,0,0] / 4 = [0,4,0,0]
  assert.deepEqual(r.sparse[0], f32([sgd(rows[0]!, 2), rows[1]!, rows[2]!, rows[3]!, rows[4]!, sgd(rows[5]!, 4), rows[6]!, rows[7]!]));
  const st = await stats(s, 's0');
  assert.equal(st.round, 1);
  assert.equal(st.waiting_pulls, 0);
  assert.equal(st.pending_contributions, 0);
  // min_round already reached: answered at once
  assert.equal((await pull(s, 's0', { dense: [0], min_round: 1 })).round, 1);
  await s.stop();
});

test('contributions with weight 0 count towards the round; a round of total weight 0 applies nothing but completes', async () => {
  const s = await startShards();
  const empty = await push(s, 's0', { round: 0, expected: 2, weight: 0 });
  assert.equal(empty.applied, false);
  const full = await push(s, 's0', { round: 0, expected: 2, weight: 3, dense: [{ block: 0, grad: f32([1, 1, 1, 1]) }] });
  assert.equal(full.applied, true);
  const r1 = await pull(s, 's0', { dense: [0], min_round: 1 });
  assert.deepEqual(r1.dense[0], f32([1, 2, 3, 4].map((x) => sgd(x, 1))), 'mean over weight 3 of 3·g is g');
  const a = await push(s, 's0', { round: 1, expected: 2, weight: 0 });
  const b = await push(s, 's0', { round: 1, expected: 2, weight: 0, dense: [{ block: 0, grad: f32([5, 5, 5, 5]) }] });
  assert.deepEqual([a.applied, b.applied], [false, true]);
  const r2 = await pull(s, 's0', { dense: [0], min_round: 2 });
  assert.equal(r2.round, 2);
  assert.equal(r2.version, 2);
  assert.deepEqual(r2.dense[0], r1.dense[0], 'total weight 0: nothing applied');
  await s.stop();
});

test('contributions to an applied round or too far ahead are refused; a lower expected count (a worker declared dead) completes the round without it', async () => {
  const s = await startShards();
  await push(s, 's0', { round: 0, expected: 1, weight: 1 });
  await assert.rejects(push(s, 's0', { round: 0, expected: 1, weight: 1 }),
    (e: unknown) => e instanceof SyncRoundError && /round 0 was already applied/.test(e.message));
  await assert.rejects(push(s, 's0', { round: 3, expected: 1, weight: 1 }),
    (e: unknown) => e instanceof SyncRoundError && /round 3 is too far ahead/.test(e.message));
  await push(s, 's0', { round: 1, expected: 3, weight: 1 });
  await assert.rejects(push(s, 's0', { round: 1, expected: null, weight: 1 }), ValidationError);
  assert.equal((await stats(s, 's0')).round, 1, 'round 1 waits for 3 contributions');
  const lowered = await push(s, 's0', { round: 1, expected: 2, weight: 1 });
  assert.equal(lowered.applied, true, 'a contributor that knows of a dead worker says 2: the round completes with these 2');
  assert.equal((await stats(s, 's0')).round, 2);
  await s.stop();
});

test('round_expected lowers what a waiting round expects (a worker declared dead): the round applies with the contributions it has', async () => {
  const s = await startShards();
  await push(s, 's0', { round: 0, expected: 3, weight: 1, dense: [{ block: 0, grad: f32([1, 0, 0, 0]) }] });
  await push(s, 's0', { round: 0, expected: 3, weight: 1, dense: [{ block: 0, grad: f32([1, 0, 0, 0]) }] });
  const waiting = pull(s, 's0', { dense: [0], min_round: 1 });
  const lowered = await s.client.ref('shard', 's0@s0').request<{ round: number; expected: number | null } & Record<string, unknown>>('round_expected', { plan_version: s.plan.version, round: 0, expected: 2 });
  assert.deepEqual(lowered, { round: 1, expected: 2 });
  const r = await waiting;
  assert.equal(r.round, 1, 'the waiting pull is answered once the round applied');
  assert.deepEqual(r.dense[0], f32([sgd(1, 1), 2, 3, 4]));
  // Ignored for an applied round; the next round keeps the lower count for contributions that name more.
  assert.deepEqual(await s.client.ref('shard', 's0@s0').request('round_expected', { plan_version: s.plan.version, round: 0, expected: 1 }), { round: 1, expected: null });
  await s.client.ref('shard', 's0@s0').request('round_expected', { plan_version: s.plan.version, round: 1, expected: 1 });
  const one = await push(s, 's0', { round: 1, expected: 3, weight: 1 });
  assert.equal(one.applied, true);
  await s.stop();
});

test('a contribution to the next round waits for the open one, then both apply in order', async () => {
  const s = await startShards();
  // One fast member already contributes to round 1 while round 0 misses one contribution.
  await push(s, 's0', { round: 0, expected: 2, weight: 1, dense: [{ block: 0, grad: f32([1, 0, 0, 0]) }] });
  await push(s, 's0', { round: 1, expected: 1, weight: 1, dense: [{ block: 0, grad: f32([0, 1, 0, 0]) }] });
  assert.equal((await stats(s, 's0')).round, 0);
  const last = await push(s, 's0', { round: 0, expected: 2, weight: 1, dense: [{ block: 0, grad: f32([1, 0, 0, 0]) }] });
  assert.equal(last.applied, true);
  assert.equal(last.version, 2, 'round 0 and the already complete round 1 were applied');
  const r = await pull(s, 's0', { dense: [0] });
  assert.equal(r.round, 2);
  assert.deepEqual(r.dense[0], f32([sgd(1, 1), sgd(2, 1), 3, 4]));
  await s.stop();
});

test('snapshot → restore into a fresh shard reproduces pulls and later updates exactly (adam state included)', async () => {
  const adam: OptimizerConfigInput = { type: 'adam', learningRate: 0.05 };
  const adagrad: OptimizerConfigInput = { type: 'adagrad', learningRate: 0.1, initialAccumulator: 0.1 };
  const a = await startShards({ dense: adam, sparse: adagrad, shards: ['s1'] });
  const ids = idsOf(a.plan, 's1', 6);
  const g = (k: number) => f32(Array.from({ length: 24 }, (_, i) => Math.sin(i + k)));
  for (let k = 0; k < 3; k++) {
    await push(a, 's1', {
      dense: [{ block: 1, grad: f32([k, -k]) }, { block: 2, grad: f32([0.5, k]) }],
      sparse: [{ table: 'emb', ids, grads: g(k) }, { table: 'wide', ids: ids.subarray(0, 2), grads: f32([k, 1]) }],
    });
  }
  const snap = await a.client.ref('shard', 's1@s1').request<ShardSnapshot & Record<string, unknown>>('snapshot', {});
  assert.equal(snap.version, 3);
  assert.equal(snap.dense.length, 2);
  assert.equal(snap.dense[0]!.state.length, 2, 'adam keeps two state slots');
  assert.equal(snap.dense[0]!.step, 3);

  const b = await startShards({ dense: adam, sparse: adagrad, shards: ['s1'], job: 'restored' });
  const restored = await b.client.ref('shard', 's1@s1').request('restore', { state: snap });
  assert.deepEqual(restored, { version: 3, round: 0 });
  const req = { dense: [1, 2], sparse: [{ table: 'emb', ids }, { table: 'wide', ids }] };
  assert.deepEqual(await pull(b, 's1', req), await pull(a, 's1', req));
  const next = { dense: [{ block: 1, grad: f32([0.3, 0.1]) }], sparse: [{ table: 'emb', ids: ids.subarray(1, 3), grads: g(9).subarray(0, 8) }] };
  assert.deepEqual(await push(b, 's1', next), await push(a, 's1', next));
  assert.deepEqual(await pull(b, 's1', req), await pull(a, 's1', req), 'the same update after restore gives the same state');
  await a.stop(); await b.stop();
});

test('restore refuses a snapshot of another layout and changes nothing', async () => {
  const s = await startShards();
  const ref = s.client.ref('shard', 's1@s1');
  const snap = await ref.request<ShardSnapshot & Record<string, unknown>>('snapshot', {});
  await push(s, 's1', { dense: [{ block: 1, grad: f32([1, 1]) }] });
  const wrongDim = { ...snap, sparse: snap.sparse.map((t) => (t.table === 'emb' ? { ...t, dim: 8 } : t)) };
  await assert.rejects(ref.request('restore', { state: wrongDim }), (e: unknown) => e instanceof ValidationError && /emb has dim 8, the plan says 4/.test(e.message));
  const otherShard = await s.client.ref('shard', 's0@s0').request<ShardSnapshot & Record<string, unknown>>('snapshot', {});
  await assert.rejects(ref.request('restore', { state: otherShard }), (e: unknown) => e instanceof ValidationError && /block 0 is not owned/.test(e.message));
  await assert.rejects(ref.request('restore', { state: { format: 1 } }), (e: unknown) => e instanceof ValidationError && /not a shard snapshot/.test(e.message));
  assert.equal((await pull(s, 's1', { dense: [1] })).version, 1, 'state unchanged');
  await s.stop();
});

test('a pull still waiting for a round when the shard stops is answered with ActorStoppedError (retryable)', async () => {
  const s = await startShards({ shards: ['s0'] });
  const waiting = pull(s, 's0', { dense: [0], min_round: 1 });
  await stats(s, 's0'); // the pull is deferred by now
  await s.server.stop();
  await assert.rejects(waiting, (e: unknown) => e instanceof ActorStoppedError && e.retryable);
  await s.client.stop();
});

test('freeze → take_frozen: the copy is of the moment of the freeze, not of the pushes after it; handed over once; a later freeze replaces it', async () => {
  const sgdOpt: OptimizerConfigInput = { type: 'sgd', learningRate: 0.1 };
  const a = await startShards({ dense: sgdOpt, sparse: sgdOpt, shards: ['s1'] });
  const ref = a.client.ref('shard', 's1@s1');
  const ids = idsOf(a.plan, 's1', 3);
  const step = (k: number) => push(a, 's1', { dense: [{ block: 1, grad: f32([k, k]) }], sparse: [{ table: 'emb', ids, grads: f32(Array.from({ length: 12 }, () => k)) }] });
  await step(1);
  const before = await ref.request<ShardSnapshot & Record<string, unknown>>('snapshot', {});
  assert.deepEqual(await ref.request('freeze', { token: 'cut-1' }), { version: 1, round: 0 });
  await step(2); // training goes on after the cut
  const frozen = await ref.request<ShardSnapshot & Record<string, unknown>>('take_frozen', { token: 'cut-1' });
  assert.equal(frozen.version, 1);
  assert.deepEqual(frozen.dense.map((b) => [...b.values]), before.dense.map((b) => [...b.values]));
  assert.deepEqual([...frozen.sparse[0]!.values], [...before.sparse[0]!.values], 'the rows as they were at the freeze');
  const now = await ref.request<ShardSnapshot & Record<string, unknown>>('snapshot', {});
  assert.equal(now.version, 2);
  assert.notDeepEqual([...now.sparse[0]!.values], [...frozen.sparse[0]!.values]);
  await assert.rejects(ref.request('take_frozen', { token: 'cut-1' }), /no copy frozen under cut-1: a later cut replaced it, it was taken already/);
  await ref.request('freeze', { token: 'cut-2' });
  await ref.request('freeze', { token: 'cut-3' });
  await assert.rejects(ref.request('take_frozen', { token: 'cut-2' }), /no copy frozen under cut-2 \(the one held is cut-3\)/);
  assert.equal((await ref.request<ShardSnapshot & Record<string, unknown>>('take_frozen', { token: 'cut-3' })).version, 2);
  await a.stop();
});
