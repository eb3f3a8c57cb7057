/**
 * The node processes `hetps up` starts: one `hetps launch …` child per node
 * of the YAML, each line of its output shown with the node's name in front
 * (JSON log lines rendered as one short line) and kept whole in
 * `<run dir>/logs/<node>.log`. Children learn the driver's pid and exit when
 * it is gone, so a killed driver leaves nothing behind.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync, type WriteStream } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { pino, type Logger } from 'pino';
import { resolveLogLevel } from '../runtime/mod.ts';

const BIN = fileURLToPath(new URL('../bin/hetps.mjs', import.meta.url));

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
}

export interface NodeProcess {
  readonly spec: NodeProcessSpec;
  readonly child: ChildProcess;
  /** Set once the process has exited. */
  exit: { code: number | null; signal: NodeJS.Signals | null } | null;
  readonly exited: Promise<void>;
}

export class NodeProcesses {
  readonly nodes: NodeProcess[] = [];
  private readonly logs: WriteStream[] = [];

  constructor(private readonly logDir: string, private readonly print: (line: string) => void, private readonly env: NodeJS.ProcessEnv = {}) {
    mkdirSync(logDir, { recursive: true });
  }

  start(spec: NodeProcessSpec): NodeProcess {
    const child = spawn(process.execPath, [BIN, 'launch', ...spec.args], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ...this.env, HETPS_PARENT_PID: String(process.pid) },
    });
    const log = createWriteStream(join(this.logDir, `${spec.name}.log`), { flags: 'a' });
    this.logs.push(log);
    const node: NodeProcess = {
      spec, child, exit: null,
      exited: new Promise<void>((resolve) => {
        child.once('exit', (code, signal) => { node.exit = { code, signal }; resolve(); });
        child.once('error', (e) => { this.print(`[${spec.name}] could not start: ${e.message}`); node.exit ??= { code: -1, signal: null }; resolve(); });
      }),
    };
    for (const stream of [child.stdout!, child.stderr!]) {
      createInterface({ input: stream }).on('line', (line) => {
        log.write(`${line}\n`);
        this.print(`[${spec.name}] ${renderLogLine(line)}`);
      });
    }
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
    await Promise.all(this.logs.map((l) => new Promise<void>((r) => l.end(() => r()))));
  }

  /** Immediately, for Ctrl-C: SIGTERM everything (children exit on their own if this process dies first). */
  killAll(signal: NodeJS.Signals = 'SIGTERM'): void {
    for (const n of this.running()) n.child.kill(signal);
  }
}
