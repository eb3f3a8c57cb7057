/**
 * An hps member's per-step arithmetic (`npm run bench:member` →
 * bench/results/member.json): what a fast member of bench:hetero's ctr
 * workload computes in JavaScript around each step, apart from the ONNX
 * step itself and the messages —
 *
 *   sums      the window's Σ samples·gradient (GradientAccumulator.add):
 *             dense blocks and the step's rows, in float64
 *   parts     the step's part for each of 3 other owners (ShardedSums.byShard
 *             with one shard each), as training.stream_slices sends them
 *   local     the local updates (LocalUpdates.step): the job's dense
 *             optimizer (Adam) on the member's copy, Adagrad on its rows
 *   reduce    at the window's end, the reducer's sums of 4 members' parts of
 *             its shard, per step index, and their push tensors (per step)
 *
 * Shapes as bench:hetero's ctr: a tower of ~100 k floats (260 → 256 → 128 →
 * 1), embedding dim 32 plus the wide part (dim 1), 4 shards, a batch of
 * 256 × 8 slots over 20 000 ids per slot (the ids drawn skewed, distinct per
 * step as a worker's bag index makes them), 4 steps a window. Each part is
 * timed over `WINDOWS` windows, 5 repeats, median ms per step.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus, totalmem } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildShardPlan } from '../topology/mod.ts';
import { SeededRandom } from '../runtime/mod.ts';
import { GradientAccumulator, ShardedSums, type ShardTensors } from '../actors/group/group-sync.ts';
import { LocalUpdates } from '../actors/worker/local-updates.ts';
import type { ComputedStep } from '../actors/worker/step.ts';
import { gitCommit } from './chaos.ts';
import { median } from './stats.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const WINDOWS = process.argv.includes('--quick') ? 20 : 100;
const STEPS_PER_WINDOW = 4;
const REPEATS = 5;
const DENSE = [['w1', 260 * 256 + 256], ['w2', 256 * 128 + 128], ['w3', 128 + 1]] as const;
const SHARDS = ['s0', 's1', 's2', 's3'];

const plan = buildShardPlan({
  version: 1, shards: SHARDS, partitions: 64, maxBlockBytes: 64 * 1024,
  denseParams: DENSE.map(([name, size]) => ({ name, size })), sparseTables: [{ name: 'emb', dim: 32 }, { name: 'wide', dim: 1 }],
});
const rng = new SeededRandom(1);

interface Step extends ComputedStep { rows: Map<string, Float32Array> }

function step(): Step {
  const ids = new Set<number>();
  // Skewed draws within each slot's 20 000 ids; a worker pulls and trains each distinct id once.
  for (let i = 0; i < 256 * 8; i++) ids.add(Math.floor(20_000 * rng.next() ** 3) + 20_000 * (i % 8));
  const u = Int32Array.from(ids);
  const floats = (n: number) => Float32Array.from({ length: n }, () => rng.normal() * 1e-2);
  return {
    loss: 0, samples: 256, uniqueIds: u, computeMs: 0, stepMs: 0, versions: new Map([['s0', 1]]),
    denseGrads: new Map(DENSE.map(([name, size]) => [name, floats(size)])),
    rowGrads: new Map([['emb', floats(u.length * 32)], ['wide', floats(u.length)]]),
    rows: new Map([['emb', floats(u.length * 32)], ['wide', floats(u.length)]]),
  };
}

const steps = Array.from({ length: 16 }, step);

function once(): Record<'sums' | 'parts' | 'local' | 'reduce', number> {
  const acc = new GradientAccumulator(plan, true);
  const local = new LocalUpdates({ dense: { type: 'adam', learningRate: 0.001 }, sparse: { type: 'adagrad', learningRate: 0.05 } });
  const params = new Map(DENSE.map(([name, size]) => [name, new Float32Array(size)]));
  const reducer = Array.from({ length: STEPS_PER_WINDOW }, () => new ShardedSums(plan));
  const t = { sums: 0, parts: 0, local: 0, reduce: 0 };
  const others = SHARDS.slice(1).map((s) => new Set([s]));
  const mine = new Set([SHARDS[0]!]);
  for (let w = 0; w < WINDOWS; w++) {
    acc.reset();
    local.newWindow();
    for (let k = 0; k < STEPS_PER_WINDOW; k++) {
      const s = steps[(w * STEPS_PER_WINDOW + k) % steps.length]!;
      let t0 = performance.now();
      acc.add(s);
      t.sums += performance.now() - t0;
      t0 = performance.now();
      local.step(params, s.denseGrads, s.uniqueIds, s.rows, s.rowGrads, 1);
      t.local += performance.now() - t0;
      t0 = performance.now();
      const part = acc.parts()[k]!;
      for (const o of others) part.sums.byShard(o);
      t.parts += performance.now() - t0;
    }
    // The reducer of s0: 4 members' parts of it per step index (this member's, four times), summed and scaled for the push.
    const t0 = performance.now();
    const slices: ShardTensors[] = acc.parts().map((p) => p.sums.byShard(mine).get(SHARDS[0]!)!);
    for (let k = 0; k < STEPS_PER_WINDOW; k++) {
      const sums = reducer[k]!;
      sums.clear();
      for (let m = 0; m < 4; m++) sums.addTensors(slices[k]!, 1);
      sums.byShard(mine, 1 / 1024);
    }
    t.reduce += performance.now() - t0;
  }
  const per = (x: number) => x / (WINDOWS * STEPS_PER_WINDOW);
  return { sums: per(t.sums), parts: per(t.parts), local: per(t.local), reduce: per(t.reduce) };
}

once(); // warm-up (JIT)
const runs = Array.from({ length: REPEATS }, once);
const ms: Record<string, number> = {};
for (const key of ['sums', 'parts', 'local', 'reduce'] as const) ms[key] = +median(runs.map((r) => r[key]))!.toFixed(3);
ms.total = +(ms.sums! + ms.parts! + ms.local! + ms.reduce!).toFixed(3);
process.stderr.write(`ms per member step: ${JSON.stringify(ms)} (ids per step ${steps[0]!.uniqueIds!.length})\n`);

const { commit, dirty } = gitCommit(ROOT);
const out = {
  benchmark: 'member', commit, dirty, date: new Date().toISOString(),
  machine: { cpu: cpus()[0]?.model ?? null, cores: availableParallelism(), memory_gib: Math.round(totalmem() / 2 ** 30), node: process.version, platform: `${process.platform} ${process.arch}` },
  definition: 'ms of JavaScript per member step around the ONNX step, median of 5 repeats of ' + `${WINDOWS} windows × ${STEPS_PER_WINDOW} steps`
    + ': sums = GradientAccumulator.add; parts = ShardedSums.byShard for 3 other owners; local = LocalUpdates.step (Adam dense, Adagrad rows); reduce = the reducer\'s sums of 4 members\' parts and their push tensors, per step',
  shapes: { dense_floats: DENSE.reduce((n, [, s]) => n + s, 0), tables: { emb: 32, wide: 1 }, shards: SHARDS.length, ids_per_step: steps.map((s) => s.uniqueIds!.length) },
  ms_per_step: ms,
  runs,
};
if (!process.argv.includes('--quick')) {
  const dir = join(ROOT, 'bench', 'results');
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'member.json'), JSON.stringify(out, null, 1) + '\n');
  console.log(`written ${join(dir, 'member.json')}`);
}
