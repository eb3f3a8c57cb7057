/**
 * The headline benchmark, version 2: hps against the peers a careful user
 * would pick instead, on an emulated heterogeneous cluster whose links differ
 * as much as its devices.
 *
 * The cluster (every node its own process, a fresh local 3-node NATS cluster
 * per run, 2 shard processes):
 *
 * | class  | workers | emulated speed | step (ms) | emulated link |
 * |--------|---------|----------------|-----------|---------------|
 * | fast   | 4       | 1.0            | 500       | 20 Mbit/s     |
 * | medium | 4       | 0.6            | 833       | 6 Mbit/s      |
 * | slow   | 2       | 0.2            | 2500      | 2.5 Mbit/s    |
 *
 * Scaled to fit one 2-core machine. A cluster of this shape at full scale —
 * 100 ms steps, links of 1000 / 300 / 125 Mbit/s, a dense tower of ~4 MB —
 * moves more bytes per second than this machine's processes can (measured
 * while choosing: a 2 MB tower at 200 ms steps ran at 1 000 samples/s with
 * the CPUs 95 % busy and every emulated node behind its step time). So time
 * runs 5× slower (500 ms steps) and bytes are 10× fewer (a 0.4 MB tower),
 * and the links are 50× slower, which keeps each class's ratio of transfer
 * time to step time that of the full-scale cluster (a fast node: ~0.4 MB of
 * dense parameters and rows each way at 20 Mbit/s ≈ 200 ms against a 500 ms
 * step). The CPUs then stay below ~70 % busy (`cpu_busy_fraction` per run).
 *
 * Emulation (actors/worker/emulation.ts): a step graph takes
 * `reference_step_ms / speed` with the real compute inside it. Links: where
 * the network lab can run (root, iproute2), every worker runs in its own
 * network namespace on a veth link held to its class's rate by `tc tbf` both
 * ways (`emulate.link: tc`, hetps up and deploy/netlab.ts), so every byte it
 * sends or receives crosses a real limit; the shards and the NATS servers
 * are on the host. Elsewhere (or `--links hold`) each pull reply, push and
 * intra-group slice of a node is held for bytes·8 / its link's bandwidth,
 * queued behind the node's other transfers (`emulate.link: hold`). The
 * protocol runs up to the sixth (hetero.json until 0518214) held; the
 * results record which (`setup.link_emulation`).
 *
 * The peers, on the same data, model, optimizer, sample budget and seed:
 *
 * | peer       | what it is |
 * |------------|------------|
 * | bsp_all    | bsp on every node |
 * | bsp_fast   | bsp on the nodes a synchronous-PS user keeps: fast + medium |
 * | asp        | asp on every node |
 * | hps_config | hps, the article's groups as configured: fast sync 4, medium sync 6, slow async |
 * | hps_auto   | hps, groups measured from the workers' profiles at start (`cluster.worker_nodes`) |
 *
 * Every peer sends its gradients (pushes, hps group slices) as fp16
 * (`communication.compression: fp16`, scaled halves; pull replies stay
 * float32): in side-by-side runs it raised hps_config's and bsp_fast's
 * samples/s by about a fifth each at the same final AUC, so it is every
 * peer's best honest configuration. Runs before it (hetero.json up to
 * 2d66964) sent float32, and their emulated links charged an hps window's
 * push only its first step's bytes (`pushBytes` ignored `later_steps`),
 * which made hps' pushes look up to sync_steps× cheaper than they are.
 *
 * Every peer starts with hetps up's start barrier (`cluster.start_barrier_seconds`,
 * on by default since this protocol's seventh run: the job starts once every
 * worker has joined, so nobody trains while the others still load and measure
 * themselves). The hps peers run 4 shards on the 2 servers
 * (`cluster.shards_per_server: 2`, so every member of a 4-member sync group
 * reduces and pushes one shard over its own link); bsp and asp keep 1 per
 * server, which was no slower for them side by side (hetero-explore.json,
 * block 6).
 *
 * hps runs with hetps' defaults, local updates inside a window included
 * (`training.local_updates`: each member steps its own copy between the
 * window's steps; actors/worker/local-updates.ts). asp and hps also run with
 * tail dispatch, on by default since 399302a (`training.tail_dispatch`: near
 * the end a worker leaves the last batches to faster ones;
 * actors/worker/tail-gate.ts); `--hps-training "tail_dispatch: false"` turns
 * it off for the hps peers.
 *
 * Protocol, per workload (fixed before any run):
 * 1. Learning rates: every peer runs the grid ×{0.5, 1, 2} of the base rates
 *    (dense and sparse together) once, at the full sample budget; hps_config
 *    also with each group learning-rate rule (`training.group_lr_scaling`
 *    none and sqrt). The choice: the lowest loss of the final model on a
 *    validation set — the samples right after the test split
 *    (`data.test_offset`), so the test split is never used to choose.
 *    hps_auto uses hps_config's rule.
 *    (Until the fifth protocol run the grid ran at half the budget and chose
 *    by the training loss of the last 10 % of batches. Side-by-side runs at
 *    the full budget showed that choice favouring rates too high for a full
 *    run: ×0.5 beat the chosen ×1 or ×2 on final test loss for bsp_fast,
 *    asp and hps_config alike — bench/results/hetero-lr-full-budget.json.)
 * 2. bsp_fast runs 3 times at its chosen rate; the target loss is the median
 *    over those runs of the test loss (evaluation subset) it reaches at 80 %
 *    of its samples (linear between evaluations).
 * 3. Every other peer runs 3 times at its chosen rate.
 * 4. Per peer: median and range of samples/s, time to target (from each
 *    run's first step: the summary's `first_step_s`), final AUC (ctr) or
 *    accuracy (mlp) and final test loss on the whole test split.
 *
 * Workloads: `ctr` (synthetic CTR data, Wide & Deep, embedding 32, tower
 * [256, 128]: 0.4 MB of dense parameters; 49 152 samples, one epoch) and
 * `mlp` (the dense 1024-d mlp, tower [128, 64]: 0.56 MB, where every step
 * moves every parameter and stale gradients hurt).
 *
 * Goals (hps = the better of hps_config and hps_auto on each measure; peers
 * = bsp_all, bsp_fast, asp; on the ctr workload):
 * - time to target ≤ 0.8 × the best peer's;
 * - final AUC ≥ the best peer's − 0.002;
 * - samples/s ≥ 1.65 × bsp_fast and ≥ 0.85 × the nominal ideal
 *   (Σ batch_size / step time over every node, no communication);
 * - hps_auto's samples/s within 5 % of hps_config's.
 *
 *   npm run bench:hetero     → bench/results/hetero.json, hetero.svg, hetero-mlp.svg
 *   options: --workloads ctr,mlp  --peers a,b  --repeats N  --no-grid  --samples N  --quick  --out DIR
 *            --links tc|hold (tc: the default where the network lab runs; hold elsewhere; --links hold where it runs is not the protocol)
 *            --reference-ms N  --ctr-hidden a,b  --mlp-hidden a,b  --hps-training "key: value; …"  --training "key: value; …" (every peer)  --optimizer "key: value; …" (every peer's dense optimizer)
 *            --sync-steps F,M (hps_config's fast and medium sync_steps instead of 4,6)  --sync-mode accumulation (those groups as accumulation groups)
 *            --lr-mult X  --group-lr none|sqrt (with --no-grid)  --compression none|adaptive (every peer float32, or adaptive, instead of the protocol's fp16)  --compression-threshold X (with adaptive)  --compress-pulls false (float32 pulls)  --servers N (instead of 2)  --shards-per-server K (instead of 1) (to explore; results then go to a temp dir)
 *            --collect DIR: aggregate the runs an earlier invocation left in DIR (e.g. one stopped after a workload)
 *            --rescore FILE: recompute the statistics and goals of a results file from the runs it records
 */
