/**
 * The headline benchmark: the reference article's heterogeneous cluster,
 * scaled down and emulated on this machine, trained in `bsp`, `asp` and `hps`
 * on the same model, data and sample budget, one mode after the other.
 *
 * Each run is a real `hetps up`: a fresh local 3-node NATS cluster
 * (deploy/local-cluster.ts), 2 shard processes and 10 worker processes —
 * 4 fast nodes (emulated speed 1.0), 4 medium (0.6) and 2 slow CPU nodes
 * (0.1) in three worker groups as in the article's example (fast: sync,
 * sync_steps 4; medium: sync, sync_steps 6; slow: async). Emulation: every
 * step graph of a node takes `emulation_reference_step_ms / speed` with the
 * real compute inside it; pulls, pushes, the queue and the group's
 * reduce come on top, as on real hardware (cpu_busy_fraction says how much
 * of the machine the job used, machine_busy_fraction what the whole machine
 * did, other users included).
 *
 * Besides the three modes, `hps_sync_steps_1` is hps with both sync groups
 * at sync_steps 1 (every step reduced and pushed, no gradient delay inside
 * a group), to show what the article's 4 and 6 buy: a window of N steps is
 * N updates computed from the window's starting parameters, exchanged in
 * one reduce instead of N.
 *
 * For hps, `window_ms_by_phase` says where each group's windows spend
 * their time (steps incl. fetching batches and rows; slices; waiting for
 * the round; gather; reduce + push; waiting for the push reports), the
 * mean over the group's members per window.
 *
 * The driver evaluates a fixed test subset every few seconds (the curves);
 * the final AUC and loss are on the whole test split. Time to target = the
 * first time a curve reaches TARGET_LOSS, interpolated linearly between the
 * two evaluations around it, counted from the first worker's first step.
 * The ideal throughput is, as the issue defines it, the sum of every node's
 * solo samples/s: each speed class measured alone (one worker, asp, same
 * servers and NATS, pulls and pushes included) — `ideal_samples_per_s`.
 * The nominal figure, Σ batch / (reference / speed) with no communication
 * at all, is reported beside it (`ideal_nominal_samples_per_s`,
 * `hps_over_nominal`). Without the solo runs the nominal one stands in.
 *
 * Writes bench/results/hetero.json and bench/results/hetero.svg (test loss
 * against training time, one line per run).
 *   --quick          a short smoke run (fewer samples, no solo runs), results in a temp dir
 *   --runs a,b       a subset of bsp,asp,hps,hps_sync_steps_1 (results in a temp dir)
 *   --no-solo        skip the solo measurements
 *   --chart-only     redraw hetero.svg (and time_to_target_s) from hetero.json
 *   --target LOSS    the target test loss (default TARGET_LOSS)
 */
import { spawn } from 'node:child_process';
import { createWriteStream, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { lineChartSvg } from './chart.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const BIN = join(ROOT, 'bin', 'hetps.mjs');
const RESULTS = fileURLToPath(new URL('./results/', import.meta.url));

const args = process.argv.slice(2);
const flag = (name: string) => args.includes(name);
const option = (name: string): string | null => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] ?? null : null; };
const QUICK = flag('--quick');
const CHART_ONLY = flag('--chart-only');

type Mode = 'bsp' | 'asp' | 'hps';
interface RunSpec {
  key: string;
  mode: Mode;
  /** sync_steps of the fast and medium groups (the article: 4 and 6). */
  syncSteps: [number, number];
  label: string;
  color: string;
}
const ALL_RUNS: RunSpec[] = [
  { key: 'bsp', mode: 'bsp', syncSteps: [4, 6], label: 'bsp', color: '#d62728' },
  { key: 'asp', mode: 'asp', syncSteps: [4, 6], label: 'asp', color: '#1f77b4' },
  { key: 'hps', mode: 'hps', syncSteps: [4, 6], label: 'hps, sync 4/6', color: '#2ca02c' },
  { key: 'hps_sync_steps_1', mode: 'hps', syncSteps: [1, 1], label: 'hps, sync 1', color: '#9467bd' },
];
const RUN_KEYS = option('--runs')?.split(',') ?? ALL_RUNS.map((r) => r.key);
for (const k of RUN_KEYS) if (!ALL_RUNS.some((r) => r.key === k)) throw new Error(`--runs: unknown run ${k} (${ALL_RUNS.map((r) => r.key).join(', ')})`);
const RUNS = ALL_RUNS.filter((r) => RUN_KEYS.includes(r.key));
const SOLO = !QUICK && !flag('--no-solo');

