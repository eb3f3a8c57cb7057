import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ActorSystem, InProcessBroker, SeededRandom, connectTransport, silentLogger, systemClock, type Transport } from '../../runtime/mod.ts';
import { buildShardPlan, parseConfig } from '../../topology/mod.ts';
import { LocalTrainer, StepSession, createOptimizer, streamOptions } from '../../native-bridge/mod.ts';
import { EMBEDDING_INIT_SCALE, optimizersFromConfig, shardPlanFromConfig, sparseLayoutFromConfig } from '../../actors/node/config-bridge.ts';
import { localOptimizersFromConfig, modelAndData, startServerNode } from '../../actors/node/nodes.ts';
import { memoryPlanStore } from '../../actors/store/plan-store.ts';
import { assemblePull, planExchange, pullRequest, pushRequest } from '../../actors/worker/param-exchange.ts';
import { ShardClient } from '../../actors/worker/shard-client.ts';
import { WorkerStepper } from '../../actors/worker/step.ts';
import type { PullReply } from '../../actors/shard/shard.messages.ts';

test('step assembly: pulls route every block and id to its owner, replies land in place, pushes split the gradients back without loss', () => {
  const plan = buildShardPlan({
    version: 3, shards: ['a', 'b', 'c'], denseParams: [{ name: 'w', size: 10 }, { name: 'bias', size: 3 }],
    sparseTables: [{ name: 'emb', dim: 2 }, { name: 'wide', dim: 1 }], partitions: 12, maxBlockBytes: 16,
  });
  const tables = plan.sparseTables;
  const ids = Int32Array.from([5, 900, 17, 3, 42, 7]);
  const exchanges = planExchange(plan, ids, { dense: true, allShards: false });
  assert.deepEqual(exchanges.flatMap((e) => [...e.ids]).sort((x, y) => x - y), [...ids].sort((x, y) => x - y), 'each id goes to exactly one shard');
  assert.equal(exchanges.flatMap((e) => e.blocks).length, plan.dense.length, 'every dense block is pulled');
  assert.equal(planExchange(plan, null, { dense: false, allShards: true }).length, 3, 'a bsp round talks to every shard');

  // Fake shards: dense value = param offset + element index; row value = id·10 + column.
  const replies: PullReply[] = exchanges.map((ex) => {
    const req = pullRequest(plan, ex, tables, null);
    assert.equal(req.plan_version, 3);
    return {
      version: 1, round: 0,
      dense: ex.blocks.map((b) => Float32Array.from({ length: b.length }, (_, i) => (b.param === 'w' ? 100 : 200) + b.offset + i)),
      sparse: req.sparse.map((s) => Float32Array.from({ length: s.ids.length * tables.find((t) => t.name === s.table)!.dim }, (_, k) => {
        const dim = tables.find((t) => t.name === s.table)!.dim;
        return s.ids[Math.floor(k / dim)]! * 10 + (k % dim);
      })),
    };
  });
  const dense = new Map([['w', new Float32Array(10)], ['bias', new Float32Array(3)]]);
  const rows = assemblePull(exchanges, replies, tables, dense, ids.length);
  assert.deepEqual([...dense.get('w')!], Array.from({ length: 10 }, (_, i) => 100 + i));
  assert.deepEqual([...dense.get('bias')!], [200, 201, 202]);
  assert.deepEqual([...rows.get('emb')!], [...ids].flatMap((id) => [id * 10, id * 10 + 1]));
  assert.deepEqual([...rows.get('wide')!], [...ids].map((id) => id * 10));

  const denseGrads = new Map([['w', Float32Array.from({ length: 10 }, (_, i) => i)], ['bias', Float32Array.from([7, 8, 9])]]);
  const rowGrads = new Map([['emb', Float32Array.from({ length: 12 }, (_, i) => i)], ['wide', Float32Array.from({ length: 6 }, (_, i) => -i)]]);
  const back = new Map([['w', new Float32Array(10)], ['bias', new Float32Array(3)]]);
  const emb = new Float32Array(12);
  for (const ex of exchanges) {
    const push = pushRequest(plan, ex, tables, denseGrads, rowGrads, { round: null, expected: null, weight: 32, baseVersion: 1 });
    for (const d of push.dense) { const b = plan.dense[d.block]!; assert.equal(b.shard, ex.shard); back.get(b.param)!.set(d.grad, b.offset); }
    const e = push.sparse.find((s) => s.table === 'emb')!;
    e.ids.forEach((id, j) => { const u = ids.indexOf(id); emb.set(e.grads.subarray(j * 2, j * 2 + 2), u * 2); });
  }
  assert.deepEqual(back, denseGrads, 'the dense gradient comes back whole from the per-shard pushes');
  assert.deepEqual([...emb], [...rowGrads.get('emb')!]);
});