import { spawn } from 'node:child_process';
import { createWriteStream, mkdirSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { lineChartSvg } from './chart.ts';
import { gitCommit, natsServerVersion } from './chaos.ts';
import { NetLab } from '../deploy/netlab.ts';
import { median, round, stat, targetStat } from './stats.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const BIN = join(ROOT, 'bin', 'hetps.mjs');
const RESULTS = fileURLToPath(new URL('./results/', import.meta.url));

const args = process.argv.slice(2);
const flag = (name: string) => args.includes(name);
const option = (name: string): string | null => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] ?? null : null; };
const QUICK = flag('--quick');
const GRID = !flag('--no-grid');
const REPEATS = Number(option('--repeats') ?? (QUICK ? 1 : 3));
const say = (s: string) => process.stderr.write(`[hetero] ${s}\n`);

// ---------------------------------------------------------------- the emulated cluster

const REFERENCE_STEP_MS = Number(option('--reference-ms') ?? 500);
const BATCH = 256;
/** To explore: the sync_steps of hps_config's fast and medium groups instead of the article's 4 and 6 (`--sync-steps 1,1`: the groups sync every step). */
const SYNC_STEPS = (option('--sync-steps') ?? '4,6').split(',').map(Number);
if (SYNC_STEPS.length !== 2 || !SYNC_STEPS.every((n) => Number.isInteger(n) && n >= 1)) throw new Error(`--sync-steps: two integers ≥ 1 (fast,medium), got ${option('--sync-steps')}`);
/**
 * To explore: `--sync-mode accumulation` makes hps_config's fast and medium groups `accumulation`
 * groups with accumulation_steps = the sync steps above (one update on the union of a round's batches
 * instead of one per step).
 */
const SYNC_MODE = option('--sync-mode') ?? 'sync';
if (SYNC_MODE !== 'sync' && SYNC_MODE !== 'accumulation') throw new Error(`--sync-mode: sync or accumulation, got ${SYNC_MODE}`);
const CLASSES = [
  { name: 'fast', size: 4, speed: 1.0, mbps: 20, sync_mode: SYNC_MODE as string, sync_steps: SYNC_STEPS[0]! as number | null },
  { name: 'medium', size: 4, speed: 0.6, mbps: 6, sync_mode: SYNC_MODE as string, sync_steps: SYNC_STEPS[1]! as number | null },
  { name: 'slow', size: 2, speed: 0.2, mbps: 2.5, sync_mode: 'async', sync_steps: null as number | null },
] as const;
/** The YAML key of a sync class's step count: `accumulation_steps` for accumulation groups, else `sync_steps`. */
const stepsKey = (c: (typeof CLASSES)[number]): string => (c.sync_mode === 'accumulation' ? 'accumulation_steps' : 'sync_steps');
/** The protocol's two server nodes; `--servers N` explores another count (the reference article's cluster has 3). */
const SERVERS = Array.from({ length: Number(option('--servers') ?? 2) }, (_, i) => `server-${i + 1}`);
/**
 * cluster.shards_per_server, each peer at its better one from side-by-side runs on tc links
 * (bench/results/hetero-explore.json, block 6): the hps peers 2 — 4 shards, so every member of a
 * 4-member sync group reduces and pushes one (shard i goes to member i mod M; with 2 shards two
 * members' links carry the group's whole push while the other two push nothing) — and bsp / asp 1,
 * for whom 2 was no faster. `--shards-per-server K` sets K for every peer (to explore).
 */
const SHARDS_PER_SERVER_OPTION = option('--shards-per-server');
const shardsPerServer = (peer: string): number => SHARDS_PER_SERVER_OPTION !== null ? Number(SHARDS_PER_SERVER_OPTION) : peer.startsWith('hps') ? 2 : 1;
const WORKERS = CLASSES.flatMap((c) => Array.from({ length: c.size }, (_, i) => ({ name: `${c.name}-${i + 1}`, cls: c })));
const stepMs = (speed: number) => REFERENCE_STEP_MS / speed;
/** The nominal, communication-free ideal: Σ batch_size / step time over every node. */
const NOMINAL_IDEAL = WORKERS.reduce((s, w) => s + (BATCH * 1000) / stepMs(w.cls.speed), 0);
const LR_GRID = [0.5, 1, 2];
/** To explore: the training settings hps peers get on top of the protocol's (`--hps-training "local_updates: false"`, YAML lines joined by ';'). */
const HPS_TRAINING = option('--hps-training')?.split(';').map((l) => l.trim()).filter((l) => l.length > 0) ?? [];
/** To explore: training settings every peer gets (`--training "tail_dispatch: false"`). */
const ALL_TRAINING = option('--training')?.split(';').map((l) => l.trim()).filter((l) => l.length > 0) ?? [];
/** To explore: dense-optimizer settings every peer gets (`--optimizer "beta1: 0.5"`). */
const ALL_OPTIMIZER = option('--optimizer')?.split(';').map((l) => l.trim()).filter((l) => l.length > 0) ?? [];
/** To explore with --no-grid: the learning-rate multiplier and the hps group rule instead of ×1 and none. */
const NO_GRID_LR = Number(option('--lr-mult') ?? 1);
const NO_GRID_RULE = (option('--group-lr') ?? 'none') as 'none' | 'sqrt';
/**
 * communication.compression of every peer: the protocol's fp16 (gradients
 * as halves: it helped every peer in side-by-side runs at no measurable
 * accuracy cost, so each peer gets it as its best honest configuration);
 * `--compression none` explores float32, `--compression adaptive` the
 * default switch by link utilisation (results then go to a temp dir).
 */
