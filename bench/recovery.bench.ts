/**
 * Recovery under faults: the quick start (examples/quickstart.yaml) as real
 * processes — `hetps up` with its shard and worker processes over a fresh
 * local 3-node NATS cluster per run (deploy/local-cluster.ts), given to the
 * job in `nats.servers` — with one fault injected once 30 % of the batches
 * are acknowledged (counted on `tel.batch.*` by a plain NATS client), and the
 * job left to finish. The fault harness is bench/chaos.ts.
 *
 * Scenarios (SIGKILL unless said otherwise):
 *   kill-worker-asp / -bsp / -hps   fast-1, in training.mode asp / bsp / hps
 *   kill-two-workers-one-group      fast-1 and fast-2 together (hps)
 *   kill-shard-primary              the process of server-1
 *   stop-shard-primary-10s          SIGSTOP server-1, SIGCONT 10 s later
 *   kill-primary-while-seeding      4 servers, backup_factor 2: server-1, then,
 *                                   300 ms later (or once the plan names it),
 *                                   the new primary of server-1's shard, which
 *                                   is seeding that shard's new backup; the
 *                                   shard's other backup has every
 *                                   acknowledged update and takes over
 *   kill-seeding-target-3-servers   3 servers, backup_factor 1: server-1, then
 *                                   the node seeded as the new backup of its
 *                                   shard; on a ring of 3 that node is also the
 *                                   primary of the shard whose backup was
 *                                   server-1, so that shard loses both copies
 *                                   (`shards_left_without_caught_up_replica`):
 *                                   what a double failure does to 2 copies
 *   kill-scheduler                  the `hetps up` driver (the scheduler runs
 *                                   in it); run only when the CLI accepts a
 *                                   standby scheduler, which then runs beside it
 *   kill-nats-server                the nats-server leading the batch queue
 *   partition-group-member-20s      fast-1 in a network namespace of
 *   partition-shard-primary-20s     deploy/netlab.ts, its link cut for 20 s
 *                                   (server-1 for the shard)
 * A scenario that cannot run here yet is recorded as `{ name, skipped }`.
 *
 * Recovery time (`recovery_definition` in the JSON, stated once in
 * chaos.ts): from the fault to the acknowledgement that ends the largest
 * stall after it, counting the acknowledgements of the workers the fault
 * affects — for a worker fault the surviving members of its group (bsp:
 * every worker), for a shard, NATS server or scheduler fault every worker.
 * A stall is a gap between those acknowledgements that begins within 2 s of
 * the fault and is longer than twice their largest gap in the 10 s before
 * it; with none, the fault stopped nothing beyond the normal rhythm and
 * recovery is the first acknowledgement after it. When no affected worker
 * acknowledges anything after the fault (the others finished the work
 * first) recovery is null and `stalled_until_end_s` is a lower bound. For
 * kill-scheduler recovery is the first answer to ctl.status after the fault
 * (the control plane back).
 *
 * lost / duplicated: the summary's `integrity` when it has one, else the ack
 * accounting (batches never acknowledged; acknowledgements beyond one per
 * batch). `auc_fault_free`: the median test AUC of fault-free runs of the
 * same mode. `replication_cost`: fault-free hps with
 * fault_tolerance.backup_factor 0 against 1, runs alternated, median
 * samples/s. Goals are fixed below, before any run; a scenario's `met` checks
 * every run against them (recovery: the slowest run).
 *
 *   npm run bench:recovery                       every scenario, 3 runs each → bench/results/recovery.json
 *   npm run bench:recovery -- --quick            1 run each (results in a temp file unless --out)
 *   npm run bench:recovery -- --only a,b         a subset (scenario names, or replication-cost)
 *   options: --runs N  --epochs N  --timeout S (per run, default 300)  --out FILE  --keep (keep run dirs and logs)  --list
 *
 * A run trains 6 epochs (the quick start's 2 take ~35 s with start-up on the
 * 2-core VM); with other work on the machine a run took 2–4 min. The whole
 * matrix is 9 fault-free runs, up to 36 with faults and 6 for the
 * replication cost: plan on one to three hours.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';
import { findNatsServer, startLocalCluster, type LocalCluster, type StartLocalClusterOptions } from '../deploy/local-cluster.ts';
import { Cleanup, DEFAULT_RECOVERY_OPTIONS, JobWatch, cliHelpMatches, gitCommit, loadNetLab, nodePids, now, placementOf, recoveryDefinition, recoveryFromAcks, followOutput, removeDir, signalGroup, sleep, spawnTracked, type NetLab, type Recovery, type Tracked, machineRecord } from './chaos.ts';
import { median } from './stats.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const BIN = join(ROOT, 'bin', 'hetps.mjs');
const RESULTS = fileURLToPath(new URL('./results/', import.meta.url));

// ---------------------------------------------------------------- flags

const argv = process.argv.slice(2);
const flag = (name: string) => argv.includes(name);
const option = (name: string): string | null => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] ?? null : null; };
const QUICK = flag('--quick');
const RUNS = QUICK ? 1 : Number(option('--runs') ?? 3);
/** The quick start trains 2 epochs (~13 s here); 6 leave room after a fault at 30 % for a stall of half a minute to end while work is left. */
const EPOCHS = Number(option('--epochs') ?? 6);
/** A run took up to ~250 s on the 2-core VM shared with other work. */
const RUN_TIMEOUT_MS = Number(option('--timeout') ?? 300) * 1000;
const KEEP = flag('--keep');
const FAULT_AT_FRACTION = 0.3;

// ---------------------------------------------------------------- goals (fixed before any run)

const GOALS = { worker_recovery_s: 1, shard_recovery_s: 2, scheduler_recovery_s: 5, lost: 0, duplicated: 0, auc_delta: 0.003, replication_ratio: 0.8 } as const;
type RecoveryGoal = 'worker_recovery_s' | 'shard_recovery_s' | 'scheduler_recovery_s';