/**
 * The target test loss: reached by every run in the measured results (see
 * the curves in hetero.json), below the early evaluations and above where
 * the slowest-learning run ends.
 */
const TARGET_LOSS = Number(option('--target') ?? 0.51);

// ---------------------------------------------------------------- the emulated cluster

/** A step graph of a speed-1 node, ms (the project's default); the real one takes ~1–4 ms here. */
const REFERENCE_STEP_MS = 100;
const BATCH = 256;
const GROUPS = [
  { name: 'fast', size: 4, speed: 1.0, sync_mode: 'sync', article: 'a100_group' },
  { name: 'medium', size: 4, speed: 0.6, sync_mode: 'sync', article: 'v100_group' },
  { name: 'slow', size: 2, speed: 0.1, sync_mode: 'async', article: 'cpu_group' },
] as const;
const SERVERS = ['server-1', 'server-2'];
/** The sample budget, one epoch (a second epoch of this data overfits: test loss rises). */
const SAMPLES = QUICK ? 40_960 : 307_200;
const TEST_SAMPLES = 20_000;
const VOCAB_PER_SLOT = 20_000;
const EVAL_EVERY_S = QUICK ? 1 : 2;
const EVAL_SAMPLES = 4096;
/** Solo runs: about 15 s of steps per speed class. */
const SOLO_SECONDS = 15;

const workers = GROUPS.flatMap((g) => Array.from({ length: g.size }, (_, i) => ({ name: `${g.name}-${i + 1}`, group: g.name, speed: g.speed })));
/** Nominal solo throughput of a worker: batch / (reference / speed). */
const nominalSolo = (speed: number) => (BATCH * 1000) / (REFERENCE_STEP_MS / speed);
const IDEAL = workers.reduce((s, w) => s + nominalSolo(w.speed), 0);

interface JobShape {
  name: string;
  mode: Mode;
  groups: { name: string; nodes: { name: string; speed: number }[]; sync_mode: string; sync_steps: number | null }[];
  samples: number;
}

function jobYaml(j: JobShape, runDir: string): string {
  const groups = j.groups.map((g) => [
    `    - name: ${g.name}`,
    `      nodes: [${g.nodes.map((n) => n.name).join(', ')}]`,
    `      sync_mode: ${g.sync_mode}`,
    ...(g.sync_steps !== null ? [`      sync_steps: ${g.sync_steps}`] : []),
  ].join('\n')).join('\n');
  const nodes = j.groups.flatMap((g) => g.nodes).map((w) => `  ${w.name}: { emulate: { speed: ${w.speed} } }`).join('\n');
  return `# generated by bench/hetero.bench.ts
job: { name: ${j.name}, run_dir: ${JSON.stringify(runDir)} }
cluster:
  worker_groups:
${groups}
  server_nodes: [${SERVERS.join(', ')}]
nodes:
${nodes}
model:
  type: ctr
  ctr: { embedding_dim: 8, hidden: [32, 16], pooling: sum, wide: true }
data:
  source: ctr-synthetic
  batch_size: ${BATCH}
  epochs: 1
  samples: ${j.samples}
  test_samples: ${TEST_SAMPLES}
  vocab_size: ${VOCAB_PER_SLOT}
optimizer:
  type: adam
  learning_rate: 0.002
  sparse: { type: adagrad, learning_rate: 0.05 }
training:
  mode: ${j.mode}
  random_seed: 42
  emulation_reference_step_ms: ${REFERENCE_STEP_MS}
fault_tolerance:
  worker_recovery_timeout: 120
logging:
  level: warn
`;
}