const COMPRESSION = option('--compression') ?? 'fp16';
/**
 * communication.compress_pulls of every peer: the protocol's true (training
 * pulls as scaled halves too: asp +21 %, hps_config +6 % samples/s side by
 * side, final AUC within the runs' spread; hetero-explore.json block 12), so
 * each peer gets it as part of its best honest configuration, as with fp16
 * gradients; `--compress-pulls false` explores float32 pulls (the protocol up
 * to its tenth run).
 */
const COMPRESS_PULLS = option('--compress-pulls') ?? 'true';
if (COMPRESS_PULLS !== 'true' && COMPRESS_PULLS !== 'false') throw new Error(`--compress-pulls: true or false, got ${COMPRESS_PULLS}`);
/**
 * How the links are limited: `tc` (the default where the network lab can run:
 * root and iproute2) puts every worker in its own namespace behind a tc tbf
 * limit at its class's rate; `hold` (elsewhere, or `--links hold`) has each
 * worker hold its transfers for bytes·8 / bandwidth.
 */
const LINKS_OPTION = option('--links');
if (LINKS_OPTION !== null && LINKS_OPTION !== 'tc' && LINKS_OPTION !== 'hold') throw new Error(`--links: tc or hold, got ${LINKS_OPTION}`);
const LAB = LINKS_OPTION === 'hold' ? null : await NetLab.available();
if (LINKS_OPTION === 'tc' && LAB !== null && !LAB.ok) throw new Error(`--links tc: the network lab cannot run here: ${LAB.reason}`);
const LINKS: 'tc' | 'hold' = LINKS_OPTION === 'hold' || !LAB?.ok ? 'hold' : 'tc';
const LINKS_WHY = LINKS_OPTION !== null ? ` (--links ${LINKS_OPTION})` : LINKS === 'tc' ? ' (the network lab runs here)' : ` (the network lab cannot run here: ${LAB !== null && !LAB.ok ? LAB.reason : ''})`;
if (!['none', 'fp16', 'adaptive'].includes(COMPRESSION)) throw new Error(`--compression: none, fp16 or adaptive, got ${COMPRESSION}`);
/** With --compression adaptive: communication.compression_threshold (default hetps' 0.5). */
const COMPRESSION_THRESHOLD = option('--compression-threshold');
if (COMPRESSION_THRESHOLD !== null && COMPRESSION !== 'adaptive') throw new Error('--compression-threshold needs --compression adaptive');
const EVAL_EVERY_S = 2;
const EVAL_SAMPLES = 4096;

type PeerKey = 'bsp_all' | 'bsp_fast' | 'asp' | 'hps_config' | 'hps_auto';
type Rule = 'none' | 'sqrt';
const PEERS: { key: PeerKey; label: string; color: string }[] = [
  { key: 'bsp_all', label: 'bsp, every node', color: '#d62728' },
  { key: 'bsp_fast', label: 'bsp, fast + medium', color: '#ff7f0e' },
  { key: 'asp', label: 'asp', color: '#1f77b4' },
  { key: 'hps_config', label: 'hps, groups configured', color: '#2ca02c' },
  { key: 'hps_auto', label: 'hps, groups measured', color: '#9467bd' },
];
const PEER_KEYS = (option('--peers')?.split(',') ?? PEERS.map((p) => p.key)) as PeerKey[];
for (const k of PEER_KEYS) if (!PEERS.some((p) => p.key === k)) throw new Error(`--peers: unknown peer ${k} (${PEERS.map((p) => p.key).join(', ')})`);

interface Workload {
  key: 'ctr' | 'mlp';
  what: string;
  samples: number;
  testSamples: number;
  /** Samples of the validation set the grid scores (right after the test split: `data.test_offset`). */
  validationSamples: number;
  model: string;
  /** `held`: the data lines of the held-out set (test_samples, test_offset). */
  data: (samples: number, held: string) => string;
  optimizer: (mult: number) => string;
  /** Bytes of the dense parameters (what a pull or push of them moves). */
  denseBytes: number;
  /** Bytes of embedding rows one batch pulls (and pushes) at most. */
  rowBytesPerBatch: number;
}
const CTR_SLOTS = 8;
const CTR_DENSE_FEATURES = 4;
const CTR_DIM = 32;
const CTR_HIDDEN = (option('--ctr-hidden') ?? '256,128').split(',').map(Number);
const MLP_INPUT = 1024;
const MLP_HIDDEN = (option('--mlp-hidden') ?? '128,64').split(',').map(Number);
const MLP_CLASSES = 10;
const towerParams = (widths: number[]) => widths.slice(1).reduce((n, w, i) => n + widths[i]! * w + w, 0);
const SAMPLES_OVERRIDE = option('--samples') !== null ? Number(option('--samples')) : null;
const WORKLOADS: Workload[] = [
  {
    key: 'ctr', what: `synthetic CTR (${CTR_SLOTS} slots × 20 000 ids, Zipf 1.1), Wide & Deep: embedding ${CTR_DIM}, sum pooling, tower [${CTR_HIDDEN.join(', ')}], wide part; adam 0.002 (dense) and adagrad 0.05 (rows) × the grid`,
    samples: SAMPLES_OVERRIDE ?? (QUICK ? 25_600 : 49_152), testSamples: 20_000, validationSamples: 10_000,
    model: `  type: ctr\n  ctr: { embedding_dim: ${CTR_DIM}, hidden: [${CTR_HIDDEN.join(', ')}], pooling: sum, wide: true }`,
    data: (n, held) => `  source: ctr-synthetic\n  batch_size: ${BATCH}\n  epochs: 1\n  samples: ${n}\n${held}\n  vocab_size: 20000\n  slots: ${CTR_SLOTS}\n  dense_features: ${CTR_DENSE_FEATURES}`,
    optimizer: (m) => `  type: adam\n  learning_rate: ${+(0.002 * m).toFixed(6)}\n  sparse: { type: adagrad, learning_rate: ${+(0.05 * m).toFixed(6)} }`,
    denseBytes: 4 * (towerParams([CTR_SLOTS * CTR_DIM + CTR_DENSE_FEATURES, ...CTR_HIDDEN, 1])),
    rowBytesPerBatch: 4 * BATCH * CTR_SLOTS * (CTR_DIM + 1),
  },
  {
    key: 'mlp', what: `synthetic dense classification (${MLP_INPUT} features, ${MLP_CLASSES} classes), mlp [${MLP_HIDDEN.join(', ')}]; adam 0.002 × the grid`,
    samples: SAMPLES_OVERRIDE ?? (QUICK ? 25_600 : 49_152), testSamples: 5_000, validationSamples: 5_000,
    model: `  type: mlp\n  mlp: { input_dim: ${MLP_INPUT}, hidden: [${MLP_HIDDEN.join(', ')}], classes: ${MLP_CLASSES} }`,
    data: (n, held) => `  source: mlp-synthetic\n  batch_size: ${BATCH}\n  epochs: 1\n  samples: ${n}\n${held}`,
    optimizer: (m) => `  type: adam\n  learning_rate: ${+(0.002 * m).toFixed(6)}`,
    denseBytes: 4 * towerParams([MLP_INPUT, ...MLP_HIDDEN, MLP_CLASSES]),
    rowBytesPerBatch: 0,
  },
];
const WORKLOAD_KEYS = option('--workloads')?.split(',') ?? WORKLOADS.map((w) => w.key);