test('a single asp worker over the shards trains step for step like train-local', async () => {
  const config = parseConfig(`cluster:
  worker_groups: [{ name: g, nodes: [w1] }]
  server_nodes: [s1, s2]
model: { type: ctr, ctr: { embedding_dim: 4, hidden: [16], pooling: mean, wide: true, hash_buckets: 5000 } }
data: { source: ctr-synthetic, batch_size: 32, samples: 256, test_samples: 64, slots: 4, dense_features: 3, vocab_size: 2000 }
optimizer: { type: adam, learning_rate: 0.01, sparse: { type: adagrad, learning_rate: 0.05 } }
training: { mode: asp, random_seed: 7 }
`, 'job.yaml');
  const md = modelAndData(config);
  // Small blocks, so dense parameters span both shards.
  const plan = shardPlanFromConfig(config, md.model, 4096 + 16 * 1024);
  assert.ok(new Set(plan.dense.map((b) => b.shard)).size === 2);
  const broker = new InProcessBroker();
  const transports: Transport[] = [];
  const system = async (name: string) => {
    const t = await connectTransport({ servers: null, broker, name });
    transports.push(t);
    return new ActorSystem({ transport: t, job: 'steptest', node: name, clock: systemClock, random: new SeededRandom(1), logger: silentLogger() });
  };
  const systems = await Promise.all(['s1', 's2', 'w1'].map(system));
  const planStore = memoryPlanStore(plan);
  for (const [i, s] of ['s1', 's2'].entries()) await startServerNode({ config, server: s, system: systems[i]!, planStore, log: silentLogger(), md });
  const session = await StepSession.create(md.model, { graph: 'step', intraOpNumThreads: 1 });
  const stepper = new WorkerStepper({
    client: new ShardClient(systems[2]!, { requestTimeoutMs: 5_000, log: silentLogger(), shouldStop: () => false, plans: plan }),
    plan, model: md.model, layout: sparseLayoutFromConfig(config, md.model), session, clock: systemClock, log: silentLogger(), emulateSpeed: null,
  });
  const { dense, sparse } = optimizersFromConfig(config, md.model);
  const local = await LocalTrainer.create({
    model: md.model, denseOptimizer: dense, sparseOptimizer: sparse, seed: 7, provider: 'cpu', intraOpNumThreads: 1,
    embeddingInitScale: EMBEDDING_INIT_SCALE, wide: true, hashBuckets: 5000,
  });
  try {
    let n = 0;
    for (const batch of md.source.batchesSync(streamOptions('train', 32, { epoch: 0 }))) {
      const ps = await stepper.run(batch, null);
      const ref = await local.trainBatch(batch);
      assert.ok(Math.abs(ps.loss! - ref) < 1e-5, `step ${n + 1}: loss ${ps.loss} over the shards vs ${ref} locally`);
      if (++n === 4) break;
    }
  } finally {
    await local.dispose();
    await session.dispose();
    for (const s of systems) await s.stop();
    for (const t of transports) await t.close();
  }
});

