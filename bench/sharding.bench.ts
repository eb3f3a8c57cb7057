/**
 * Hotness sharding against round-robin (`npm run bench:sharding` →
 * bench/results/sharding.json): for each workload and shard count, the
 * floats the workers' pulls of a whole epoch route to each shard (dense
 * blocks and rows, `planExchange` on each batch's distinct hashed ids, as a
 * worker does), under the round-robin plan and under the plan hotness
 * sharding makes from the first `sharding.warmup_batches` (64). The
 * imbalance is (max − min) / max over the shards. Deterministic: the data
 * streams are seeded, nothing is timed.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { imbalanceOf, parseConfig, type HetpsConfig, type ShardPlan } from '../topology/mod.ts';
import { partitionHotness, shardingReport, shardPlanFromConfig, sparseLayoutFromConfig, trainingBatchIds } from '../actors/node/config-bridge.ts';
import { modelAndData } from '../actors/node/nodes.ts';
import { planExchange } from '../actors/worker/param-exchange.ts';
import { gitCommit } from './chaos.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));

/** The benchmark's ctr workload (bench:hetero's data and model). */
const ctr = (servers: string, perServer: number) => `job: { name: sharding }
cluster: { server_nodes: [${servers}], worker_nodes: [w1], shards_per_server: ${perServer} }
model:
  type: ctr
  ctr: { embedding_dim: 32, hidden: [256, 128], pooling: sum, wide: true }
data: { source: ctr-synthetic, batch_size: 256, epochs: 1, samples: 49152, test_samples: 1000, vocab_size: 20000, slots: 8, dense_features: 4 }
training: { mode: asp }
`;
const quick = readFileSync(join(ROOT, 'examples', 'quickstart.yaml'), 'utf8');

const CASES: { workload: string; yaml: string }[] = [
  { workload: 'ctr (bench:hetero data), 2 servers', yaml: ctr('s1, s2', 1) },
  { workload: 'ctr (bench:hetero data), 3 servers', yaml: ctr('s1, s2, s3', 1) },
  { workload: 'ctr (bench:hetero data), 2 servers × 4 shards', yaml: ctr('s1, s2', 4) },
  { workload: 'quick start (spam), 2 servers', yaml: quick },
  { workload: 'quick start (spam), 2 servers × 4 shards', yaml: quick.replace('server_nodes: [server-1, server-2]', 'server_nodes: [server-1, server-2]\n  shards_per_server: 4') },
];

function epochFloats(config: HetpsConfig, md: ReturnType<typeof modelAndData>, plan: ShardPlan): { perShard: Record<string, number>; batches: number } {
  const perId = sparseLayoutFromConfig(config, md.model).tables.reduce((n, t) => n + t.dim, 0);
  const perShard: Record<string, number> = Object.fromEntries(plan.shards.map((s) => [s, 0]));
  let batches = 0;
  for (const ids of trainingBatchIds(config, md, Infinity)) {
    for (const ex of planExchange(plan, ids, { dense: true, allShards: false })) perShard[ex.shard]! += ex.blocks.reduce((n, b) => n + b.length, 0) + ex.ids.length * perId;
    batches++;
  }
  for (const s of plan.shards) perShard[s] = Math.round(perShard[s]! / batches);
  return { perShard, batches };
}
const spread = (l: Record<string, number>) => Number(imbalanceOf(new Map(Object.entries(l))).imbalance.toFixed(4));

const results = CASES.map(({ workload, yaml }) => {
  const config = parseConfig(yaml, workload);
  const md = modelAndData(config);
  const t0 = performance.now();
  const hot = partitionHotness(config, md);
  const warmupMs = Math.round(performance.now() - t0);
  if ('skipped' in hot) throw new Error(`${workload}: ${hot.skipped}`);
  const plan = shardPlanFromConfig(config, md.model, 1 << 20, 1, hot.loads);
  const rr = shardPlanFromConfig(config, md.model, 1 << 20, 1);
  const report = shardingReport(config, md.model, 1 << 20, plan, hot);
  const [h, r] = [epochFloats(config, md, plan), epochFloats(config, md, rr)];
  const row = {
    workload, shards: plan.shards.length, partitions: plan.partitions, warmup_batches: hot.batches, epoch_batches: h.batches, warmup_ms: warmupMs,
    round_robin: { floats_per_batch: r.perShard, imbalance: spread(r.perShard) },
    hotness: { floats_per_batch: h.perShard, imbalance: spread(h.perShard), expected_imbalance: report.expected_imbalance },
  };
  console.log(`${workload}: ${row.shards} shards, ${row.partitions} partitions; epoch imbalance round-robin ${row.round_robin.imbalance}, hotness ${row.hotness.imbalance} (warm-up ${hot.batches} of ${h.batches} batches, ${warmupMs} ms)`);
  return row;
});

const { commit, dirty } = gitCommit(ROOT);
const out = {
  benchmark: 'sharding', commit, dirty, date: new Date().toISOString(),
  machine: { cpu: cpus()[0]?.model ?? null, cores: availableParallelism(), memory_gib: Math.round(totalmem() / 2 ** 30), node: process.version, platform: `${process.platform} ${process.arch}` },
  definition: 'floats per batch each shard moves over a whole epoch of pulls (dense blocks + distinct hashed ids × the sparse tables\' dims, routed by planExchange as a worker does); imbalance = (max − min) / max over the shards; hotness plans from the first sharding.warmup_batches (64) batches of epoch 0',
  results,
};
const dir = join(ROOT, 'bench', 'results');
mkdirSync(dir, { recursive: true });
writeFileSync(join(dir, 'sharding.json'), JSON.stringify(out, null, 1) + '\n');
console.log(`written ${join(dir, 'sharding.json')}`);
