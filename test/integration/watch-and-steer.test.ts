/**
 * Watching and steering a running job, as an operator does, during the quick
 * start (examples/quickstart.yaml on a local 3-node NATS cluster):
 *
 * - `/metrics` parses as Prometheus text, with ≥ 12 `hetps_` families whose
 *   values move while training runs;
 * - `hetps ctl status --json`, `hetps tail batch` and `hetps top --once`
 *   against the job;
 * - the dashboard in a real browser (playwright-core driving Debian's
 *   chromium): the numbers change, every worker and shard is listed, pause
 *   stops the samples/s line and resume restarts it, and the pause shows in
 *   the events; the checkpoint and regroup buttons get their replies and
 *   events. With HETPS_DASHBOARD_SCREENSHOT=<file> it also saves a
 *   screenshot of the running page there (docs/dashboard.png is one).
 *
 * The job runs with `monitoring.auth: token`: `/metrics` and the API answer
 * 401 without the token and take it as a bearer header; the browser opens
 * the URL `hetps up` printed, whose token becomes a cookie that the page's
 * stream and buttons then carry.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { readFile, readdir, stat, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { chromium } from 'playwright-core';
import { ROOT, explainExit, hetps, tempDirForFile } from '../support/ps.ts';
import { until } from '../support/until.ts';

const tempDir = tempDirForFile('hetps-watch-');
const parsePrometheus = createRequire(import.meta.url)('parse-prometheus-text-format') as (text: string) => { name: string; metrics: unknown[] }[];
const CHROMIUM = process.env.HETPS_CHROMIUM ?? '/usr/bin/chromium';

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const a = s.address();
      s.close(() => resolve(typeof a === 'object' && a !== null ? a.port : 0));
    });
  });
}

const WORKERS = ['fast-1', 'fast-2', 'fast-3', 'slow-1', 'slow-2'];

test('the quick start, watched and steered: /metrics, hetps ctl / tail / top, and the dashboard in chromium (pause, resume, checkpoint, regroup)', { timeout: 420_000 }, async (t) => {
  // The quick start as shipped, with its runs in a temp dir, ten epochs (time to look at it: ~2 min of training), and a job name of its own.
  const quick = parse(await readFile(join(ROOT, 'examples', 'quickstart.yaml'), 'utf8')) as Record<string, Record<string, unknown>>;
  const job = `watch${process.pid}`;
  quick.job = { name: job, run_dir: join(tempDir(), 'runs') };
  quick.data = { ...quick.data, epochs: 10 };
  quick.monitoring = { ...(quick.monitoring ?? {}), auth: 'token' };
  const cfg = join(tempDir(), 'quickstart.yaml');
  await writeFile(cfg, stringify(quick));
  const port = await freePort();
  const up = hetps(['up', '--config', cfg, '--monitor-port', String(port), '--eval-every', '2', '--eval-samples', '512', '--summary', join(tempDir(), 'summary.json')], { timeoutMs: 400_000 });
  try {
    await until(() => /dashboard: http:\/\/127\.0\.0\.1:\d+\//.test(up.stderr()) && /NATS cluster up: /.test(up.stderr()), 'the dashboard URL and the NATS URLs', 60_000, () => up.stderr().slice(-3000));
    const base = `http://127.0.0.1:${port}/`;
    const printed = new RegExp(`dashboard: (${base.replace(/[.]/g, '\\.')}\\?token=([0-9a-f]{64}))  \\(metrics: ${base.replace(/[.]/g, '\\.')}metrics with Authorization: Bearer <the token in (\\S+)>\\)`).exec(up.stderr());
    assert.ok(printed !== null, `the URL printed is the port asked for, with the token and where it is kept: ${up.stderr().split('\n').find((l) => l.includes('dashboard:'))}`);
    const [, loginUrl, token, tokenFile] = printed;
    assert.equal((await readFile(tokenFile!, 'utf8')).trim(), token, `${tokenFile} holds the token`);
    assert.equal((await stat(tokenFile!)).mode & 0o777, 0o600, 'readable by its owner only');
    assert.ok(tokenFile!.startsWith(join(tempDir(), 'runs')) && (await readdir(join(tokenFile!, '..'))).includes('dashboard-token'), tokenFile);
    const auth = { headers: { Authorization: `Bearer ${token}` } };
    assert.equal((await fetch(`${base}metrics`)).status, 401, '/metrics without the token');
    assert.equal((await fetch(`${base}api/ctl/pause`, { method: 'POST', body: '{}' })).status, 401, 'a command without the token');
    const nats = /NATS cluster up: (\S+)/.exec(up.stderr())![1]!;

    // ---- /metrics: parses, ≥ 12 hetps_ families, and they move while training runs.
    const scrape = async () => {
      const r = await fetch(`${base}metrics`, auth);
      assert.equal(r.status, 200);
      assert.match(r.headers.get('content-type') ?? '', /text\/plain/);
      return parsePrometheus(await r.text()).filter((f) => f.name.startsWith('hetps_'));
    };
    const samplesOf = (fams: { name: string; metrics: unknown[] }[]) => Number((fams.find((f) => f.name === 'hetps_samples_total')?.metrics[0] as { value?: string } | undefined)?.value ?? 0);
    await until(async () => samplesOf(await scrape()) > 0, 'training to start (hetps_samples_total > 0)', 90_000, () => up.stderr().slice(-3000));
    const a = await scrape();
    await new Promise((r) => setTimeout(r, 5_000));
    const b = await scrape();
    const moved = b.filter((f) => JSON.stringify(f.metrics) !== JSON.stringify(a.find((x) => x.name === f.name)?.metrics)).map((f) => f.name);
    t.diagnostic(`hetps_ families: ${b.length}; moved in 5 s: ${moved.length} (${moved.join(', ')})`);
    assert.ok(b.length >= 12, `${b.length} hetps_ families`);
    assert.ok(moved.length >= 12, `only ${moved.length} hetps_ families moved: ${moved.join(', ')}`);
    for (const f of ['hetps_samples_total', 'hetps_step_seconds', 'hetps_shard_requests_total', 'hetps_wire_bytes']) assert.ok(moved.includes(f), `${f} moved`);

    // ---- the dashboard in a real browser.
    const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--headless', '--no-sandbox'] });
    try {
      const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
      // The printed URL: its token becomes a cookie, and the address the dashboard's own.
      await page.goto(loginUrl!);
      assert.equal(page.url(), base, 'the token left the address bar');
      const text = (id: string) => page.locator(`#${id}`).innerText();
      await until(async () => (await text('state')) === 'training', 'the page to show the job training', 20_000);
      const s0 = Number((await text('samples')).replace(/,/g, ''));
      await until(async () => Number((await text('samples')).replace(/,/g, '')) > s0, 'the sample count to grow on the page', 20_000);
      for (const w of WORKERS) assert.equal(await page.locator(`#nodes tr[data-node="${w}"]`).count(), 1, `the nodes panel lists ${w}`);
      // What each worker holds (taken, not yet acknowledged), from its progress telemetry: a count once it has reported.
      await until(async () => (await Promise.all(WORKERS.map((w) => page.locator(`#nodes tr[data-node="${w}"] td.held`).innerText()))).every((x) => /^\d+$/.test(x)),
        'every worker\'s held count on the page', 20_000);
      for (const g of ['fast', 'slow']) assert.equal(await page.locator(`#groups tr[data-group="${g}"]`).count(), 1, `the groups panel lists ${g}`);
      const shards = ((await (await fetch(`${base}api/snapshot`, auth)).json()) as { status: { shards: { shard: string }[] } }).status.shards.map((x) => x.shard);
      assert.deepEqual(shards.sort(), ['server-1', 'server-2']);
      for (const sh of shards) assert.equal(await page.locator(`#shards tr[data-shard="${sh}"]`).count(), 1, `the shards panel lists ${sh}`);
      // Load balancing runs (two servers, sync replication): the panel shows each server's measured load.
      await until(async () => /server load \(parameter floats\/s\): server-1 [\d.]+ M, server-2 [\d.]+ M; imbalance/.test(await page.locator('[data-testid="server-load"]').innerText().catch(() => '')),
        'the server loads on the page', 20_000);
      if (process.env.HETPS_DASHBOARD_SCREENSHOT) {
        await new Promise((r) => setTimeout(r, 8_000));
        await page.screenshot({ path: process.env.HETPS_DASHBOARD_SCREENSHOT, fullPage: true });
      }

      const rate = async () => Number((await text('rate')).replace(/,/g, ''));
      await until(async () => (await rate()) > 0, 'samples/s above 0 while training', 20_000);
      await page.click('#pause');
      await until(async () => /ctl\.pause: /.test(await text('reply')) && !/…/.test(await text('reply')), 'the pause reply on the page', 30_000);
      await until(async () => (await text('state')) === 'paused', 'the job to be paused', 60_000, () => up.stderr().slice(-2000));
      // Paused: the line stays at 0 (the rate is per second between snapshots).
      await until(async () => (await rate()) === 0, 'samples/s to drop to 0', 10_000);
      const frozen = await text('samples');
      await new Promise((r) => setTimeout(r, 2_500));
      assert.equal(await rate(), 0, 'samples/s stays at 0 while paused');
      assert.equal(await text('samples'), frozen, 'no sample is trained while paused');
      assert.ok(await page.locator('#events li[data-kind="pause"]').count() >= 1, 'the pause is in the events');
      await page.click('#resume');
      await until(async () => (await rate()) > 0, 'samples/s back above 0 after resume', 60_000, () => up.stderr().slice(-2000));
      assert.ok(await page.locator('#events li[data-kind="resume"]').count() >= 1, 'the resume is in the events');

      // Checkpoint and regroup (recompute), from their buttons: the reply on the page, the event in the list.
      await page.click('#checkpoint');
      await until(async () => /^ctl\.checkpoint: /.test(await text('reply')), 'the checkpoint reply on the page', 60_000, () => up.stderr().slice(-2000));
      const ck = JSON.parse((await text('reply')).replace(/^ctl\.checkpoint: /, '')) as { path?: string; bytes?: number };
      assert.ok(typeof ck.path === 'string' && ck.bytes! > 0, `a checkpoint written: ${await text('reply')}`);
      await until(async () => (await page.locator('#events li[data-kind="checkpoint"]').count()) >= 1, 'the checkpoint in the events', 10_000);
      await page.click('#regroup');
      await until(async () => /^ctl\.regroup: /.test(await text('reply')), 'the regroup reply on the page', 60_000, () => up.stderr().slice(-2000));
      const rg = JSON.parse((await text('reply')).replace(/^ctl\.regroup: /, '')) as { accepted?: boolean; groups_version?: number; groups?: { nodes: string[] }[]; note?: string };
      assert.equal(typeof rg.groups_version, 'number', `a regroup reply: ${await text('reply')}`);
      assert.deepEqual(rg.groups!.flatMap((g) => g.nodes).sort(), WORKERS, 'the groups recomputed from the profiles hold every worker');
      // Recomputed groups equal to the current ones are answered, not applied (accepted: false, with a note).
      if (rg.accepted) await until(async () => (await page.locator('#events li[data-kind="regroup"]').count()) >= 1, 'the regroup in the events', 10_000);
      else assert.match(rg.note ?? '', /same as the current one/);

      // ---- the CLI against the running job, by its NATS URLs and name.
      const status = await hetps(['ctl', 'status', '--json', '--nats', nats, '--job', job], { timeoutMs: 30_000 }).exited;
      assert.equal(status.code, 0, explainExit(status));
      const st = JSON.parse(status.stdout) as {
        job: string; state: string; workers: { node: string }[]; shards: { shard: string }[]; groups: { name: string }[];
        load_balancing: { loads: Record<string, number> | null; threshold: number; inactive: string | null } | null;
        sharding: { hotness: boolean; warmup_batches: number; expected_loads: Record<string, number> | null } | null;
      };
      assert.equal(st.job, job);
      assert.deepEqual([Object.keys(st.load_balancing?.loads ?? {}).sort(), st.load_balancing?.threshold, st.load_balancing?.inactive], [['server-1', 'server-2'], 0.3, null]);
      assert.ok(Object.values(st.load_balancing!.loads!).every((l) => l > 0), `both servers carry traffic: ${JSON.stringify(st.load_balancing)}`);
      // The quick start's plan: hotness sharding over its 2 shards, from 64 warm-up batches.
      assert.deepEqual([st.sharding?.hotness, st.sharding?.warmup_batches, Object.keys(st.sharding?.expected_loads ?? {}).sort()], [true, 64, ['server-1', 'server-2']], JSON.stringify(st.sharding));
      assert.equal(st.state, 'training');
      assert.deepEqual(st.workers.map((w) => w.node).sort(), WORKERS);
      assert.deepEqual(st.groups.map((g) => g.name).sort(), ['fast', 'slow']);
      const bad = await hetps(['ctl', 'status', '{not json', '--nats', nats, '--job', job], { timeoutMs: 30_000 }).exited;
      assert.equal(bad.code, 2);
      assert.match(bad.stderr, /the fields are not JSON/);
      const tail = await hetps(['tail', 'batch', '--count', '3', '--json', '--nats', nats, '--job', job], { timeoutMs: 60_000 }).exited;
      assert.equal(tail.code, 0, explainExit(tail));
      const lines = tail.stdout.trim().split('\n').map((l) => JSON.parse(l) as { kind: string; source: string; data: { batch_id: string; samples: number } });
      assert.equal(lines.length, 3);
      for (const l of lines) {
        assert.equal(l.kind, 'batch');
        assert.ok(WORKERS.includes(l.source), l.source);
        assert.match(l.data.batch_id, /\S/);
      }
      const top = await hetps(['top', '--once', '--nats', nats, '--job', job], { timeoutMs: 30_000 }).exited;
      assert.equal(top.code, 0, explainExit(top));
      for (const w of [...WORKERS, 'fast', 'slow']) assert.match(top.stdout, new RegExp(`^${w}\\s`, 'm'), `top lists ${w}`);

      // The job ends: the page keeps its last state.
      const r = await up.exited;
      assert.equal(r.code, 0, explainExit(r));
      await until(async () => (await text('state')) === 'ended', 'the page to say the job ended', 20_000);
      assert.equal(await page.locator('#nodes tr[data-node]').count(), WORKERS.length, 'the last state stays on the page');
      const s = JSON.parse(await readFile(join(tempDir(), 'summary.json'), 'utf8')) as { batches: number; batches_acked: number; duplicate_acks: number; run_dir: string };
      assert.equal(s.batches_acked, s.batches, 'every batch acknowledged');
      assert.equal(s.duplicate_acks, 0);

      // hetps report: the same page, static, from the run's telemetry log.
      const rep = await hetps(['report', s.run_dir], { timeoutMs: 30_000 }).exited;
      assert.equal(rep.code, 0, explainExit(rep));
      const html = await readFile(join(s.run_dir, 'report.html'), 'utf8');
      assert.match(html, /window\.HETPS_REPORT = /);
      assert.doesNotMatch(html, /src="\/assets\//, 'every asset inlined');
      const report = await browser.newPage();
      await report.goto(`file://${join(s.run_dir, 'report.html')}`);
      assert.equal(await report.locator('#state').innerText(), 'ended (report)');
      for (const w of WORKERS) assert.equal(await report.locator(`#nodes tr[data-node="${w}"]`).count(), 1, `the report lists ${w}`);
      assert.equal(await report.locator('button[data-cmd]').count(), 0, 'a report steers nothing');
      assert.ok(await report.locator('#events li[data-kind="pause"]').count() >= 1, 'the pause is in the report\'s events');
      const missing = await hetps(['report', join(tempDir(), 'nowhere')], { timeoutMs: 30_000 }).exited;
      assert.equal(missing.code, 2);
      assert.match(missing.stderr, /telemetry\.jsonl: not there; RUN_DIR must be a run directory/);
    } finally {
      await browser.close();
    }
  } finally {
    up.kill('SIGKILL');
    await up.exited;
  }
});