// ---------------------------------------------------------------- the job

type Mode = 'asp' | 'bsp' | 'hps';
type FaultTolerance = Record<string, number | string | boolean>;

interface JobSpec {
  job: string;
  mode: Mode;
  dir: string;
  urls: string[];
  serverNodes: string[] | null;
  faultTolerance: FaultTolerance;
}

const QUICKSTART = parseYaml(readFileSync(join(ROOT, 'examples', 'quickstart.yaml'), 'utf8')) as Record<string, any>;
const GROUPS = (QUICKSTART.cluster.worker_groups as { name: string; nodes: string[] }[]).map((g) => ({ name: g.name, nodes: [...g.nodes] }));

/** The quick start with this run's name, run dir, cluster, mode, epochs and fault_tolerance. */
function jobConfig(s: JobSpec): Record<string, any> {
  const c = structuredClone(QUICKSTART);
  c.job = { ...c.job, name: s.job, run_dir: join(s.dir, 'runs') };
  c.nats = { ...c.nats, servers: s.urls };
  c.data.epochs = EPOCHS;
  c.training.mode = s.mode;
  // bsp refuses max_staleness: every step waits for every worker.
  if (s.mode === 'bsp') delete c.training.max_staleness;
  if (s.serverNodes) c.cluster.server_nodes = s.serverNodes;
  if (Object.keys(s.faultTolerance).length) c.fault_tolerance = { ...c.fault_tolerance, ...s.faultTolerance };
  return c;
}

interface Summary {
  mode: string; samples: number; samples_per_s: number; test_auc: number | null; wall_s: number;
  batches: number; batches_acked: number; duplicate_acks: number; redelivered: number; not_active: string[];
  /** The end-of-run integrity check, where the driver has one. */
  integrity?: ({ acked: number; applied: number; lost: number; duplicated: number; replicas_equal: boolean | null } & Record<string, unknown>) | null;
}

// ---------------------------------------------------------------- scenarios

class SkipScenario extends Error {
  constructor(reason: string) { super(reason); this.name = 'SkipScenario'; }
}

interface RunContext {
  job: string;
  dir: string;
  configFile: string;
  config: Record<string, any>;
  cluster: LocalCluster;
  watch: JobWatch;
  cleanup: Cleanup;
  driver: Tracked | null;
  say(line: string): void;
  /** The pid of a node process the driver started. */
  nodePid(node: string): number;
  /** A process of the run besides the driver (own process group, killed with the run). */
  spawnExtra(name: string, args: string[]): Tracked;
}

interface Injected {
  /** When the fault happened (monotonic ms). */
  at: number;
  what: string;
  /** Whose acknowledgements show recovery. */
  affected: (node: string) => boolean;
  /** Job nodes the fault took away (their dead verdicts are timed). */
  victims: string[];
  detail?: Record<string, unknown>;
  /** kill-scheduler: when the control plane answered again (monotonic ms; null: never). */
  controlBack?: Promise<number | null>;
  /** A process whose exit ends the run instead of the driver's, and the summary it writes. */
  finisher?: { proc: Tracked; summaryFile: string };
  /** Work the fault still does (a SIGCONT, a heal) that the run waits for before it ends. */
  pending?: Promise<void>;
}

interface Scenario {
  name: string;
  mode: Mode;
  goal: RecoveryGoal;
  fault: string;
  serverNodes?: string[];
  faultTolerance?: FaultTolerance;
  /** Checked once before the scenario's runs: why it cannot run here, or null. */
  available?: () => Promise<string | null>;
  clusterOptions?: Partial<StartLocalClusterOptions>;
  /** Nodes the driver does not start (the scenario starts them). */
  skipNodes?: string[];
  beforeDriver?: (ctx: RunContext) => Promise<void>;
  /** Once the job exists (its plan and batches are written); may throw SkipScenario. */
  onJob?: (ctx: RunContext) => Promise<void>;
  inject: (ctx: RunContext) => Promise<Injected>;
}

const groupOf = (node: string) => GROUPS.find((g) => g.nodes.includes(node))!;
const survivorsOf = (victims: string[]) => { const alive = groupOf(victims[0]!).nodes.filter((n) => !victims.includes(n)); return (n: string) => alive.includes(n); };
const everyWorker = () => true;

function killNodes(nodes: string[], affected: (n: string) => boolean) {
  return async (ctx: RunContext): Promise<Injected> => {
    const pids = nodes.map((n) => ctx.nodePid(n));
    const at = now();
    for (const pid of pids) process.kill(pid, 'SIGKILL');
    return { at, what: `SIGKILL ${nodes.map((n, i) => `${n} (pid ${pids[i]})`).join(', ')}`, affected, victims: nodes };
  };
}

/** `hetps launch` arguments that run `node` of this job (as the driver would, without its run id). */
function launchArgs(ctx: RunContext, node: string, urls: string[]): string[] {
  const which = ctx.config.cluster.server_nodes.includes(node)
    ? ['--role', 'server', '--server-id', node]
    : ['--role', 'worker', '--group', groupOf(node).name, '--node-rank', String(groupOf(node).nodes.indexOf(node))];
  return [BIN, 'launch', ...which, '--config', ctx.configFile, '--nats', urls.join(','), '--job', ctx.job];
}

