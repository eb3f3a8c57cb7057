/**
 * The monitor's web side, on `monitoring.port` (`hetps up --monitor-port`):
 *
 * - `/` — the live dashboard (actors/monitor/dashboard/): samples/s and the
 *   losses over time, groups and their gap, nodes with utilisation and
 *   health, a staleness histogram, shard load, bytes on the wire, the job's
 *   events, and buttons for pause / resume / checkpoint / regroup;
 * - `/api/stream` — server-sent events: a snapshot every second (what the
 *   page draws), and `event: end` once the job has ended (the page keeps its
 *   last state);
 * - `/api/snapshot` — the latest snapshot with the history so far (JSON);
 * - `POST /api/ctl/<command>` — a control command with a JSON body, sent to
 *   `hps.<job>.ctl.<command>` like any NATS client; the reply comes back;
 * - `/metrics` — Prometheus text format (metrics.ts);
 * - `/assets/…` — the page's script and style, and uPlot from the package
 *   (no CDN).
 *
 * It listens on 127.0.0.1 unless told otherwise (`--monitor-host`): the
 * buttons steer the job. With a token (`monitoring.auth: token`) every path
 * answers 401 unless the request carries it: `?token=` (the URL printed at
 * start; the page then sets an HttpOnly, SameSite=Strict cookie and drops
 * it from the address), the cookie, or `Authorization: Bearer <token>`
 * (scripts, Prometheus' scrape).
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { appendFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Logger, Transport } from '../../runtime/mod.ts';
import { compressionOffBelow, type CompressionChoice, type GradientCompressionSetting } from '../../topology/mod.ts';
import { requestControl, type JobStatus } from '../scheduler/scheduler.messages.ts';
import { JobMetrics, STALENESS_BUCKETS, groupProgress, statusOverControl } from './metrics.ts';
import { subscribeVerdicts, type MonitorActorDefinition } from './monitor.actor.ts';
import { subscribeEvents } from './monitor.messages.ts';
import { subscribeTelemetry } from './telemetry.ts';

/** The run's snapshots in its run directory, one JSON line a second (`hetps report RUN_DIR` draws them). */
export const TELEMETRY_LOG = 'telemetry.jsonl';

/** The control commands the page may send. */
export const DASHBOARD_COMMANDS = ['pause', 'resume', 'checkpoint', 'regroup', 'recover', 'status'] as const;
const HISTORY = 900;
const BODY_LIMIT = 64 * 1024;

export interface MonitorServerOptions {
  port: number;
  host?: string;
  /** Every request must carry it (monitoring.auth: token); null or absent: none asked for. */
  token?: string | null;
  job: string;
  transport: Transport;
  watch: JobWatch;
  log: Logger;
}

/** One point of the page's time series. */
export interface SeriesPoint { t_s: number; samples: number; samples_per_s: number; loss: number | null; test_loss: number | null; test_auc: number | null }

export interface Snapshot {
  job: string;
  at_ms: number;
  ended: boolean;
  status: JobStatus | null;
  groups: Record<string, { steps: number; gap: number }>;
  staleness: { le: number | null; count: number }[];
  wire: { bytes_out: number; bytes_in: number; compression: string };
  point: SeriesPoint;
}

const percent = (x: number) => `${Math.round(x * 1000) / 10} %`;

/**
 * The dashboard's wire line for communication.compression as the workers
 * apply it; with adaptive, also where the workers' choices stand now (from
 * their progress telemetry), when any has said.
 */
export function describeGradientCompression(setting: GradientCompressionSetting | null, choices: Iterable<CompressionChoice> = []): string {
  if (setting === null || setting.mode === null) return 'none (gradients are sent uncompressed)';
  if (setting.mode === 'fp16') return 'fp16 (gradients in pushes and group slices as scaled halves)';
  const rule = `adaptive: fp16 above ${percent(setting.threshold)} link utilisation (float32 again below ${percent(compressionOffBelow(setting.threshold))})`;
  const now = [...choices];
  return now.length === 0 ? rule : `${rule}; now fp16 on ${now.filter((c) => c === 'fp16').length} of ${now.length} workers`;
}

