/**
 * `hetps report RUN_DIR [--out FILE]`: the dashboard's charts and panels as
 * one static HTML file, drawn from the run's telemetry log
 * (`<run dir>/telemetry.jsonl`, a snapshot a second written by the monitor),
 * with uPlot and the page's script inlined: it opens anywhere, offline.
 */
import type { Command } from 'commander';
import { readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { ConfigError } from '../runtime/mod.ts';
import { TELEMETRY_LOG, assetPath, dashboardAsset, type Snapshot } from '../actors/monitor/monitor-http.ts';
import type { JobStatus } from '../actors/scheduler/scheduler.messages.ts';

/** The report's HTML for the snapshots of a run's telemetry log. */
export async function reportHtml(snapshots: Snapshot[]): Promise<string> {
  if (snapshots.length === 0) throw new ConfigError('the telemetry log has no snapshot: the run ended before its first second of training?', { data: { field: 'RUN_DIR' } });
  const final = snapshots[snapshots.length - 1]!;
  // Each snapshot carries only the latest events: the report lists every one of the run.
  const events = new Map<string, JobStatus['events'][number]>();
  for (const s of snapshots) for (const e of s.status?.events ?? []) events.set(`${e.at_ms}|${e.kind}|${e.node}|${e.text}`, e);
  const last: Snapshot = final.status === null ? final : { ...final, status: { ...final.status, events: [...events.values()].sort((a, b) => a.at_ms - b.at_ms) } };
  const data = { history: snapshots.map((s) => s.point), last };
  const read = (f: string) => readFile(f, 'utf8');
  const [page, js, css, uplotJs, uplotCss] = await Promise.all([
    read(dashboardAsset('index.html')), read(assetPath('dashboard.js')), read(assetPath('dashboard.css')), read(assetPath('uPlot.iife.min.js')), read(assetPath('uPlot.min.css')),
  ]);
  // `</` inside the inlined JSON and scripts must not close their <script> element.
  const inline = (s: string) => s.replace(/<\/(script)/gi, '<\\/$1');
  return page
    .replace('<title>hetps dashboard</title>', `<title>hetps report: ${last.job}</title>`)
    .replace('<link rel="stylesheet" href="/assets/uPlot.min.css">', () => `<style>${uplotCss}</style>`)
    .replace('<link rel="stylesheet" href="/assets/dashboard.css">', () => `<style>${css}</style>`)
    .replace('<script src="/assets/uPlot.iife.min.js"></script>', () => `<script>${inline(uplotJs)}</script>`)
    .replace('<script src="/assets/dashboard.js"></script>', () => `<script>window.HETPS_REPORT = ${inline(JSON.stringify(data))};</script>\n<script>${inline(js)}</script>`)
    .replace('Served by the job\'s monitor. <a href="/metrics">/metrics</a> (Prometheus).', `A report of run ${last.status?.run_id ?? ''} (hetps report), from ${snapshots.length} snapshots.`);
}

/** Reads `<run dir>/telemetry.jsonl`; a line that does not parse (a run killed mid-write) is skipped. */
export async function readTelemetryLog(runDir: string): Promise<Snapshot[]> {
  const file = join(runDir, TELEMETRY_LOG);
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (e) {
    throw new ConfigError(`${file}: ${(e as NodeJS.ErrnoException).code === 'ENOENT' ? 'not there' : (e as Error).message}; RUN_DIR must be a run directory of hetps up (job.run_dir/<run id>)`, { data: { field: 'RUN_DIR' } });
  }
  const out: Snapshot[] = [];
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    try { out.push(JSON.parse(line) as Snapshot); } catch { /* a torn last line */ }
  }
  return out;
}

export function register(program: Command): void {
  program
    .command('report')
    .description('write a static HTML report of a finished (or running) job from its run directory\'s telemetry log: the dashboard\'s charts and panels, offline')
    .argument('<run-dir>', 'the run directory (job.run_dir/<run id>, printed by hetps up)')
    .option('--out <file>', 'where to write it (default <run-dir>/report.html)')
    .action(async (runDir: string, flags: { out?: string }) => {
      const snapshots = await readTelemetryLog(resolve(runDir));
      const out = resolve(flags.out ?? join(runDir, 'report.html'));
      await writeFile(out, await reportHtml(snapshots));
      process.stdout.write(`report: ${out} (${snapshots.length} snapshots)\n`);
    });
}