// ---- network partitions (deploy/netlab.ts) --------------------------------------------------
// The node runs in a network namespace of the lab, reaching the cluster (listening on 0.0.0.0)
// through its link's host address; the driver skips it. The fault cuts the link for `forMs`.
function partition(node: string, forMs: number, affected: (n: string) => boolean): Pick<Scenario, 'available' | 'clusterOptions' | 'skipNodes' | 'beforeDriver' | 'inject'> {
  const labs = new WeakMap<RunContext, NetLab>();
  return {
    available: async () => { const r = await loadNetLab(ROOT); return 'skipped' in r ? r.skipped : null; },
    clusterOptions: { listenHost: '0.0.0.0' },
    skipNodes: [node],
    beforeDriver: async (ctx) => {
      const loaded = await loadNetLab(ROOT);
      if ('skipped' in loaded) throw new SkipScenario(loaded.skipped);
      const lab = await loaded.module.NetLab.create({ name: 'recovery' });
      labs.set(ctx, lab);
      ctx.cleanup.add('network lab', () => lab.dispose());
      const link = await lab.addNode(node);
      const urlsFor = (ctx.cluster as { urlsFor?: (host: string) => string[] }).urlsFor;
      const urls = urlsFor ? urlsFor.call(ctx.cluster, link.hostIp) : ctx.cluster.urls.map((u) => u.replace('127.0.0.1', link.hostIp));
      const child = await lab.spawn(node, process.execPath, launchArgs(ctx, node, urls), { cwd: ROOT, env: { ...process.env } });
      followOutput(child, join(ctx.dir, `${node}.log`));
      ctx.cleanup.add(`${node} in the lab`, () => { try { child.kill('SIGKILL'); } catch { /* gone */ } });
      ctx.say(`${node} runs in the network lab (node ${link.nodeIp}, cluster via ${link.hostIp})`);
    },
    inject: async (ctx) => {
      const lab = labs.get(ctx)!;
      const at = now();
      await lab.cut(node);
      const pending = sleep(forMs - (now() - at)).then(() => lab.heal(node)).then(() => ctx.say(`${node}'s link healed`));
      return { at, what: `cut ${node}'s link for ${forMs / 1000} s`, affected, victims: [node], pending };
    },
  };
}

// ---- kill while seeding -------------------------------------------------------------------

/** onJob: the run's plan with its replica placement is there. */
async function awaitPlacement(ctx: RunContext): Promise<void> {
  let plan = await ctx.watch.plan();
  for (let i = 0; i < 100 && plan === null; i++) { await sleep(100); plan = await ctx.watch.plan(); }
  if (placementOf(plan) === null) throw new SkipScenario('no replica placement in the plan yet');
}

/** SIGKILLs server-1 and waits for the plan that fails its shard over and seeds a new backup of it (the new primary seeds it). */
async function killServer1UntilSeeding(ctx: RunContext): Promise<{
  shard: string; at: number; pid1: number; seeding: { primary: string; node: string; version: number; seen: number; replicas: ReturnType<typeof placementOf> };
}> {
  const before = await ctx.watch.plan();
  const placement = placementOf(before);
  const shard = Object.entries(placement ?? {}).find(([, r]) => r.primary === 'server-1')?.[0];
  if (!placement || shard === undefined) throw new Error(`server-1 is the primary of no shard in plan v${before?.version}: ${JSON.stringify(before?.placement)}`);
  const pid1 = ctx.nodePid('server-1');
  const at = now();
  process.kill(pid1, 'SIGKILL');
  while (now() - at < 30_000) {
    const p = await ctx.watch.plan();
    const r = placementOf(p);
    const rs = r?.[shard];
    const node = rs?.seeding.find((n) => n !== 'server-1');
    if (p && r && rs && node && rs.primary !== 'server-1' && p.version > before!.version) return { shard, at, pid1, seeding: { primary: rs.primary, node, version: p.version, seen: now(), replicas: r } };
    await sleep(50);
  }
  throw new Error(`no plan seeded a new backup of shard ${shard} within 30 s of server-1's death`);
}

// ---- a standby scheduler (kill-scheduler) --------------------------------------------------
type Standby = 'up --standby' | 'launch --role scheduler';
let standbyKind: Standby | null | undefined;
function standby(): Standby | null {
  standbyKind ??= cliHelpMatches(ROOT, BIN, 'up', /--standby\b/) ? 'up --standby'
    : cliHelpMatches(ROOT, BIN, 'launch', /--role <role>[^\n]*scheduler/) ? 'launch --role scheduler' : null;
  return standbyKind;
}

