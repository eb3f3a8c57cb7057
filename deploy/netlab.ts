/**
 * Network lab: node processes in their own Linux network namespaces, each on
 * a veth link to the host, so a test or benchmark can cut, heal and
 * rate-limit one node's link while the others carry on. `netem` is not
 * available on our machines, so a partition is the link's state and a slow
 * link is a `tc tbf` qdisc on both ends (host side: traffic to the node;
 * namespace side: traffic from it). A cut is a real one: nothing passes,
 * TCP connections stall and retransmit; after `heal` a short cut is ridden
 * out by TCP itself, a long one (past the client's ping timeout) ends in the
 * client reconnecting.
 *
 *   await using lab = await NetLab.create({ name: 'ps' });
 *   const n = await lab.addNode('w1');
 *   const child = lab.spawn('w1', process.execPath, ['worker.mjs', ...cluster.urlsFor(n.hostIp)]);
 *   await lab.cut('w1'); … await lab.heal('w1');
 *
 * Addresses: each lab takes one private /24 in 10.200.0.0–10.253.255.0 and
 * gives node i the /30 at 4i (host side .4i+1, node .4i+2). The lab's number
 * picks both the /24 and the 5-character prefix of its names (interfaces
 * `<prefix>h<i>` / `<prefix>n<i>`, within Linux's 15; namespaces
 * `hetps-<prefix>-<node>`), is chosen at random and reserved by creating
 * `<lock dir>/<prefix>.json` exclusively, so labs of concurrent test
 * processes never share one; a /24 that any interface or route of the host
 * already touches is skipped.
 *
 * Cleanup: `dispose()` (or `await using`) kills what the lab spawned and
 * every other process left in its namespaces, then deletes its veths and
 * namespaces. The same runs synchronously on process exit, SIGINT and
 * SIGTERM; a lab whose process was SIGKILLed is swept by the next
 * `NetLab.create` on the machine (its lock file names a dead pid).
 *
 * Needs root (CAP_SYS_ADMIN for namespaces, CAP_NET_ADMIN for links) and
 * iproute2 (`ip`, `tc`); `NetLab.available()` says whether this machine can.
 */
import { execFile, execFileSync, spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { ConfigError, HetpsError, MissingDependencyError } from '../runtime/errors.ts';

(Symbol as { asyncDispose?: symbol }).asyncDispose ??= Symbol.for('Symbol.asyncDispose');

/** One node of a lab: its namespace and both ends of its link. */
export interface LabNode {
  readonly name: string;
  readonly netns: string;
  /** The host end's address: what the node reaches the host's servers by. */
  readonly hostIp: string;
  /** The node's own address, as the host sees it. */
  readonly nodeIp: string;
  /** The host end of the veth pair (cut, heal and rate act on it). */
  readonly hostIf: string;
  /** The namespace end of the veth pair. */
  readonly nodeIf: string;
}

export interface NetLabOptions {
  /** Shown in errors and the lock file, to tell labs apart; default 'lab'. */
  name?: string;
}

export interface RateLimitOptions {
  /** Bucket size in KiB: how much may pass at line rate after a quiet spell. Default max(16, 10 ms of traffic). */
  burstKb?: number;
  /** Longest a packet may wait in the queue before it is dropped. Default 100 ms. */
  latencyMs?: number;
}

export type NetLabAvailability = { ok: true } | { ok: false; reason: string };

const FIRST_OCTET2 = 200;
const LAB_SLOTS = 54 * 256; // 10.200.0.0/24 … 10.253.255.0/24
const MAX_NODES = 63; // /30s in a /24
const CREATE_ATTEMPTS = 20;
const KILL_GRACE_MS = 1_000;
const IPROUTE_HINT = 'install iproute2 (apt-get install -y iproute2)';
const ROOT_HINT = 'run as root (network namespaces and veth links need CAP_SYS_ADMIN and CAP_NET_ADMIN)';

// ---------------------------------------------------------------------------
// Commands.

/** A failed `ip`/`tc` command: the command line, its stderr, and what to do. */
function commandError(cmd: string, args: readonly string[], e: unknown): HetpsError {
  const err = e as NodeJS.ErrnoException & { stderr?: string | Buffer };
  const line = [cmd, ...args].join(' ');
  if (err.code === 'ENOENT') {
    return new MissingDependencyError(`\`${line}\` failed: ${cmd} was not found on PATH; ${IPROUTE_HINT}.`, { cause: e, data: { command: line } });
  }
  const stderr = String(err.stderr ?? '').trim() || err.message;
  const denied = /operation not permitted|permission denied/i.test(stderr);
  const what = denied ? ROOT_HINT : adviceFor(stderr);
  return new HetpsError(`\`${line}\` failed: ${stderr}${what ? `\n${what}` : ''}`, { cause: e, data: { command: line, stderr } });
}

function adviceFor(stderr: string): string | null {
  if (/exec of "[^"]+" failed: no such file/i.test(stderr)) return `The command is not on PATH inside the namespace; ${IPROUTE_HINT} for tc, or give the full path.`;
  if (/unknown qdisc|specified qdisc kind is unknown|sch_tbf/i.test(stderr)) return 'The kernel lacks the tbf qdisc: load it with `modprobe sch_tbf`.';
  if (/file exists/i.test(stderr)) return 'A namespace or interface of that name is left over: `ip netns list` and `ip link` show it; delete it or dispose the lab that made it.';
  if (/cannot find device|does not exist/i.test(stderr)) return 'The interface is gone (the lab was disposed, or its namespace deleted by hand).';
  return null;
}

function run(cmd: string, args: readonly string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { encoding: 'utf8', timeout: 15_000 }, (e, stdout, stderr) => {
      if (e) reject(commandError(cmd, args, Object.assign(e, { stderr })));
      else resolve(stdout);
    });
  });
}

