/**
 * hps over a real 3-node NATS cluster: a member of a sync group is
 * SIGKILLed mid-training. The health actor's `dead` verdict for it arrives
 * within 1.5 s (heard by a plain nats.js client on tel.health); its group
 * degrades to async on that verdict (its group mate pushes its windows on
 * its own); once the worker recovery timeout (3 s) passes with it still
 * dead, the driver re-forms the group without it and the mate syncs again;
 * its unacknowledged batches come back from the queue after ack_wait;
 * every batch is acknowledged exactly once.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { startTestCluster, type TestCluster } from '../support/cluster.ts';
import { connect } from '@nats-io/transport-node';
import { encode } from '@msgpack/msgpack';
import { hetps, watchAcks, watchVerdicts, writeJobConfig, type Child, type Exited } from '../support/ps.ts';

let nats: TestCluster;
let dir: string;

const explain = (r: Exited) => `exit ${r.code ?? r.signal}; stderr (tail):\n${r.stderr.split('\n').slice(-40).join('\n')}`;

before(async () => {
  nats = await startTestCluster({ nodes: 3 });
  dir = await mkdtemp(join(tmpdir(), 'hetps-hps-kill-'));
});

after(async () => {
  await nats?.[Symbol.asyncDispose]();
  if (dir) await rm(dir, { recursive: true, force: true });
});

/**
 * g1 [w1, w2] and g2 [w3, w4] (sync every 4 steps; worker_recovery_timeout 3 s) on 2 servers, each node its own process,
 * the driver started once every worker is ready; every child goes into `children` (killed by the caller).
 */
async function hpsRun(job: string, children: Child[], epochs = 1) {
  const cfg = await writeJobConfig(dir, { job, mode: 'hps', servers: nats.urls, runDir: join(dir, 'runs'), samples: 3200, epochs, workerRecoveryTimeoutS: 3 });
  for (const s of ['s1', 's2']) children.push(hetps(['launch', '--role', 'server', '--config', cfg, '--server-id', s], { timeoutMs: 160_000 }));
  const workers = [['g1', '0'], ['g1', '1'], ['g2', '0'], ['g2', '1']].map(([g, r]) =>
    hetps(['launch', '--role', 'worker', '--config', cfg, '--group', g!, '--node-rank', r!], { timeoutMs: 160_000 }));
  children.push(...workers);
  // Every node profiles itself when it joins: let them finish before the driver starts (not a race these tests are about).
  const ready = Date.now() + 60_000;
  for (const w of workers) {
    while (!/ready; waiting for the job/.test(w.stderr())) {
      assert.ok(Date.now() < ready && w.child.exitCode === null, `a worker did not get ready:\n${w.stderr().slice(-2000)}`);
      await sleep(50);
    }
  }
  const summaryFile = join(dir, `${job}-summary.json`);
  const driver = hetps(['up', '--config', cfg, '--no-launch', '--summary', summaryFile], { timeoutMs: 160_000 });
  children.push(driver);
  return { workers: workers as [Child, Child, Child, Child], driver, summaryFile };
}

