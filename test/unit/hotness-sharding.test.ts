/**
 * Hotness sharding from a job's config and data (actors/node/config-bridge.ts
 * over topology/shard-plan.ts): the warm-up reads the first training batches
 * the way a worker indexes them, the plan places the partitions by what it
 * counted, and the floats a worker's pulls then route to each shard are what
 * the report expected — evener than round-robin over the whole epoch.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError } from '../../runtime/mod.ts';
import { parseConfig, serverCapacities, type HetpsConfig } from '../../topology/mod.ts';
import { partitionHotness, shardingReport, shardPlanFromConfig, sparseLayoutFromConfig, trainingBatchIds } from '../../actors/node/config-bridge.ts';
import { modelAndData } from '../../actors/node/nodes.ts';
import { prepareJob } from '../../actors/scheduler/job.ts';
import { memoryPlanStore } from '../../actors/store/plan-store.ts';
import { memoryJobInfoStore } from '../../actors/store/job-info.ts';
import { memoryBatchQueue } from '../../actors/store/batch-queue.ts';
import { planExchange } from '../../actors/worker/param-exchange.ts';
import { systemClock } from '../../runtime/mod.ts';

const FILE = 'hotness.yaml';
function ctrConfig(sharding = '', perServer = 4): HetpsConfig {
  return parseConfig(`job: { name: hot }
cluster: { server_nodes: [s1, s2], worker_nodes: [w1], shards_per_server: ${perServer} }
model:
  type: ctr
  ctr: { embedding_dim: 8, hidden: [16], pooling: sum, wide: true }
data: { source: ctr-synthetic, batch_size: 128, epochs: 1, samples: 12800, test_samples: 256, vocab_size: 20000, slots: 8, dense_features: 4 }
training: { mode: asp }
${sharding}`, FILE);
}

/** The floats the pulls of an epoch's first `limit` batches ask each shard for, the way a worker routes them. */
function routedFloats(config: HetpsConfig, plan: ReturnType<typeof shardPlanFromConfig>, limit = Infinity): { perShard: Record<string, number>; batches: number } {
  const md = modelAndData(config);
  const perId = sparseLayoutFromConfig(config, md.model).tables.reduce((n, t) => n + t.dim, 0);
  const perShard: Record<string, number> = Object.fromEntries(plan.shards.map((s) => [s, 0]));
  let batches = 0;
  for (const ids of trainingBatchIds(config, md, limit)) {
    for (const ex of planExchange(plan, ids, { dense: true, allShards: false })) {
      perShard[ex.shard]! += ex.blocks.reduce((n, x) => n + x.length, 0) + ex.ids.length * perId;
    }
    batches++;
  }
  return { perShard, batches };
}

const spread = (l: Record<string, number>) => { const v = Object.values(l); return (Math.max(...v) - Math.min(...v)) / Math.max(...v); };

test('the warm-up\'s expected loads are what the workers\' pulls route to each shard; over the whole epoch the shards\' floats are evener than round-robin\'s', () => {
  const config = ctrConfig();
  assert.deepEqual(config.sharding, { hotness: true, warmup_batches: 64 }, 'on by default, 64 batches');
  const md = modelAndData(config);
  const hot = partitionHotness(config, md);
  assert.ok(!('skipped' in hot));
  assert.equal(hot.batches, 64);
  const plan = shardPlanFromConfig(config, md.model, 1 << 20, 1, hot.loads);
  const rr = shardPlanFromConfig(config, md.model, 1 << 20, 1);
  const report = shardingReport(config, md.model, 1 << 20, plan, hot);
  assert.equal(report.hotness, true);
  assert.equal(report.partitions, 512);
  // What the report expected for the warm-up batches is exactly what their pulls route (per batch).
  const warm = routedFloats(config, plan, 64);
  for (const s of plan.shards) assert.ok(Math.abs(warm.perShard[s]! / 64 - report.expected_loads![s]!) <= 0.5, `${s}: routed ${warm.perShard[s]! / 64} per batch, expected ${report.expected_loads![s]}`);
  // The whole epoch (100 batches, 36 never sampled): hotness evener than round-robin.
  const allHot = routedFloats(config, plan);
  const allRr = routedFloats(config, rr);
  assert.equal(allHot.batches, 100);
  const [h, r] = [spread(allHot.perShard), spread(allRr.perShard)];
  assert.ok(r > 0.03, `round-robin leaves 8 shards ${r.toFixed(4)} apart here`);
  assert.ok(h < r / 2 && h < 0.03, `hotness ${h.toFixed(4)} against round-robin ${r.toFixed(4)}`);
  assert.ok(report.expected_imbalance! < report.round_robin_imbalance!, JSON.stringify(report));
});