/**
 * The held-out set a run scores: the test split, or (the grid) the
 * validation set — as many samples right after the test split
 * (`data.test_offset`), so tuning never looks at the test split.
 */
function heldOut(w: Workload, set: 'test' | 'validation'): string {
  return set === 'test' ? `  test_samples: ${w.testSamples}` : `  test_samples: ${w.validationSamples}\n  test_offset: ${w.testSamples}`;
}

function jobYaml(peer: PeerKey, w: Workload, lrMult: number, rule: Rule, samples: number, runDir: string, set: 'test' | 'validation' = 'test'): string {
  const mode = peer.startsWith('bsp') ? 'bsp' : peer === 'asp' ? 'asp' : 'hps';
  const classes: readonly (typeof CLASSES)[number][] = peer === 'bsp_fast' ? CLASSES.filter((c) => c.name !== 'slow') : CLASSES;
  const workers = WORKERS.filter((x) => classes.includes(x.cls));
  const cluster = peer === 'hps_auto'
    ? `  worker_nodes: [${workers.map((x) => x.name).join(', ')}]\n  grouping: { sync_steps: ${CLASSES[0].sync_steps} }`
    : `  worker_groups:\n${classes.map((c) => [
      `    - name: ${c.name}`,
      `      nodes: [${workers.filter((x) => x.cls === c).map((x) => x.name).join(', ')}]`,
      `      sync_mode: ${c.sync_mode}`,
      ...(c.sync_steps !== null ? [`      ${stepsKey(c)}: ${c.sync_steps}`] : []),
    ].join('\n')).join('\n')}`;
  return `# generated by bench/hetero.bench.ts (${peer}, lr ×${lrMult}${mode === 'hps' ? `, group_lr_scaling ${rule}` : ''})
job: { name: hetero-${peer.replace(/_/g, '-')}, run_dir: ${JSON.stringify(runDir)} }
cluster:
${cluster}
  server_nodes: [${SERVERS.join(', ')}]
  shards_per_server: ${shardsPerServer(peer)}
nodes:
${workers.map((x) => `  ${x.name}: { emulate: { speed: ${x.cls.speed}, bandwidth_mbps: ${x.cls.mbps}, link: ${LINKS} } }`).join('\n')}
model:
${w.model}
data:
${w.data(samples, heldOut(w, set))}
optimizer:
${w.optimizer(lrMult)}
${ALL_OPTIMIZER.map((l) => `  ${l}\n`).join('')}training:
  mode: ${mode}
  random_seed: 42
  emulation_reference_step_ms: ${REFERENCE_STEP_MS}
${mode === 'hps' ? `  group_lr_scaling: ${rule}\n${HPS_TRAINING.map((l) => `  ${l}\n`).join('')}` : ''}${ALL_TRAINING.map((l) => `  ${l}\n`).join('')}communication:
  compression: ${COMPRESSION}
${COMPRESSION_THRESHOLD !== null ? `  compression_threshold: ${COMPRESSION_THRESHOLD}\n` : ''}  compress_pulls: ${COMPRESS_PULLS}
fault_tolerance:
  worker_recovery_timeout: 120
logging:
  level: warn
`;
}

// ---------------------------------------------------------------- one run

interface CurvePoint { t_s: number; samples: number; test_loss: number; test_auc: number | null; test_accuracy?: number | null }
interface UpSummary {
  samples: number; samples_per_s: number; train_s: number; wall_s: number; first_step_s: number | null;
  test_auc: number | null; test_logloss: number; test_accuracy?: number; final_train_loss: number | null;
  batches: number; batches_acked: number; duplicate_acks: number; curve: CurvePoint[];
  cpu: { cpu_busy_fraction: number; machine_busy_fraction: number | null } | null;
  grouping?: { groups: { name: string; nodes: string[]; sync_mode: string; sync_steps: number | null }[] } | null;
  integrity?: { applied: number; dropped_stale: number } | null;
  staleness?: { count: number; mean: number; max: number; refused: number; scaled: number; dense_dropped?: number; sparse_dropped?: number } | null;
}

/** `--collect DIR`: the runs of an earlier invocation, read back from its directory instead of run again (same protocol, same order). */
const COLLECT = option('--collect');

let runCounter = 0;
async function hetpsUp(tag: string, yaml: string, dir: string): Promise<UpSummary> {
  if (COLLECT !== null) {
    const file = readdirSync(COLLECT).find((f) => f.endsWith(`-${tag}-summary.json`));
    if (file === undefined) throw new Error(`--collect ${COLLECT}: run ${tag} is not there (the invocation stopped before it)`);
    const head = readFileSync(join(COLLECT, file.replace(/-summary\.json$/, '.yaml')), 'utf8').split('\n')[0];
    if (head !== yaml.split('\n')[0]) throw new Error(`--collect: ${file} was run as "${head}", not "${yaml.split('\n')[0]}"`);
    return JSON.parse(readFileSync(join(COLLECT, file), 'utf8')) as UpSummary;
  }
  const n = ++runCounter;
  const cfg = join(dir, `${n}-${tag}.yaml`);
  writeFileSync(cfg, yaml);
  const summaryFile = join(dir, `${n}-${tag}-summary.json`);
  const logFile = join(dir, `${n}-${tag}.log`);
  const log = createWriteStream(logFile);
  say(`run ${n}: ${tag}`);
  const t0 = Date.now();
  const child = spawn(process.execPath, [BIN, 'up', '--config', cfg, '--summary', summaryFile, '--eval-every', String(EVAL_EVERY_S), '--eval-samples', String(EVAL_SAMPLES)], {
    cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, HETPS_LOG_LEVEL: process.env.HETPS_LOG_LEVEL ?? 'warn' },
  });
  for (const stream of [child.stdout!, child.stderr!]) createInterface({ input: stream }).on('line', (l) => log.write(`${l}\n`));
  const code = await new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  await new Promise<void>((r) => log.end(() => r()));
  if (code !== 0) throw new Error(`hetps up (${tag}) exited with ${code}; log: ${logFile}`);
  const s = JSON.parse(readFileSync(summaryFile, 'utf8')) as UpSummary;
  say(`run ${n}: ${tag}: ${Math.round(s.samples_per_s)} samples/s, test loss ${s.test_logloss.toFixed(4)}, train loss ${s.final_train_loss?.toFixed(4)}, ${((Date.now() - t0) / 1000).toFixed(0)} s`);
  return s;
}