test('hps: a sync-group member SIGKILLed mid-training degrades its group to async on the dead verdict; after the recovery timeout the group re-forms without it; every batch acknowledged once', { timeout: 120_000 }, async (t) => {
  const job = 'hpskill';
  const watch = await watchAcks(nats.urls, job);
  const health = await watchVerdicts(nats.urls, job);
  const { acks, byNode } = watch;
  const children: Child[] = [];
  try {
    const { workers: [victim, w2], driver, summaryFile } = await hpsRun(job, children);
    const deadline = Date.now() + 60_000;
    while ((byNode.get('w1') ?? 0) < 8) {
      assert.ok(Date.now() < deadline, `w1 never acknowledged 8 batches; driver stderr:\n${driver.stderr().slice(-3000)}`);
      await sleep(20);
    }
    victim.kill('SIGKILL');
    const killTime = Date.now();
    const killedAt = byNode.get('w1')!;
    while (health.first('w1', 'dead', killTime) === undefined) {
      assert.ok(Date.now() - killTime < 10_000, `no dead verdict for w1: ${JSON.stringify(health.verdicts)}`);
      await sleep(5);
    }
    const deadAfter = health.first('w1', 'dead', killTime)!.at - killTime;
    t.diagnostic(`w1's dead verdict arrived ${deadAfter} ms after SIGKILL`);
    assert.ok(deadAfter <= 1_500, `dead verdict after ${deadAfter} ms`);
    const w2Before = byNode.get('w2') ?? 0;

    const r = await driver.exited;
    assert.equal(r.code, 0, explain(r));
    const s = JSON.parse(await readFile(summaryFile, 'utf8')) as {
      batches: number; batches_acked: number; duplicate_acks: number; redelivered: number; integrity: { lost: number; duplicated: number; replicas_equal: boolean | null };
      regroups: { trigger: string; reason: string; at_s: number; pause_s: number }[];
    };
    assert.deepEqual([s.integrity.lost, s.integrity.duplicated, s.integrity.replicas_equal], [0, 0, true], 'nothing lost or applied twice on the shards');
    t.diagnostic(`w1 killed after ${killedAt} acks; per worker ${JSON.stringify(Object.fromEntries(byNode))}; ${s.redelivered} redelivered`);
    assert.equal(s.batches_acked, s.batches);
    assert.equal(s.duplicate_acks, 0);
    assert.equal(acks.size, s.batches, 'every batch id was acknowledged');
    assert.deepEqual([...acks.entries()].filter(([, n]) => n !== 1), [], 'and each exactly once');
    assert.equal(byNode.get('w1'), killedAt, 'the killed member acknowledged nothing more');
    assert.ok((byNode.get('w2') ?? 0) > w2Before + 4, 'its group mate went on training without it');
    const e2 = await w2.exited;
    assert.equal(e2.code, 0, explain(e2));
    assert.match(e2.stderr, /w1 is dead by the health actor's verdict; the group goes on without it \(async/);
    assert.match(e2.stderr, /group g1: degraded to async while w1 is dead: w2 pushes its windows on its own/);
    const reform = s.regroups.find((g) => g.trigger === 'recovery-timeout');
    assert.ok(reform, `the driver re-formed g1 without w1 after the recovery timeout: ${JSON.stringify(s.regroups)}`);
    assert.match(reform.reason, /w1 dead for longer than the worker recovery timeout \(3\.0 s\)/);
    // Re-formed: w2 forms without the dead w1 at once (no forming timeout) and syncs again.
    assert.match(e2.stderr, /w1 left the group \(dead by the health actor's verdict\); the group goes on without them/);
    assert.match(e2.stderr, /regrouped \(groups v\d+\): now sync inside group g1 \(w1, w2\)/);
    t.diagnostic(`re-formed ${reform.at_s} s into the run, paused ${reform.pause_s} s`);
  } finally {
    await health.close();
    await watch.close();
    for (const c of children) c.kill('SIGKILL');
  }
});

test('hps: a dead verdict for a sync-group member that comes and goes where the driver does not see it (a scheduler that took over after it) stalls nothing: the member pushes alone on its mate\'s notice, the driver re-forms the group it finds degraded with both alive', { timeout: 180_000 }, async (t) => {
  const job = 'hpsflap';
  const watch = await watchAcks(nats.urls, job);
  const { acks, byNode } = watch;
  const children: Child[] = [];
  // A plain nats.js client publishes the verdicts, as a health actor in a scheduler process that then died would have:
  // the workers' verdict watchers take them, the running driver's health actor never made them.
  const nc = await connect({ servers: nats.urls, name: 'verdict-flapper' });
  try {
    // Two epochs: long enough after the verdicts for the driver to find the group degraded for the recovery timeout (3 s).
    const { workers: [w1, w2], driver, summaryFile } = await hpsRun(job, children, 2);
    const deadline = Date.now() + 60_000;
    while ((byNode.get('w1') ?? 0) < 4) {
      assert.ok(Date.now() < deadline, `w1 never acknowledged 4 batches; driver stderr:\n${driver.stderr().slice(-3000)}`);
      await sleep(20);
    }
    const verdict = (state: 'dead' | 'alive') => nc.publish(`hps.${job}.tel.health.w1`, encode({ node: 'w1', role: 'worker', state, since_ms: Date.now(), reason: 'test', reported: 'training', silent_ms: 0 }));
    verdict('dead');
    await sleep(300);
    verdict('alive');
    await nc.flush();
    const flappedAt = byNode.get('w1')!;

    // A stall names where each of g1's members and the driver were.
    const stalled = new AbortController();
    const tail = (c: Child) => c.stderr().split('\n').filter((l) => !/serves membership|does not take its/.test(l)).slice(-15).join('\n');
    const r = await Promise.race([driver.exited, sleep(90_000, null, { signal: stalled.signal }).then(() => {
      throw new Error(`the job did not end within 90 s of the verdicts\nw1:\n${tail(w1)}\nw2:\n${tail(w2)}\ndriver:\n${tail(driver)}`);
    })]).finally(() => stalled.abort());
    assert.equal(r.code, 0, explain(r));
    const s = JSON.parse(await readFile(summaryFile, 'utf8')) as {
      batches: number; batches_acked: number; duplicate_acks: number; integrity: { lost: number; duplicated: number; replicas_equal: boolean | null };
      regroups: { trigger: string; reason: string; at_s: number; pause_s: number }[];
    };
    assert.deepEqual([s.integrity.lost, s.integrity.duplicated, s.integrity.replicas_equal], [0, 0, true], 'nothing lost or applied twice on the shards');
    assert.equal(s.batches_acked, s.batches);
    assert.equal(acks.size, s.batches, 'every batch id was acknowledged');
    assert.deepEqual([...acks.entries()].filter(([, n]) => n !== 1), [], 'and each exactly once');
    assert.ok(byNode.get('w1')! > flappedAt, 'w1 went on training');
    const [e1, e2] = [await w1.exited, await w2.exited];
    assert.equal(e2.code, 0, explain(e2));
    assert.match(e2.stderr, /w1 is dead by the health actor's verdict; the group goes on without it \(async/);
    assert.match(e2.stderr, /group g1: w1 is (back|alive again)/);
    assert.equal(s.regroups.filter((g) => g.trigger === 'rejoin').length, 0, `the driver saw no dead verdict, so no rejoin: ${JSON.stringify(s.regroups)}`);
    const reform = s.regroups.find((g) => g.trigger === 'stranded');
    assert.ok(reform, `the driver re-formed g1, degraded with every member alive: ${JSON.stringify(s.regroups)}`);
    assert.match(reform.reason, /group g1 degraded for [0-9.]+ s with every member alive by the health verdicts/);
    assert.match(e2.stderr, /regrouped \(groups v\d+\): now sync inside group g1 \(w1, w2\)/);
    t.diagnostic(`w1 acknowledged ${flappedAt} before the verdicts, ${byNode.get('w1')} in all; re-formed ${reform.at_s} s into the run (${reform.reason}), paused ${reform.pause_s} s; `
      + `w1 pushed ${(e1.stderr.match(/a member pushes this window alone/g) ?? []).length} window(s) alone on its mate's notice`);
  } finally {
    await nc.close();
    await watch.close();
    for (const c of children) c.kill('SIGKILL');
  }
});