test('nothing to measure: an mlp, sharding.hotness false; warmup_batches bounds the read; bad settings are named', () => {
  const mlp = parseConfig(`job: { name: m }
cluster: { server_nodes: [s1, s2], worker_nodes: [w1] }
model: { type: mlp, mlp: { input_dim: 8, hidden: [4], classes: 2 } }
data: { source: mlp-synthetic, batch_size: 16, epochs: 1, samples: 64, test_samples: 16 }
`, FILE);
  // (input_dim 8, below the synthetic data's 16 latent dimensions: its data is built on 8 of them.)
  assert.deepEqual(partitionHotness(mlp, modelAndData(mlp)), { skipped: 'the model has no sparse tables' });
  const off = ctrConfig('sharding: { hotness: false }');
  assert.deepEqual(partitionHotness(off, modelAndData(off)), { skipped: 'sharding.hotness is false' });
  const few = ctrConfig('sharding: { warmup_batches: 3 }');
  const r = partitionHotness(few, modelAndData(few));
  assert.ok(!('skipped' in r) && r.batches === 3);
  const more = ctrConfig('sharding: { warmup_batches: 1000 }');
  const all = partitionHotness(more, modelAndData(more));
  assert.ok(!('skipped' in all) && all.batches === 100, 'at most the epoch\'s batches');
  for (const [bad, what] of [['sharding: { warmup_batches: 0 }', /sharding\.warmup_batches/], ['sharding: { hotness: maybe }', /sharding\.hotness/], ['sharding: { hot: true }', /sharding.*hot/]] as const) {
    assert.throws(() => ctrConfig(bad), (e: unknown) => e instanceof ConfigError && what.test(e.message), bad);
  }
});

test('prepareJob writes the hotness plan and reports it; the same config and data give the same plan again', async () => {
  const config = ctrConfig();
  const md = modelAndData(config);
  const planStore = memoryPlanStore(null);
  const make = () => prepareJob({
    config, runId: 'r1', maxPayload: 1 << 20, md, planStore, jobStore: memoryJobInfoStore(), queue: memoryBatchQueue({ clock: systemClock, ackWaitMs: 30_000 }),
  });
  const a = await make();
  assert.equal(a.sharding.hotness, true);
  assert.deepEqual((await planStore.get())!.partitionOwner, a.plan.partitionOwner);
  const rr = shardPlanFromConfig(config, md.model, 1 << 20, 1);
  assert.notDeepEqual(a.plan.partitionOwner, rr.partitionOwner, 'not the round-robin owners');
  const b = await make();
  assert.equal(b.plan.version, a.plan.version, 'the same plan: no new version');
  assert.deepEqual(b.plan.partitionOwner, a.plan.partitionOwner);
});

test('nodes.<server>.capacity: a server of capacity 3 is expected to move three times the floats of one of capacity 1, the report compares per unit of capacity; a capacity on a worker or ≤ 0 is refused', () => {
  const config = ctrConfig('nodes: { s1: { capacity: 3 } }', 1);
  assert.deepEqual(serverCapacities(config), { s1: 3 });
  assert.equal(serverCapacities(ctrConfig()), null);
  const md = modelAndData(config);
  const hot = partitionHotness(config, md);
  assert.ok(!('skipped' in hot));
  const plan = shardPlanFromConfig(config, md.model, 1 << 20, 1, hot.loads);
  const report = shardingReport(config, md.model, 1 << 20, plan, hot);
  const l = report.expected_loads!;
  assert.ok(Math.abs(l.s1! / 3 - l.s2!) / l.s2! < 0.02, `3 : 1: ${JSON.stringify(l)}`);
  assert.ok(report.expected_imbalance! < 0.02, JSON.stringify(report));
  // What the workers' pulls route over the epoch follows it.
  const routed = routedFloats(config, plan).perShard;
  assert.ok(Math.abs(routed.s1! / 3 - routed.s2!) / routed.s2! < 0.03, `routed ${JSON.stringify(routed)}`);
  for (const [bad, what] of [
    ['nodes: { w1: { capacity: 2 } }', /nodes\.w1\.capacity.*"w1" is not in cluster\.server_nodes/],
    ['nodes: { s1: { capacity: 0 } }', /nodes\.s1\.capacity.*> 0/],
  ] as const) {
    assert.throws(() => ctrConfig(bad, 1), (e: unknown) => e instanceof ConfigError && what.test(e.message), bad);
  }
});