/** The dashboard's own files. */
export const dashboardAsset = (name: string) => join(dirname(fileURLToPath(import.meta.url)), 'dashboard', name);
const uplotDir = () => dirname(createRequire(import.meta.url).resolve('uplot/dist/uPlot.iife.min.js'));
/** What `/assets/<name>` serves, and its type: the page's script and style, and uPlot from its package. */
export const ASSET_TYPES: Record<string, string> = {
  'dashboard.js': 'text/javascript; charset=utf-8', 'dashboard.css': 'text/css; charset=utf-8',
  'uPlot.iife.min.js': 'text/javascript; charset=utf-8', 'uPlot.min.css': 'text/css; charset=utf-8',
};
export const assetPath = (name: string) => (name.startsWith('uPlot') ? join(uplotDir(), name) : dashboardAsset(name));

/**
 * The job as the dashboard and the run's telemetry log see it: a snapshot
 * every second (status over `ctl.status`, the rate over the last second, the
 * latest evaluation, the staleness histogram, bytes on the wire), the
 * history of points, the Prometheus metrics, and — given a file — every
 * snapshot appended to it as a JSON line (`<run dir>/telemetry.jsonl`, what
 * `hetps report` draws from).
 */
export class JobWatch {
  readonly metrics: JobMetrics;
  readonly history: SeriesPoint[] = [];
  latest: Snapshot | null = null;
  ended = false;
  private readonly unsubs: (() => void)[] = [];
  private readonly listeners = new Set<(s: Snapshot, ended: boolean) => void>();
  private timer: NodeJS.Timeout | null = null;
  private readonly wire = new Map<string, { out: number; in: number }>();
  /** Each worker's compression choice, as its latest progress telemetry said. */
  private readonly choices = new Map<string, CompressionChoice>();
  private readonly t0 = Date.now();
  private lastSamples = 0;
  private lastAt = Date.now();
  private testLoss: number | null = null;
  private testAuc: number | null = null;
  private readonly status: () => Promise<JobStatus | null>;
  private ticking: Promise<void> | null = null;

  constructor(private readonly o: {
    job: string; transport: Transport; monitor: MonitorActorDefinition; recordTo?: string | null; everyMs?: number;
    /** communication.compression as the workers apply it (gradientCompressionFromConfig); null or absent: float32. */
    compression?: GradientCompressionSetting | null;
  }) {
    this.status = statusOverControl(o.transport, o.job);
    // A scrape reads the status of the latest snapshot (at most a second old): no request of its own.
    this.metrics = new JobMetrics({ status: async () => this.latest?.status ?? null });
    this.unsubs.push(subscribeTelemetry(o.transport, o.job, {
      batch: (t) => this.metrics.batch(t),
      progress: (t) => {
        this.metrics.progress(t);
        this.wire.set(t.node, { out: t.bytes_out, in: t.bytes_in });
        if (t.compression !== null) this.choices.set(t.node, t.compression);
      },
    }));
    this.unsubs.push(subscribeEvents(o.transport, o.job, (e) => this.metrics.event(e)));
    this.unsubs.push(subscribeVerdicts(o.transport, o.job, (v) => this.metrics.verdict(v)));
    this.unsubs.push(o.monitor.training.onEvaluation((e) => {
      this.testLoss = e.logloss;
      this.testAuc = e.auc;
      this.metrics.evaluation(e);
    }));
    this.timer = setInterval(() => { void this.tick(); }, o.everyMs ?? 1_000);
    this.timer.unref();
  }

  /** Called with each snapshot (and `ended` once the job has ended); returns the unsubscribe. */
  onSnapshot(f: (s: Snapshot, ended: boolean) => void): () => void {
    this.listeners.add(f);
    return () => this.listeners.delete(f);
  }

  /** The job has ended: a last snapshot, marked ended, then no more. */
  async end(): Promise<void> {
    if (this.ended) return;
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    await this.ticking;
    await this.tick(true);
    for (const u of this.unsubs) u();
    this.unsubs.length = 0;
  }

  private tick(final = false): Promise<void> {
    if (this.ended) return Promise.resolve();
    const p = this.snapshot(final).finally(() => { this.ticking = null; });
    this.ticking = p;
    return p;
  }