/** First time (s on the curve's axis) the curve is at or below `target`, linear between evaluations; null if never. */
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

/** The test loss the curve has after `samples` acknowledged samples, linear between evaluations. */
export function lossAtSamples(curve: readonly CurvePoint[], samples: number): number | null {
  for (let i = 1; i < curve.length; i++) {
    const q = curve[i - 1]!; const p = curve[i]!;
    if (p.samples < samples) continue;
    if (p.samples === q.samples) return p.test_loss;
    const f = (samples - q.samples) / (p.samples - q.samples);
    return q.test_loss + f * (p.test_loss - q.test_loss);
  }
  return null;
}

const roundOrNull = (x: number | null | undefined, digits: number) => (x === null || x === undefined || !Number.isFinite(x) ? null : round(x, digits));

interface RunRecord {
  lr_mult: number; rule: Rule | null; samples_per_s: number; train_s: number; first_step_s: number | null;
  final_auc: number | null; final_accuracy: number | null; final_loss: number; final_train_loss: number | null;
  time_to_target_s: number | null; batches_acked: number; batches: number; duplicate_acks: number;
  cpu_busy_fraction: number | null; machine_busy_fraction: number | null;
  groups: { name: string; nodes: string[]; sync_mode: string; sync_steps: number | null }[] | null;
  /** Batches whose update the shards applied, and those refused as too stale (acknowledged, counted in samples/s, not learned from). */
  batches_applied: number | null; batches_dropped_stale: number | null;
  /** The shards' pushes (one per shard a push reached): how many, refused, and applied without their dense part or their rows. */
  stale_pushes: { count: number; mean: number; max: number; refused: number; dense_dropped: number; sparse_dropped: number } | null;
  curve: CurvePoint[];
}

function record(s: UpSummary, lrMult: number, rule: Rule | null): RunRecord {
  return {
    lr_mult: lrMult, rule, samples_per_s: Math.round(s.samples_per_s), train_s: round(s.train_s, 1), first_step_s: roundOrNull(s.first_step_s, 2),
    final_auc: roundOrNull(s.test_auc, 4), final_accuracy: roundOrNull(s.test_accuracy, 4), final_loss: round(s.test_logloss, 4),
    final_train_loss: roundOrNull(s.final_train_loss, 4), time_to_target_s: null,
    batches_acked: s.batches_acked, batches: s.batches, duplicate_acks: s.duplicate_acks,
    cpu_busy_fraction: roundOrNull(s.cpu?.cpu_busy_fraction, 3), machine_busy_fraction: roundOrNull(s.cpu?.machine_busy_fraction, 3),
    groups: s.grouping?.groups.map((g) => ({ name: g.name, nodes: g.nodes, sync_mode: g.sync_mode, sync_steps: g.sync_steps })) ?? null,
    batches_applied: s.integrity?.applied ?? null, batches_dropped_stale: s.integrity?.dropped_stale ?? null,
    stale_pushes: s.staleness ? {
      count: s.staleness.count, mean: round(s.staleness.mean, 2), max: s.staleness.max, refused: s.staleness.refused,
      dense_dropped: s.staleness.dense_dropped ?? 0, sparse_dropped: s.staleness.sparse_dropped ?? 0,
    } : null,
    curve: s.curve.map((p) => ({ t_s: round(p.t_s, 2), samples: p.samples, test_loss: round(p.test_loss, 5), test_auc: roundOrNull(p.test_auc, 5), test_accuracy: roundOrNull(p.test_accuracy, 5) })),
  };
}

/** Time to target counted from the run's first step (the curve's axis starts at the first worker loop). */
function timeFromFirstStep(r: RunRecord, target: number): number | null {
  const t = timeToTarget(r.curve, target);
  return t === null ? null : round(Math.max(0, t - (r.first_step_s ?? 0)), 2);
}

// ---------------------------------------------------------------- one workload

