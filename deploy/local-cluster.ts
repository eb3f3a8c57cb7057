/**
 * Local NATS cluster launcher: N `nats-server` processes on this machine with
 * routes (full mesh), JetStream and monitoring, each with its own directory
 * (`DIR/<name>/nats.conf`, `nats.log`, `nats.pid`, `js/`), described by
 * `DIR/cluster.json` so a later process can report on it or stop it.
 *
 * Port modes, per kind (client / cluster / http):
 * - a fixed base: node i (0-based) gets base + i; every port is checked free
 *   before anything starts, so a clash fails fast with the port named.
 * - null (random): client and http ports are `-1` (nats-server picks) and read
 *   back from the ports file it writes. Cluster ports are reserved here
 *   (bind :0, read, close) because nats-server 2.9 refuses to start clustered
 *   JetStream without a configured route ("JetStream cluster requires
 *   configured routes"), so node 1 cannot start alone on `-1` and gossip the
 *   rest in; if another process grabs a reserved port in that short window the
 *   start is retried with fresh ports.
 * After the first start every node's config is rewritten with its actual
 * ports, so `restart(name)` brings a node back on the same URLs.
 *
 * Client ports listen on 127.0.0.1 unless `listenHost` says otherwise (e.g.
 * '0.0.0.0', so node processes in a network namespace of deploy/netlab.ts
 * reach the cluster through their link's host address: `urlsFor(hostIp)`).
 * Route and monitoring ports always stay on 127.0.0.1.
 *
 * Durability (no `sync_interval`). JetStream acknowledges a write once it
 * is in the page cache of a quorum of the stream's replicas, not once it is
 * on disk. nats-server 2.10 added `jetstream { sync_interval: <duration> |
 * always }` to choose how often the file store fsyncs; 2.9 (Debian ships
 * 2.9.10) refuses the field (`unknown field "sync_interval"`, from both
 * `nats-server -t` and a real start), so none is written here. A 2.9 file
 * store fsyncs on a fixed 2-minute background timer and otherwise leaves
 * write-back to the kernel (strace on 2.9.10: a message acknowledged at t
 * reached fsync 115 s later, on the tick 120 s after its stream was made).
 * hetps relies on replication instead: the batch queue and the KV buckets
 * are R3 on the 3 local servers (actors/store/replicas.ts), so an
 * acknowledged write is in the page cache of at least 2 servers and one
 * server dying (SIGKILL, crash) loses nothing; see
 * test/integration/jetstream-durability.test.ts. All three losing power at
 * once (here: the one machine they share) can lose up to the last two
 * minutes of acknowledged writes. On nats-server 2.10 or later, add
 * `sync_interval` to renderConf to narrow that window.
 *
 * Imports only node builtins and runtime/errors.ts: it runs before anything
 * else of ours exists (CLI `hetps nats up`, test harness).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, closeSync, constants as fsConstants, existsSync, openSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { request } from 'node:http';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { ConfigError, HetpsError, MissingDependencyError, PortInUseError, TimeoutError } from '../runtime/errors.ts';

// Node 20.20 has it; older 20.x builds do not. Symbol.for keeps this runtime-free.
(Symbol as { asyncDispose?: symbol }).asyncDispose ??= Symbol.for('Symbol.asyncDispose');

/** One node of a local cluster, as written to `DIR/cluster.json`. */
export interface LocalClusterNode {
  name: string;
  pid: number;
  client_url: string;
  /** null for a single-node "cluster" (no cluster block, no routes). */
  cluster_port: number | null;
  http_port: number;
  conf: string;
  log: string;
}

export interface LocalClusterFile {
  cluster_name: string;
  jetstream: boolean;
  /** Address the client ports listen on; absent in files of older versions (127.0.0.1). */
  listen_host?: string;
  nodes: LocalClusterNode[];
}

export interface NodeStatus {
  name: string;
  client_url: string;
  /** Distinct servers this node has a route to (0 when it is not running). */
  routes: number;
  running: boolean;
}

export interface ClusterStatus {
  nodes: NodeStatus[];
}

export interface StopReport {
  nodes: { name: string; pid: number; was_running: boolean; stopped_with: 'SIGTERM' | 'SIGKILL' | null }[];
}