  private async snapshot(final: boolean): Promise<void> {
    const status = await this.status().catch(() => null);
    if (this.ended) return;
    const now = Date.now();
    const samples = status?.progress.samples ?? this.lastSamples;
    const dt = (now - this.lastAt) / 1000;
    const point: SeriesPoint = {
      t_s: (now - this.t0) / 1000, samples,
      // The rate over the last interval (the progress figure is the mean since the start): a pause shows as 0 at once.
      samples_per_s: dt > 0 ? Math.max(0, samples - this.lastSamples) / dt : 0,
      loss: status?.progress.loss ?? null, test_loss: this.testLoss, test_auc: this.testAuc,
    };
    this.lastSamples = samples;
    this.lastAt = now;
    this.history.push(point);
    if (this.history.length > HISTORY) this.history.splice(0, this.history.length - HISTORY);
    let out = 0; let inn = 0;
    for (const w of this.wire.values()) { out += w.out; inn += w.in; }
    if (final) this.ended = true;
    const snap: Snapshot = {
      job: this.o.job, at_ms: now, ended: this.ended, status,
      groups: status === null ? {} : groupProgress(status),
      staleness: [...STALENESS_BUCKETS, Number.POSITIVE_INFINITY].map((le) => ({ le: Number.isFinite(le) ? le : null, count: this.metrics.stalenessCounts.get(le) ?? 0 })),
      wire: { bytes_out: out, bytes_in: inn, compression: describeGradientCompression(this.o.compression ?? null, this.choices.values()) },
      point,
    };
    this.latest = snap;
    if (this.o.recordTo) await appendFile(this.o.recordTo, `${JSON.stringify(snap)}\n`).catch(() => undefined);
    for (const f of this.listeners) f(snap, this.ended);
  }
}

export class MonitorServer {
  private readonly server: Server;
  private readonly clients = new Set<ServerResponse>();
  private readonly unsubscribe: () => void;
  /** Where it serves (no token in it). */
  url = '';
  /** The URL to open: `url`, with `?token=` when a token is asked for. */
  loginUrl = '';

  private constructor(private readonly o: MonitorServerOptions) {
    this.unsubscribe = o.watch.onSnapshot((snap, ended) => {
      const line = ended ? `event: end\ndata: ${JSON.stringify(snap)}\n\n` : `data: ${JSON.stringify(snap)}\n\n`;
      for (const c of this.clients) { c.write(line); if (ended) c.end(); }
      if (ended) this.clients.clear();
    });
    this.server = createServer((req, res) => { void this.handle(req, res); });
  }

  static async start(o: MonitorServerOptions): Promise<MonitorServer> {
    const s = new MonitorServer(o);
    try {
      await new Promise<void>((resolve, reject) => {
        s.server.once('error', reject);
        s.server.listen(o.port, o.host ?? '127.0.0.1', () => { s.server.off('error', reject); resolve(); });
      });
    } catch (e) {
      s.unsubscribe();
      throw e;
    }
    const addr = s.server.address();
    const port = typeof addr === 'object' && addr !== null ? addr.port : o.port;
    s.url = `http://${o.host === undefined || o.host === '0.0.0.0' ? '127.0.0.1' : o.host}:${port}/`;
    s.loginUrl = o.token ? `${s.url}?token=${encodeURIComponent(o.token)}` : s.url;
    return s;
  }

