/**
 * A server process restarted mid-job under the same name, over a real 3-node
 * NATS cluster: s1 (primary of one shard, backup of the other) is SIGKILLed
 * and started again at once with `hetps launch --role server --server-id s1`.
 * The new process holds a fresh state: the dead verdict fails its shard over
 * to s2, and once the new process is alive it gets a replica of both shards
 * again, seeded while training goes on (a backup refuses a restarted
 * primary's stream, so the fresh state is never served as the model). The
 * job ends with every batch acknowledged exactly once, nothing lost or
 * applied twice, and the replicas equal. With s1 a backup again, s2 holds
 * both primaries: load balancing (2 s of imbalance over 0.3) hands one back
 * to s1 while training goes on.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { clusterAndDirForFile, explainExit, hetps, watchAcks, writeJobConfig, type Child } from '../support/ps.ts';
import { until } from '../support/until.ts';

const env = clusterAndDirForFile('hetps-server-restart-');

test('a server SIGKILLed and started again under the same name is failed over, given its replicas again by seeding, and handed a primary back by load balancing; nothing lost or applied twice', { timeout: 240_000 }, async (t) => {
  const job = 'srestart';
  const cfg = await writeJobConfig(env.dir(), { job, mode: 'hps', servers: env.nats().urls, runDir: join(env.dir(), 'runs'), samples: 4000, epochs: 6, workerRecoveryTimeoutS: 30 });
  // Emulated steps, so training lasts long enough for the restart to happen in the middle of it.
  await writeFile(cfg, (await readFile(cfg, 'utf8')).replace('training: { mode: hps, random_seed: 42 }', 'training: { mode: hps, random_seed: 42, emulation_reference_step_ms: 30 }')
    // Once s1 is back as a backup, s2 holds both primaries: load balancing hands one back after 2 s of that.
    + 'load_balancing: { imbalance_threshold: 0.3, sustain_seconds: 2 }\n');
  const watch = await watchAcks(env.nats().urls, job);
  const { acks } = watch;
  const children: Child[] = [];
  const server = (id: string) => hetps(['launch', '--role', 'server', '--config', cfg, '--server-id', id], { timeoutMs: 230_000 });
  try {
    const s1 = server('s1');
    children.push(s1, server('s2'));
    for (const [g, r] of [['g1', '0'], ['g1', '1'], ['g2', '0'], ['g2', '1']] as const) {
      children.push(hetps(['launch', '--role', 'worker', '--config', cfg, '--group', g, '--node-rank', r], { timeoutMs: 230_000 }));
    }
    const summaryFile = join(env.dir(), 'summary.json');
    const driver = hetps(['up', '--config', cfg, '--no-launch', '--summary', summaryFile], { timeoutMs: 230_000 });
    children.push(driver);
    await until(() => acks.size >= 30, '30 batches acknowledged', 150_000, () => driver.stderr().slice(-3000));
    s1.child.kill('SIGKILL');
    const killedAt = acks.size;
    const again = server('s1');
    children.push(again);
    t.diagnostic(`s1 SIGKILLed at ${killedAt} acknowledged batches and started again`);

    const r = await driver.exited;
    assert.equal(r.code, 0, explainExit(r));
    const s = JSON.parse(await readFile(summaryFile, 'utf8')) as {
      batches: number; batches_acked: number; duplicate_acks: number;
      integrity: { lost: number; duplicated: number; replicas_equal: boolean | null; applied: number; dropped_stale?: number };
      replication: { failovers: { shard: string; from: string; to: string }[]; replicas_added: { shard: string; node: string; kind: string }[]; unprotected: string[]; shards_lost: string[] };
      load_balancing: {
        migrations: { shard: string; from: string; to: string; epoch: number; imbalance: number; took_ms: number; measured_after: { imbalance: number } | null }[];
      } | null;
    };
    t.diagnostic(`load balancing: ${JSON.stringify(s.load_balancing)}`);
    assert.ok(s.replication.failovers.some((f) => f.from === 's1' && f.to === 's2'), `s1's shard failed over to s2: ${JSON.stringify(s.replication.failovers)}`);
    const seededOnS1 = [...new Set(s.replication.replicas_added.filter((x) => x.node === 's1').map((x) => x.shard))].sort();
    assert.deepEqual(seededOnS1, ['s1', 's2'], `the restarted s1 was given a replica of both shards again: ${JSON.stringify(s.replication.replicas_added)}`);
    // A seeded replica becomes a backup while training goes on: once it is at most a message behind, pushes wait
    // for it, and it is made a backup when it has confirmed the stream up to there.
    const backOnS1 = s.replication.replicas_added.filter((x) => x.node === 's1' && x.kind === 'backup').map((x) => x.shard).sort();
    t.diagnostic(`s1 back as backup of ${JSON.stringify(backOnS1)}; unprotected at the end ${JSON.stringify(s.replication.unprotected)}`);
    assert.deepEqual(backOnS1, ['s1', 's2'], `the restarted s1 became a backup of both shards again: ${JSON.stringify(s.replication.replicas_added)}`);
    assert.deepEqual(s.replication.shards_lost, []);
    assert.equal(s.batches_acked, s.batches);
    assert.equal(s.duplicate_acks, 0);
    assert.deepEqual([...acks.entries()].filter(([, n]) => n !== 1), [], 'every batch acknowledged exactly once');
    assert.deepEqual([s.integrity.lost, s.integrity.duplicated, s.integrity.replicas_equal], [0, 0, true], JSON.stringify(s.integrity));
    assert.equal(s.integrity.applied + (s.integrity.dropped_stale ?? 0), s.batches, 'every batch applied once, or acknowledged and dropped as too stale');
    assert.match(again.stderr(), /seeded from s2/, 'the new s1 process took its state from s2');
    // s2 held both primaries after the failover: once s1 was a backup again, load balancing handed one back to it,
    // on the fresh process's seeded state, and the integrity checks above cover the handover.
    const back = s.load_balancing?.migrations.filter((m) => m.from === 's2' && m.to === 's1') ?? [];
    const balancerLog = () => driver.stderr().split('\n').filter((l) => /load balancing|caught up|seeded its replica/.test(l)).slice(-20).join('\n');
    assert.equal(back.length, 1, `one primary handed back to s1: ${JSON.stringify(s.load_balancing)}\n${balancerLog()}`);
    assert.ok(back[0]!.imbalance > 0.3, 'moved on an imbalance over the threshold');
    const after = back[0]!.measured_after;
    assert.ok(after !== null && after.imbalance < 0.3, `the loads measured once the move settled are within the threshold: ${JSON.stringify(after)}`);
  } finally {
    await watch.close();
    for (const c of children) c.kill('SIGKILL');
  }
});