export interface StartLocalClusterOptions {
  nodes: number;
  /** Where configs, logs and JetStream data go; a fresh temp dir (removed on dispose) when omitted. */
  dir?: string;
  /** Base client port (node i gets base + i); null or omitted: random. */
  clientPort?: number | null;
  /**
   * Address the client ports listen on (default '127.0.0.1'). '0.0.0.0'
   * also serves other interfaces, e.g. the veth links of deploy/netlab.ts;
   * `urlsFor(host)` gives the URLs as seen from there.
   */
  listenHost?: string;
  clusterPort?: number | null;
  httpPort?: number | null;
  /** Server max_payload in bytes; null or omitted: the NATS default (1 MiB). */
  maxPayload?: number | null;
  jetstream?: boolean;
  clusterName?: string;
  logger?: (line: string) => void;
  /** Let the servers outlive this process (a CLI that starts them and exits). */
  detached?: boolean;
  /** How long to wait for routes and JetStream on every node (default 20 s). */
  readyTimeoutMs?: number;
  /**
   * The servers' `authorization { … }` block (deploy/auth.ts renderAuthorization):
   * clients must log in and get only their role's subjects. null or omitted: open.
   */
  authorization?: string | null;
}

const CLUSTER_FILE = 'cluster.json';
const STOP_GRACE_MS = 5_000;
const POLL_MS = 200;
const RANDOM_START_ATTEMPTS = 3;
/** nats-server refuses a max_payload above max_pending (64 MiB by default). */
const MAX_PENDING = 64 * 1024 * 1024;

/** Path of the nats-server binary: `NATS_SERVER_BIN`, else `nats-server` on PATH. */
export function findNatsServer(): string {
  const fromEnv = process.env.NATS_SERVER_BIN;
  if (fromEnv) {
    if (isExecutable(fromEnv)) return fromEnv;
    throw new MissingDependencyError(
      `NATS_SERVER_BIN=${fromEnv} is not an executable file. ${installHint()}`,
      { data: { NATS_SERVER_BIN: fromEnv } },
    );
  }
  for (const d of (process.env.PATH ?? '').split(delimiter)) {
    if (!d) continue;
    const candidate = join(d, 'nats-server');
    if (isExecutable(candidate)) return candidate;
  }
  throw new MissingDependencyError(`nats-server was not found on PATH. ${installHint()}`);
}

function installHint(): string {
  return 'Install it with "apt-get install -y nats-server" (Debian/Ubuntu), or download a release from ' +
    'https://github.com/nats-io/nats-server/releases and set NATS_SERVER_BIN=/path/to/nats-server.';
}

