/**
 * Worker failover in asp and bsp over a real 3-node NATS cluster: one worker
 * SIGKILLed mid-training. Its batch comes back from the queue after the
 * short ack_wait (fault_tolerance.ack_wait_ms), bsp rounds go on with one
 * contribution fewer once the health actor says it is dead, and the job ends
 * with every batch acknowledged exactly once and the shards' integrity check
 * finding nothing lost or applied twice. (hps: test/chaos/hps-member-kill.)
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { clusterAndDirForFile, explainExit, hetps, watchAcks, writeJobConfig, type Child } from '../support/ps.ts';
import { until } from '../support/until.ts';

const env = clusterAndDirForFile('hetps-worker-failover-');

for (const mode of ['asp', 'bsp'] as const) {
  test(`${mode}: a worker SIGKILLed mid-training; the others go on; nothing lost or applied twice`, { timeout: 180_000 }, async (t) => {
    const job = `wfail${mode}`;
    const cfg = await writeJobConfig(env.dir(), { job, mode, servers: env.nats().urls, runDir: join(env.dir(), 'runs'), samples: 2560, epochs: 1, workerRecoveryTimeoutS: 30 });
    // Emulated steps, so training lasts long enough to kill a worker in the middle of it.
    await writeFile(cfg, (await readFile(cfg, 'utf8')).replace(`training: { mode: ${mode}, random_seed: 42 }`,
      `training: { mode: ${mode}, random_seed: 42, emulation_reference_step_ms: 40 }\nnodes: { w1: { emulate: { speed: 1 } }, w2: { emulate: { speed: 1 } }, w3: { emulate: { speed: 1 } }, w4: { emulate: { speed: 1 } } }`));
    const watch = await watchAcks(env.nats().urls, job);
    const children: Child[] = [];
    try {
      for (const s of ['s1', 's2']) children.push(hetps(['launch', '--role', 'server', '--config', cfg, '--server-id', s], { timeoutMs: 170_000 }));
      const workers = [['g1', '0'], ['g1', '1'], ['g2', '0'], ['g2', '1']].map(([g, r]) =>
        hetps(['launch', '--role', 'worker', '--config', cfg, '--group', g!, '--node-rank', r!], { timeoutMs: 170_000 }));
      children.push(...workers);
      const summaryFile = join(env.dir(), `${job}-summary.json`);
      const driver = hetps(['up', '--config', cfg, '--no-launch', '--summary', summaryFile], { timeoutMs: 170_000 });
      children.push(driver);
      // The queue hands batches to whoever asks first, so on a loaded machine one worker may get few of
      // them: the victim is the first worker with 3 acknowledgements, not a fixed one.
      const names = ['w1', 'w2', 'w3', 'w4'];
      let victim: string | undefined;
      await until(() => {
        if (driver.child.exitCode !== null) throw new Error(`the driver ended before any worker acknowledged 3 batches\n${driver.stderr().slice(-3000)}`);
        victim = names.find((w) => (watch.byNode.get(w) ?? 0) >= 3);
        return victim !== undefined;
      }, 'a worker acknowledged 3 batches', 120_000, () => `${JSON.stringify(Object.fromEntries(watch.byNode))}\n${driver.stderr().slice(-3000)}`);
      const killedAt = watch.byNode.get(victim!)!;
      workers[names.indexOf(victim!)]!.child.kill('SIGKILL');
      const killTime = Date.now();
      const others = () => names.filter((w) => w !== victim).reduce((n, w) => n + (watch.byNode.get(w) ?? 0), 0);
      const before = others();
      await until(() => others() > before, 'an acknowledgement by another worker after the kill', 30_000, () => driver.stderr().slice(-3000));
      t.diagnostic(`${mode}: first acknowledgement by another worker ${Date.now() - killTime} ms after the kill`);
      const r = await driver.exited;
      assert.equal(r.code, 0, explainExit(r));
      const s = JSON.parse(await readFile(summaryFile, 'utf8')) as {
        batches: number; batches_acked: number; duplicate_acks: number; redelivered: number;
        integrity: { lost: number; duplicated: number; replicas_equal: boolean | null; applied: number; dropped_stale?: number };
      };
      assert.equal(s.batches_acked, s.batches);
      assert.equal(s.duplicate_acks, 0);
      assert.deepEqual([...watch.acks.entries()].filter(([, n]) => n !== 1), [], 'every batch acknowledged exactly once');
      assert.equal(watch.byNode.get(victim!), killedAt, 'the killed worker acknowledged nothing more');
      assert.deepEqual([s.integrity.lost, s.integrity.duplicated, s.integrity.replicas_equal], [0, 0, true], JSON.stringify(s.integrity));
      assert.equal(s.integrity.applied + (s.integrity.dropped_stale ?? 0), s.batches, 'every batch applied once, or acknowledged and dropped as too stale');
      t.diagnostic(`${mode}: ${victim} killed after ${killedAt} acks; per worker ${JSON.stringify(Object.fromEntries(watch.byNode))}; ${s.redelivered} redelivered`);
    } finally {
      await watch.close();
      for (const c of children) c.child.kill('SIGKILL');
    }
  });
}
