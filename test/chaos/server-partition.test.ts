/**
 * A network partition of a shard's primary, on a real network: server s1
 * runs in its own Linux network namespace of the network lab
 * (deploy/netlab.ts), reaching a 3-node NATS cluster over a veth link; the
 * workers, s2 and the driver run on the host. Mid-training s1's link is cut
 * for 5 s, then healed:
 *
 * - the dead verdict fails shard s1 over to s2 (its backup): training goes
 *   on, with s2 holding both primaries;
 * - the cut-off primary applies nothing the job keeps: whatever it took
 *   during the cut it could not get its backup to confirm, so none of it was
 *   acknowledged; once healed it follows the new plan, its replicas start
 *   again fresh and are seeded from s2 as backups;
 * - with s1 a backup again and s2 serving everything, load balancing
 *   (`sustain_seconds: 2`) hands one primary back to s1;
 * - the job ends with every batch acknowledged exactly once, the integrity
 *   check finding nothing lost or applied twice and the replicas equal.
 *
 * Needs root and iproute2 (CI runs as root); where the lab cannot run the
 * test fails with the reason rather than skip.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ChildProcess } from 'node:child_process';
import { BIN, ROOT, explainExit, hetps, watchAcks, watchVerdicts, writeJobConfig, type Child } from '../support/ps.ts';
import { until } from '../support/until.ts';
import { collectOutput, labAndClusterForFile } from '../support/lab.ts';

const CUT_MS = 5_000;

const fx = labAndClusterForFile({ prefix: 'hetps-server-partition-', lab: 'spart', natsNodes: 3 });

test('a shard primary cut off for 5 s is failed over on its dead verdict; healed, it is seeded back as a backup and load balancing hands it a primary again; nothing lost or applied twice', { timeout: 300_000 }, async (t) => {
  const cluster = fx.cluster();
  const lab = fx.lab();
  const dir = fx.dir();
  const job = 'spart';
  const urls = cluster.urls;
  const cfg = await writeJobConfig(dir, { job, mode: 'hps', servers: urls, runDir: join(dir, 'runs'), samples: 4000, epochs: 8, workerRecoveryTimeoutS: 30 });
  await writeFile(cfg, (await readFile(cfg, 'utf8')).replace('training: { mode: hps, random_seed: 42 }', 'training: { mode: hps, random_seed: 42, emulation_reference_step_ms: 30 }')
    + 'load_balancing: { imbalance_threshold: 0.3, sustain_seconds: 2 }\n');
  const watch = await watchAcks(urls, job);
  const health = await watchVerdicts(urls, job);
  const { acks } = watch;
  const children: Child[] = [];
  let s1: ChildProcess | null = null;
  try {
    const link = await lab.addNode('s1');
    s1 = lab.spawn('s1', process.execPath, [BIN, 'launch', '--role', 'server', '--config', cfg, '--server-id', 's1', '--nats', cluster.urlsFor(link.hostIp).join(','), '--job', job],
      { cwd: ROOT, env: { ...process.env }, stdio: ['ignore', 'pipe', 'pipe'] });
    const s1Out = collectOutput(s1);
    children.push(hetps(['launch', '--role', 'server', '--config', cfg, '--server-id', 's2'], { timeoutMs: 290_000 }));
    for (const [g, r] of [['g1', '0'], ['g1', '1'], ['g2', '0'], ['g2', '1']] as const) {
      children.push(hetps(['launch', '--role', 'worker', '--config', cfg, '--group', g, '--node-rank', r], { timeoutMs: 290_000 }));
    }
    const summaryFile = join(dir, 'summary.json');
    const driver = hetps(['up', '--config', cfg, '--no-launch', '--summary', summaryFile], { timeoutMs: 290_000 });
    children.push(driver);

    await until(() => acks.size >= 30, '30 batches acknowledged', 150_000, () => `${driver.stderr().slice(-3000)}\n--- s1:\n${s1Out().slice(-2000)}`);
    const cutAt = Date.now();
    const ackedAtCut = acks.size;
    await lab.cut('s1');
    await until(() => health.first('s1', 'dead', cutAt) !== undefined, 'a dead verdict for s1', 10_000, () => JSON.stringify(health.verdicts.slice(-10)));
    const deadAfter = health.first('s1', 'dead', cutAt)!.at - cutAt;
    await sleep(Math.max(0, CUT_MS - (Date.now() - cutAt)));
    const duringCut = acks.size - ackedAtCut;
    await lab.heal('s1');
    const healedAt = Date.now();
    t.diagnostic(`s1 dead ${deadAfter} ms after the cut; ${duringCut} batches acknowledged during the ${CUT_MS / 1000} s cut`);
    assert.ok(duringCut > 0, 'training went on while s1 was cut off (its shard served by s2)');

    const ended = await Promise.race([driver.exited, sleep(150_000, null, { ref: false })]);
    assert.ok(ended !== null, `the job did not end within 150 s of the heal\n--- driver:\n${driver.stderr().slice(-4000)}\n--- s1:\n${s1Out().slice(-3000)}`);
    assert.equal(ended.code, 0, explainExit(ended));
    t.diagnostic(`the job ended ${((Date.now() - healedAt) / 1000).toFixed(1)} s after the heal`);
    const s = JSON.parse(await readFile(summaryFile, 'utf8')) as {
      batches: number; batches_acked: number; duplicate_acks: number;
      integrity: { lost: number; duplicated: number; replicas_equal: boolean | null; applied: number; dropped_stale?: number };
      replication: { failovers: { shard: string; from: string; to: string }[]; replicas_added: { shard: string; node: string; kind: string }[]; shards_lost: string[] };
      load_balancing: { migrations: { shard: string; from: string; to: string; imbalance: number; took_ms: number; measured_after: { imbalance: number } | null }[] } | null;
    };
    t.diagnostic(`failovers ${JSON.stringify(s.replication.failovers)}; replicas added ${JSON.stringify(s.replication.replicas_added.map((r) => `${r.shard}@${r.node}:${r.kind}`))}; moves ${JSON.stringify(s.load_balancing?.migrations)}`);
    assert.ok(s.replication.failovers.some((f) => f.shard === 's1' && f.from === 's1' && f.to === 's2'), 'shard s1 failed over to s2');
    assert.deepEqual(s.replication.shards_lost, []);
    const backOnS1 = [...new Set(s.replication.replicas_added.filter((r) => r.node === 's1' && r.kind === 'backup').map((r) => r.shard))].sort();
    assert.deepEqual(backOnS1, ['s1', 's2'], 'healed, s1 was seeded back as a backup of both shards');
    assert.match(s1Out(), /seeded from s2/, 'its replicas took their state from s2, not from what it held when cut off');
    const back = s.load_balancing?.migrations.filter((m) => m.from === 's2' && m.to === 's1') ?? [];
    assert.equal(back.length, 1, `load balancing handed one primary back to s1: ${JSON.stringify(s.load_balancing)}`);
    assert.equal(s.batches_acked, s.batches);
    assert.equal(s.duplicate_acks, 0);
    assert.deepEqual([...acks.entries()].filter(([, n]) => n !== 1), [], 'every batch acknowledged exactly once');
    assert.deepEqual([s.integrity.lost, s.integrity.duplicated, s.integrity.replicas_equal], [0, 0, true], JSON.stringify(s.integrity));
    assert.equal(s.integrity.applied + (s.integrity.dropped_stale ?? 0), s.batches, 'every batch applied once, or acknowledged and dropped as too stale');
  } finally {
    await health.close();
    await watch.close();
    try { s1?.kill('SIGKILL'); } catch { /* gone */ }
    for (const c of children) c.kill('SIGKILL');
  }
});