const SCENARIOS: Scenario[] = [
  { name: 'kill-worker-asp', mode: 'asp', goal: 'worker_recovery_s', fault: 'SIGKILL fast-1', inject: killNodes(['fast-1'], survivorsOf(['fast-1'])) },
  { name: 'kill-worker-bsp', mode: 'bsp', goal: 'worker_recovery_s', fault: 'SIGKILL fast-1', inject: killNodes(['fast-1'], everyWorker) },
  { name: 'kill-worker-hps', mode: 'hps', goal: 'worker_recovery_s', fault: 'SIGKILL fast-1', inject: killNodes(['fast-1'], survivorsOf(['fast-1'])) },
  { name: 'kill-shard-primary', mode: 'hps', goal: 'shard_recovery_s', fault: 'SIGKILL server-1', inject: killNodes(['server-1'], everyWorker) },
  {
    name: 'stop-shard-primary-10s', mode: 'hps', goal: 'shard_recovery_s', fault: 'SIGSTOP server-1, SIGCONT after 10 s',
    inject: async (ctx) => {
      const pid = ctx.nodePid('server-1');
      const at = now();
      process.kill(pid, 'SIGSTOP');
      ctx.cleanup.add('SIGCONT server-1', () => { try { process.kill(pid, 'SIGCONT'); } catch { /* gone */ } });
      const pending = sleep(10_000).then(() => { try { process.kill(pid, 'SIGCONT'); } catch { /* gone */ } ctx.say('server-1 continued'); });
      return { at, what: `SIGSTOP server-1 (pid ${pid}) for 10 s`, affected: everyWorker, victims: ['server-1'], pending };
    },
  },
  {
    name: 'kill-scheduler', mode: 'hps', goal: 'scheduler_recovery_s', fault: 'SIGKILL the hetps up driver (scheduler) with a standby beside it',
    available: async () => (standby() === null
      ? 'no standby scheduler: the CLI accepts neither `hetps up --standby` nor `hetps launch --role scheduler`, and the job cannot finish without its driver (its nodes exit when it is gone)'
      : null),
    onJob: async (ctx) => {
      const summaryFile = join(ctx.dir, 'standby-summary.json');
      const args = standby() === 'up --standby'
        ? [BIN, 'up', '--config', ctx.configFile, '--standby', '--summary', summaryFile]
        : [BIN, 'launch', '--role', 'scheduler', '--config', ctx.configFile, '--nats', ctx.cluster.urls.join(','), '--job', ctx.job,
          ...(cliHelpMatches(ROOT, BIN, 'launch', /--summary\b/) ? ['--summary', summaryFile] : [])];
      const proc = ctx.spawnExtra('standby', args);
      standbys.set(ctx, { proc, summaryFile });
      ctx.say(`standby scheduler started (${standby()}, pid ${proc.pid})`);
    },
    inject: async (ctx) => {
      const pid = ctx.driver!.pid;
      const at = now();
      process.kill(pid, 'SIGKILL');
      // The control plane is back when some scheduler answers ctl.status again.
      const controlBack = (async () => {
        while (now() - at < 120_000) {
          if (await ctx.watch.status(1_000) !== null) return now();
          await sleep(100);
        }
        return null;
      })();
      return { at, what: `SIGKILL the driver (pid ${pid})`, affected: everyWorker, victims: [], controlBack, finisher: standbys.get(ctx)! };
    },
  },
  {
    name: 'kill-nats-server', mode: 'hps', goal: 'shard_recovery_s', fault: 'SIGKILL the nats-server leading the batch queue (of 3)',
    inject: async (ctx) => {
      const leader = await ctx.watch.batchStreamLeader();
      const victim = leader !== null && ctx.cluster.nodes.some((n) => n.name === leader) ? leader : ctx.cluster.nodes[0]!.name;
      const pid = ctx.cluster.node(victim).pid;
      const at = now();
      await ctx.cluster.kill(victim, 'SIGKILL');
      return { at, what: `SIGKILL nats-server ${victim} (pid ${pid})`, affected: everyWorker, victims: [], detail: { nats_node: victim, batch_stream_leader: leader } };
    },
  },
  { name: 'partition-group-member-20s', mode: 'hps', goal: 'worker_recovery_s', fault: 'cut fast-1\'s network link for 20 s', ...partition('fast-1', 20_000, survivorsOf(['fast-1'])) },
  { name: 'partition-shard-primary-20s', mode: 'hps', goal: 'shard_recovery_s', fault: 'cut server-1\'s network link for 20 s', ...partition('server-1', 20_000, everyWorker) },
  {
    name: 'kill-primary-while-seeding', mode: 'hps', goal: 'shard_recovery_s',
    fault: 'SIGKILL server-1, then (≥ 300 ms later, once the plan seeds a new backup of its shard) that shard\'s new primary, which is seeding it; 4 servers, backup_factor 2',
    serverNodes: ['server-1', 'server-2', 'server-3', 'server-4'],
    faultTolerance: { backup_factor: 2 },
    onJob: awaitPlacement,
    inject: async (ctx) => {
      const { shard, at, pid1, seeding } = await killServer1UntilSeeding(ctx);
      await sleep(Math.max(0, at + 300 - now()));
      // Shards whose only caught-up replica the second kill takes (a seeding replica has not caught up).
      const onlyCaughtUp = Object.entries(seeding.replicas!)
        .filter(([, r]) => [r.primary, ...r.backups].filter((n) => n !== 'server-1').every((n) => n === seeding!.primary))
        .map(([s]) => s);
      const pid2 = ctx.nodePid(seeding.primary);
      const second = now();
      process.kill(pid2, 'SIGKILL');
      ctx.say(`SIGKILL ${seeding.primary} (pid ${pid2}), the new primary of shard ${shard} seeding ${seeding.node} in plan v${seeding.version}, ${Math.round(second - at)} ms after server-1`);
      return {
        at, what: `SIGKILL server-1 (pid ${pid1}), then ${seeding.primary} (pid ${pid2}) ${Math.round(second - at)} ms later`, affected: everyWorker, victims: ['server-1', seeding.primary],
        detail: { shard, new_primary: seeding.primary, new_backup: seeding.node, plan_version: seeding.version, plan_seen_after_ms: Math.round(seeding.seen - at), second_kill_after_ms: Math.round(second - at), shards_left_without_caught_up_replica: onlyCaughtUp },
      };
    },
  },
  {
    // Run before kill-primary-while-seeding had its present form; kept to show what a double failure does to backup_factor 1.
    name: 'kill-seeding-target-3-servers', mode: 'hps', goal: 'shard_recovery_s',
    fault: 'SIGKILL server-1, then (≥ 300 ms later, once the plan names it) the node seeded as the new backup of its shard; 3 servers, backup_factor 1',
    serverNodes: ['server-1', 'server-2', 'server-3'],
    faultTolerance: { backup_factor: 1 },
    onJob: awaitPlacement,
    inject: async (ctx) => {
      const { shard, at, pid1, seeding: seeded } = await killServer1UntilSeeding(ctx);
      await sleep(Math.max(0, at + 300 - now()));
      // Shards whose only caught-up replica the second kill takes (a seeding replica has not caught up).
      const onlyCaughtUp = Object.entries(seeded.replicas!)
        .filter(([, r]) => [r.primary, ...r.backups].filter((n) => n !== 'server-1').every((n) => n === seeded!.node))
        .map(([s]) => s);
      const pid2 = ctx.nodePid(seeded.node);
      const second = now();
      process.kill(pid2, 'SIGKILL');
      ctx.say(`SIGKILL ${seeded.node} (pid ${pid2}), seeding shard ${shard} in plan v${seeded.version}, ${Math.round(second - at)} ms after server-1`);
      return {
        at, what: `SIGKILL server-1 (pid ${pid1}), then ${seeded.node} (pid ${pid2}) ${Math.round(second - at)} ms later`, affected: everyWorker, victims: ['server-1', seeded.node],
        detail: { shard, new_backup: seeded.node, plan_version: seeded.version, plan_seen_after_ms: Math.round(seeded.seen - at), second_kill_after_ms: Math.round(second - at), shards_left_without_caught_up_replica: onlyCaughtUp },
      };
    },
  },
  { name: 'kill-two-workers-one-group', mode: 'hps', goal: 'worker_recovery_s', fault: 'SIGKILL fast-1 and fast-2 together', inject: killNodes(['fast-1', 'fast-2'], survivorsOf(['fast-1', 'fast-2'])) },
];
const standbys = new WeakMap<RunContext, { proc: Tracked; summaryFile: string }>();

