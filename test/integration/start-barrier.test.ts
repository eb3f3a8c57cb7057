/**
 * cluster.start_barrier_seconds over a real NATS cluster, nodes started by
 * hand (`hetps launch`) and the driver with --no-launch: the job — the
 * workers' start signal — is created only once every worker has joined; a
 * worker that never comes delays it by the barrier's limit only, and the
 * others train every batch.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { until } from '../support/until.ts';
import { assertNothingLost, clusterAndDirForFile, explainExit, hetps, watchAcks, writeJobConfig, type Child, type LossSummary } from '../support/ps.ts';

const { nats, dir } = clusterAndDirForFile('hetps-barrier-');

/** The workers named (of w1..w4, groups g1 [w1, w2] and g2 [w3, w4]). */
function launchWorkers(cfg: string, workers: readonly string[]): Child[] {
  const rank: Record<string, [string, string]> = { w1: ['g1', '0'], w2: ['g1', '1'], w3: ['g2', '0'], w4: ['g2', '1'] };
  return workers.map((w) => hetps(['launch', '--role', 'worker', '--config', cfg, '--group', rank[w]![0], '--node-rank', rank[w]![1]], { timeoutMs: 100_000 }));
}

/** Servers s1, s2 and the workers named. */
function launch(cfg: string, workers: readonly string[]): Child[] {
  return [...['s1', 's2'].map((s) => hetps(['launch', '--role', 'server', '--config', cfg, '--server-id', s], { timeoutMs: 100_000 })), ...launchWorkers(cfg, workers)];
}

test('the driver creates the job only once every worker joined: three workers wait for the fourth, which then trains too; nothing lost', { timeout: 110_000 }, async () => {
  const job = 'barrierall';
  const cfg = await writeJobConfig(dir(), { job, mode: 'asp', servers: nats().urls, runDir: join(dir(), 'runs'), samples: 1200, epochs: 2, workerRecoveryTimeoutS: 10 });
  const watch = await watchAcks(nats().urls, job);
  const nodes = launch(cfg, ['w1', 'w2', 'w3']);
  let driver: Child | null = null;
  try {
    const summaryFile = join(dir(), `${job}-summary.json`);
    driver = hetps(['up', '--config', cfg, '--no-launch', '--summary', summaryFile], { timeoutMs: 100_000 });
    const d = driver;
    // The driver's progress lines go to stderr.
    await until(() => /start barrier: 3\/4 workers joined \(waiting for w4;/.test(d.stderr()), 'the barrier counts the three workers started', 60_000, () => d.stderr().slice(-2000));
    // Held at the barrier: no worker has the job, none trains, nothing is acknowledged.
    await sleep(3_000);
    assert.doesNotMatch(d.stderr(), /job created/, 'no job before w4 joined');
    for (const w of nodes.slice(2)) assert.doesNotMatch(w.stderr(), /worker training/, 'no worker trains before w4 joined');
    assert.equal(watch.acks.size, 0);
    nodes.push(...launchWorkers(cfg, ['w4']));
    const r = await d.exited;
    assert.equal(r.code, 0, explainExit(r));
    assert.match(r.stderr, /start barrier: all 4 workers joined in [\d.]+ s; starting the job/);
    assert.ok(r.stderr.indexOf('start barrier: all 4') < r.stderr.indexOf('job created'), 'the job is created after the barrier');
    const s = JSON.parse(await readFile(summaryFile, 'utf8')) as LossSummary;
    assertNothingLost(s, watch.acks);
    assert.ok((watch.byNode.get('w4') ?? 0) > 0, `w4 trained too: ${JSON.stringify(Object.fromEntries(watch.byNode))}`);
  } finally {
    await watch.close();
    driver?.kill('SIGKILL');
    for (const c of nodes) c.kill('SIGKILL');
  }
});

test('a worker that never joins holds the job back for start_barrier_seconds only: the line names it, the other three train every batch once', { timeout: 110_000 }, async () => {
  const job = 'barriermiss';
  const cfg = await writeJobConfig(dir(), { job, mode: 'asp', servers: nats().urls, runDir: join(dir(), 'runs'), samples: 1200, epochs: 2, workerRecoveryTimeoutS: 10, startBarrierSeconds: 2 });
  const watch = await watchAcks(nats().urls, job);
  const nodes = launch(cfg, ['w1', 'w2', 'w3']);
  try {
    // The nodes ready first, so the 2 s of the barrier are spent waiting for w4 alone.
    await until(() => nodes.slice(2).every((w) => /ready; waiting for the job/.test(w.stderr())), 'the three workers are ready', 60_000, () => nodes.map((w) => w.stderr().slice(-500)).join('\n'));
    const summaryFile = join(dir(), `${job}-summary.json`);
    const r = await hetps(['up', '--config', cfg, '--no-launch', '--summary', summaryFile], { timeoutMs: 100_000 }).exited;
    assert.equal(r.code, 0, explainExit(r));
    assert.match(r.stderr, /start barrier: w4 not joined after 2 s; the job starts without waiting longer/);
    const s = JSON.parse(await readFile(summaryFile, 'utf8')) as LossSummary;
    assertNothingLost(s, watch.acks);
    assert.deepEqual([...watch.byNode.keys()].sort(), ['w1', 'w2', 'w3']);
  } finally {
    await watch.close();
    for (const c of nodes) c.kill('SIGKILL');
  }
});
