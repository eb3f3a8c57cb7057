/**
 * The quick start over a real 3-node NATS cluster with `backup_factor: 1`
 * (the default with two servers): once without faults, then with the
 * process of server-1 — primary of shard server-1, backup of shard
 * server-2 — SIGKILLed after 30 % of the batches. The second run still
 * completes with every batch acknowledged exactly once, the integrity check
 * reports nothing lost or applied twice and the replicas equal, the backup
 * on server-2 was promoted (a failover in the summary), and the test AUC is
 * within 0.003 of the fault-free run's.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { assertNothingLost, clusterAndDirForFile, explainExit, hetps, ROOT, watchAcks, type Child } from '../support/ps.ts';
import { until } from '../support/until.ts';

const env = clusterAndDirForFile('hetps-failover-');

interface Summary {
  batches: number; batches_acked: number; duplicate_acks: number; test_auc: number;
  integrity: { acked: number; applied: number; lost: number; duplicated: number; replicas_equal: boolean | null } | null;
  replication: { backup_factor: number; failovers: { shard: string; from: string; to: string; epoch: number; decided_ms: number }[]; client_reroutes: number };
}

async function quickstart(job: string, kill: { afterFraction: number } | null, t: { diagnostic(s: string): void }): Promise<{ summary: Summary; killedAt: number | null; firstAckAfter: number | null }> {
  const quick = await readFile(join(ROOT, 'examples', 'quickstart.yaml'), 'utf8');
  const cfg = join(env.dir(), `${job}.yaml`);
  await writeFile(cfg, quick.replace('name: quickstart', `name: ${job}\n  run_dir: ${join(env.dir(), 'runs')}`)
    + `\nnats:\n  servers: [${env.nats().urls.join(', ')}]\n`);
  const watch = await watchAcks(env.nats().urls, job);
  const children: Child[] = [];
  try {
    const servers = ['server-1', 'server-2'].map((s) => hetps(['launch', '--role', 'server', '--config', cfg, '--server-id', s], { timeoutMs: 280_000 }));
    children.push(...servers);
    for (const [g, n] of [['fast', 3], ['slow', 2]] as const) {
      for (let r = 0; r < n; r++) children.push(hetps(['launch', '--role', 'worker', '--config', cfg, '--group', g, '--node-rank', String(r)], { timeoutMs: 280_000 }));
    }
    const summaryFile = join(env.dir(), `${job}-summary.json`);
    const driver = hetps(['up', '--config', cfg, '--no-launch', '--summary', summaryFile], { timeoutMs: 280_000 });
    children.push(driver);
    let killedAt: number | null = null;
    let firstAckAfter: number | null = null;
    if (kill) {
      const total = 292; // the quick start's batches (2 epochs)
      await until(() => watch.acks.size >= Math.round(total * kill.afterFraction), `${kill.afterFraction * 100}% acknowledged`, 180_000, () => driver.stderr().slice(-3000));
      const before = watch.acks.size;
      servers[0]!.child.kill('SIGKILL');
      killedAt = Date.now();
      const seen = new Set(watch.acks.keys());
      t.diagnostic(`server-1 SIGKILLed at ${before} acknowledged batches`);
      await until(() => [...watch.acks.keys()].some((b) => !seen.has(b)), 'an acknowledgement after the kill', 60_000, () => driver.stderr().slice(-3000));
      firstAckAfter = Date.now();
    }
    const r = await driver.exited;
    assert.equal(r.code, 0, explainExit(r));
    await sleep(200);
    const summary = JSON.parse(await readFile(summaryFile, 'utf8')) as Summary;
    assertNothingLost(summary, watch.acks);
    return { summary, killedAt, firstAckAfter };
  } finally {
    for (const c of children) c.child.kill('SIGKILL');
    await watch.close();
  }
}

test('quick start with backup_factor 1: SIGKILL of a shard primary mid-run loses nothing and applies nothing twice', { timeout: 600_000 }, async (t) => {
  const clean = await quickstart('failclean', null, t);
  assert.equal(clean.summary.replication.backup_factor, 1);
  assert.equal(clean.summary.integrity!.replicas_equal, true, 'fault-free: the replicas are equal');

  const faulty = await quickstart('failkill', { afterFraction: 0.3 }, t);
  const s = faulty.summary;
  assert.equal(s.integrity!.replicas_equal, true);
  const promoted = s.replication.failovers.find((f) => f.shard === 'server-1');
  assert.ok(promoted, `shard server-1 failed over: ${JSON.stringify(s.replication)}`);
  assert.equal(promoted.from, 'server-1');
  assert.equal(promoted.to, 'server-2');
  assert.ok(Math.abs(s.test_auc - clean.summary.test_auc) <= 0.003, `AUC ${s.test_auc} vs fault-free ${clean.summary.test_auc}`);
  t.diagnostic(`fault-free AUC ${clean.summary.test_auc.toFixed(4)}, with the kill ${s.test_auc.toFixed(4)}; failover decided ${promoted.decided_ms} ms after the dead verdict (plan v${promoted.epoch}); `
    + `first acknowledgement ${faulty.firstAckAfter! - faulty.killedAt!} ms after the kill; ${s.replication.client_reroutes} driver re-routes`);
});