  async close(): Promise<void> {
    this.unsubscribe();
    for (const c of this.clients) c.end();
    this.clients.clear();
    this.server.closeAllConnections?.();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://localhost');
    const path = url.pathname;
    const watch = this.o.watch;
    const token = this.o.token ?? null;
    if (token !== null) {
      const given = url.searchParams.get('token');
      if (given !== null && sameToken(given, token)) {
        // The token in the address: kept in a cookie from now on, and out of the address bar and history.
        url.searchParams.delete('token');
        res.writeHead(303, { 'Set-Cookie': `${TOKEN_COOKIE}=${encodeURIComponent(token)}; HttpOnly; SameSite=Strict; Path=/`, Location: `${path}${url.search}` });
        res.end();
        return;
      }
      if (!authorised(req, token)) {
        this.o.log.warn({ path, remote: req.socket.remoteAddress }, 'dashboard: a request without the job\'s token refused');
        this.json(res, 401, { error: 'this dashboard asks for the job\'s token: open the URL `hetps up` printed (…/?token=…), or send Authorization: Bearer <token> (the token is in <run dir>/dashboard-token, or monitoring.token_file)' });
        return;
      }
    }
    try {
      if (req.method === 'GET' && path === '/metrics') {
        const text = await watch.metrics.text();
        res.writeHead(200, { 'Content-Type': watch.metrics.contentType });
        res.end(text);
      } else if (req.method === 'GET' && (path === '/' || path === '/index.html')) {
        this.file(res, dashboardAsset('index.html'), 'text/html; charset=utf-8');
      } else if (req.method === 'GET' && path.startsWith('/assets/') && ASSET_TYPES[path.slice('/assets/'.length)] !== undefined) {
        const name = path.slice('/assets/'.length);
        this.file(res, assetPath(name), ASSET_TYPES[name]!);
      } else if (req.method === 'GET' && path === '/api/snapshot') {
        this.json(res, 200, { ...(watch.latest ?? {}), history: watch.history });
      } else if (req.method === 'GET' && path === '/api/stream') {
        res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache', Connection: 'keep-alive' });
        res.write(`event: history\ndata: ${JSON.stringify(watch.history)}\n\n`);
        if (watch.ended) { res.write(`event: end\ndata: ${JSON.stringify(watch.latest)}\n\n`); res.end(); return; }
        if (watch.latest !== null) res.write(`data: ${JSON.stringify(watch.latest)}\n\n`);
        this.clients.add(res);
        req.on('close', () => this.clients.delete(res));
      } else if (req.method === 'POST' && path.startsWith('/api/ctl/')) {
        await this.ctl(path.slice('/api/ctl/'.length), req, res);
      } else {
        this.json(res, 404, { error: `no such page: ${req.method} ${path} (the dashboard is at /, metrics at /metrics)` });
      }
    } catch (e) {
      this.o.log.warn({ path, err: (e as Error).message }, 'monitor: request failed');
      if (!res.headersSent) this.json(res, 500, { error: (e as Error).message });
      else res.end();
    }
  }

  private async ctl(command: string, req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (!(DASHBOARD_COMMANDS as readonly string[]).includes(command)) {
      this.json(res, 400, { error: `unknown or not allowed from the page: ${command} (allowed: ${DASHBOARD_COMMANDS.join(', ')})` });
      return;
    }
    let body = '';
    for await (const chunk of req) {
      body += String(chunk);
      if (body.length > BODY_LIMIT) { this.json(res, 413, { error: `body over ${BODY_LIMIT} bytes` }); return; }
    }
    let fields: unknown = {};
    if (body.trim() !== '') {
      try { fields = JSON.parse(body); } catch (e) { this.json(res, 400, { error: `the body is not JSON: ${(e as Error).message}` }); return; }
    }
    this.o.log.info({ command, from: 'dashboard', remote: req.socket.remoteAddress }, `dashboard: ctl.${command}`);
    try {
      this.json(res, 200, await requestControl(this.o.transport, this.o.job, command, fields, 60_000));
    } catch (e) {
      this.json(res, 502, { error: `no answer from the job's scheduler: ${(e as Error).message}` });
    }
  }

  private file(res: ServerResponse, path: string, type: string): void {
    res.writeHead(200, { 'Content-Type': type, 'Cache-Control': 'no-cache' });
    res.end(readFileSync(path));
  }

  private json(res: ServerResponse, code: number, v: unknown): void {
    res.writeHead(code, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify(v));
  }
}

const TOKEN_COOKIE = 'hetps_token';

/** A new dashboard token: 32 random bytes, hex. */
export function newDashboardToken(): string {
  return randomBytes(32).toString('hex');
}

function sameToken(given: string, token: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(token);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** The request carries the token: as `Authorization: Bearer`, or in the cookie the page set. */
function authorised(req: IncomingMessage, token: string): boolean {
  const bearer = /^Bearer\s+(\S+)$/i.exec(req.headers.authorization ?? '');
  if (bearer !== null && sameToken(bearer[1]!, token)) return true;
  for (const part of (req.headers.cookie ?? '').split(';')) {
    const eq = part.indexOf('=');
    if (eq < 0 || part.slice(0, eq).trim() !== TOKEN_COOKIE) continue;
    let v: string;
    try { v = decodeURIComponent(part.slice(eq + 1).trim()); } catch { continue; }
    if (sameToken(v, token)) return true;
  }
  return false;
}
