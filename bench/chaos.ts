/**
 * Fault injection for benchmarks that break a real job on purpose
 * (bench/recovery.bench.ts): what a job's processes are and how to signal
 * them, a plain NATS client's view of the job (acknowledgements, health
 * verdicts, ctl.status, the shard plan), the recovery time read from the
 * acknowledgements, and clean-up of everything a run started, also on
 * Ctrl-C. Linux only: node processes are found through /proc.
 */
import { NetLab } from '../deploy/netlab.ts';
import { findNatsServer } from '../deploy/local-cluster.ts';
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { createWriteStream, readFileSync, readdirSync, rmSync, type WriteStream } from 'node:fs';
import { availableParallelism, cpus, totalmem } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { connect, headers, type NatsConnection, type Subscription } from '@nats-io/transport-node';
import { jetstreamManager } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import { decode } from '@msgpack/msgpack';
import { controlSubject, telemetryWildcard } from '../runtime/subjects.ts';
import { PLAN_KEY, planBucketName } from '../actors/store/plan-store.ts';
import { batchStreamName } from '../actors/store/batch-queue.ts';

/** Milliseconds on the monotonic clock; every time in this module is one. */
export const now = (): number => performance.now();
export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------- clean-up

type Disposer = () => Promise<void> | void;

/**
 * Everything a run started, undone in reverse order: by the run when it
 * ends, or all at once on SIGINT / SIGTERM (then the process exits 130).
 */
export class Cleanup {
  private readonly stack: { what: string; fn: Disposer }[] = [];
  private static readonly all = new Set<Cleanup>();
  private static hooked = false;

  constructor() {
    Cleanup.all.add(this);
    Cleanup.hook();
  }

  add(what: string, fn: Disposer): void {
    this.stack.push({ what, fn });
  }

  /** Runs every disposer (newest first), each at most `capMs`; errors are reported, not thrown. */
  async run(capMs = 10_000): Promise<void> {
    Cleanup.all.delete(this);
    while (this.stack.length) {
      const { what, fn } = this.stack.pop()!;
      try {
        await Promise.race([Promise.resolve().then(fn), sleep(capMs).then(() => { throw new Error(`gave up after ${capMs} ms`); })]);
      } catch (e) {
        process.stderr.write(`[chaos] clean-up of ${what}: ${(e as Error).message}\n`);
      }
    }
  }

  private static hook(): void {
    if (Cleanup.hooked) return;
    Cleanup.hooked = true;
    const onSignal = (sig: NodeJS.Signals) => {
      process.stderr.write(`\n[chaos] ${sig}: stopping everything this benchmark started\n`);
      // A second signal: leave at once (the exit hooks still SIGKILL our nats-servers and node groups).
      process.once(sig, () => process.exit(130));
      void Promise.all([...Cleanup.all].map((c) => c.run(5_000))).finally(() => process.exit(130));
    };
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
  }
}

// ---------------------------------------------------------------- processes

/** Process groups this process created (detached children), SIGKILLed if it exits without cleaning up. */
const liveGroups = new Set<number>();
let groupsHooked = false;
function trackGroup(pgid: number): void {
  liveGroups.add(pgid);
  if (groupsHooked) return;
  groupsHooked = true;
  process.on('exit', () => { for (const g of liveGroups) signalGroup(g, 'SIGKILL'); });
}

/** Signals a whole process group; a stopped member is continued first, so SIGTERM reaches it. */
export function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try { process.kill(-pgid, 'SIGCONT'); } catch { /* gone */ }
  try { process.kill(-pgid, signal); } catch { /* gone */ }
}

export interface Tracked {
  readonly child: ChildProcess;
  readonly pid: number;
  /** The last lines of its stdout and stderr together. */
  tail(lines?: number): string;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  exit: { code: number | null; signal: NodeJS.Signals | null } | null;
  /** SIGKILL to its whole process group (it and every process it started). */
  killGroup(): void;
}

/**
 * `cmd args` as the leader of a new process group (so it and every node it
 * starts can be killed together), output appended to `logFile`, the last
 * lines kept for error reports.
 */
