/**
 * What checkpoints cost, on the quick start (examples/quickstart.yaml as
 * shipped, a local 3-node NATS cluster started by each `hetps up`):
 *
 * - throughput: runs without checkpoints and with one every 10 s
 *   (`checkpoint.every_s: 10`, `full_every: 3`), each training 6 epochs
 *   (~35 s here, three cuts a run), alternated in pairs so both
 *   sides see the same machine; `samples_per_s_*` are medians of the runs'
 *   summaries, `throughput_ratio` = with / without;
 * - the pause for the cut (`pause_ms`, from every checkpoint of the runs
 *   with them): how long training stood still;
 * - bytes: `full_bytes` / `delta_bytes` (medians per checkpoint),
 *   `delta_ratio` = full / delta; `write_mb_per_s` = bytes written over the
 *   time spent encoding and writing them (after training resumed);
 * - `resume_s`: `hetps up --resume DIR` from a mid-run checkpoint of the
 *   last run with checkpoints, from the command's start to the moment every
 *   shard is restored (stderr `resume: shard … restored`), cluster and node
 *   start-up included; the resumed run trains to the end, and its
 *   `resumed_from.batches_done + batches_acked = batches` is recorded;
 * - where the pause goes: `pausing_ms` (until every worker stopped at its
 *   boundary) and `snapshot_ms` (the shards' snapshots) of each cut;
 * - `skewed`: what deltas save on a large Zipf-skewed table — the quick
 *   start's cluster on synthetic CTR data (8 slots × 500 000 ids per slot,
 *   Zipf 1.05, 100 000 samples, one epoch, 4 M hash buckets), a checkpoint
 *   every 5 s with `full_every: 4`. The table grows all run long (new ids
 *   keep coming), so fulls of different moments do not compare: each
 *   delta is compared with a full checkpoint of the same moment, by rows
 *   (`rows_held / rows`; a row's bytes are the same in both). Measured, no
 *   goal (Check-N-Run reports 6–17× less data with deltas; the quick
 *   start's small table changes almost whole between checkpoints, so it
 *   cannot show this).
 *
 * Goals (the issue's, fixed before any run): a checkpoint every 10 s costs
 * at most 5 % of throughput (`throughput_ratio` ≥ 0.95), and the pause for
 * the cut is at most 200 ms.
 *
 *   npm run bench:checkpoint                 → bench/results/checkpoint.json
 *   options: --pairs N (default 4: with 2 the ratio moved by ±10 % between invocations)  --epochs N (default 6)  --out FILE
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { earlierResults, gitCommit, machineRecord } from './chaos.ts';
import { median } from './stats.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const BIN = join(ROOT, 'bin', 'hetps.mjs');
const argv = process.argv.slice(2);
const option = (name: string): string | null => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] ?? null : null; };
const PAIRS = Number(option('--pairs') ?? 4);
// The throughput pairs train the quick start for this many epochs (shipped: 2, ~10 s here), so a 10 s period takes
// several cuts a run and start-up noise weighs less than in a run that ends near its first cut.
const EPOCHS = Number(option('--epochs') ?? 6);
const OUT = option('--out') ?? join(ROOT, 'bench', 'results', 'checkpoint.json');
const GOALS = { throughput_ratio: 0.95, pause_ms: 200 };
const say = (s: string) => process.stderr.write(`[checkpoint] ${s}\n`);

interface Taken {
  name: string; path: string; kind: 'full' | 'delta'; trigger: string; bytes: number; pause_ms: number; pausing_ms?: number; snapshot_ms?: number;
  write_ms: number; rows: number; rows_held: number; moment_wait_ms?: number; aligned?: boolean;
}
interface Summary {
  samples_per_s: number; batches: number; batches_acked: number; test_auc: number | null; wall_s: number; checkpoints: Taken[];
  resumed_from?: { checkpoint: string; batches_done: number };
}

/** One `hetps up`; resolves with its summary, its stderr and when each watched line first appeared (ms after the start). */
function up(config: string, extra: string[], watch: RegExp | null = null): Promise<{ summary: Summary; stderr: string; watchedAt: number | null; wall_ms: number }> {
  return new Promise((resolve, reject) => {
    const summaryFile = `${config}.${Date.now()}.summary.json`;
    const t0 = performance.now();
    const child = spawn(process.execPath, [BIN, 'up', '--config', config, '--summary', summaryFile, ...extra], { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    let watchedAt: number | null = null;
    let partial = '';
    child.stderr.on('data', (d: Buffer) => {
      const text = d.toString();
      stderr += text;
      partial += text;
      const lines = partial.split('\n');
      partial = lines.pop() ?? '';
      if (watch !== null) for (const l of lines) if (watch.test(l)) watchedAt = performance.now() - t0;
    });
    child.on('error', reject);
    child.on('exit', (code) => {
      const wall_ms = performance.now() - t0;
      if (code !== 0) { reject(new Error(`hetps up ${extra.join(' ')} exited ${code}:\n${stderr.split('\n').slice(-30).join('\n')}`)); return; }
      resolve({ summary: JSON.parse(readFileSync(summaryFile, 'utf8')) as Summary, stderr, watchedAt, wall_ms });
    });
  });
}

const round = (x: number | null, d = 3) => (x === null ? null : +x.toFixed(d));

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'hetps-bench-checkpoint-'));
  const began = performance.now();
  try {
    const quick = readFileSync(join(ROOT, 'examples', 'quickstart.yaml'), 'utf8');
    if (!/\n  epochs: 2\n/.test(quick)) throw new Error('examples/quickstart.yaml no longer has data.epochs: 2; update bench:checkpoint');
    const config = (name: string, checkpoint: string, epochs = 2) => {
      const file = join(dir, `${name}.yaml`);
      const text = quick.replace('name: quickstart', `name: ${name}\n  run_dir: ${join(dir, 'runs')}`).replace('\n  epochs: 2\n', `\n  epochs: ${epochs}\n`);
      writeFileSync(file, `${text}\ncheckpoint:\n${checkpoint}`);
      return file;
    };
    const without = config('ckb-without', '  every_s: 0\n  at_end: false\n', EPOCHS);
    const root = join(dir, 'ckpts');
    mkdirSync(root, { recursive: true });
    const withCk = config('ckb-with', `  dir: ${root}\n  every_s: 10\n  full_every: 3\n  keep: 1000\n  at_end: false\n`, EPOCHS);
    const runs: { side: 'with' | 'without'; pair: number; samples_per_s: number; wall_s: number; checkpoints: Taken[]; test_auc: number | null }[] = [];
    for (let pair = 1; pair <= PAIRS; pair++) {
      // Alternate which side goes first, so a drift of the machine's load does not favour one.
      const order: ('with' | 'without')[] = pair % 2 ? ['without', 'with'] : ['with', 'without'];
      for (const side of order) {
        say(`pair ${pair}/${PAIRS}: ${side} checkpoints`);
        const r = await up(side === 'with' ? withCk : without, []);
        runs.push({ side, pair, samples_per_s: r.summary.samples_per_s, wall_s: r.summary.wall_s, checkpoints: r.summary.checkpoints ?? [], test_auc: r.summary.test_auc });
        say(`  ${Math.round(r.summary.samples_per_s)} samples/s, ${r.summary.checkpoints?.length ?? 0} checkpoints, AUC ${r.summary.test_auc}`);
      }
    }
    const taken = runs.filter((r) => r.side === 'with').flatMap((r) => r.checkpoints);
    const withRate = median(runs.filter((r) => r.side === 'with').map((r) => r.samples_per_s));
    const withoutRate = median(runs.filter((r) => r.side === 'without').map((r) => r.samples_per_s));
    const written = taken.reduce((n, c) => n + c.bytes, 0);
    const writeMs = taken.reduce((n, c) => n + c.write_ms, 0);

    // Resume from a mid-run checkpoint of the last run with checkpoints (the middle one: a delta when there is one).
    const lastWith = runs.filter((r) => r.side === 'with').at(-1)!.checkpoints;
    let resume: Record<string, unknown> | null = null;
    if (lastWith.length > 0) {
      const from = lastWith[Math.floor((lastWith.length - 1) / 2)]!;
      say(`resume from ${from.name} (${from.kind})`);
      const r = await up(withCk, ['--resume', from.path], /resume: shard \S+ restored/);
      resume = {
        from: from.name, kind: from.kind, restored_after_s: round(r.watchedAt === null ? null : r.watchedAt / 1000),
        wall_s: round(r.wall_ms / 1000), batches: r.summary.batches, batches_acked: r.summary.batches_acked, resumed_from: r.summary.resumed_from ?? null,
        accounted: (r.summary.resumed_from?.batches_done ?? 0) + r.summary.batches_acked === r.summary.batches, test_auc: r.summary.test_auc,
      };
    }
    // More cuts, on the quick start as shipped (about 10 s of training here). Supplementary: `met.pause` stays
    // defined on the cuts of the runs above.
    const every2Root = join(dir, 'ckpts-every-2s');
    const every2 = config('ckb-every-2s', `  dir: ${every2Root}\n  every_s: 2\n  full_every: 3\n  keep: 1000\n  at_end: false\n`);
    say('supplementary: the quick start with a checkpoint every 2 s (mid-run cuts)');
    const e2 = await up(every2, []);
    const e2Taken = e2.summary.checkpoints ?? [];
    const e2Pauses = e2Taken.map((c) => c.pause_ms);
    const pauseEvery2s = {
      setup: 'the quick start as shipped with checkpoint: { every_s: 2, full_every: 3, at_end: false }, one run',
      pause_ms: { median: median(e2Pauses), max: e2Pauses.length ? Math.max(...e2Pauses) : null },
      at_or_under_goal: e2Pauses.filter((p) => p <= GOALS.pause_ms).length,
      cuts: e2Taken.map(({ name, kind, pause_ms, pausing_ms, snapshot_ms, moment_wait_ms, aligned }) => ({ name, kind, pause_ms, pausing_ms, snapshot_ms, moment_wait_ms, aligned })),
      samples_per_s: e2.summary.samples_per_s,
    };
    say(`  ${e2Taken.length} cuts: pause median ${pauseEvery2s.pause_ms.median} ms, max ${pauseEvery2s.pause_ms.max} ms (${pauseEvery2s.at_or_under_goal} at or under ${GOALS.pause_ms} ms)`);
    // A large skewed table: what deltas save where few rows change between checkpoints.
    const skewedRoot = join(dir, 'ckpts-skewed');
    const skewedFile = join(dir, 'ckb-skewed.yaml');
    writeFileSync(skewedFile, `${quick.slice(0, quick.indexOf('\nmodel:')).replace('name: quickstart', `name: ckb-skewed\n  run_dir: ${join(dir, 'runs')}`)}
model:
  type: ctr
  ctr: { embedding_dim: 16, hidden: [32, 16], pooling: sum, wide: true, hash_buckets: 4000000 }
data:
  source: ctr-synthetic
  batch_size: 64
  epochs: 1
  samples: 100000
  test_samples: 2000
  slots: 8
  vocab_size: 500000
  zipf_exponent: 1.05
optimizer:
  type: adam
  learning_rate: 0.002
  sparse: { type: adagrad, learning_rate: 0.05 }
training:
  mode: hps
  max_staleness: 16
  emulation_reference_step_ms: 40
  random_seed: 42
checkpoint:
  dir: ${skewedRoot}
  every_s: 5
  full_every: 4
  keep: 1000
  at_end: false
`);
    say('skewed table: synthetic CTR, 8 × 500 000 ids, Zipf 1.05, a checkpoint every 5 s, full_every 4');
    const sk = await up(skewedFile, []);
    const skTaken = sk.summary.checkpoints ?? [];
    const skFull = skTaken.filter((c) => c.kind === 'full');
    const skDelta = skTaken.filter((c) => c.kind === 'delta');
    const skFullBytes = median(skFull.map((c) => c.bytes));
    const skDeltaBytes = median(skDelta.map((c) => c.bytes));
    const skewed = {
      setup: 'the quick start\'s cluster; ctr-synthetic 8 slots × 500 000 ids, Zipf 1.05, 100 000 samples, batch 64, 1 epoch; embedding 16, 4 M hash buckets; checkpoint every 5 s, full_every 4',
      samples_per_s: sk.summary.samples_per_s, test_auc: sk.summary.test_auc,
      full_bytes: skFullBytes, delta_bytes: skDeltaBytes,
      delta_rows_fraction: round(median(skDelta.map((c) => c.rows / Math.max(1, c.rows_held)))),
      delta_ratio_same_moment: round(median(skDelta.map((c) => c.rows_held / Math.max(1, c.rows))), 2),
      delta_ratio_definition: 'median over deltas of rows held / rows written: the data a full checkpoint of the same moment writes over what the delta writes',
      checkpoints: skTaken.map(({ name, kind, bytes, pause_ms, rows, rows_held }) => ({ name, kind, bytes, pause_ms, rows, rows_held })),
    };
    say(`  ${skTaken.length} checkpoints: full ${skFullBytes} B, delta ${skDeltaBytes} B ; a delta writes ${skewed.delta_rows_fraction} of the rows held (${skewed.delta_ratio_same_moment}× less than a full one then)`);

    const ratio = withRate !== null && withoutRate !== null ? withRate / withoutRate : null;
    const pauses = taken.map((c) => c.pause_ms);
    // Bytes on the quick start: the 10 s runs' checkpoints and the 2 s run's (full, delta, delta in each 10 s run).
    const quickTaken = [...taken, ...e2Taken];
    const fullBytes = median(quickTaken.filter((c) => c.kind === 'full').map((c) => c.bytes));
    const quickDeltas = quickTaken.filter((c) => c.kind === 'delta');
    const deltaBytes = median(quickDeltas.map((c) => c.bytes));
    const pauseMax = pauses.length ? Math.max(...pauses) : null;
    const { commit, dirty } = gitCommit(ROOT);
    const result = {
      benchmark: 'checkpoint',
      commit, dirty, date: new Date().toISOString(),
      machine: machineRecord(),
      setup: {
        job: `examples/quickstart.yaml (2 servers, 5 emulated workers, hps), each run its own local 3-node NATS cluster; the throughput pairs and the resume train ${EPOCHS} epochs instead of 2, the other runs as shipped`,
        epochs: EPOCHS,
        with: 'checkpoint: { every_s: 10, full_every: 3, at_end: false }', without: 'checkpoint: { every_s: 0, at_end: false }',
        pairs: PAIRS, order: 'alternated per pair', bench_wall_s: round((performance.now() - began) / 1000, 0),
      },
      goals: GOALS,
      full_bytes: fullBytes, delta_bytes: deltaBytes, delta_ratio: round(fullBytes !== null && deltaBytes ? fullBytes / deltaBytes : null, 2),
      delta_rows_fraction: round(median(quickDeltas.map((c) => c.rows / Math.max(1, c.rows_held)))),
      bytes_from: 'full_bytes, delta_bytes: medians over the quick start\'s checkpoints, those of the 10 s runs and of the 2 s run (pause_every_2s)',
      pause_ms: { median: median(pauses), max: pauseMax },
      pause_parts_ms: {
        definition: 'pause_ms = pausing (pause request → every worker stopped at its window or step boundary) + snapshots (every shard\'s) + resuming',
        pausing_median: median(taken.flatMap((c) => (c.pausing_ms === undefined ? [] : [c.pausing_ms]))),
        snapshot_median: median(taken.flatMap((c) => (c.snapshot_ms === undefined ? [] : [c.snapshot_ms]))),
      },
      pause_every_2s: pauseEvery2s,
      skewed,
      write_mb_per_s: round(writeMs > 0 ? written / 1e6 / (writeMs / 1000) : null, 1),
      resume_s: resume?.restored_after_s ?? null,
      resume_definition: 'seconds from starting `hetps up --resume DIR` (cluster and node start-up included) to the last shard restored',
      samples_per_s_with: withRate, samples_per_s_without: withoutRate, throughput_ratio: round(ratio),
      // The spread: with / without within each pair (run side by side).
      pair_ratios: Array.from({ length: PAIRS }, (_, i) => {
        const rate = (side: string) => runs.find((r) => r.pair === i + 1 && r.side === side)?.samples_per_s ?? null;
        const w = rate('with'), wo = rate('without');
        return w !== null && wo !== null ? round(w / wo) : null;
      }),
      met: {
        throughput: ratio !== null && ratio >= GOALS.throughput_ratio,
        pause: pauseMax !== null && pauseMax <= GOALS.pause_ms,
      },
      resume,
      checkpoints: taken.map(({ name, kind, trigger, bytes, pause_ms, pausing_ms, snapshot_ms, write_ms, rows, rows_held, moment_wait_ms, aligned }) => ({ name, kind, trigger, bytes, pause_ms, pausing_ms, snapshot_ms, write_ms, rows, rows_held, moment_wait_ms, aligned })),
      runs,
      // Earlier invocations stay in the file, newest first, without their bulky lists.
      superseded: earlierResults(OUT, ['runs', 'checkpoints']),
    };
    mkdirSync(join(OUT, '..'), { recursive: true });
    writeFileSync(OUT, `${JSON.stringify(result, null, 2)}\n`);
    say(`wrote ${OUT}: throughput ${result.samples_per_s_with} vs ${result.samples_per_s_without} samples/s (ratio ${result.throughput_ratio}); `
      + `pause median ${result.pause_ms.median} ms, max ${result.pause_ms.max} ms; full ${fullBytes} B, delta ${deltaBytes} B (${result.delta_ratio}×); resume ${result.resume_s} s`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