function isExecutable(p: string): boolean {
  try {
    if (!statSync(p).isFile()) return false;
    accessSync(p, fsConstants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * True when `pid` is a live process (not a zombie) and, when `conf` is given
 * and /proc can tell, one started with that config — so a recycled pid is
 * never mistaken for (or killed as) one of our servers.
 */
export function processAlive(pid: number, conf?: string): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  try {
    // A killed child whose parent exited may linger as a zombie where PID 1 does not reap.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    if (state === 'Z' || state === 'X') return false;
    if (conf !== undefined) {
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
      if (!cmdline.includes(conf)) return false;
    }
  } catch {
    // No /proc (macOS) or the process just went away: trust kill(0).
  }
  return true;
}

// ---------------------------------------------------------------------------
// Children of this process that must not outlive it (non-detached starts).

const liveChildren = new Set<number>();
let exitHookInstalled = false;

function trackChild(pid: number): void {
  liveChildren.add(pid);
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    process.on('exit', () => {
      for (const p of liveChildren) {
        try { process.kill(p, 'SIGKILL'); } catch { /* already gone */ }
      }
    });
  }
}

// ---------------------------------------------------------------------------
// Config.

interface NodePlan {
  name: string;
  dir: string;
  conf: string;
  log: string;
  /** -1: let nats-server pick. */
  clientPort: number;
  httpPort: number;
  clusterPort: number | null;
  routes: string[];
}

interface ConfShared {
  clusterName: string;
  listenHost: string;
  maxPayload: number | null;
  jetstream: boolean;
  authorization: string | null;
}

function renderConf(p: NodePlan, shared: ConfShared, note: string): string {
  const q = (s: string) => JSON.stringify(s);
  const lines = [
    `# Written by hetps (deploy/local-cluster.ts). ${note}`,
    `server_name: ${q(p.name)}`,
    `listen: ${q(hostPort(shared.listenHost, p.clientPort))}`,
    `http: ${q(`127.0.0.1:${p.httpPort}`)}`,
  ];
  if (shared.maxPayload !== null) lines.push(`max_payload: ${shared.maxPayload}`);
  lines.push(
    `ports_file_dir: ${q(p.dir)}`,
    `log_file: ${q(p.log)}`,
    `pid_file: ${q(join(p.dir, 'nats.pid'))}`,
  );
  if (p.clusterPort !== null) {
    lines.push(
      'cluster {',
      `  name: ${q(shared.clusterName)}`,
      `  listen: ${q(`127.0.0.1:${p.clusterPort}`)}`,
      `  routes: [${p.routes.map(q).join(', ')}]`,
      '}',
    );
  }
  if (shared.authorization !== null) lines.push(shared.authorization.trimEnd());
  if (shared.jetstream) {
    // No sync_interval: nats-server 2.9 refuses it (see the top of this file).
    lines.push(
      'jetstream {',
      `  store_dir: ${q(join(p.dir, 'js'))}`,
      '  max_memory_store: 256MB',
      '  max_file_store: 1GB',
      '}',
    );
  }
  return lines.join('\n') + '\n';
}

// ---------------------------------------------------------------------------
// Small I/O helpers.

/** GET + JSON over node:http without keep-alive, so a CLI exits right after. */
function getJson(url: string, timeoutMs = 1_500): Promise<Record<string, unknown>> {
  return new Promise((resolvePromise, reject) => {
    const req = request(url, { agent: false, timeout: timeoutMs }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => { body += c; });
      res.on('end', () => {
        if ((res.statusCode ?? 0) >= 400) return reject(new Error(`${url}: HTTP ${res.statusCode}`));
        try { resolvePromise(JSON.parse(body) as Record<string, unknown>); } catch (e) { reject(e as Error); }
      });
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`${url}: no answer in ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end();
  });
}

function logTail(path: string, lines = 15): string {
  try {
    const text = readFileSync(path, 'utf8').trimEnd();
    if (!text) return '    (log is empty)';
    return text.split('\n').slice(-lines).map((l) => `    ${l}`).join('\n');
  } catch {
    return '    (no log written)';
  }
}

function portIsFree(port: number, host = '127.0.0.1'): Promise<boolean> {
  return new Promise((resolvePromise) => {
    const srv = createServer();
    srv.once('error', () => resolvePromise(false));
    srv.listen({ port, host, exclusive: true }, () => srv.close(() => resolvePromise(true)));
  });
}

/** Distinct free ports, held open together so they cannot coincide, then released. */
async function reservePorts(n: number): Promise<number[]> {
  const servers = await Promise.all(Array.from({ length: n }, () => new Promise<ReturnType<typeof createServer>>((res, rej) => {
    const s = createServer();
    s.once('error', rej);
    s.listen({ port: 0, host: '127.0.0.1', exclusive: true }, () => res(s));
  })));
  const ports = servers.map((s) => (s.address() as { port: number }).port);
  await Promise.all(servers.map((s) => new Promise<void>((r) => s.close(() => r()))));
  return ports;
}

function portOf(url: string): number {
  return Number(new URL(url).port);
}

/** `host:port`, with an IPv6 host in brackets. */
function hostPort(host: string, port: number): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

/** A wildcard listen address serves 127.0.0.1 too; a specific one only itself. */
function connectHost(listenHost: string): string {
  if (listenHost === '0.0.0.0') return '127.0.0.1';
  if (listenHost === '::') return '::1';
  return listenHost;
}

function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\./.test(host);
}

function clientUrl(host: string, port: number): string {
  return `nats://${hostPort(host, port)}`;
}

function removeStalePortsFiles(nodeDir: string): void {
  try {
    for (const f of readdirSync(nodeDir)) if (f.endsWith('.ports')) rmSync(join(nodeDir, f), { force: true });
  } catch { /* dir missing */ }
}

interface PortsFile { nats?: string[]; monitoring?: string[]; cluster?: string[] }

function readPortsFile(nodeDir: string, pid: number): PortsFile | null {
  const suffix = `_${pid}.ports`;
  let files: string[];
  try { files = readdirSync(nodeDir); } catch { return null; }
  const f = files.find((x) => x.endsWith(suffix));
  if (!f) return null;
  try {
    const parsed = JSON.parse(readFileSync(join(nodeDir, f), 'utf8')) as PortsFile;
    return parsed.nats?.[0] && parsed.monitoring?.[0] ? parsed : null;
  } catch {
    return null; // written but not complete yet
  }
}

function assertPortBase(value: number | null | undefined, flag: string, nodes: number): number | null {
  if (value === null || value === undefined) return null;
  if (!Number.isInteger(value) || value < 1 || value + nodes - 1 > 65535) {
    throw new ConfigError(`${flag} must be a port between 1 and ${65536 - nodes} (node i uses base + i), got ${value}. Use 0 for random ports.`, {
      data: { flag, value },
    });
  }
  return value;
}

// ---------------------------------------------------------------------------
// A running (or stopped) cluster.


/**
 * Handle on a local cluster, either started by this process (`startLocalCluster`)
 * or found on disk (`loadLocalCluster`). Processes are addressed by pid, checked
 * against their config path so a recycled pid is never signalled.
 */
export class LocalCluster implements AsyncDisposable {
  readonly dir: string;
  readonly clusterName: string;
  readonly jetstream: boolean;
  /** Address the client ports listen on ('127.0.0.1' unless started with `listenHost`). */
  readonly listenHost: string;
  readonly nodes: LocalClusterNode[];
  readonly readyTimeoutMs: number;
  /** Our own ChildProcess per node name, when this process started it. */
  private readonly children = new Map<string, ChildProcess>();
  private readonly detached: boolean;
  private readonly ownsDir: boolean;
  private readonly logger: (line: string) => void;
  private stopping: Promise<void> | null = null;

  /** @internal use startLocalCluster / loadLocalCluster */
  constructor(init: {
    dir: string; clusterName: string; jetstream: boolean; nodes: LocalClusterNode[]; detached: boolean; ownsDir: boolean;
    logger?: (line: string) => void; readyTimeoutMs?: number; listenHost?: string;
  }) {
    this.dir = init.dir;
    this.clusterName = init.clusterName;
    this.jetstream = init.jetstream;
    this.listenHost = init.listenHost ?? '127.0.0.1';
    this.nodes = init.nodes;
    this.detached = init.detached;
    this.ownsDir = init.ownsDir;
    this.logger = init.logger ?? (() => undefined);
    this.readyTimeoutMs = init.readyTimeoutMs ?? 20_000;
  }

  /** Client URLs as this machine reaches them (`nats://127.0.0.1:<port>` unless `listenHost` is one other address), in node order. */
  get urls(): string[] {
    return this.nodes.map((n) => n.client_url);
  }

  /**
   * Client URLs as seen from elsewhere: `nats://<host>:<port>` in node order,
   * e.g. `urlsFor(node.hostIp)` for a process in a deploy/netlab.ts
   * namespace. Needs a cluster started with a `listenHost` that serves
   * `host` ('0.0.0.0' serves every address of this machine).
   */
  urlsFor(host: string): string[] {
    const h = host.trim();
    if (!h) throw new ConfigError('urlsFor needs a host (an IP address or name), got an empty string');
    const wildcard = this.listenHost === '0.0.0.0' || this.listenHost === '::';
    if (!wildcard && h !== this.listenHost && !(isLoopback(h) && isLoopback(this.listenHost))) {
      throw new ConfigError(
        `the cluster at ${this.dir} listens for clients on ${this.listenHost} only, so ${h} would not reach it; ` +
        `start it with listenHost: '0.0.0.0' (or '${h}')`,
        { data: { listenHost: this.listenHost, host: h } },
      );
    }
    return this.nodes.map((n) => clientUrl(h, portOf(n.client_url)));
  }

  node(name: string): LocalClusterNode {
    const n = this.nodes.find((x) => x.name === name);
    if (!n) throw new ConfigError(`no node named ${JSON.stringify(name)} in the cluster at ${this.dir}; nodes are ${this.nodes.map((x) => x.name).join(', ')}`);
    return n;
  }

  isRunning(name: string): boolean {
    const n = this.node(name);
    return processAlive(n.pid, n.conf);
  }

  /**
   * Sends `signal` to a node. For terminating signals it resolves once the
   * process is gone, so a status read right after sees it down.
   */
  async kill(name: string, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const n = this.node(name);
    if (!processAlive(n.pid, n.conf)) return;
    process.kill(n.pid, signal);
    if (signal === 'SIGKILL' || signal === 'SIGTERM' || signal === 'SIGINT' || signal === 'SIGQUIT') {
      await this.waitGone(n, signal === 'SIGKILL' ? 5_000 : STOP_GRACE_MS * 2);
    }
  }

  /** Stops the node if running, then starts it again with the same config and ports; waits for its routes. */
  async restart(name: string): Promise<void> {
    const n = this.node(name);
    if (processAlive(n.pid, n.conf)) await this.stopNode(n);
    const bin = findNatsServer();
    this.stopping = null; // a running node again: a later stop() must stop it
    removeStalePortsFiles(join(this.dir, n.name));
    n.pid = this.spawnNode(bin, n.name, n.conf, n.log);
    await this.writeClusterFile();
    const peers = this.nodes.filter((o) => o !== n && processAlive(o.pid, o.conf)).length;
    const deadline = Date.now() + this.readyTimeoutMs;
    await this.waitPortsFile(n, deadline);
    await this.waitReady([n], () => peers, deadline, this.jetstream);
  }

  async status(): Promise<ClusterStatus> {
    const nodes = await Promise.all(this.nodes.map(async (n): Promise<NodeStatus> => {
      const running = processAlive(n.pid, n.conf);
      let routes = 0;
      if (running) {
        try { routes = countRoutes(await getJson(`http://127.0.0.1:${n.http_port}/routez`)); } catch { /* starting or stuck */ }
      }
      return { name: n.name, client_url: n.client_url, routes, running };
    }));
    return { nodes };
  }

  /** SIGTERM every node, wait, SIGKILL what is left. Safe to call more than once. */
  stop(): Promise<void> {
    this.stopping ??= this.stopAll().then(() => undefined);
    return this.stopping;
  }

  /** @internal also used by stopLocalCluster for its report */
  async stopAll(): Promise<StopReport> {
    const report = await Promise.all(this.nodes.map(async (n) => {
      const wasRunning = processAlive(n.pid, n.conf);
      const how = wasRunning ? await this.stopNode(n) : null;
      return { name: n.name, pid: n.pid, was_running: wasRunning, stopped_with: how };
    }));
    return { nodes: report };
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
    if (this.ownsDir) await rm(this.dir, { recursive: true, force: true });
  }

  // --- internals shared with startLocalCluster ---

  /** @internal */
  spawnNode(bin: string, name: string, conf: string, log: string): number {
    const fd = openSync(log, 'a');
    let child: ChildProcess;
    try {
      child = spawn(bin, ['-c', conf], { stdio: ['ignore', fd, fd], detached: this.detached });
    } finally {
      closeSync(fd);
    }
    if (child.pid === undefined) {
      throw new HetpsError(`could not start ${bin} for node ${name}; see ${log}`);
    }
    const pid = child.pid;
    child.once('exit', () => liveChildren.delete(pid));
    child.once('error', () => undefined); // surfaces as an early exit
    if (this.detached) child.unref();
    else trackChild(pid);
    this.children.set(name, child);
    return pid;
  }

  /** @internal */
  hasExited(name: string): boolean {
    const n = this.node(name);
    const child = this.children.get(name);
    if (child && child.pid === n.pid) return child.exitCode !== null || child.signalCode !== null;
    return !processAlive(n.pid, n.conf);
  }

  /** @internal */
  async waitPortsFile(n: LocalClusterNode, deadline: number): Promise<PortsFile> {
    const nodeDir = join(this.dir, n.name);
    for (;;) {
      const pf = readPortsFile(nodeDir, n.pid);
      if (pf) return pf;
      if (this.hasExited(n.name)) throw this.earlyExitError(n);
      if (Date.now() > deadline) {
        throw new TimeoutError(`nats-server for ${n.name} (pid ${n.pid}) wrote no ports file in time; see ${n.log}:\n${logTail(n.log)}`, {
          data: { node: n.name, log: n.log },
        });
      }
      await sleep(POLL_MS);
    }
  }

  /** @internal */
  earlyExitError(n: LocalClusterNode): HetpsError {
    const tail = logTail(n.log);
    const inUse = /address already in use/i.test(tail);
    const msg = `nats-server for ${n.name} exited during start-up; last lines of ${n.log}:\n${tail}`;
    return inUse
      ? new PortInUseError(`${msg}\nA port it needs is taken: pick other ports or stop the process holding it.`, { data: { node: n.name, log: n.log } })
      : new HetpsError(msg, { data: { node: n.name, log: n.log } });
  }

  /** @internal Polls /routez and /jsz until every node in `which` is ready. */
  async waitReady(which: LocalClusterNode[], peersOf: (n: LocalClusterNode) => number, deadline: number, jetstream: boolean): Promise<void> {
    const lastLine = new Map<string, string>();
    const pending = new Map<string, string>(which.map((n) => [n.name, 'starting']));
    for (;;) {
      await Promise.all(which.filter((n) => pending.has(n.name)).map(async (n) => {
        if (this.hasExited(n.name)) throw this.earlyExitError(n);
        const want = peersOf(n);
        let state: string;
        try {
          const routes = countRoutes(await getJson(`http://127.0.0.1:${n.http_port}/routez`));
          const js = jetstream ? jetstreamState(await getJson(`http://127.0.0.1:${n.http_port}/jsz`)) : 'ok';
          if (routes >= want && js === 'ok') {
            pending.delete(n.name);
            this.logger(`${n.name}: ready (${routes}/${want} routes${jetstream ? ', JetStream up' : ''})`);
            return;
          }
          state = `routes ${routes}/${want}${jetstream ? `, JetStream ${js}` : ''}`;
        } catch {
          state = 'monitoring endpoint not answering yet';
        }
        pending.set(n.name, state);
        if (lastLine.get(n.name) !== state) {
          lastLine.set(n.name, state);
          this.logger(`${n.name}: waiting (${state})`);
        }
      }));
      if (pending.size === 0) return;
      if (Date.now() > deadline) {
        // Log tails go into the message: a temp dir (and its logs) is removed once the start fails.
        const detail = [...pending].map(([name, state]) => {
          const log = this.node(name).log;
          return `  ${name}: ${state}; log ${log} ends:\n${logTail(log, 5)}`;
        }).join('\n');
        const secs = this.readyTimeoutMs / 1000;
        throw new TimeoutError(
          `NATS cluster not ready after ${secs < 10 ? secs.toFixed(1) : Math.round(secs)} s; not ready:\n${detail}\n` +
          'Check those logs; on a slow or busy machine allow more time (readyTimeoutMs).',
          { data: { notReady: [...pending.keys()] } },
        );
      }
      await sleep(POLL_MS);
    }
  }

  /** @internal */
  async writeClusterFile(): Promise<void> {
    const file: LocalClusterFile = { cluster_name: this.clusterName, jetstream: this.jetstream, listen_host: this.listenHost, nodes: this.nodes };
    await writeFile(join(this.dir, CLUSTER_FILE), JSON.stringify(file, null, 2) + '\n');
  }

  private async stopNode(n: LocalClusterNode): Promise<'SIGTERM' | 'SIGKILL'> {
    try { process.kill(n.pid, 'SIGTERM'); } catch { return 'SIGTERM'; }
    if (await this.waitGone(n, STOP_GRACE_MS)) return 'SIGTERM';
    try { process.kill(n.pid, 'SIGKILL'); } catch { /* gone meanwhile */ }
    await this.waitGone(n, 5_000);
    return 'SIGKILL';
  }

  private async waitGone(n: LocalClusterNode, timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (this.hasExited(n.name)) return true;
      await sleep(50);
    }
    return false;
  }
}

function countRoutes(routez: Record<string, unknown>): number {
  // Distinct remote servers: newer servers pool several connections per peer.
  const routes = routez.routes;
  if (Array.isArray(routes)) {
    return new Set(routes.map((r) => (r as { remote_id?: string }).remote_id).filter(Boolean)).size;
  }
  return typeof routez.num_routes === 'number' ? routez.num_routes : 0;
}

function jetstreamState(jsz: Record<string, unknown>): string {
  if (jsz.error) return `error: ${JSON.stringify(jsz.error)}`;
  if (jsz.disabled === true) return 'disabled';
  const meta = jsz.meta_cluster as { leader?: string } | undefined;
  if (meta && !meta.leader) return 'waiting for a meta leader';
  return 'ok';
}

// ---------------------------------------------------------------------------

/**
 * Starts an N-node local cluster and resolves once every node has routes to
 * all the others and JetStream answers (with a meta leader when clustered).
 * On failure everything it started is killed.
 */
export async function startLocalCluster(opts: StartLocalClusterOptions): Promise<LocalCluster> {
  const count = opts.nodes;
  if (!Number.isInteger(count) || count < 1 || count > 32) {
    throw new ConfigError(`nodes must be a whole number from 1 to 32, got ${count}`);
  }
  const clientBase = assertPortBase(opts.clientPort, '--port', count);
  const clusterBase = assertPortBase(opts.clusterPort, '--cluster-port', count);
  const httpBase = assertPortBase(opts.httpPort, '--http-port', count);
  const maxPayload = opts.maxPayload ?? null;
  if (maxPayload !== null && (!Number.isInteger(maxPayload) || maxPayload < 1 || maxPayload > MAX_PENDING)) {
    throw new ConfigError(
      `max payload must be a whole number of bytes from 1 to ${MAX_PENDING} (nats-server's max_pending), got ${maxPayload}; ` +
      'larger messages are chunked by the hetps runtime anyway.',
    );
  }
  const listenHost = (opts.listenHost ?? '127.0.0.1').trim();
  if (!listenHost || /[\s"]/.test(listenHost)) {
    throw new ConfigError(`listenHost must be an IP address such as 127.0.0.1 or 0.0.0.0, got ${JSON.stringify(opts.listenHost)}`);
  }
  const shared: ConfShared = { clusterName: opts.clusterName ?? 'hetps', listenHost, maxPayload, jetstream: opts.jetstream ?? true, authorization: opts.authorization ?? null };
  const logger = opts.logger ?? (() => undefined);
  const bin = findNatsServer();

  const ownsDir = opts.dir === undefined;
  const dir = ownsDir ? await mkdtemp(join(tmpdir(), 'hetps-nats-')) : resolve(opts.dir!);
  await mkdir(dir, { recursive: true });
  await refuseIfRunning(dir);

  const names = Array.from({ length: count }, (_, i) => `n${i + 1}`);
  const clustered = count > 1;

  // Fixed ports: distinct and free, checked before anything starts.
  const fixed: { port: number; node: string; kind: string; flag: string }[] = [];
  names.forEach((name, i) => {
    if (clientBase !== null) fixed.push({ port: clientBase + i, node: name, kind: 'client', flag: '--port' });
    if (clusterBase !== null && clustered) fixed.push({ port: clusterBase + i, node: name, kind: 'cluster (route)', flag: '--cluster-port' });
    if (httpBase !== null) fixed.push({ port: httpBase + i, node: name, kind: 'http (monitoring)', flag: '--http-port' });
  });
  const seen = new Map<number, string>();
  for (const f of fixed) {
    const other = seen.get(f.port);
    if (other) throw new ConfigError(`port ${f.port} would be used twice (${other} and ${f.kind} port of ${f.node}); choose bases at least ${count} apart.`);
    seen.set(f.port, `${f.kind} port of ${f.node}`);
  }
  for (const f of fixed) {
    const host = f.kind === 'client' ? listenHost : '127.0.0.1';
    if (!(await portIsFree(f.port, host))) {
      throw new PortInUseError(
        `port ${f.port} (${f.kind} port of ${f.node}) is already in use on ${host}. ` +
        `Pick another base with ${f.flag} (or --port 0 for random ports), or stop the process using it ` +
        `(\`ss -ltnp 'sport = :${f.port}'\` shows it; an earlier cluster stops with \`hetps nats down --dir DIR\`).`,
        { data: { port: f.port, node: f.node, kind: f.kind } },
      );
    }
  }

  const attempts = clustered && clusterBase === null ? RANDOM_START_ATTEMPTS : 1;
  for (let attempt = 1; ; attempt++) {
    const cluster = new LocalCluster({
      dir, clusterName: shared.clusterName, jetstream: shared.jetstream, nodes: [], detached: opts.detached ?? false, ownsDir, logger,
      readyTimeoutMs: opts.readyTimeoutMs ?? 20_000, listenHost,
    });
    try {
      await launch(cluster, bin, names, { clientBase, clusterBase, httpBase }, shared, logger);
      return cluster;
    } catch (e) {
      await cluster.stop().catch(() => undefined);
      const retry = e instanceof PortInUseError && attempt < attempts;
      if (!retry) {
        if (ownsDir) await rm(dir, { recursive: true, force: true }).catch(() => undefined);
        throw e;
      }
      logger(`a reserved route port was taken meanwhile; retrying with fresh ports (attempt ${attempt + 1}/${attempts})`);
    }
  }
}

async function launch(
  cluster: LocalCluster, bin: string, names: string[],
  bases: { clientBase: number | null; clusterBase: number | null; httpBase: number | null },
  shared: ConfShared, logger: (line: string) => void,
): Promise<void> {
  const { dir } = cluster;
  const clustered = names.length > 1;
  const started = Date.now();
  const clusterPorts: (number | null)[] = !clustered
    ? names.map(() => null)
    : bases.clusterBase !== null
      ? names.map((_, i) => bases.clusterBase! + i)
      : await reservePorts(names.length);

  const plans: NodePlan[] = names.map((name, i) => {
    const nodeDir = join(dir, name);
    return {
      name, dir: nodeDir, conf: join(nodeDir, 'nats.conf'), log: join(nodeDir, 'nats.log'),
      clientPort: bases.clientBase !== null ? bases.clientBase + i : -1,
      httpPort: bases.httpBase !== null ? bases.httpBase + i : -1,
      clusterPort: clusterPorts[i] ?? null,
      routes: clusterPorts.filter((_, j) => j !== i && clusterPorts[j] !== null).map((p) => `nats://127.0.0.1:${p}`),
    };
  });

  logger(`starting ${names.length} nats-server node${names.length > 1 ? 's' : ''} in ${dir}`);
  for (const p of plans) {
    await mkdir(join(p.dir, 'js'), { recursive: true });
    removeStalePortsFiles(p.dir);
    // 0600: with access control on, the configuration holds the users' passwords.
    await writeFile(p.conf, renderConf(p, shared, 'Ports are pinned to the actual ones once the node is up.'), { mode: 0o600 });
  }
  for (const p of plans) {
    const pid = cluster.spawnNode(bin, p.name, p.conf, p.log);
    cluster.nodes.push({
      name: p.name, pid, client_url: p.clientPort > 0 ? clientUrl(connectHost(shared.listenHost), p.clientPort) : '', cluster_port: p.clusterPort,
      http_port: p.httpPort > 0 ? p.httpPort : 0, conf: p.conf, log: p.log,
    });
  }
  // Written as soon as pids are known, so an interrupted start can still be stopped with `nats down`.
  await cluster.writeClusterFile();

  const deadline = Date.now() + cluster.readyTimeoutMs;
  for (const n of cluster.nodes) {
    const pf = await cluster.waitPortsFile(n, deadline);
    n.client_url = clientUrl(connectHost(shared.listenHost), portOf(pf.nats![0]!));
    n.http_port = portOf(pf.monitoring![0]!);
    logger(`${n.name}: pid ${n.pid}, client ${n.client_url}, monitoring http://127.0.0.1:${n.http_port}`);
  }
  await cluster.writeClusterFile();

  // Pin actual ports so restart(name) and `-c nats.conf` by hand bring the node back where it was.
  for (const [i, p] of plans.entries()) {
    const n = cluster.nodes[i]!;
    await writeFile(p.conf, renderConf({ ...p, clientPort: portOf(n.client_url), httpPort: n.http_port }, shared,
      'Ports pinned to those of the first start, so a restart keeps the same URLs.'));
  }

  await cluster.waitReady(cluster.nodes, () => names.length - 1, deadline, shared.jetstream);
  logger(`cluster ready in ${((Date.now() - started) / 1000).toFixed(1)} s: ${cluster.urls.join(',')}`);
}

export async function refuseIfRunning(dir: string): Promise<void> {
  const file = join(dir, CLUSTER_FILE);
  if (!existsSync(file)) return;
  let prev: LocalClusterFile;
  try {
    prev = JSON.parse(await readFile(file, 'utf8')) as LocalClusterFile;
  } catch {
    return; // unreadable leftovers get overwritten
  }
  const running = (prev.nodes ?? []).filter((n) => processAlive(n.pid, n.conf));
  if (running.length > 0) {
    throw new ConfigError(
      `a NATS cluster is already running from ${dir} (${running.map((n) => `${n.name} pid ${n.pid}`).join(', ')}). ` +
      `Stop it with \`hetps nats down --dir ${dir}\` or choose another --dir.`,
      { data: { dir, pids: running.map((n) => n.pid) } },
    );
  }
}

/** Reads `DIR/cluster.json` into a handle that can report on, kill, restart or stop those servers. */
export async function loadLocalCluster(dir: string): Promise<LocalCluster> {
  const abs = resolve(dir);
  const file = join(abs, CLUSTER_FILE);
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (e) {
    throw new ConfigError(
      `no local NATS cluster in ${abs} (${CLUSTER_FILE} not found). Start one with \`hetps nats up --dir ${dir}\`, or pass the --dir it was started with.`,
      { cause: e, data: { dir: abs } },
    );
  }
  let parsed: LocalClusterFile;
  try {
    parsed = JSON.parse(text) as LocalClusterFile;
    if (!Array.isArray(parsed.nodes)) throw new Error('no "nodes" array');
  } catch (e) {
    throw new ConfigError(`${file} is not a cluster description written by hetps (${(e as Error).message}); remove it and start again.`, { cause: e });
  }
  return new LocalCluster({
    dir: abs, clusterName: parsed.cluster_name ?? 'hetps', jetstream: parsed.jetstream ?? true, nodes: parsed.nodes,
    detached: true, ownsDir: false, listenHost: parsed.listen_host ?? '127.0.0.1',
  });
}

/** Per node: client URL, distinct routes and whether its process is running. */
export async function clusterStatus(dir: string): Promise<ClusterStatus> {
  return (await loadLocalCluster(dir)).status();
}

/** Stops the servers recorded in `DIR/cluster.json` (SIGTERM, then SIGKILL after a grace period). */
export async function stopLocalCluster(dir: string): Promise<StopReport> {
  return (await loadLocalCluster(dir)).stopAll();
}