/** Like `run`, but an error whose stderr matches `ignore` counts as success (deleting what is already gone). */
async function runIgnoring(cmd: string, args: readonly string[], ignore: RegExp): Promise<void> {
  try {
    await run(cmd, args);
  } catch (e) {
    const stderr = String((e as HetpsError).data?.stderr ?? '');
    if (!ignore.test(stderr)) throw e;
  }
}

function runSyncQuiet(cmd: string, args: readonly string[]): string {
  try {
    return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 5_000 });
  } catch {
    return '';
  }
}

/** What `ip` says when deleting a link or namespace that is already gone. */
const GONE = /cannot find device|does not exist|no such file/i;

// ---------------------------------------------------------------------------
// Lock files: one per lab, naming its owner, so labs of concurrent processes
// never share a number and a lab whose owner died can be swept.

interface LockFile {
  lab: string;
  prefix: string;
  subnet: string;
  pid: number;
  /** Field 22 of /proc/<pid>/stat, so a recycled pid is not taken for the owner. */
  start_time: string | null;
}

function lockDir(): string {
  for (const d of ['/run/hetps-netlab', join(tmpdir(), 'hetps-netlab')]) {
    try {
      mkdirSync(d, { recursive: true, mode: 0o700 });
      return d;
    } catch { /* try the next */ }
  }
  throw new HetpsError(`cannot create a lock directory for the network lab in /run or ${tmpdir()}; ${ROOT_HINT}`);
}

function processStartTime(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19] ?? null;
  } catch {
    return null;
  }
}

function ownerAlive(lock: LockFile): boolean {
  const now = processStartTime(lock.pid);
  if (now === null) return false;
  return lock.start_time === null || lock.start_time === now;
}

/** Removes the namespaces and links of a lab whose owner is gone (synchronous: also used at exit). */
function sweepSync(prefix: string): void {
  for (const ns of runSyncQuiet('ip', ['netns', 'list']).split('\n').map((l) => l.split(' ')[0] ?? '')) {
    if (!ns.startsWith(`hetps-${prefix}-`)) continue;
    for (const pid of runSyncQuiet('ip', ['netns', 'pids', ns]).split(/\s+/).filter(Boolean)) {
      try { process.kill(Number(pid), 'SIGKILL'); } catch { /* gone */ }
    }
    runSyncQuiet('ip', ['netns', 'delete', ns]);
  }
  for (const line of runSyncQuiet('ip', ['-o', 'link', 'show']).split('\n')) {
    const name = /^\d+:\s+([^:@\s]+)/.exec(line)?.[1];
    if (name && name.startsWith(prefix) && /^[a-z0-9]{5}[hn]\d+$/.test(name)) runSyncQuiet('ip', ['link', 'delete', name]);
  }
}

