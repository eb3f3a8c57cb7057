/**
 * `hetps up` starts the node processes, so it sees one exit: the health
 * actor's verdict for a SIGKILLed worker is `dead` with the exit as its
 * reason, without waiting for dead_after_ms of silence (which is set to 30 s
 * here, so only the exit can explain a fast verdict). The asp job still
 * acknowledges every batch exactly once.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { connect } from '@nats-io/transport-node';
import { decode } from '@msgpack/msgpack';
import { clusterAndDirForFile, explainExit, hetps, writeJobConfig } from '../support/ps.ts';

const env = clusterAndDirForFile('hetps-exit-');
const explain = explainExit;

test('a launched worker that is SIGKILLed is dead at once (its exit seen), and the job completes exactly once', { timeout: 150_000 }, async (t) => {
  const job = 'exitv';
  const base = await writeJobConfig(env.dir(), { job, mode: 'asp', servers: env.nats().urls, runDir: join(env.dir(), 'runs'), samples: 2400, epochs: 1, workerRecoveryTimeoutS: 3 });
  const cfg = join(env.dir(), 'exit.yaml');
  await writeFile(cfg, (await readFile(base, 'utf8')).replace('fault_tolerance: { worker_recovery_timeout: 3 }',
    'fault_tolerance: { worker_recovery_timeout: 3, heartbeat_ms: 250, dead_after_ms: 30000 }'));
  const nc = await connect({ servers: env.nats().urls, name: 'exit-watcher' });
  const verdicts: { node: string; state: string; reason: string; at: number }[] = [];
  let acked = 0;
  nc.subscribe(`hps.${job}.tel.health.*`, { callback: (_e, m) => { verdicts.push({ ...(decode(m.data) as { node: string; state: string; reason: string }), at: Date.now() }); } });
  nc.subscribe(`hps.${job}.tel.batch.*`, { callback: (_e, m) => { if ((decode(m.data) as { ack_confirmed: boolean }).ack_confirmed) acked++; } });
  await nc.flush();
  const summaryFile = join(env.dir(), 'summary.json');
  const driver = hetps(['up', '--config', cfg, '--summary', summaryFile], { timeoutMs: 140_000 });
  try {
    const deadline = Date.now() + 100_000;
    while (acked < 5) {
      assert.ok(Date.now() < deadline && driver.child.exitCode === null, `no training:\n${driver.stderr().slice(-3000)}`);
      await sleep(20);
    }
    // w1's process, started by the driver (its arguments name the job's config and its group rank).
    const pid = Number(execFileSync('pgrep', ['-f', `launch --role worker --group g1 --node-rank 0 .*${cfg}`]).toString().trim().split('\n')[0]);
    assert.ok(pid > 0, 'found the worker process');
    process.kill(pid, 'SIGKILL');
    const killedAt = Date.now();
    while (!verdicts.some((v) => v.node === 'w1' && v.state === 'dead')) {
      assert.ok(Date.now() - killedAt < 10_000, `no dead verdict for w1: ${JSON.stringify(verdicts)}`);
      await sleep(5);
    }
    const v = verdicts.find((x) => x.node === 'w1' && x.state === 'dead')!;
    t.diagnostic(`w1 dead ${v.at - killedAt} ms after SIGKILL: ${v.reason}`);
    assert.match(v.reason, /process exited \(signal SIGKILL\)/);
    assert.ok(v.at - killedAt < 1_500, `${v.at - killedAt} ms`);
    const r = await driver.exited;
    assert.equal(r.code, 0, explain(r));
    const s = JSON.parse(await readFile(summaryFile, 'utf8')) as { batches: number; batches_acked: number; duplicate_acks: number };
    assert.equal(s.batches_acked, s.batches);
    assert.equal(s.duplicate_acks, 0);
  } finally {
    driver.kill('SIGKILL');
    await nc.close();
  }
});