const REPLICATION = 'replication-cost';
const ONLY = option('--only')?.split(',').map((s) => s.trim()).filter(Boolean) ?? null;
if (ONLY) for (const n of ONLY) if (n !== REPLICATION && !SCENARIOS.some((s) => s.name === n)) throw new Error(`--only: unknown scenario ${n} (${[...SCENARIOS.map((s) => s.name), REPLICATION].join(', ')})`);
if (!Number.isInteger(RUNS) || RUNS < 1) throw new Error(`--runs must be a positive integer, got ${option('--runs')}`);
if (!Number.isInteger(EPOCHS) || EPOCHS < 1) throw new Error(`--epochs must be a positive integer, got ${option('--epochs')}`);

// ---------------------------------------------------------------- one run

interface RunSpec {
  label: string;
  k: number;
  n: number;
  mode: Mode;
  scenario: Scenario | null;
  faultTolerance: FaultTolerance;
}

interface RunResult {
  run: number;
  failed?: true;
  error?: string;
  wall_s: number;
  fault?: { what: string; at_batches: number; of_batches: number; at_s: number } & Record<string, unknown>;
  recovery_s?: number | null;
  /**
   * `stalled_until_end_s`: when no affected worker acknowledged anything after the fault, from the
   * fault to the job's last acknowledgement: the stall lasted at least that long (the work ran out first).
   */
  recovery?: Recovery & { control_plane_s?: number | null; stalled_until_end_s?: number | null };
  dead_verdict_s?: Record<string, number | null>;
  lost: number | null;
  duplicated: number | null;
  replicas_equal: boolean | null;
  integrity_from: 'summary' | 'acks' | null;
  final_auc: number | null;
  samples_per_s: number | null;
  batches: number | null;
  batches_acked: number | null;
  redelivered: number | null;
  duplicate_acks: number | null;
  /** The summary's integrity report as it came (null when it had none). */
  integrity: Record<string, unknown> | null;
  acks_heard: number;
  not_active?: string[];
}

let benchRoot = '';
const say = (line: string) => process.stderr.write(`[recovery] ${line}\n`);
const round = (x: number, d = 3) => Number(x.toFixed(d));