function sweepDeadLabs(dir: string): void {
  let files: string[];
  try { files = readdirSync(dir); } catch { return; }
  for (const f of files) {
    if (!f.endsWith('.json')) continue;
    const path = join(dir, f);
    let lock: LockFile;
    try { lock = JSON.parse(readFileSync(path, 'utf8')) as LockFile; } catch { continue; }
    if (ownerAlive(lock)) continue;
    sweepSync(lock.prefix);
    rmSync(path, { force: true });
  }
}

// ---------------------------------------------------------------------------
// Host addresses in use, so a lab's /24 never overlaps one.

function ipToInt(ip: string): number {
  return ip.split('.').reduce((acc, o) => acc * 256 + Number(o), 0);
}

/**
 * Whether the /24 at `base` is taken on this host: one of its addresses lies
 * in it, or a route at least as specific as /24 does (another lab's /30s, a
 * VPN's /24). Broader routes (a /8 elsewhere) are no clash: a lab's /30s are
 * more specific and win.
 */
async function subnetInUse(base: number): Promise<boolean> {
  const inside = (ip: string) => ((ipToInt(ip) & 0xffffff00) >>> 0) === base;
  const addrs = [...(await run('ip', ['-o', '-4', 'addr', 'show'])).matchAll(/inet (\d+\.\d+\.\d+\.\d+)/g)].map((m) => m[1]!);
  if (addrs.some(inside)) return true;
  for (const line of (await run('ip', ['-4', 'route', 'show', 'table', 'all'])).split('\n')) {
    // "10.1.2.0/24 dev …", or with a type first: "local 10.1.2.3 dev …", "unreachable 10.1.2.0/24".
    const dest = line.trim().split(/\s+/).slice(0, 2).find((w) => /^\d+\.\d+\.\d+\.\d+(\/\d+)?$/.test(w));
    if (!dest) continue;
    const [ip, bits] = dest.split('/');
    if (Number(bits ?? 32) >= 24 && inside(ip!)) return true;
  }
  return false;
}