async function runWorkload(w: Workload, dir: string) {
  const grid: Record<string, { lr_mult: number; rule: Rule | null; validation_loss: number; validation_auc: number | null; validation_accuracy: number | null; final_train_loss: number | null; samples_per_s: number }[]> = {};
  const chosen: Record<string, { lr_mult: number; rule: Rule | null }> = {};
  // The whole budget: a rate chosen at half of it favoured higher rates than serve the full run best (see the header).
  const gridSamples = w.samples;
  const hps = (p: PeerKey) => p.startsWith('hps');
  // 1. The learning-rate grid (hps_config also over the group rule), at the full budget, scored on the validation set.
  const order: PeerKey[] = ['bsp_fast', 'bsp_all', 'asp', 'hps_config', 'hps_auto'].filter((p) => PEER_KEYS.includes(p as PeerKey)) as PeerKey[];
  for (const peer of order) {
    const rules: (Rule | null)[] = peer === 'hps_config' ? ['none', 'sqrt'] : peer === 'hps_auto' ? [chosen.hps_config?.rule ?? 'none'] : [null];
    if (!GRID) { chosen[peer] = { lr_mult: NO_GRID_LR, rule: hps(peer) ? (option('--group-lr') !== null ? NO_GRID_RULE : rules[0] ?? 'none') : null }; continue; }
    const tried: (typeof grid)[string] = [];
    for (const rule of rules) {
      for (const m of LR_GRID) {
        const s = await hetpsUp(`${w.key}-grid-${peer}-lr${m}${rule ? `-${rule}` : ''}`, jobYaml(peer, w, m, rule ?? 'none', gridSamples, join(dir, 'runs'), 'validation'), dir);
        // The run's held-out scores are of the validation set (its test_offset skips the test split).
        tried.push({
          lr_mult: m, rule, validation_loss: round(s.test_logloss, 4), validation_auc: roundOrNull(s.test_auc, 4), validation_accuracy: roundOrNull(s.test_accuracy, 4),
          final_train_loss: roundOrNull(s.final_train_loss, 4), samples_per_s: Math.round(s.samples_per_s),
        });
      }
    }
    grid[peer] = tried;
    const best = [...tried].sort((a, b) => a.validation_loss - b.validation_loss)[0]!;
    chosen[peer] = { lr_mult: best.lr_mult, rule: best.rule };
    say(`${w.key}: ${peer} chooses lr ×${best.lr_mult}${best.rule ? `, group_lr_scaling ${best.rule}` : ''} (validation loss ${best.validation_loss})`);
  }
  // 2–3. The repeats: bsp_fast's first (they fix the target), then the others' in turn (machine noise spreads over every peer).
  const runs: Record<string, RunRecord[]> = Object.fromEntries(order.map((p) => [p, []]));
  const repeat = async (peer: PeerKey, k: number) => {
    const c = chosen[peer]!;
    const s = await hetpsUp(`${w.key}-${peer}-${k + 1}`, jobYaml(peer, w, c.lr_mult, c.rule ?? 'none', w.samples, join(dir, 'runs')), dir);
    runs[peer]!.push(record(s, c.lr_mult, c.rule));
  };
  const first = order.includes('bsp_fast') ? ['bsp_fast' as const] : [];
  for (const peer of first) for (let k = 0; k < REPEATS; k++) await repeat(peer, k);
  for (let k = 0; k < REPEATS; k++) for (const peer of order.filter((p) => !first.includes(p as 'bsp_fast'))) await repeat(peer, k);
  const targetFrom = runs.bsp_fast ?? runs[order[0]!]!;
  const targets = targetFrom.map((r) => lossAtSamples(r.curve, 0.8 * r.batches * BATCH)).filter((x): x is number => x !== null);
  const target = targets.length > 0 ? round(median(targets)!, 5) : null;
  for (const rs of Object.values(runs)) for (const r of rs) r.time_to_target_s = target === null ? null : timeFromFirstStep(r, target);

  const peers = Object.fromEntries(order.map((p) => {
    const rs = runs[p]!;
    const c = chosen[p]!;
    return [p, {
      samples_per_s: stat(rs.map((r) => r.samples_per_s), 0),
      time_to_target_s: targetStat(rs.map((r) => r.time_to_target_s), 2),
      final_auc: stat(rs.map((r) => r.final_auc), 4),
      final_accuracy: stat(rs.map((r) => r.final_accuracy), 4),
      final_loss: stat(rs.map((r) => r.final_loss), 4),
      applied_fraction: stat(rs.map((r) => (r.batches_applied === null || r.batches_acked === 0 ? null : r.batches_applied / r.batches_acked)), 3),
      lr: { mult: c.lr_mult, ...(w.key === 'ctr' ? { dense: +(0.002 * c.lr_mult).toFixed(6), sparse: +(0.05 * c.lr_mult).toFixed(6) } : { dense: +(0.002 * c.lr_mult).toFixed(6) }), group_lr_scaling: c.rule },
      runs: rs,
    }];
  })) as Record<PeerKey, {
    samples_per_s: ReturnType<typeof stat>; time_to_target_s: ReturnType<typeof targetStat>; final_auc: ReturnType<typeof stat>; final_accuracy: ReturnType<typeof stat>; final_loss: ReturnType<typeof stat>; applied_fraction: ReturnType<typeof stat>;
    lr: { mult: number; dense: number; sparse?: number; group_lr_scaling: Rule | null }; runs: RunRecord[];
  }>;
  return { target, targets: targets.map((t) => round(t, 5)), grid, gridSamples, peers };
}
type WorkloadResult = Awaited<ReturnType<typeof runWorkload>>;

// ---------------------------------------------------------------- goals

/** The goals of one workload, from its peers' statistics. */
function goals(p: WorkloadResult['peers'], w: Workload) {
  const present = (k: PeerKey) => p[k] !== undefined;
  const baselines = (['bsp_all', 'bsp_fast', 'asp'] as PeerKey[]).filter(present);
  const hpsPeers = (['hps_config', 'hps_auto'] as PeerKey[]).filter(present);
  const better = (vals: (number | null)[], lower: boolean) => {
    const v = vals.filter((x): x is number => x !== null);
    return v.length === 0 ? null : lower ? Math.min(...v) : Math.max(...v);
  };
  const hpsTime = better(hpsPeers.map((k) => p[k].time_to_target_s.median), true);
  const peerTime = better(baselines.map((k) => p[k].time_to_target_s.median), true);
  const quality = (k: PeerKey) => (w.key === 'ctr' ? p[k].final_auc.median : p[k].final_accuracy.median);
  const hpsQ = better(hpsPeers.map(quality), false);
  const peerQ = better(baselines.map(quality), false);
  const hpsRate = better(hpsPeers.map((k) => p[k].samples_per_s.median), false);
  const bspFast = present('bsp_fast') ? p.bsp_fast.samples_per_s.median : null;
  const ratio = (a: number | null, b: number | null) => (a !== null && b !== null && b > 0 ? round(a / b, 3) : null);
  const autoOverConfig = present('hps_auto') && present('hps_config') ? ratio(p.hps_auto.samples_per_s.median, p.hps_config.samples_per_s.median) : null;
  return {
    time_to_target: { goal: 'hps (better of hps_config, hps_auto) reaches the target in ≤ 0.8 × the best peer\'s time (medians over every run; a run that never reaches it counts as infinitely slow)', hps_s: hpsTime, best_peer_s: peerTime, ratio: ratio(hpsTime, peerTime), met: peerTime === null ? null : hpsTime !== null && hpsTime <= 0.8 * peerTime, ...(hpsTime === null && hpsPeers.length > 0 ? { note: 'the median run of neither hps peer reached the target loss' } : {}) },
    final_quality: {
      goal: w.key === 'ctr' ? 'hps final AUC ≥ the best peer\'s − 0.002 (medians)' : 'hps final accuracy ≥ the best peer\'s − 0.002 (medians; recorded, the issue sets this goal on the ctr workload)',
      hps: hpsQ, best_peer: peerQ, met: hpsQ !== null && peerQ !== null ? hpsQ >= peerQ - 0.002 : null,
    },
    over_bsp_fast: { goal: 'hps samples/s ≥ 1.65 × bsp_fast', ratio: ratio(hpsRate, bspFast), met: hpsRate !== null && bspFast !== null ? hpsRate >= 1.65 * bspFast : null },
    over_ideal: { goal: 'hps samples/s ≥ 0.85 × the nominal ideal', ratio: ratio(hpsRate, NOMINAL_IDEAL), met: hpsRate !== null ? hpsRate >= 0.85 * NOMINAL_IDEAL : null },
    auto_grouping: { goal: 'hps_auto samples/s within 5 % of hps_config', ratio: autoOverConfig, met: autoOverConfig !== null ? Math.abs(autoOverConfig - 1) <= 0.05 : null },
  };
}