function clusterJob(run: RunSpec): JobShape {
  return {
    name: `hetero-${run.key.replace(/_/g, '-')}`,
    mode: run.mode,
    groups: GROUPS.map((g, k) => ({
      name: g.name, sync_mode: g.sync_mode, sync_steps: g.sync_mode === 'sync' ? run.syncSteps[k]! : null,
      nodes: workers.filter((w) => w.group === g.name).map((w) => ({ name: w.name, speed: w.speed })),
    })),
    samples: SAMPLES,
  };
}

// ---------------------------------------------------------------- one run

interface CurvePoint { t_s: number; samples: number; test_loss: number; test_auc: number | null }
interface NodeUtil {
  window_phases_s?: Record<string, number> | null; windows?: number;
  busy_s: number; utilisation: number; compute_s: number | null; steps: number; samples: number; emulated_speed: number | null; dropped_stale: number; busy_from: string;
}
interface UpSummary {
  mode: string; samples: number; samples_per_s: number; train_s: number; wall_s: number; test_auc: number | null; test_logloss: number;
  batches: number; batches_acked: number; duplicate_acks: number; per_worker: Record<string, number>;
  curve: CurvePoint[]; utilisation: { wall_s: number; mean: number; per_node: Record<string, NodeUtil> };
  cpu: { window_s: number; cores: number; process_cpu_s: number; cpu_busy_fraction: number; machine_busy_fraction: number | null; per_process: Record<string, number | null> } | null;
  /** The shards' staleness histogram (added by hps' change; absent in older summaries). */
  staleness?: unknown;
}

async function hetpsUp(tag: string, job: JobShape, dir: string, evalEvery: number): Promise<UpSummary> {
  const cfg = join(dir, `${tag}.yaml`);
  writeFileSync(cfg, jobYaml(job, join(dir, 'runs')));
  const summaryFile = join(dir, `${tag}-summary.json`);
  const log = createWriteStream(join(dir, `${tag}.log`));
  process.stderr.write(`\n== ${tag}: hetps up --config ${cfg}\n`);
  const child = spawn(process.execPath, [BIN, 'up', '--config', cfg, '--summary', summaryFile, '--eval-every', String(evalEvery), '--eval-samples', String(EVAL_SAMPLES)], {
    cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, HETPS_LOG_LEVEL: process.env.HETPS_LOG_LEVEL ?? 'warn' },
  });
  for (const stream of [child.stdout!, child.stderr!]) {
    createInterface({ input: stream }).on('line', (l) => { log.write(`${l}\n`); process.stderr.write(`[${tag}] ${l}\n`); });
  }
  const code = await new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  await new Promise<void>((r) => log.end(() => r()));
  if (code !== 0) throw new Error(`hetps up (${tag}) exited with ${code}; log: ${join(dir, `${tag}.log`)}`);
  return JSON.parse(readFileSync(summaryFile, 'utf8')) as UpSummary;
}

/** First time the curve is at or below `target`, interpolated between the evaluations around the crossing; null if never. */
export function timeToTarget(curve: readonly CurvePoint[], target: number): number | null {
  for (let i = 0; i < curve.length; i++) {
    const p = curve[i]!;
    if (p.test_loss > target) continue;
    if (i === 0) return p.t_s;
    const q = curve[i - 1]!;
    const f = (q.test_loss - target) / (q.test_loss - p.test_loss);
    return q.t_s + f * (p.t_s - q.t_s);
  }
  return null;
}

const round = (x: number, digits: number) => Number(x.toFixed(digits));
const roundOrNull = (x: number | null | undefined, digits: number) => (x === null || x === undefined ? null : round(x, digits));