export function spawnTracked(cmd: string, args: string[], o: { cwd: string; env?: NodeJS.ProcessEnv; logFile: string; prefix?: string }): Tracked {
  const child = spawn(cmd, args, { cwd: o.cwd, env: { ...process.env, ...o.env }, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  const pid = child.pid!;
  trackGroup(pid);
  const { log, last } = followOutput(child, o.logFile, o.prefix ?? '');
  const t: Tracked = {
    child, pid, exit: null,
    tail: (n = 30) => last.slice(-n).join('\n'),
    exited: new Promise((resolve) => {
      child.once('exit', (code, signal) => {
        t.exit = { code, signal };
        // Let the pipes drain into the log before reporting.
        setTimeout(() => { log.end(); resolve(t.exit!); }, 100);
      });
      child.once('error', (e) => { last.push(`could not start: ${e.message}`); t.exit ??= { code: -1, signal: null }; log.end(); resolve(t.exit); });
    }),
    killGroup: () => { signalGroup(pid, 'SIGKILL'); liveGroups.delete(pid); },
  };
  return t;
}

/** Appends a child's stdout and stderr to `logFile` (so its pipes never fill) and keeps its last 200 lines. */
export function followOutput(child: ChildProcess, logFile: string, prefix = ''): { log: WriteStream; last: string[] } {
  const log: WriteStream = createWriteStream(logFile, { flags: 'a' });
  const last: string[] = [];
  for (const stream of [child.stdout, child.stderr]) {
    if (!stream) continue;
    createInterface({ input: stream }).on('line', (l) => {
      log.write(`${prefix}${l}\n`);
      last.push(l);
      if (last.length > 200) last.splice(0, last.length - 200);
    });
  }
  return { log, last };
}

export interface ProcInfo { pid: number; ppid: number; args: string[] }

/** The live (not zombie) children of `ppid`, with their arguments, from /proc. */
export function childrenOf(ppid: number): ProcInfo[] {
  const out: ProcInfo[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (rest[0] === 'Z' || rest[0] === 'X' || Number(rest[1]) !== ppid) continue;
      const args = readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0').filter(Boolean);
      out.push({ pid: Number(d), ppid, args });
    } catch { /* gone meanwhile */ }
  }
  return out;
}

/**
 * The node a `hetps launch …` command line runs: `--server-id S`, `--node N`,
 * or `--group G --node-rank R` looked up in the job's groups. Null for
 * anything else.
 */
export function nodeOfLaunchArgs(args: readonly string[], groups: readonly { name: string; nodes: readonly string[] }[]): string | null {
  if (!args.includes('launch')) return null;
  const value = (flag: string) => { const i = args.indexOf(flag); return i >= 0 ? args[i + 1] ?? null : null; };
  const server = value('--server-id');
  if (server) return server;
  const node = value('--node');
  if (node) return node;
  const group = value('--group');
  if (group === null) return null;
  return groups.find((g) => g.name === group)?.nodes[Number(value('--node-rank') ?? 0)] ?? null;
}

/** Pids of the node processes a `hetps up` driver started, by node name. */
export function nodePids(driverPid: number, groups: readonly { name: string; nodes: readonly string[] }[]): Map<string, number> {
  const out = new Map<string, number>();
  for (const p of childrenOf(driverPid)) {
    const node = nodeOfLaunchArgs(p.args, groups);
    if (node !== null) out.set(node, p.pid);
  }
  return out;
}

/** True when the CLI's help for `command` matches `pattern` (a feature check at run time, not a version guess). */
export function cliHelpMatches(root: string, bin: string, command: string, pattern: RegExp): boolean {
  try {
    const text = execFileSync(process.execPath, [bin, command, '--help'], { cwd: root, encoding: 'utf8', timeout: 60_000, stdio: ['ignore', 'pipe', 'pipe'] });
    return pattern.test(text);
  } catch {
    return false;
  }
}

export function removeDir(dir: string): void {
  try { rmSync(dir, { recursive: true, force: true }); } catch { /* best effort */ }
}

// ---------------------------------------------------------------- a plain NATS client's view of the job

export interface AckEvent { at: number; node: string; batch_id: string; redelivered: boolean }
export interface VerdictEvent { at: number; node: string; role: string; state: string; reason: string }

/**
 * One connection per NATS server, each pinned to it, so killing a server
 * leaves the others hearing the telemetry (a message is counted once however
 * many connections hear it), plus one client connection over every server
 * for requests.
 */
export class JobWatch {
  /** Confirmed acknowledgements in arrival order. */
  readonly acks: AckEvent[] = [];
  readonly verdicts: VerdictEvent[] = [];
  /** Confirmed acknowledgements per batch id. */
  readonly ackCount = new Map<string, number>();
  private readonly seen = new Set<string>();
  private readonly seenVerdicts = new Set<string>();

  private constructor(readonly job: string, private readonly listeners: NatsConnection[], readonly client: NatsConnection, private readonly subs: Subscription[]) {}

  static async open(urls: readonly string[], job: string): Promise<JobWatch> {
    const opts = { noAsyncTraces: true, maxReconnectAttempts: -1, reconnectTimeWait: 250 };
    const listeners = await Promise.all(urls.map((u, i) => connect({ ...opts, servers: [u], name: `chaos-listener-${i + 1}` })));
    const client = await connect({ ...opts, servers: [...urls], name: 'chaos-client' });
    const w = new JobWatch(job, listeners, client, []);
    for (const nc of listeners) {
      w.subs.push(nc.subscribe(telemetryWildcard(job, 'batch'), { callback: (_e, m) => { try { w.onBatch(decode(m.data) as Record<string, unknown>); } catch { /* not ours */ } } }));
      w.subs.push(nc.subscribe(telemetryWildcard(job, 'health'), { callback: (_e, m) => { try { w.onVerdict(decode(m.data) as Record<string, unknown>); } catch { /* not ours */ } } }));
    }
    await Promise.all(listeners.map((nc) => nc.flush()));
    return w;
  }

  private onBatch(b: Record<string, unknown>): void {
    if (b.ack_confirmed !== true) return;
    const node = String(b.node); const id = String(b.batch_id); const redelivered = b.redelivered === true;
    // The same telemetry message heard on several connections.
    const key = `${node}|${id}|${redelivered}`;
    if (this.seen.has(key)) return;
    this.seen.add(key);
    this.acks.push({ at: now(), node, batch_id: id, redelivered });
    this.ackCount.set(id, (this.ackCount.get(id) ?? 0) + 1);
  }

  private onVerdict(v: Record<string, unknown>): void {
    const e = { at: now(), node: String(v.node), role: String(v.role), state: String(v.state), reason: String(v.reason ?? '') };
    const key = `${e.node}|${e.state}|${String(v.since_ms)}`;
    if (this.seenVerdicts.has(key)) return;
    this.seenVerdicts.add(key);
    this.verdicts.push(e);
  }

  /** Distinct batches acknowledged so far. */
  get acked(): number { return this.ackCount.size; }

  /** `ctl.status` as a JSON request (the reply's `result`), or null when no scheduler answered within `timeoutMs`. */
  async status(timeoutMs = 2_000): Promise<Record<string, any> | null> {
    const h = headers();
    h.set('Content-Type', 'application/json');
    try {
      const m = await this.client.request(controlSubject(this.job, 'status'), JSON.stringify({ events: 0 }), { timeout: timeoutMs, headers: h });
      const r = JSON.parse(new TextDecoder().decode(m.data)) as { type: string; result?: Record<string, any> };
      return r.type === 'reply' ? r.result ?? null : null;
    } catch {
      return null;
    }
  }

  /** The shard plan as stored (`HPS_<job>_plan`, key `current`, JSON), or null while there is none. */
  async plan(): Promise<Record<string, any> | null> {
    try {
      const kv = await new Kvm(this.client).open(planBucketName(this.job));
      const e = await kv.get(PLAN_KEY);
      if (e === null || e.operation !== 'PUT') return null;
      return JSON.parse(new TextDecoder().decode(e.value)) as Record<string, any>;
    } catch {
      return null;
    }
  }

  /** The NATS server (its server_name, `n1`…) leading the job's batch work queue, or null. */
  async batchStreamLeader(): Promise<string | null> {
    try {
      const jsm = await jetstreamManager(this.client, { timeout: 5_000 });
      return (await jsm.streams.info(batchStreamName(this.job))).cluster?.leader ?? null;
    } catch {
      return null;
    }
  }

  async close(): Promise<void> {
    for (const s of this.subs) s.unsubscribe();
    await Promise.all([...this.listeners, this.client].map((nc) => nc.close().catch(() => undefined)));
  }
}

// ---------------------------------------------------------------- replica placement in the plan

export interface Replicas { primary: string; backups: string[]; seeding: string[] }

/**
 * The plan's replica placement by shard (`placement.replicas`, see
 * topology/replication.ts), or null when the plan has none.
 */
export function placementOf(plan: Record<string, any> | null): Record<string, Replicas> | null {
  const r = plan?.placement?.replicas;
  if (r === null || typeof r !== 'object') return null;
  const out: Record<string, Replicas> = {};
  for (const [shard, v] of Object.entries(r as Record<string, any>)) {
    if (typeof v?.primary !== 'string') return null;
    out[shard] = { primary: v.primary, backups: Array.isArray(v.backups) ? v.backups.map(String) : [], seeding: Array.isArray(v.seeding) ? v.seeding.map(String) : [] };
  }
  return out;
}

// ---------------------------------------------------------------- recovery time

export interface RecoveryOptions {
  /** Only a stall that begins this soon after the fault counts (in-flight steps finishing first). */
  settleMs: number;
  /** The normal gap: the largest gap between the same acknowledgements in this window before the fault. */
  baselineMs: number;
  /** A stall is a gap longer than this many normal gaps (so ordinary jitter after the fault is not one). */
  stallFactor: number;
}

export const DEFAULT_RECOVERY_OPTIONS: RecoveryOptions = { settleMs: 2_000, baselineMs: 10_000, stallFactor: 2 };

export function recoveryDefinition(o: RecoveryOptions = DEFAULT_RECOVERY_OPTIONS): string {
  return 'Seconds from the fault to the acknowledgement (tel.batch with ack_confirmed) that ends the largest stall after it, '
    + 'counting only the acknowledgements of the workers the fault affects (a worker kill or partition: the surviving members of its group, '
    + 'in bsp every worker; a shard, NATS server or scheduler fault: every worker). A stall is a gap between consecutive such acknowledgements '
    + `(the first gap runs from the fault itself) that begins at most ${o.settleMs / 1000} s after the fault (in-flight steps may finish first) `
    + `and is longer than ${o.stallFactor} × the largest gap between the same acknowledgements in the ${o.baselineMs / 1000} s before the fault (the normal rhythm; ordinary jitter is not a stall). `
    + 'Without such a stall the fault stopped nothing beyond the normal rhythm, and recovery_s is the time to the first acknowledgement after it. '
    + 'null: no affected worker acknowledged anything after the fault.';
}

export interface Recovery {
  recovery_s: number | null;
  /** The first affected acknowledgement after the fault. */
  first_ack_s: number | null;
  /** The stall that defined recovery_s (start, from the fault), or null when there was none beyond normal. */
  stall_from_s: number | null;
  normal_gap_s: number | null;
  acks_after: number;
}

/** The recovery time as `recoveryDefinition` states it; `times` are the affected acknowledgements' arrival times (ms, any order). */
export function recoveryFromAcks(faultAt: number, times: readonly number[], o: RecoveryOptions = DEFAULT_RECOVERY_OPTIONS): Recovery {
  const sorted = [...times].sort((a, b) => a - b);
  const after = sorted.filter((t) => t > faultAt);
  const before = sorted.filter((t) => t <= faultAt && t >= faultAt - o.baselineMs);
  let normal: number | null = null;
  for (let i = 1; i < before.length; i++) normal = Math.max(normal ?? 0, before[i]! - before[i - 1]!);
  const s = (ms: number) => Number((ms / 1000).toFixed(3));
  if (after.length === 0) return { recovery_s: null, first_ack_s: null, stall_from_s: null, normal_gap_s: normal === null ? null : s(normal), acks_after: 0 };
  const gaps: { from: number; to: number }[] = [{ from: faultAt, to: after[0]! }];
  for (let i = 1; i < after.length && after[i - 1]! <= faultAt + o.settleMs; i++) gaps.push({ from: after[i - 1]!, to: after[i]! });
  let stall: { from: number; to: number } | null = null;
  // Without a normal rhythm to compare with (under two acknowledgements before the fault) no gap counts as a stall.
  if (normal !== null) {
    for (const g of gaps) if (g.to - g.from > o.stallFactor * normal && (stall === null || g.to - g.from > stall.to - stall.from)) stall = g;
  }
  return {
    recovery_s: s((stall?.to ?? after[0]!) - faultAt),
    first_ack_s: s(after[0]! - faultAt),
    stall_from_s: stall === null ? null : s(stall.from - faultAt),
    normal_gap_s: normal === null ? null : s(normal),
    acks_after: after.length,
  };
}

// ---------------------------------------------------------------- network lab (deploy/netlab.ts)

/** The network lab (deploy/netlab.ts): nodes in their own network namespace, cut off and healed at will. */
export type { NetLab };
interface NetLabModule { NetLab: typeof NetLab }

/** The lab when it can run here (root, iproute2, namespaces); else why not. */
export async function loadNetLab(_root: string): Promise<{ module: NetLabModule } | { skipped: string }> {
  const a = await NetLab.available();
  if (!a.ok) return { skipped: `the network lab cannot run here: ${a.reason}` };
  return { module: { NetLab } };
}

/** The checkout's commit and whether tracked files other than bench/results differ from it (a result file records both; a benchmark that writes several results, or runs twice, must not mark its own second file dirty). */
export function gitCommit(root: string): { commit: string | null; dirty: boolean | null } {
  const git = (args: string[]) => execFileSync('git', ['--no-optional-locks', ...args], { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  try {
    return { commit: git(['rev-parse', 'HEAD']), dirty: git(['status', '--porcelain', '--untracked-files=no', '--', '.', ':(exclude)bench/results']) !== '' };
  } catch {
    return { commit: null, dirty: null };
  }
}

/**
 * What a result file held before this invocation, to keep under
 * `superseded` (newest first): its own fields without `drop` (bulky ones)
 * and without its own `superseded`, followed by that list. [] when there is
 * no readable file yet.
 */
export function earlierResults(file: string | URL, drop: readonly string[] = []): unknown[] {
  try {
    const before = JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown> & { superseded?: unknown[] };
    const { superseded = [], ...rest } = before;
    for (const k of drop) delete rest[k];
    return [rest, ...superseded];
  } catch {
    return [];
  }
}

/**
 * `rounds` back-to-back timings of a raw baseline and hetps, the side going
 * first alternating (raw first in even rounds), so a drift of the machine's
 * load does not favour one. Each side returns the seconds its round took; a
 * null side is not timed (profiling one side). `paired`: raw / hetps time of
 * every round where both ran.
 */
export async function alternateRounds(rounds: number, raw: (() => Promise<number>) | null, ours: (() => Promise<number>) | null): Promise<{ rawSeconds: number; oursSeconds: number; paired: number[] }> {
  let rawSeconds = 0; let oursSeconds = 0;
  const paired: number[] = [];
  for (let r = 0; r < rounds; r++) {
    let a = 0; let b = 0;
    if (r % 2 === 0 && raw) a = await raw();
    if (ours) b = await ours();
    if (r % 2 === 1 && raw) a = await raw();
    rawSeconds += a; oursSeconds += b;
    if (a && b) paired.push(a / b);
  }
  return { rawSeconds, oursSeconds, paired };
}

/** The machine a result was measured on, as every result file records it. */
export function machineRecord(): Record<string, unknown> {
  return {
    cpu: cpus()[0]?.model ?? null, cores: availableParallelism(), memory_gib: Math.round(totalmem() / 2 ** 30), node: process.version,
    platform: `${process.platform} ${process.arch}`, nats_server: natsServerVersion(), shared: 'other work may run on the same machine during the bench',
  };
}

/** `nats-server --version` of the binary the jobs use, or null. */
export function natsServerVersion(): string | null {
  try { return execFileSync(findNatsServer(), ['--version'], { encoding: 'utf8' }).trim(); } catch { return null; }
}