async function runOnce(spec: RunSpec): Promise<RunResult> {
  const tag = `${spec.label} run ${spec.k}/${spec.n}`;
  const dir = join(benchRoot, `${spec.label}-${spec.k}`);
  mkdirSync(dir, { recursive: true });
  const cleanup = new Cleanup();
  if (!KEEP) cleanup.add('run dir', () => removeDir(dir));
  const started = now();
  const deadline = started + RUN_TIMEOUT_MS;
  const s = spec.scenario;
  const result: RunResult = {
    run: spec.k, wall_s: 0, lost: null, duplicated: null, replicas_equal: null, integrity_from: null, final_auc: null,
    samples_per_s: null, batches: null, batches_acked: null, redelivered: null, duplicate_acks: null, integrity: null, acks_heard: 0,
  };
  let driver: Tracked | null = null;
  let injected: Injected | null = null;
  const fail = (error: string, tailOf: Tracked | null) => {
    result.failed = true;
    const tail = tailOf?.tail(30) ?? '';
    result.error = tail ? `${error}\n--- last lines of its output ---\n${tail}` : error;
  };
  try {
    say(`${tag}: starting (${spec.mode}${s ? `, fault: ${s.fault}` : ', no fault'})`);
    const cluster = await startLocalCluster({
      nodes: 3, dir: join(dir, 'nats'), clientPort: null, clusterPort: null, httpPort: null, jetstream: true, readyTimeoutMs: 60_000,
      ...(s?.clusterOptions ?? {}),
    });
    cleanup.add('nats cluster', () => cluster.stop());
    const job = `rec-${spec.label}-${spec.k}`;
    const config = jobConfig({ job, mode: spec.mode, dir, urls: cluster.urls, serverNodes: s?.serverNodes ?? null, faultTolerance: { ...spec.faultTolerance, ...(s?.faultTolerance ?? {}) } });
    const configFile = join(dir, `${job}.yaml`);
    writeFileSync(configFile, `# the quick start (examples/quickstart.yaml) as bench/recovery.bench.ts runs it\n${stringifyYaml(config)}`);
    const w = await JobWatch.open(cluster.urls, job);
    cleanup.add('watch connections', () => w.close());
    const ctx: RunContext = {
      job, dir, configFile, config, cluster, watch: w, cleanup, driver: null,
      say: (l) => say(`${tag}: ${l}`),
      nodePid: (node) => {
        const pid = nodePids(ctx.driver!.pid, GROUPS).get(node);
        if (pid === undefined) throw new Error(`no process of ${node} among the driver's children`);
        return pid;
      },
      spawnExtra: (name, args) => {
        const t = spawnTracked(process.execPath, args, { cwd: ROOT, logFile: join(dir, `${name}.log`) });
        cleanup.add(name, () => t.killGroup());
        return t;
      },
    };
    await s?.beforeDriver?.(ctx);
    const summaryFile = join(dir, 'summary.json');
    const skip = s?.skipNodes?.length ? ['--skip', s.skipNodes.join(',')] : [];
    const d = driver = ctx.driver = spawnTracked(process.execPath, [BIN, 'up', '--config', configFile, '--summary', summaryFile, ...skip], { cwd: ROOT, logFile: join(dir, 'driver.log') });
    cleanup.add('driver and its nodes', () => d.killGroup());

    // Until the job exists: its batch count (and plan) come with the first ctl.status that has them.
    let total = 0;
    let lastNote = now();
    const runEnded = () => d.exit !== null || now() > deadline;
    while (total === 0 && !runEnded()) {
      const st = await w.status(1_000);
      total = Number(st?.progress?.batches_total ?? 0);
      if (total === 0) await sleep(250);
    }
    if (total > 0) await s?.onJob?.(ctx);
    if (s && total > 0) {
      const at = Math.ceil(FAULT_AT_FRACTION * total);
      while (w.acked < at && !runEnded()) {
        await sleep(20);
        if (now() - lastNote > 15_000) { lastNote = now(); ctx.say(`${w.acked}/${total} batches acknowledged, waiting for ${at}`); }
      }
      if (!runEnded()) {
        const atBatches = w.acked;
        injected = await s.inject(ctx);
        result.fault = { what: injected.what, at_batches: atBatches, of_batches: total, at_s: round((injected.at - started) / 1000, 1), ...(injected.detail ?? {}) };
        ctx.say(`fault at ${atBatches}/${total} batches: ${injected.what}`);
      }
    }
    // The job ends when its driver (or the standby that took over) exits.
    const ender = injected?.finisher?.proc ?? d;
    while (ender.exit === null && now() < deadline) {
      await sleep(100);
      if (now() - lastNote > 15_000) { lastNote = now(); ctx.say(`${w.acked}/${total || '?'} batches acknowledged, ${Math.round((now() - started) / 1000)} s`); }
    }
    // Its last lines (the error, if any) reach the tail once the pipes drain.
    if (ender.exit !== null) await ender.exited;
    await injected?.pending?.catch(() => undefined);
    result.acks_heard = w.acked;
    if (ender.exit === null) {
      fail(`timed out after ${RUN_TIMEOUT_MS / 1000} s (${w.acked}/${total || '?'} batches acknowledged)`, ender);
    } else if (s && injected === null) {
      fail(`the job ended (exit ${ender.exit.code ?? ender.exit.signal}) before ${Math.round(FAULT_AT_FRACTION * 100)} % of its batches were acknowledged; no fault injected`, ender);
    } else if (ender.exit.code !== 0) {
      fail(`the job failed: ${ender === d ? 'hetps up' : 'the standby'} exited with ${ender.exit.code ?? ender.exit.signal}`, ender);
    }
    const file = injected?.finisher?.summaryFile ?? summaryFile;
    if (!result.failed && !existsSync(file)) fail(`the job ended without writing its summary (${file})`, ender);
    if (!result.failed) {
      const sum = JSON.parse(readFileSync(file, 'utf8')) as Summary;
      result.final_auc = sum.test_auc === null ? null : round(sum.test_auc, 4);
      result.samples_per_s = Math.round(sum.samples_per_s);
      result.batches = sum.batches;
      result.batches_acked = sum.batches_acked;
      result.redelivered = sum.redelivered;
      result.duplicate_acks = sum.duplicate_acks;
      result.not_active = sum.not_active;
      if (sum.integrity) {
        result.integrity_from = 'summary';
        result.lost = sum.integrity.lost;
        result.duplicated = sum.integrity.duplicated;
        result.replicas_equal = sum.integrity.replicas_equal;
        result.integrity = sum.integrity;
      } else {
        result.integrity_from = 'acks';
        result.lost = sum.batches - sum.batches_acked;
        result.duplicated = sum.duplicate_acks;
      }
    }
    if (injected) {
      const times = w.acks.filter((a) => injected!.affected(a.node)).map((a) => a.at);
      const rec: RunResult['recovery'] = recoveryFromAcks(injected.at, times);
      if (rec.recovery_s === null) {
        const last = w.acks.at(-1)?.at ?? null;
        rec.stalled_until_end_s = last !== null && last > injected.at ? round((last - injected.at) / 1000) : null;
      }
      let recovery = rec.recovery_s;
      if (injected.controlBack) {
        const back = await Promise.race([injected.controlBack, sleep(5_000).then(() => null)]);
        rec.control_plane_s = back === null ? null : round((back - injected.at) / 1000);
        recovery = rec.control_plane_s;
      }
      result.recovery = rec;
      result.recovery_s = recovery;
      result.dead_verdict_s = Object.fromEntries(injected.victims.map((v) => {
        const dead = w.verdicts.find((x) => x.node === v && x.state === 'dead' && x.at >= injected!.at);
        return [v, dead ? round((dead.at - injected!.at) / 1000) : null];
      }));
    }
  } catch (e) {
    if (e instanceof SkipScenario) throw e;
    fail(`the run broke: ${(e as Error).stack ?? String(e)}`, driver);
  } finally {
    result.wall_s = round((now() - started) / 1000, 1);
    if (driver) signalGroup(driver.pid, 'SIGKILL');
    await cleanup.run();
  }
  const fmt = (x: number | null | undefined, d = 2) => (x === null || x === undefined ? '-' : x.toFixed(d));
  say(`${tag}: ${result.failed ? `FAILED (${result.error!.split('\n')[0]})` : 'done'}`
    + `${injected ? `, recovery ${fmt(result.recovery_s)} s${result.recovery?.stalled_until_end_s != null ? ` (no affected acknowledgement after the fault; ≥ ${fmt(result.recovery.stalled_until_end_s)} s)` : ''}` : ''}, AUC ${fmt(result.final_auc, 4)}, lost ${result.lost ?? '-'}, duplicated ${result.duplicated ?? '-'}`
    + `, ${Math.round(result.samples_per_s ?? 0)} samples/s, ${result.wall_s} s`);
  return result;
}

