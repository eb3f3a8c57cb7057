/**
 * The node processes `hetps up` starts: one `hetps launch …` child per node
 * of the YAML, each line of its output shown with the node's name in front
 * (JSON log lines rendered as one short line) and kept whole in
 * `<run dir>/logs/<node>.log`.
 *
 * A child is not tied to this process's life: it writes its output straight
 * into its log file (this process follows the file; no pipe that would break
 * under it) and is not told this process's pid, so a driver that is
 * SIGKILLed leaves its nodes training while a standby scheduler takes the job
 * over (deploy/run-job.ts). Nodes end on the job's shutdown message, on
 * SIGTERM / SIGINT (the driver's Ctrl-C handler sends SIGTERM to each; a
 * terminal's Ctrl-C reaches them too, as they share its process group).
 */
import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { closeSync, fstatSync, mkdirSync, openSync, readSync } from 'node:fs';
import { join } from 'node:path';
import { StringDecoder } from 'node:string_decoder';
import { fileURLToPath } from 'node:url';
import { pino, type Logger } from 'pino';
import { resolveLogLevel } from '../runtime/mod.ts';

const BIN = fileURLToPath(new URL('../bin/hetps.mjs', import.meta.url));

/**
 * V8 flags for every node process. Shards and workers turn over hundreds of
 * KB of short-lived typed arrays per push and pull; with V8's default 16 MiB
 * semi-spaces they scavenge (and promote) several times a window. 64 MiB
 * halved a shard's time to apply a push on the quick start (p50 28 → 14 ms),
 * and every push in flight is something a checkpoint's pause waits for. A
 * node started by hand takes the same flag:
 * `node --max-semi-space-size=64 bin/hetps.mjs launch …`.
 */
export const NODE_PROCESS_FLAGS: readonly string[] = ['--max-semi-space-size=64'];

const LEVEL_NAMES: Record<number, string> = { 10: 'TRACE', 20: 'DEBUG', 30: 'INFO', 40: 'WARN', 50: 'ERROR', 60: 'FATAL' };