function runResult(run: RunSpec, s: UpSummary, target: number) {
  const perNode = Object.fromEntries(Object.entries(s.utilisation.per_node).map(([n, u]) => [n, {
    utilisation: round(u.utilisation, 3), busy_s: round(u.busy_s, 2), compute_s: roundOrNull(u.compute_s, 2),
    steps: u.steps, samples: u.samples, emulated_speed: u.emulated_speed, dropped_stale: u.dropped_stale, busy_from: u.busy_from,
  }]));
  const perGroup = Object.fromEntries(GROUPS.map((g) => {
    const us = workers.filter((w) => w.group === g.name).map((w) => s.utilisation.per_node[w.name]?.utilisation ?? 0);
    return [g.name, round(us.reduce((a, b) => a + b, 0) / us.length, 3)];
  }));
  // hps: where a window's time goes, per group: mean over its members of seconds per window by phase.
  const windowPhases = run.mode !== 'hps' ? null : Object.fromEntries(GROUPS.map((g) => {
    const members = workers.filter((w) => w.group === g.name).map((w) => s.utilisation.per_node[w.name]).filter((u) => u?.window_phases_s);
    const perWindow: Record<string, number> = {};
    for (const u of members) {
      const windows = Math.max(1, u!.windows ?? 1);
      for (const [k, v] of Object.entries(u!.window_phases_s!)) perWindow[k] = (perWindow[k] ?? 0) + (v * 1000) / windows / members.length;
    }
    return [g.name, Object.fromEntries(Object.entries(perWindow).map(([k, v]) => [k, Math.round(v)]))];
  }));
  return {
    mode: run.mode,
    sync_steps: run.mode === 'hps' ? { fast: run.syncSteps[0], medium: run.syncSteps[1] } : null,
    samples: s.samples,
    samples_per_s: Math.round(s.samples_per_s),
    train_s: round(s.train_s, 1),
    wall_s: round(s.wall_s, 1),
    utilisation: { mean: round(s.utilisation.mean, 3), per_group: perGroup, per_node: perNode },
    window_ms_by_phase: windowPhases,
    time_to_target_s: roundOrNull(timeToTarget(s.curve, target), 1),
    final_auc: roundOrNull(s.test_auc, 4),
    final_loss: round(s.test_logloss, 4),
    batches_per_worker: s.per_worker,
    batches_acked: s.batches_acked,
    duplicate_acks: s.duplicate_acks,
    cpu_busy_fraction: s.cpu ? round(s.cpu.cpu_busy_fraction, 3) : null,
    machine_busy_fraction: roundOrNull(s.cpu?.machine_busy_fraction, 3),
    process_cpu_s: s.cpu ? round(s.cpu.process_cpu_s, 1) : null,
    cpu_window_s: s.cpu ? round(s.cpu.window_s, 1) : null,
    staleness: s.staleness ?? null,
    curve: s.curve.map((p) => ({ t_s: round(p.t_s, 2), samples: p.samples, test_loss: round(p.test_loss, 5), test_auc: roundOrNull(p.test_auc, 5) })),
  };
}
type RunResult = ReturnType<typeof runResult>;

/** The goals, for `hps` or its variant against bsp and asp; null where a run is missing. */
function goals(results: Record<string, Pick<RunResult, 'samples_per_s' | 'final_auc' | 'time_to_target_s'>>, key: string, ideal: { value: number; from: string }) {
  const hps = results[key]; const bsp = results.bsp; const asp = results.asp;
  return {
    over_bsp: { goal: 'samples/s ≥ 1.65 × bsp', met: hps && bsp ? hps.samples_per_s / bsp.samples_per_s >= 1.65 : null },
    over_ideal: { goal: `samples/s ≥ 0.85 × ideal (${ideal.from})`, met: hps ? hps.samples_per_s / ideal.value >= 0.85 : null },
    auc: { goal: 'final AUC ≥ bsp final AUC − 0.005', met: hps?.final_auc != null && bsp?.final_auc != null ? hps.final_auc >= bsp.final_auc - 0.005 : null },
    first_to_target: {
      goal: 'reaches the target loss sooner than bsp and asp',
      met: hps && bsp && asp ? hps.time_to_target_s !== null && [bsp, asp].every((o) => o.time_to_target_s === null || o.time_to_target_s > hps.time_to_target_s!) : null,
    },
  };
}