// ---------------------------------------------------------------- aggregation

const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

function scenarioResult(s: Scenario, runs: RunResult[], aucFaultFree: number | null) {
  const done = runs.filter((r) => !r.failed);
  const recoveries = done.map((r) => r.recovery_s).filter((x): x is number => typeof x === 'number');
  const aucs = done.map((r) => r.final_auc).filter((x): x is number => x !== null);
  const lost = done.length && done.every((r) => r.lost !== null) ? sum(done.map((r) => r.lost!)) : null;
  const duplicated = done.length && done.every((r) => r.duplicated !== null) ? sum(done.map((r) => r.duplicated!)) : null;
  const eq = done.map((r) => r.replicas_equal);
  const replicasEqual = eq.includes(false) ? false : eq.length > 0 && eq.every((x) => x === true) ? true : null;
  const finalAuc = median(aucs);
  const recoveryMax = recoveries.length ? Math.max(...recoveries) : null;
  const metDetail = {
    every_run_finished: done.length === runs.length,
    [s.goal]: recoveries.length === runs.length && recoveryMax !== null && recoveryMax <= GOALS[s.goal],
    lost: lost === GOALS.lost,
    duplicated: duplicated === GOALS.duplicated,
    auc_delta: finalAuc !== null && aucFaultFree !== null && finalAuc >= aucFaultFree - GOALS.auc_delta,
    replicas_equal: replicasEqual !== false,
  };
  return {
    name: s.name,
    mode: s.mode,
    fault: s.fault,
    goal: { [s.goal]: GOALS[s.goal], lost: GOALS.lost, duplicated: GOALS.duplicated, auc_delta: GOALS.auc_delta },
    runs: runs.length,
    failed_runs: runs.length - done.length,
    /** Finished runs in which no affected worker acknowledged anything after the fault (see stalled_until_end_s). */
    runs_without_recovery: done.filter((r) => r.recovery_s === null || r.recovery_s === undefined).length,
    recovery_s: { median: recoveries.length ? round(median(recoveries)!) : null, max: recoveryMax === null ? null : round(recoveryMax) },
    lost,
    duplicated,
    replicas_equal: replicasEqual,
    final_auc: finalAuc === null ? null : round(finalAuc, 4),
    auc_fault_free: aucFaultFree === null ? null : round(aucFaultFree, 4),
    met: Object.values(metDetail).every(Boolean),
    met_detail: metDetail,
    per_run: runs,
  };
}

// ---------------------------------------------------------------- main

const commit = () => gitCommit(ROOT);