// ---------------------------------------------------------------- the chart

/** Median and range over runs of the test loss, on a common time grid (time from each run's first step). */
function bandOf(rs: RunRecord[]): { line: { x: number; y: number }[]; band: { x: number; lo: number; hi: number }[] } {
  const shifted = rs.map((r) => r.curve.map((p) => ({ t: Math.max(0, p.t_s - (r.first_step_s ?? 0)), y: p.test_loss })));
  const end = Math.min(...shifted.map((c) => c.at(-1)?.t ?? 0));
  const at = (c: { t: number; y: number }[], t: number) => {
    for (let i = 1; i < c.length; i++) {
      if (c[i]!.t < t) continue;
      const a = c[i - 1]!; const b = c[i]!;
      return b.t === a.t ? b.y : a.y + ((t - a.t) / (b.t - a.t)) * (b.y - a.y);
    }
    return c.at(-1)!.y;
  };
  const line: { x: number; y: number }[] = []; const band: { x: number; lo: number; hi: number }[] = [];
  const steps = 60;
  for (let k = 0; k <= steps; k++) {
    const t = (end * k) / steps;
    const ys = shifted.map((c) => at(c, t));
    line.push({ x: round(t, 2), y: median(ys)! });
    band.push({ x: round(t, 2), lo: Math.min(...ys), hi: Math.max(...ys) });
  }
  return { line, band };
}

async function chart(r: WorkloadResult, w: Workload): Promise<string> {
  const present = PEERS.filter((p) => r.peers[p.key]);
  const series = present.map((p) => {
    const { line, band } = bandOf(r.peers[p.key].runs);
    return { name: `${p.label}: ${r.peers[p.key].samples_per_s.median?.toLocaleString('en-US')}/s`, points: line, band };
  });
  const all = series.flatMap((s) => s.points.map((p) => p.y));
  const lo = Math.min(...all, r.target ?? Infinity);
  const hi = Math.min(Math.max(...all), lo + 4 * Math.max(0.02, (r.target ?? lo) - lo));
  return lineChartSvg({
    title: `hetps, EMULATED heterogeneous cluster (${w.key}): test loss over time`,
    subtitle: [
      `10 workers emulated on one ${availableParallelism()}-core machine: 4 fast (step ${stepMs(1)} ms, ${CLASSES[0].mbps} Mbit/s),`,
      `4 medium (${Math.round(stepMs(0.6))} ms, ${CLASSES[1].mbps} Mbit/s), 2 slow (${stepMs(0.2)} ms, ${CLASSES[2].mbps} Mbit/s); 2 servers; 3-node NATS.`,
      `${w.samples.toLocaleString('en-US')} samples (batch ${BATCH}) per run; median of ${REPEATS} runs, the band is their range;`,
      'time from each run\'s first step; each peer at its own tuned learning rate.',
    ],
    xTitle: 'training time from the first step (s)',
    yTitle: `test log loss (${EVAL_SAMPLES} held-out samples)`,
    legendTitle: 'median samples/s',
    series,
    colors: present.map((p) => p.color),
    rules: r.target === null ? [] : [{ y: r.target, label: `target ${r.target.toFixed(4)} (bsp_fast at 80 % of its budget)` }],
    yDomain: [Math.floor((lo - 0.005) * 200) / 200, Math.ceil(hi * 100) / 100],
  });
}

// ---------------------------------------------------------------- main

/**
 * `--rescore FILE`: recompute the per-peer statistics and the goals of an
 * earlier results file from the runs it records (each run's time to target
 * against the file's own target), without running anything. The runs, the
 * target and the file's commit and date stay; `rescored` says when and by
 * which commit the statistics were recomputed.
 */
function rescore(file: string): void {
  const out = JSON.parse(readFileSync(file, 'utf8')) as {
    goals: unknown; peers: unknown;
    workloads: Record<string, { goals: unknown; peers: Record<string, { time_to_target_s: unknown; runs: RunRecord[] }> }>;
    rescored?: unknown;
  };
  for (const [k, wl] of Object.entries(out.workloads)) {
    const w = WORKLOADS.find((x) => x.key === k);
    if (w === undefined) throw new Error(`--rescore ${file}: workload "${k}" is not one of ${WORKLOADS.map((x) => x.key).join(', ')}`);
    for (const peer of Object.values(wl.peers)) peer.time_to_target_s = targetStat(peer.runs.map((r) => r.time_to_target_s), 2);
    wl.goals = goals(wl.peers as unknown as WorkloadResult['peers'], w);
    if (k === 'ctr') { out.goals = wl.goals; out.peers = wl.peers; }
    say(`${k}: ${JSON.stringify(wl.goals)}`);
  }
  out.rescored = { commit: gitCommit(ROOT).commit, date: new Date().toISOString(), what: 'statistics and goals recomputed from the recorded runs (--rescore); no run was repeated' };
  writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
  say(`rescored: ${file}`);
}

