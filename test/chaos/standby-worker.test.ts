/**
 * A warmed standby worker takes a dead member's place (fault_tolerance.
 * standby_workers, the article's preheat_backup), over a real 3-node NATS
 * cluster: w5 starts with the job, loads data and model, profiles itself and
 * waits; w1 of group g1 is SIGKILLed mid-training. On w1's dead verdict the
 * driver regroups with w5 in w1's place (g1 = [w5, w2]); w2 pauses at its
 * next window boundary, the group re-forms, and w5 trains in sync rounds
 * with w2. The job ends with every batch acknowledged exactly once and the
 * shards' integrity check finding nothing lost or applied twice.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { clusterAndDirForFile, explainExit, hetps, watchAcks, writeJobConfig, type Child } from '../support/ps.ts';
import { until } from '../support/until.ts';

const env = clusterAndDirForFile('hetps-standby-');

test('hps: a warmed standby takes a SIGKILLed member\'s place in its group; nothing lost or applied twice', { timeout: 240_000 }, async (t) => {
  const job = 'standby';
  const cfg = await writeJobConfig(env.dir(), { job, mode: 'hps', servers: env.nats().urls, runDir: join(env.dir(), 'runs'), samples: 4000, epochs: 2, workerRecoveryTimeoutS: 30 });
  await writeFile(cfg, (await readFile(cfg, 'utf8')).replace('fault_tolerance: { worker_recovery_timeout: 30 }',
    'fault_tolerance: { worker_recovery_timeout: 30, standby_workers: [w5], preheat_backup: true }'));
  const watch = await watchAcks(env.nats().urls, job);
  const { acks, byNode } = watch;
  const children: Child[] = [];
  try {
    for (const s of ['s1', 's2']) children.push(hetps(['launch', '--role', 'server', '--config', cfg, '--server-id', s], { timeoutMs: 230_000 }));
    const workers = [['g1', '0'], ['g1', '1'], ['g2', '0'], ['g2', '1']].map(([g, r]) =>
      hetps(['launch', '--role', 'worker', '--config', cfg, '--group', g!, '--node-rank', r!], { timeoutMs: 230_000 }));
    const standby = hetps(['launch', '--role', 'worker', '--config', cfg, '--node', 'w5'], { timeoutMs: 230_000 });
    children.push(...workers, standby);
    await until(() => workers.every((w) => /ready; waiting for the job/.test(w.stderr())) && /ready; waiting for the job/.test(standby.stderr()),
      'every worker ready', 90_000, () => standby.stderr().slice(-2000));
    const summaryFile = join(env.dir(), 'summary.json');
    const driver = hetps(['up', '--config', cfg, '--no-launch', '--summary', summaryFile], { timeoutMs: 230_000 });
    children.push(driver);
    await until(() => /standby w5: warm and waiting to take the place of a dead group member/.test(standby.stderr()), 'w5 waiting as a standby', 60_000,
      () => standby.stderr().slice(-2000));

    await until(() => (byNode.get('w1') ?? 0) >= 4, 'w1 acknowledged 4 batches', 120_000,
      () => `${JSON.stringify(Object.fromEntries(byNode))}\n${driver.stderr().slice(-3000)}`);
    assert.equal(byNode.get('w5') ?? 0, 0, 'the standby trained nothing before a member died');
    workers[0]!.child.kill('SIGKILL');
    const killTime = Date.now();
    const killedAt = byNode.get('w1')!;
    await until(() => (byNode.get('w5') ?? 0) > 0, 'a batch acknowledged by the standby', 60_000, () => `${standby.stderr().slice(-2000)}\n${driver.stderr().slice(-2000)}`);
    t.diagnostic(`w5's first acknowledgement ${Date.now() - killTime} ms after w1's SIGKILL`);

    const r = await driver.exited;
    assert.equal(r.code, 0, explainExit(r));
    const s = JSON.parse(await readFile(summaryFile, 'utf8')) as {
      batches: number; batches_acked: number; duplicate_acks: number; redelivered: number;
      integrity: { lost: number; duplicated: number; replicas_equal: boolean | null; applied: number; dropped_stale?: number };
      regroups: { trigger: string; replaced: { dead: string; standby: string; group: string }[]; groups: { name: string; nodes: string[] }[]; pause_s: number }[];
    };
    const took = s.regroups.find((g) => g.trigger === 'standby');
    assert.ok(took, `a standby regroup: ${JSON.stringify(s.regroups)}`);
    assert.deepEqual(took.replaced, [{ dead: 'w1', standby: 'w5', group: 'g1' }]);
    assert.deepEqual(took.groups.find((g) => g.name === 'g1')!.nodes, ['w5', 'w2']);
    assert.equal(byNode.get('w1'), killedAt, 'the killed worker acknowledged nothing more');
    assert.equal(s.batches_acked, s.batches);
    assert.equal(s.duplicate_acks, 0);
    assert.equal(acks.size, s.batches);
    assert.deepEqual([...acks.entries()].filter(([, n]) => n !== 1), [], 'every batch acknowledged exactly once');
    assert.deepEqual([s.integrity.lost, s.integrity.duplicated, s.integrity.replicas_equal], [0, 0, true], JSON.stringify(s.integrity));
    assert.equal(s.integrity.applied + (s.integrity.dropped_stale ?? 0), s.batches, 'every batch applied once, or acknowledged and dropped as too stale');
    assert.match(standby.stderr(), /standby w5: takes a place in group g1 \(w5, w2\)/);
    assert.match(workers[1]!.stderr(), /regrouped \(groups v\d+\): now sync inside group g1 \(w5, w2\)/);
    t.diagnostic(`standby regroup paused the others ${took.pause_s} s; per worker ${JSON.stringify(Object.fromEntries(byNode))}; ${s.redelivered} redelivered`);
  } finally {
    await watch.close();
    for (const c of children) c.kill('SIGKILL');
  }
});