function intToIp(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

// ---------------------------------------------------------------------------
// Exit-time cleanup of labs not disposed.

const liveLabs = new Set<NetLab>();
const signals: NodeJS.Signals[] = ['SIGINT', 'SIGTERM'];

function onExit(): void {
  for (const lab of liveLabs) lab.disposeSync();
}

function onSignal(sig: NodeJS.Signals): void {
  // Counted before the cleanup, which removes this listener.
  const alone = process.listenerCount(sig) === 1;
  onExit();
  // Only we listened: do what the signal would have done without us (end the process).
  if (alone) {
    unhook();
    process.kill(process.pid, sig);
  }
}

function hook(lab: NetLab): void {
  if (liveLabs.size === 0) {
    process.on('exit', onExit);
    for (const s of signals) process.on(s, onSignal);
  }
  liveLabs.add(lab);
}

function unhook(lab?: NetLab): void {
  if (lab) liveLabs.delete(lab);
  if (lab && liveLabs.size > 0) return;
  process.off('exit', onExit);
  for (const s of signals) process.off(s, onSignal);
}

// ---------------------------------------------------------------------------

/** A set of namespaced nodes on veth links to this host. Make one with `NetLab.create`. */
export class NetLab implements AsyncDisposable {
  readonly name: string;
  /** 5 characters that start every interface of this lab (and, after `hetps-`, every namespace). */
  readonly prefix: string;
  /** The lab's /24, e.g. `10.213.7.0/24`. */
  readonly subnet: string;
  /** The lock file reserving the lab's number (`<lock dir>/<prefix>.json`), removed on dispose. */
  readonly lockPath: string;
  private readonly base: number;
  private readonly nodes = new Map<string, LabNode>();
  /** Namespaces and host interfaces made so far, including those of a node whose setup failed half way. */
  private readonly namespaces = new Set<string>();
  private readonly hostIfs = new Set<string>();
  private readonly children = new Set<ChildProcess>();
  private disposing: Promise<void> | null = null;

  private constructor(init: { name: string; prefix: string; base: number; lockPath: string }) {
    this.name = init.name;
    this.prefix = init.prefix;
    this.base = init.base;
    this.subnet = `${intToIp(init.base)}/24`;
    this.lockPath = init.lockPath;
  }

  /**
   * Whether this machine can run a lab: root, `ip` and `tc` present, and a
   * namespace with a veth link and a tbf qdisc can really be made (a probe
   * lab is made and removed).
   */
  static async available(): Promise<NetLabAvailability> {
    if (process.platform !== 'linux') return { ok: false, reason: `network namespaces need Linux; this is ${process.platform}` };
    if (typeof process.getuid === 'function' && process.getuid() !== 0) {
      return { ok: false, reason: `not running as root (uid ${process.getuid()}); ${ROOT_HINT}` };
    }
    for (const cmd of ['ip', 'tc']) {
      try {
        await run(cmd, ['-V']);
      } catch (e) {
        return { ok: false, reason: (e as Error).message };
      }
    }
    const probe = `hetps-probe-${process.pid.toString(36)}-${Math.floor(Math.random() * 36 ** 4).toString(36)}`;
    const suffix = Math.floor(Math.random() * 36 ** 5).toString(36).padStart(5, '0');
    const hostIf = `hpb${suffix}h`;
    try {
      await run('ip', ['netns', 'add', probe]);
      await run('ip', ['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', `hpb${suffix}n`, 'netns', probe]);
      await run('ip', ['netns', 'exec', probe, 'tc', 'qdisc', 'add', 'dev', 'lo', 'root', 'tbf', 'rate', '1mbit', 'burst', '32kb', 'latency', '50ms']);
      return { ok: true };
    } catch (e) {
      return { ok: false, reason: (e as Error).message };
    } finally {
      runSyncQuiet('ip', ['link', 'delete', hostIf]);
      runSyncQuiet('ip', ['netns', 'delete', probe]);
    }
  }

  /** A new, empty lab with its own /24 and name prefix. */
  static async create(opts: NetLabOptions = {}): Promise<NetLab> {
    const name = opts.name ?? 'lab';
    const dir = lockDir();
    sweepDeadLabs(dir);
    const startTime = processStartTime(process.pid);
    for (let attempt = 0; attempt < CREATE_ATTEMPTS; attempt++) {
      const slot = Math.floor(Math.random() * LAB_SLOTS);
      // 'l' + 4 base-36 digits: 36^4 > LAB_SLOTS, so the prefix names the slot.
      const prefix = `l${slot.toString(36).padStart(4, '0')}`;
      const base = ((10 << 24) | ((FIRST_OCTET2 + (slot >> 8)) << 16) | ((slot & 255) << 8)) >>> 0;
      const lockPath = join(dir, `${prefix}.json`);
      const lock: LockFile = { lab: name, prefix, subnet: `${intToIp(base)}/24`, pid: process.pid, start_time: startTime };
      try {
        writeFileSync(lockPath, JSON.stringify(lock) + '\n', { flag: 'wx' });
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === 'EEXIST') continue; // another lab has it
        throw new HetpsError(`cannot write the network lab's lock file ${lockPath}: ${(e as Error).message}; ${ROOT_HINT}`, { cause: e });
      }
      try {
        const leftovers = (await run('ip', ['-o', 'link', 'show'])).includes(`: ${prefix}`) ||
          (await run('ip', ['netns', 'list'])).includes(`hetps-${prefix}-`);
        if (leftovers || await subnetInUse(base)) {
          rmSync(lockPath, { force: true });
          continue;
        }
      } catch (e) {
        rmSync(lockPath, { force: true });
        throw e;
      }
      const lab = new NetLab({ name, prefix, base, lockPath });
      hook(lab);
      return lab;
    }
    throw new HetpsError(
      `network lab ${JSON.stringify(name)}: no free 10.200-253.x.0/24 found in ${CREATE_ATTEMPTS} tries; ` +
      `other labs hold them or the host routes them. \`ls ${dir}\` lists the labs; \`ip -4 route\` shows the routes.`,
    );
  }

  /** The node called `name`; a ConfigError naming the lab's nodes when there is none. */
  node(name: string): LabNode {
    const n = this.nodes.get(name);
    if (!n) {
      const known = [...this.nodes.keys()];
      throw new ConfigError(`network lab ${this.name} has no node ${JSON.stringify(name)}; its nodes are ${known.length ? known.join(', ') : '(none yet: addNode first)'}`);
    }
    return n;
  }

  /**
   * A namespace `hetps-<prefix>-<name>` on a veth link to the host: addresses
   * on both ends, `lo` up, default route via the host end.
   */
  async addNode(name: string): Promise<LabNode> {
    this.assertOpen();
    if (!/^[A-Za-z0-9_-]{1,32}$/.test(name)) {
      throw new ConfigError(`lab node names are 1-32 of [A-Za-z0-9_-], got ${JSON.stringify(name)}`);
    }
    if (this.nodes.has(name)) throw new ConfigError(`network lab ${this.name} already has a node ${JSON.stringify(name)}`);
    const index = this.nodes.size;
    if (index >= MAX_NODES) throw new ConfigError(`network lab ${this.name} is full: ${MAX_NODES} nodes per lab (one /30 each in a /24)`);
    const netns = `hetps-${this.prefix}-${name}`;
    const hostIf = `${this.prefix}h${index}`;
    const nodeIf = `${this.prefix}n${index}`;
    const hostIp = intToIp(this.base + 4 * index + 1);
    const nodeIp = intToIp(this.base + 4 * index + 2);
    // Recorded once made (never before: a failed `add` must not lead to deleting a namesake).
    await run('ip', ['netns', 'add', netns]);
    this.namespaces.add(netns);
    try {
      await run('ip', ['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', nodeIf, 'netns', netns]);
      this.hostIfs.add(hostIf);
      await run('ip', ['addr', 'add', `${hostIp}/30`, 'dev', hostIf]);
      await run('ip', ['link', 'set', hostIf, 'up']);
      await run('ip', ['-n', netns, 'link', 'set', 'lo', 'up']);
      await run('ip', ['-n', netns, 'addr', 'add', `${nodeIp}/30`, 'dev', nodeIf]);
      await run('ip', ['-n', netns, 'link', 'set', nodeIf, 'up']);
      await run('ip', ['-n', netns, 'route', 'add', 'default', 'via', hostIp]);
    } catch (e) {
      if (this.hostIfs.has(hostIf)) await this.removeLink(hostIf).catch(() => undefined);
      await this.removeNamespace(netns).catch(() => undefined);
      throw e;
    }
    const node: LabNode = { name, netns, hostIp, nodeIp, hostIf, nodeIf };
    this.nodes.set(name, node);
    return { ...node };
  }

  /**
   * `child_process.spawn(command, args, options)` inside the node's
   * namespace (through `ip netns exec`, which execs the command: the child's
   * pid is the command's). Killed on dispose.
   */
  spawn(name: string, command: string, args: readonly string[] = [], options: SpawnOptions = {}): ChildProcess {
    this.assertOpen();
    const n = this.node(name);
    const child = spawn('ip', ['netns', 'exec', n.netns, command, ...args], options);
    this.children.add(child);
    child.once('exit', () => this.children.delete(child));
    child.once('error', () => this.children.delete(child));
    return child;
  }

  /** Takes the host end of the node's link down: nothing passes either way until `heal`. */
  async cut(name: string): Promise<void> {
    const n = this.node(name);
    await run('ip', ['link', 'set', n.hostIf, 'down']);
  }

  /** Brings the host end back up (its address and route come back with it). */
  async heal(name: string): Promise<void> {
    const n = this.node(name);
    await run('ip', ['link', 'set', n.hostIf, 'up']);
  }

  /** Whether the host end of the node's link is up (not cut). */
  async isUp(name: string): Promise<boolean> {
    const n = this.node(name);
    const out = await run('ip', ['-o', 'link', 'show', 'dev', n.hostIf]);
    return /<[^>]*\bUP\b[^>]*>/.test(out);
  }

  /**
   * Limits the node's link to `mbps` megabits per second in both directions:
   * a tbf qdisc on the host end (traffic to the node) and on the namespace
   * end (traffic from it). Replaces an earlier limit.
   */
  async rateLimit(name: string, mbps: number, opts: RateLimitOptions = {}): Promise<void> {
    const n = this.node(name);
    if (!Number.isFinite(mbps) || mbps <= 0) throw new ConfigError(`rate must be a positive number of Mbit/s, got ${mbps}`);
    const latencyMs = opts.latencyMs ?? 100;
    if (!Number.isFinite(latencyMs) || latencyMs <= 0) throw new ConfigError(`latencyMs must be a positive number, got ${latencyMs}`);
    // tbf needs a bucket of at least one full-size packet and one timer tick of traffic.
    const burstKb = opts.burstKb ?? Math.max(16, Math.ceil((mbps * 1e6 / 8) * 0.01 / 1024));
    if (!Number.isFinite(burstKb) || burstKb < 2) throw new ConfigError(`burstKb must be at least 2 (one full-size packet), got ${burstKb}`);
    const tbf = ['root', 'tbf', 'rate', `${Math.round(mbps * 1000)}kbit`, 'burst', `${Math.round(burstKb)}kb`, 'latency', `${Math.round(latencyMs)}ms`];
    await run('tc', ['qdisc', 'replace', 'dev', n.hostIf, ...tbf]);
    await run('ip', ['netns', 'exec', n.netns, 'tc', 'qdisc', 'replace', 'dev', n.nodeIf, ...tbf]);
  }

  /** Removes the node's rate limit on both ends (none set is fine). */
  async clearRate(name: string): Promise<void> {
    const n = this.node(name);
    const none = /no such file|cannot delete qdisc with handle of zero|invalid handle|not found/i;
    await runIgnoring('tc', ['qdisc', 'del', 'dev', n.hostIf, 'root'], none);
    await runIgnoring('ip', ['netns', 'exec', n.netns, 'tc', 'qdisc', 'del', 'dev', n.nodeIf, 'root'], none);
  }

  /**
   * Kills what the lab spawned (SIGTERM, then SIGKILL after a second) and any
   * other process left in its namespaces, deletes its veths and namespaces
   * and frees its /24. Safe to call more than once; throws, after trying
   * everything, if something could not be removed.
   */
  dispose(): Promise<void> {
    this.disposing ??= this.disposeAsync();
    return this.disposing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.dispose();
  }

  /** @internal the exit hook's synchronous, best-effort dispose. */
  disposeSync(): void {
    for (const c of this.children) {
      try { c.kill('SIGKILL'); } catch { /* gone */ }
    }
    for (const ns of this.namespaces) {
      for (const pid of runSyncQuiet('ip', ['netns', 'pids', ns]).split(/\s+/).filter(Boolean)) {
        try { process.kill(Number(pid), 'SIGKILL'); } catch { /* gone */ }
      }
    }
    for (const i of this.hostIfs) runSyncQuiet('ip', ['link', 'delete', i]);
    for (const ns of this.namespaces) runSyncQuiet('ip', ['netns', 'delete', ns]);
    this.hostIfs.clear();
    this.namespaces.clear();
    rmSync(this.lockPath, { force: true });
    unhook(this);
  }

  private async disposeAsync(): Promise<void> {
    const failures: string[] = [];
    const children = [...this.children];
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
    const deadline = Date.now() + KILL_GRACE_MS;
    while (children.some((c) => c.exitCode === null && c.signalCode === null) && Date.now() < deadline) await sleep(25);
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    for (const ns of this.namespaces) {
      try {
        const pids = (await run('ip', ['netns', 'pids', ns])).split(/\s+/).filter(Boolean);
        for (const pid of pids) {
          try { process.kill(Number(pid), 'SIGKILL'); } catch { /* gone */ }
        }
      } catch { /* namespace gone already */ }
    }
    for (const i of [...this.hostIfs]) {
      try { await this.removeLink(i); } catch (e) { failures.push((e as Error).message); }
    }
    for (const ns of [...this.namespaces]) {
      try { await this.removeNamespace(ns); } catch (e) { failures.push((e as Error).message); }
    }
    rmSync(this.lockPath, { force: true });
    unhook(this);
    if (failures.length > 0) {
      throw new HetpsError(`network lab ${this.name} (${this.prefix}, ${this.subnet}) left things behind:\n${failures.join('\n')}`);
    }
  }

  /** Deleting one end of a veth deletes both; done before the namespace so nothing lingers while it is torn down. */
  private async removeLink(hostIf: string): Promise<void> {
    await runIgnoring('ip', ['link', 'delete', hostIf], GONE);
    this.hostIfs.delete(hostIf);
  }

  private async removeNamespace(netns: string): Promise<void> {
    await runIgnoring('ip', ['netns', 'delete', netns], GONE);
    this.namespaces.delete(netns);
  }

  private assertOpen(): void {
    if (this.disposing) throw new ConfigError(`network lab ${this.name} (${this.prefix}) was disposed`);
  }
}