/** A pino JSON line as `LEVEL message key=value …`; other lines as they are. */
export function renderLogLine(line: string): string {
  if (!line.startsWith('{')) return line;
  let o: Record<string, unknown>;
  try { o = JSON.parse(line) as Record<string, unknown>; } catch { return line; }
  if (typeof o.msg !== 'string' && typeof o.level !== 'number') return line;
  const { level, msg, time: _t, pid: _p, hostname: _h, name: _n, node: _node, actor, err, ...rest } = o;
  const parts = [`${(LEVEL_NAMES[level as number] ?? String(level)).padEnd(5)}`];
  if (typeof actor === 'string') parts.push(`(${actor})`);
  parts.push(typeof msg === 'string' ? msg : '');
  const extra = Object.entries(rest).map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`);
  if (err && typeof err === 'object') extra.push(`err=${String((err as { message?: unknown }).message ?? JSON.stringify(err))}`);
  return [...parts, ...extra].join(' ');
}

/**
 * A logger whose lines go through `print` as `[node] LEVEL message …` (node:
 * the `node` binding of a child logger, else `name`), so the driver's own
 * nodes (embedded mode) read like the children's and share the progress line.
 */
export function lineLogger(level: string, name: string, print: (line: string) => void): Logger {
  return pino({ level: resolveLogLevel(level), name }, {
    write(chunk: string) {
      for (const line of chunk.split('\n')) {
        if (!line) continue;
        let node = name;
        try { const o = JSON.parse(line) as { node?: unknown }; if (typeof o.node === 'string') node = o.node; } catch { /* plain line */ }
        print(`[${node}] ${renderLogLine(line)}`);
      }
    },
  });
}

export interface NodeProcessSpec {
  name: string;
  role: 'server' | 'worker';
  args: string[];
  /** Starts the child instead of `child_process.spawn` (same arguments): e.g. `NetLab.spawn` into the node's namespace. */
  spawn?: (command: string, args: readonly string[], options: SpawnOptions) => ChildProcess;
}

export interface NodeProcess {
  readonly spec: NodeProcessSpec;
  readonly child: ChildProcess;
  /** Set once the process has exited. */
  exit: { code: number | null; signal: NodeJS.Signals | null } | null;
  readonly exited: Promise<void>;
}

/** Follows a file that another process appends to, line by line, from `from` bytes on. */
class LogTail {
  private readonly fd: number;
  private pos: number;
  private partial = '';
  private readonly buf = Buffer.alloc(64 * 1024);
  /** Keeps a character split between two reads whole. */
  private readonly decoder = new StringDecoder('utf8');
  private closed = false;

  constructor(file: string, from: number, private readonly onLine: (line: string) => void) {
    this.fd = openSync(file, 'r');
    this.pos = from;
  }

  /** Reads what was appended since the last call. */
  read(): void {
    if (this.closed) return;
    for (;;) {
      let n: number;
      try { n = readSync(this.fd, this.buf, 0, this.buf.length, this.pos); } catch { return; }
      if (n <= 0) return;
      this.pos += n;
      const text = this.partial + this.decoder.write(this.buf.subarray(0, n));
      const lines = text.split('\n');
      this.partial = lines.pop() ?? '';
      for (const line of lines) this.onLine(line);
    }
  }

  /** The rest, a last unterminated line included; then stops. */
  close(): void {
    if (this.closed) return;
    this.read();
    this.partial += this.decoder.end();
    if (this.partial) this.onLine(this.partial);
    this.partial = '';
    this.closed = true;
    try { closeSync(this.fd); } catch { /* closed */ }
  }
}

/** How often the children's log files are read for new lines. */
const TAIL_MS = 200;

export class NodeProcesses {
  readonly nodes: NodeProcess[] = [];
  private readonly tails = new Set<LogTail>();
  private readonly ticker: ReturnType<typeof setInterval>;

  constructor(private readonly logDir: string, private readonly print: (line: string) => void, private readonly env: NodeJS.ProcessEnv = {}) {
    mkdirSync(logDir, { recursive: true });
    this.ticker = setInterval(() => { for (const t of this.tails) t.read(); }, TAIL_MS);
    this.ticker.unref();
  }

  start(spec: NodeProcessSpec): NodeProcess {
    const file = join(this.logDir, `${spec.name}.log`);
    const env: NodeJS.ProcessEnv = { ...process.env, ...this.env };
    // Nodes are not tied to the driver's process (a standby may take the job over): they end on the job's shutdown, or after a minute without any scheduler heartbeat (cli/launch.ts).
    delete env.HETPS_PARENT_PID;
    const fd = openSync(file, 'a');
    let child: ChildProcess;
    let from: number;
    try {
      from = fstatSync(fd).size;
      child = (spec.spawn ?? spawn)(process.execPath, [...NODE_PROCESS_FLAGS, BIN, 'launch', ...spec.args], { stdio: ['ignore', fd, fd], env });
    } finally {
      closeSync(fd);
    }
    const tail = new LogTail(file, from, (line) => this.print(`[${spec.name}] ${renderLogLine(line)}`));
    this.tails.add(tail);
    const finish = () => { tail.close(); this.tails.delete(tail); };
    const node: NodeProcess = {
      spec, child, exit: null,
      exited: new Promise<void>((resolve) => {
        child.once('exit', (code, signal) => { node.exit = { code, signal }; finish(); resolve(); });
        child.once('error', (e) => { this.print(`[${spec.name}] could not start: ${e.message}`); node.exit ??= { code: -1, signal: null }; finish(); resolve(); });
      }),
    };
    this.nodes.push(node);
    return node;
  }

  running(role: 'server' | 'worker' | null = null): NodeProcess[] {
    return this.nodes.filter((n) => n.exit === null && (role === null || n.spec.role === role));
  }

  /** Waits up to `graceMs` for every child to exit on its own, then SIGTERM, then SIGKILL. */
  async stop(graceMs: number): Promise<void> {
    const wait = (ms: number) => Promise.race([
      Promise.all(this.nodes.map((n) => n.exited)),
      new Promise((r) => setTimeout(r, ms).unref()),
    ]);
    await wait(graceMs);
    for (const n of this.running()) n.child.kill('SIGTERM');
    await wait(5_000);
    for (const n of this.running()) n.child.kill('SIGKILL');
    await wait(2_000);
    this.close();
  }

  /** Immediately, for Ctrl-C: SIGTERM everything. */
  killAll(signal: NodeJS.Signals = 'SIGTERM'): void {
    for (const n of this.running()) n.child.kill(signal);
  }

  /** Stops following the log files (what is in them so far is printed). */
  close(): void {
    clearInterval(this.ticker);
    for (const t of this.tails) t.close();
    this.tails.clear();
  }
}