async function soloRuns(dir: string) {
  const out: { group: string; speed: number; nominal_samples_per_s: number; measured_samples_per_s: number; steps: number; utilisation: number }[] = [];
  for (const g of GROUPS) {
    const steps = Math.max(8, Math.round((SOLO_SECONDS * 1000) / (REFERENCE_STEP_MS / g.speed)));
    const job: JobShape = {
      name: `hetero-solo-${g.name}`, mode: 'asp', samples: steps * BATCH,
      groups: [{ name: 'solo', nodes: [{ name: `${g.name}-solo`, speed: g.speed }], sync_mode: 'async', sync_steps: null }],
    };
    const s = await hetpsUp(`solo-${g.name}`, job, dir, 0);
    out.push({
      group: g.name, speed: g.speed, nominal_samples_per_s: Math.round(nominalSolo(g.speed)), measured_samples_per_s: Math.round(s.samples_per_s),
      steps: s.batches_acked, utilisation: round(s.utilisation.mean, 3),
    });
  }
  return out;
}

async function chart(results: Record<string, Pick<RunResult, 'curve' | 'samples_per_s'>>, target: number): Promise<string> {
  const present = ALL_RUNS.filter((r) => results[r.key]);
  const all = present.flatMap((r) => results[r.key]!.curve.map((p) => p.test_loss));
  // Cut off the first evaluations (untrained model) so the part where the runs differ is readable.
  const lo = Math.min(...all, target);
  const hi = Math.min(Math.max(...all), lo + 4 * Math.max(0.01, target - lo));
  return lineChartSvg({
    title: 'hetps, EMULATED heterogeneous cluster: test loss over time',
    // Short lines: without a canvas Vega estimates text widths generously and sizes the SVG to them.
    subtitle: [
      `10 workers emulated on one ${availableParallelism()}-core machine: 4 at speed 1.0, 4 at 0.6, 2 at 0.1`,
      `(a step takes ${REFERENCE_STEP_MS} ms / speed); 2 servers; 3-node NATS; every node its own process.`,
      `Synthetic CTR data, the same ${SAMPLES.toLocaleString('en-US')} samples (batch ${BATCH}) in each run;`,
      `test loss of ${EVAL_SAMPLES} held-out samples, evaluated while training runs.`,
    ],
    xTitle: 'training time (s)',
    yTitle: 'test log loss',
    legendTitle: 'samples/s',
    series: present.map((r) => ({
      name: `${r.label}: ${results[r.key]!.samples_per_s.toLocaleString('en-US')}/s`,
      points: results[r.key]!.curve.map((p) => ({ x: p.t_s, y: p.test_loss })),
    })),
    colors: present.map((r) => r.color),
    rules: [{ y: target, label: `target loss ${target}` }],
    yDomain: [Math.floor((lo - 0.005) * 200) / 200, Math.ceil(hi * 100) / 100],
  });
}

// ---------------------------------------------------------------- main