async function main(): Promise<void> {
  if (flag('--list')) {
    for (const s of SCENARIOS) process.stdout.write(`${s.name.padEnd(28)} ${s.mode}  ${s.fault}\n`);
    process.stdout.write(`${REPLICATION.padEnd(28)} hps  no fault: backup_factor 0 against 1\n`);
    return;
  }
  findNatsServer(); // fails early, with the install hint, when nats-server is missing
  const selected = SCENARIOS.filter((s) => ONLY === null || ONLY.includes(s.name));
  const withReplication = ONLY === null || ONLY.includes(REPLICATION);
  const partial = QUICK || ONLY !== null;
  const out = option('--out') ?? (partial ? join(tmpdir(), `hetps-recovery-${new Date().toISOString().replace(/[:.]/g, '-')}.json`) : join(RESULTS, 'recovery.json'));
  benchRoot = mkdtempSync(join(tmpdir(), 'hetps-bench-recovery-'));
  const rootCleanup = new Cleanup();
  if (!KEEP) {
    rootCleanup.add('bench dir', () => removeDir(benchRoot));
    // Also when a second Ctrl-C cuts the clean-up short.
    process.on('exit', () => removeDir(benchRoot));
  }
  const began = now();
  say(`${selected.length} scenario(s)${withReplication ? ' + replication cost' : ''}, ${RUNS} run(s) each, quick start with ${EPOCHS} epochs, `
    + `fault at ${FAULT_AT_FRACTION * 100} % of the batches, ${RUN_TIMEOUT_MS / 1000} s per run at most; work dir ${benchRoot}`);

  try {
    // Which scenarios can run here at all (checked before any run, so a skip costs nothing).
    const skipped = new Map<string, string>();
    for (const s of selected) {
      const why = await s.available?.() ?? null;
      if (why !== null) { skipped.set(s.name, why); say(`${s.name}: skipped — ${why}`); }
    }

    // Fault-free runs of each mode the scenarios use: auc_fault_free.
    const baselines: Record<string, { runs: RunResult[]; auc_median: number | null; samples_per_s_median: number | null }> = {};
    for (const mode of [...new Set(selected.filter((s) => !skipped.has(s.name)).map((s) => s.mode))]) {
      const runs: RunResult[] = [];
      for (let k = 1; k <= RUNS; k++) runs.push(await runOnce({ label: `fault-free-${mode}`, k, n: RUNS, mode, scenario: null, faultTolerance: {} }));
      const ok = runs.filter((r) => !r.failed);
      baselines[mode] = {
        runs,
        auc_median: median(ok.map((r) => r.final_auc).filter((x): x is number => x !== null)),
        samples_per_s_median: median(ok.map((r) => r.samples_per_s).filter((x): x is number => x !== null)),
      };
    }

    const scenarios: unknown[] = [];
    for (const s of selected) {
      const why = skipped.get(s.name);
      if (why !== undefined) { scenarios.push({ name: s.name, mode: s.mode, fault: s.fault, skipped: why }); continue; }
      const runs: RunResult[] = [];
      let skip: string | null = null;
      for (let k = 1; k <= RUNS && skip === null; k++) {
        try {
          runs.push(await runOnce({ label: s.name, k, n: RUNS, mode: s.mode, scenario: s, faultTolerance: {} }));
        } catch (e) {
          if (!(e instanceof SkipScenario)) throw e;
          skip = e.message;
          say(`${s.name}: skipped — ${skip}`);
        }
      }
      scenarios.push(skip !== null ? { name: s.name, mode: s.mode, fault: s.fault, skipped: skip } : scenarioResult(s, runs, baselines[s.mode]?.auc_median ?? null));
    }

    // The price of a backup per shard, fault-free, runs alternated so both see the same machine.
    let replication: Record<string, unknown> = { samples_per_s_with_backup: null, samples_per_s_without: null, ratio: null, skipped: 'not selected (--only)' };
    if (withReplication) {
      const without: RunResult[] = []; const withBackup: RunResult[] = [];
      for (let k = 1; k <= RUNS; k++) {
        without.push(await runOnce({ label: 'backup-factor-0', k, n: RUNS, mode: 'hps', scenario: null, faultTolerance: { backup_factor: 0 } }));
        withBackup.push(await runOnce({ label: 'backup-factor-1', k, n: RUNS, mode: 'hps', scenario: null, faultTolerance: { backup_factor: 1 } }));
      }
      const rate = (rs: RunResult[]) => median(rs.filter((r) => !r.failed && r.samples_per_s !== null).map((r) => r.samples_per_s!));
      const w = rate(withBackup); const wo = rate(without);
      const ratio = w !== null && wo !== null && wo > 0 ? round(w / wo) : null;
      replication = {
        samples_per_s_with_backup: w, samples_per_s_without: wo, ratio,
        met: ratio !== null && ratio >= GOALS.replication_ratio,
        // Whether the job acted on backup_factor at all (a setting not active yet is listed in the summary).
        backup_factor_not_active: withBackup.some((r) => (r.not_active ?? []).some((l) => l.includes('backup_factor'))),
        per_run: { with_backup: withBackup, without },
      };
    }

    const { commit: sha, dirty } = commit();
    const result = {
      benchmark: 'recovery',
      commit: sha,
      dirty,
      date: new Date().toISOString(),
      machine: machineRecord(),
      goals: GOALS,
      goal_rule: 'a scenario is met when every run finished, the slowest run\'s recovery_s is within its recovery goal, nothing was lost or duplicated (summed over runs), '
        + 'the median final AUC is at least auc_fault_free − auc_delta, and no run saw unequal replicas; replication_cost is met when ratio ≥ replication_ratio',
      recovery_definition: `${recoveryDefinition(DEFAULT_RECOVERY_OPTIONS)} kill-scheduler: seconds from the fault to the first answer to ctl.status after it (the control plane back).`,
      integrity_definition: 'from the summary\'s integrity when present; else lost = batches never acknowledged (batches − batches_acked) and duplicated = acknowledgements beyond one per batch (duplicate_acks), replicas_equal null',
      setup: {
        job: 'examples/quickstart.yaml: spam filter (Wide & Deep), 2 servers, 5 EMULATED workers (fast ×3 at speed 1.0, slow ×2 at 0.4), hps groups fast (sync 2) and slow (sync 4)',
        epochs: EPOCHS,
        modes: 'asp / bsp / hps by training.mode; everything else as shipped (fault_tolerance: defaults unless a scenario sets it)',
        fault_at: `once ${FAULT_AT_FRACTION * 100} % of the batches are acknowledged (tel.batch, ack_confirmed)`,
        nats: 'a fresh local 3-node nats-server cluster per run (deploy/local-cluster.ts), the job given it in nats.servers; every node its own process',
        runs_per_scenario: RUNS,
        run_timeout_s: RUN_TIMEOUT_MS / 1000,
        quick: QUICK,
        only: ONLY,
        bench_wall_s: round((now() - began) / 1000, 0),
      },
      baselines,
      scenarios,
      replication_cost: replication,
    };
    mkdirSync(join(out, '..'), { recursive: true });
    writeFileSync(out, `${JSON.stringify(result, null, 2)}\n`);
    say(`wrote ${out}`);
    for (const sc of scenarios as { name: string; skipped?: string; recovery_s?: { median: number | null; max: number | null }; final_auc?: number | null; auc_fault_free?: number | null; lost?: number | null; duplicated?: number | null; met?: boolean; failed_runs?: number }[]) {
      if (sc.skipped) { process.stderr.write(`  ${sc.name.padEnd(28)} skipped: ${sc.skipped}\n`); continue; }
      process.stderr.write(`  ${sc.name.padEnd(28)} recovery median ${sc.recovery_s?.median ?? '-'} s, max ${sc.recovery_s?.max ?? '-'} s; AUC ${sc.final_auc ?? '-'} (fault-free ${sc.auc_fault_free ?? '-'}); `
        + `lost ${sc.lost ?? '-'}, duplicated ${sc.duplicated ?? '-'}; failed runs ${sc.failed_runs}; goals ${sc.met ? 'met' : 'missed'}\n`);
    }
    if (withReplication) process.stderr.write(`  replication cost: ${JSON.stringify({ with: replication.samples_per_s_with_backup, without: replication.samples_per_s_without, ratio: replication.ratio })}\n`);
  } finally {
    await rootCleanup.run();
  }
}

await main();
// onnxruntime and NATS handles must not keep a finished bench alive.
process.exit(0);