async function main(): Promise<void> {
  const RESCORE = option('--rescore');
  if (RESCORE !== null) return rescore(RESCORE);
  const full = !QUICK && GRID && REPEATS >= 3 && SAMPLES_OVERRIDE === null && !['--reference-ms', '--ctr-hidden', '--mlp-hidden', '--hps-training', '--training', '--lr-mult', '--group-lr', '--compression', '--compression-threshold', '--compress-pulls', '--servers', '--shards-per-server', '--optimizer', '--sync-steps', '--sync-mode'].some((o) => option(o) !== null) && LINKS_OPTION !== 'hold' && PEER_KEYS.length === PEERS.length && (WORKLOAD_KEYS.length === WORKLOADS.length || COLLECT !== null);
  // Before anything is written: the results' own files would make the tree look dirty.
  const git = gitCommit(ROOT);
  const dir = mkdtempSync(join(tmpdir(), 'hetps-bench-hetero-'));
  const outDir = option('--out') ?? (full ? RESULTS : dir);
  mkdirSync(outDir, { recursive: true });
  say(`runs and logs in ${dir}; results to ${outDir}${full ? '' : ' (not the full protocol: not written to bench/results)'}`);
  const started = Date.now();
  const results: Record<string, WorkloadResult> = {};
  for (const w of WORKLOADS.filter((x) => WORKLOAD_KEYS.includes(x.key))) {
    results[w.key] = await runWorkload(w, dir);
    writeFileSync(join(outDir, w.key === 'ctr' ? 'hetero.svg' : `hetero-${w.key}.svg`), await chart(results[w.key]!, w));
  }
  const ctr = results.ctr;
  const main = ctr ?? Object.values(results)[0]!;
  const rate = (k: PeerKey) => main.peers[k]?.samples_per_s.median ?? null;
  const ratio = (a: number | null, b: number | null) => (a !== null && b !== null && b > 0 ? round(a / b, 3) : null);
  const hpsRate = Math.max(rate('hps_config') ?? 0, rate('hps_auto') ?? 0) || null;
  const out = {
    benchmark: 'hetero',
    version: 2,
    commit: git.commit,
    dirty: git.dirty,
    runs_commit: COLLECT === null ? git.commit : option('--runs-commit'),
    date: new Date().toISOString(),
    machine: { cpu: cpus()[0]?.model ?? null, cores: availableParallelism(), memory_gib: Math.round(totalmem() / 2 ** 30), node: process.version, nats_server: natsServerVersion(), shared: 'other work may run on the same machine: see machine_busy_fraction per run' },
    emulated: true,
    ideal_samples_per_s: Math.round(NOMINAL_IDEAL),
    ideal_from: 'nominal: Σ over the 10 workers of batch_size / (reference_step_ms / speed), no communication',
    target_loss: main.target,
    target_rule: 'the median over bsp_fast\'s runs of the test loss (evaluation subset) at 80 % of its samples; time_to_target_s counts from each run\'s first step',
    hps_over_bsp: ratio(hpsRate, rate('bsp_all')),
    hps_over_bsp_fast: ratio(hpsRate, rate('bsp_fast')),
    hps_over_asp: ratio(hpsRate, rate('asp')),
    hps_over_ideal: ratio(hpsRate, NOMINAL_IDEAL),
    goals: ctr ? goals(ctr.peers, WORKLOADS[0]!) : null,
    peers: main.peers,
    workloads: Object.fromEntries(Object.entries(results).map(([k, r]) => [k, {
      what: WORKLOADS.find((w) => w.key === k)!.what,
      samples: WORKLOADS.find((w) => w.key === k)!.samples,
      target_loss: r.target, target_per_bsp_fast_run: r.targets,
      goals: goals(r.peers, WORKLOADS.find((w) => w.key === k)!),
      lr_grid: { multipliers: LR_GRID, samples: r.gridSamples, criterion: 'lowest validation_loss: the final model\'s loss on the validation set (the samples right after the test split, data.test_offset; never the test split), after the full budget', tried: r.grid },
      bytes_per_step: {
        dense_bytes: WORKLOADS.find((w) => w.key === k)!.denseBytes,
        rows_bytes_max: WORKLOADS.find((w) => w.key === k)!.rowBytesPerBatch,
        note: 'a worker step pulls the dense parameters and its batch\'s rows, and pushes their gradients: asp and bsp every step; an hps sync group pulls once per window, and the members\' slices and the owners\' pushes carry one part per step index for the whole group',
      },
      peers: r.peers,
    }])),
    setup: {
      cluster: CLASSES.map((c) => ({ class: c.name, workers: c.size, speed: c.speed, step_ms: round(stepMs(c.speed), 1), link_mbps: c.mbps, hps_config: c.sync_mode === 'async' ? 'async' : `${c.sync_mode}, ${stepsKey(c)} ${c.sync_steps}` })),
      scale: 'time 5× slower (500 ms steps), bytes 10× fewer (0.4 MB tower), links 50× slower than a full-scale cluster of this shape (100 ms steps, 1000/300/125 Mbit/s, ~4 MB tower): each class keeps its ratio of transfer time to step time; see the file\'s header',
      link_emulation: LINKS === 'tc'
        ? `emulate.link tc: every worker runs in its own network namespace on a veth link held to its class's rate by tc tbf both ways (hetps up, deploy/netlab.ts): every byte a worker sends or receives crosses it; the shards and NATS servers are on the host, unlimited${LINKS_WHY}`
        : `emulate.link hold: each pull reply, push (every step of a window's push) and group slice of a node is held for bytes·8 / bandwidth on its one link${LINKS_WHY}`,
      compression: COMPRESSION === 'fp16' ? `every peer: communication.compression fp16 (gradients in pushes and group slices as scaled halves)${COMPRESS_PULLS === 'true' ? ' and compress_pulls (training pulls as scaled halves too)' : '; pull replies float32'}`
        : COMPRESSION === 'adaptive' ? `every peer: communication.compression adaptive (fp16 while a worker's link utilisation is above ${COMPRESSION_THRESHOLD ?? 0.5})` : 'none: every gradient float32',
      servers: SERVERS.length,
      shards_per_server: Object.fromEntries(PEER_KEYS.map((p) => [p, shardsPerServer(p)])),
      nats: 'a fresh local 3-node cluster per run (routes, JetStream), every node its own process',
      reference_step_ms: REFERENCE_STEP_MS,
      batch_size: BATCH,
      repeats: REPEATS,
      evaluation: { every_s: EVAL_EVERY_S, subset: EVAL_SAMPLES, final: 'final_auc / final_accuracy / final_loss on the whole test split after training' },
      samples_per_s: 'acknowledged samples / (first worker loop → last acknowledgement)',
      applied_fraction: 'batches whose update the shards applied / batches acknowledged (hps acknowledges a batch whose push a shard refused as staler than training.max_staleness: counted in samples/s, not learned from)',
      bench_wall_s: COLLECT === null ? Math.round((Date.now() - started) / 1000) : null,
      collected_from: COLLECT === null ? null : 'the runs were made by an earlier invocation of this protocol and aggregated from its directory (--collect)',
      workloads_run: Object.keys(results),
      quick: QUICK,
    },
  };
  writeFileSync(join(outDir, 'hetero.json'), `${JSON.stringify(out, null, 2)}\n`);
  for (const [k, r] of Object.entries(results)) {
    say(`\n${k}: target ${r.target}`);
    for (const [p, v] of Object.entries(r.peers)) {
      say(`${p.padEnd(11)} ${String(v.samples_per_s.median).padStart(6)} samples/s [${v.samples_per_s.min}–${v.samples_per_s.max}]  to target ${v.time_to_target_s.median} s [${v.time_to_target_s.min}–${v.time_to_target_s.max}]  `
        + `AUC ${v.final_auc.median} acc ${v.final_accuracy.median} loss ${v.final_loss.median}  applied ${v.applied_fraction.median}  lr ×${v.lr.mult}${v.lr.group_lr_scaling ? ` ${v.lr.group_lr_scaling}` : ''}`);
    }
    say(JSON.stringify(out.workloads[k]!.goals));
  }
  say(`results: ${join(outDir, 'hetero.json')}`);
}

await main();