async function main(): Promise<void> {
  mkdirSync(RESULTS, { recursive: true });
  if (CHART_ONLY) {
    const out = JSON.parse(readFileSync(join(RESULTS, 'hetero.json'), 'utf8')) as {
      target_loss: number; target_reached_by_all: boolean; modes: Record<string, RunResult>; goals: unknown; goals_hps_sync_steps_1: unknown;
      ideal_samples_per_s: number; ideal_from: string;
    };
    const target = option('--target') !== null ? TARGET_LOSS : out.target_loss;
    for (const r of Object.values(out.modes)) r.time_to_target_s = roundOrNull(timeToTarget(r.curve, target), 1);
    out.target_loss = target;
    out.target_reached_by_all = Object.values(out.modes).every((r) => r.time_to_target_s !== null);
    const ideal = { value: out.ideal_samples_per_s, from: out.ideal_from.startsWith('measured') ? 'measured solo sum' : 'nominal (no solo runs)' };
    out.goals = goals(out.modes, 'hps', ideal);
    out.goals_hps_sync_steps_1 = goals(out.modes, 'hps_sync_steps_1', ideal);
    writeFileSync(join(RESULTS, 'hetero.json'), `${JSON.stringify(out, null, 2)}\n`);
    writeFileSync(join(RESULTS, 'hetero.svg'), await chart(out.modes, target));
    process.stderr.write(`redrew ${join(RESULTS, 'hetero.svg')} (time_to_target_s against ${target})\n`);
    return;
  }
  const full = !QUICK && RUNS.length === ALL_RUNS.length && SOLO;
  const dir = mkdtempSync(join(tmpdir(), 'hetps-bench-hetero-'));
  const outDir = full ? RESULTS : dir;
  const summaries: Record<string, UpSummary> = {};
  for (const run of RUNS) summaries[run.key] = await hetpsUp(run.key, clusterJob(run), dir, EVAL_EVERY_S);
  const solo = SOLO ? await soloRuns(dir) : null;

  const results: Record<string, RunResult> = {};
  for (const run of RUNS) results[run.key] = runResult(run, summaries[run.key]!, TARGET_LOSS);
  const rate = (k: string) => results[k]?.samples_per_s ?? null;
  const ratio = (a: number | null, b: number | null) => (a !== null && b !== null && b > 0 ? round(a / b, 3) : null);
  let cpuS = 0; let windowS = 0; let cores = availableParallelism();
  for (const run of RUNS) { const c = summaries[run.key]!.cpu; if (c) { cpuS += c.process_cpu_s; windowS += c.window_s; cores = c.cores; } }
  const measuredIdeal = solo ? workers.reduce((s, w) => s + solo.find((x) => x.speed === w.speed)!.measured_samples_per_s, 0) : null;
  const reachedByAll = Object.values(results).every((r) => r.time_to_target_s !== null);
  const ideal = measuredIdeal !== null ? { value: measuredIdeal, from: 'measured solo sum' } : { value: IDEAL, from: 'nominal (no solo runs)' };
  const out = {
    benchmark: 'hetero',
    emulated: true,
    ideal_samples_per_s: Math.round(ideal.value),
    ideal_from: measuredIdeal !== null
      ? 'measured: Σ over the 10 workers of the solo samples/s of its speed class (one worker alone, asp, same servers and NATS)'
      : 'nominal (the solo runs were skipped): Σ over the 10 workers of batch_size / (reference_step_ms / speed)',
    ideal_nominal_samples_per_s: Math.round(IDEAL),
    ideal_nominal_from: 'Σ over the 10 workers of batch_size / (reference_step_ms / speed): the emulated steps alone, no communication',
    target_loss: TARGET_LOSS,
    target_rule: 'a test loss (on the evaluation subset) every run reaches; time_to_target_s is the first time a curve reaches it (linear between evaluations), from the first worker step',
    target_reached_by_all: reachedByAll,
    hps_over_bsp: ratio(rate('hps'), rate('bsp')),
    hps_over_ideal: ratio(rate('hps'), ideal.value),
    hps_over_nominal: ratio(rate('hps'), IDEAL),
    hps_sync_steps_1_over_bsp: ratio(rate('hps_sync_steps_1'), rate('bsp')),
    hps_sync_steps_1_over_ideal: ratio(rate('hps_sync_steps_1'), ideal.value),
    cpu_busy_fraction: windowS > 0 ? round(cpuS / (windowS * cores), 3) : null,
    goals: goals(results, 'hps', ideal),
    goals_hps_sync_steps_1: goals(results, 'hps_sync_steps_1', ideal),
    modes: results,
    solo,
    setup: {
      machine: { cores: availableParallelism(), cpu: cpus()[0]?.model ?? null, memory_gib: Math.round(totalmem() / 2 ** 30), shared: 'other engineers\' runs may share it: see machine_busy_fraction per run' },
      emulation: {
        reference_step_ms: REFERENCE_STEP_MS,
        rule: 'the step graph of a node at speed s takes reference_step_ms / s (real compute inside, ~1–4 ms here); pulls, pushes, queue and group reduce come on top',
        groups: GROUPS.map((g) => ({ name: g.name, as_in_the_article: g.article, workers: g.size, speed: g.speed, step_ms: round(REFERENCE_STEP_MS / g.speed, 1), sync_mode: g.sync_mode })),
        sync_steps: 'hps: fast 4, medium 6 (the article); hps_sync_steps_1: 1 and 1',
      },
      servers: SERVERS.length,
      nats: 'a fresh local 3-node cluster per run (routes, JetStream), every node its own process',
      model: 'ctr (Wide & Deep): embedding 8, sum pooling, tower [32, 16], wide part; adam 0.002 dense, adagrad 0.05 rows; hps: max_staleness 32 (the default), staleness_tolerance auto (pushes staler than the recent median at lr·(1+t)/(1+s))',
      data: { source: 'ctr-synthetic', samples: SAMPLES, epochs: 1, test_samples: TEST_SAMPLES, vocab_per_slot: VOCAB_PER_SLOT, batch_size: BATCH },
      evaluation: { every_s: EVAL_EVERY_S, subset: EVAL_SAMPLES, note: 'curves: the first EVAL_SAMPLES test samples, evaluated by the driver against the shards while training runs (one thread); final_auc / final_loss: the whole test split after training' },
      samples_per_s: 'acknowledged samples / (first worker step → last acknowledgement)',
      utilisation: 'emulated step time / training window per worker (busy_from: telemetry = the workers\' emulated_step_ms)',
      cpu_busy_fraction: 'CPU seconds of the job\'s processes (workers, shards, nats-servers, driver) over the training windows of the runs / (window × cores)',
      solo: SOLO ? `one worker alone per speed class, asp, ~${SOLO_SECONDS} s of steps, same servers and NATS` : null,
      quick: QUICK,
      runs: RUNS.map((r) => r.key),
      node: process.version,
      date: new Date().toISOString(),
    },
  };
  writeFileSync(join(outDir, 'hetero.json'), `${JSON.stringify(out, null, 2)}\n`);
  writeFileSync(join(outDir, 'hetero.svg'), await chart(results, TARGET_LOSS));
  const table = RUNS.map((run) => {
    const r = results[run.key]!;
    return `${run.key.padEnd(17)} ${String(r.samples_per_s).padStart(6)} samples/s  util ${(r.utilisation.mean * 100).toFixed(0).padStart(3)}%  `
      + `to target ${r.time_to_target_s === null ? '   -  ' : `${r.time_to_target_s.toFixed(1)} s`}  AUC ${r.final_auc}  loss ${r.final_loss}  `
      + `train ${r.train_s} s  cpu ${r.cpu_busy_fraction} (machine ${r.machine_busy_fraction})`;
  }).join('\n');
  process.stderr.write(`\n${table}\nideal ${Math.round(ideal.value)} samples/s (${ideal.from}; nominal ${Math.round(IDEAL)}); hps/bsp ${out.hps_over_bsp}; hps/ideal ${out.hps_over_ideal}; hps/nominal ${out.hps_over_nominal}`
    + `${reachedByAll ? '' : `\nWARNING: not every run reached the target loss ${TARGET_LOSS}`}\n`
    + `results: ${join(outDir, 'hetero.json')}, ${join(outDir, 'hetero.svg')}${full ? '' : ` (runs in ${dir})`}\n`);
}

await main();