test('local updates (training.local_updates): a window\'s next step computes from the member\'s own updated copy, exactly the job\'s optimizer applied to it; the shards are untouched', async () => {
  const config = parseConfig(`cluster:
  worker_groups: [{ name: g, nodes: [w1], sync_mode: sync, sync_steps: 4 }]
  server_nodes: [s1]
model: { type: ctr, ctr: { embedding_dim: 4, hidden: [16], pooling: mean, wide: true, hash_buckets: 5000 } }
data: { source: ctr-synthetic, batch_size: 32, samples: 256, test_samples: 64, slots: 4, dense_features: 3, vocab_size: 2000 }
optimizer: { type: adam, learning_rate: 0.01, sparse: { type: adagrad, learning_rate: 0.05 } }
training: { mode: hps, random_seed: 7, local_updates: true }
`, 'job.yaml');
  const md = modelAndData(config);
  const plan = shardPlanFromConfig(config, md.model, 1024 * 1024);
  const broker = new InProcessBroker();
  const transports: Transport[] = [];
  const system = async (name: string) => {
    const t = await connectTransport({ servers: null, broker, name });
    transports.push(t);
    return new ActorSystem({ transport: t, job: 'localtest', node: name, clock: systemClock, random: new SeededRandom(1), logger: silentLogger() });
  };
  const [s1, w1] = await Promise.all(['s1', 'w1'].map(system));
  await startServerNode({ config, server: 's1', system: s1!, planStore: memoryPlanStore(plan), log: silentLogger(), md });
  const session = await StepSession.create(md.model, { graph: 'step', intraOpNumThreads: 1 });
  const make = (localOptimizers: ReturnType<typeof localOptimizersFromConfig>) => new WorkerStepper({
    client: new ShardClient(w1!, { requestTimeoutMs: 5_000, log: silentLogger(), shouldStop: () => false, plans: plan }),
    plan, model: md.model, layout: sparseLayoutFromConfig(config, md.model), session, clock: systemClock, log: silentLogger(), emulateSpeed: null, localOptimizers,
  });
  const near = (x: Float32Array, y: Float32Array, what: string) => {
    assert.equal(x.length, y.length, what);
    for (let i = 0; i < x.length; i++) assert.ok(Math.abs(x[i]! - y[i]!) <= 1e-6, `${what}[${i}]: ${x[i]} vs ${y[i]}`);
  };
  try {
    const optimizers = localOptimizersFromConfig(config)!;
    assert.deepEqual(optimizers.dense, { type: 'adam', learningRate: 0.01, weightDecay: 0, schedule: { type: 'constant' }, beta1: 0.9, beta2: 0.999, epsilon: 1e-8, decoupledWeightDecay: false });
    assert.equal(optimizers.sparse?.type, 'adagrad');
    assert.equal(localOptimizersFromConfig({ ...config, training: { ...config.training, local_updates: false } }), null);
    assert.equal(localOptimizersFromConfig({ ...config, training: { ...config.training, mode: 'asp' } }), null);
    const batch = md.source.batchesSync(streamOptions('train', 32, { epoch: 0 })).next().value!;
    const plain = make(null);
    const p0 = await plain.prepare(batch, { reuseDense: false });
    const first = await plain.computePrepared(p0);
    plain.stepLocally(p0, first);
    assert.equal((await plain.compute(batch, { reuseDense: true })).loss, first.loss, 'without local updates a window\'s steps compute from the pulled parameters');

    const local = make(optimizers);
    assert.ok(local.localUpdates && !plain.localUpdates);
    const p1 = await local.prepare(batch, { reuseDense: false });
    const a = await local.computePrepared(p1);
    assert.equal(a.loss, first.loss);
    // The same update by hand: the job's optimizers (fresh state, step 1) on the values the step used, at the group's rate (×2).
    const dense = createOptimizer(optimizers.dense);
    const expectedDense = new Map([...local.denseParams].map(([k, v]) => {
      const w = Float32Array.from(v);
      dense.updateDense(w, a.denseGrads.get(k)!, dense.allocateState(w.length), 1, 2);
      return [k, w];
    }));
    const sparse = createOptimizer(optimizers.sparse!);
    const U = p1.index!.uniqueIds.length;
    const expectedRows = new Map([...p1.rows].map(([name, values]) => {
      const d = values.length / U;
      const out = Float32Array.from(values);
      for (let u = 0; u < U; u++) sparse.updateRow(out.subarray(u * d, (u + 1) * d), a.rowGrads!.get(name)!.subarray(u * d, (u + 1) * d), sparse.allocateState(d), 1, 1, 2);
      return [name, out];
    }));
    local.stepLocally(p1, a, 2);
    assert.deepEqual(local.denseParams, expectedDense);
    assert.deepEqual(local.localRowsKept, { emb: U, wide: U });
    // The window's next step: the rows are pulled again (the shard has not changed them) and the member's deltas are added.
    const p2 = await local.prepare(batch, { reuseDense: true });
    const b = await local.computePrepared(p2);
    for (const [name, want] of expectedRows) near(p2.rows.get(name)!, want, `${name} rows in the window's next step`);
    assert.ok(b.loss < a.loss, `a local step on the batch lowers its loss (${a.loss} → ${b.loss})`);
    // A NaN gradient is not applied locally (the shards refuse it and say so).
    const nan = { ...b, denseGrads: new Map([...b.denseGrads].map(([k, v]) => [k, Float32Array.from(v, (x, i) => (i === 0 ? Number.NaN : x))])) };
    const before = new Map([...local.denseParams].map(([k, v]) => [k, Float32Array.from(v)]));
    local.stepLocally(p2, nan, 2);
    assert.deepEqual(local.denseParams, before);
    // The next window's first pull starts afresh: dense and rows as on the shard, which never saw the local steps.
    const p3 = await local.prepare(batch, { reuseDense: false });
    assert.equal((await local.computePrepared(p3)).loss, first.loss);
    for (const [name, values] of p0.rows) near(p3.rows.get(name)!, values, `${name} rows in the next window`);
  } finally {
    await session.dispose();
    for (const s of [s1!, w1!]) await s.stop();
    for (const t of transports) await t.close();
  }
});
