/**
 * A training script (the API, `HeterogeneousParameterServer`) as a member of
 * an hps sync group over a real 3-node NATS cluster: its steps take part in
 * the group's rounds with a launched worker, and every batch is acknowledged
 * exactly once; a regroup mid-run moves it into the other group, where it
 * trains on and its batches are reported.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startTestCluster, type TestCluster } from '../support/cluster.ts';
import { hetps, node, watchAcks, writeJobConfig, type Exited } from '../support/ps.ts';
import { verifyCheckpoint } from '../../actors/store/checkpoint.ts';

let nats: TestCluster;
let dir: string;

const explain = (r: Exited) => `exit ${r.code ?? r.signal}; stderr (tail):\n${r.stderr.split('\n').slice(-40).join('\n')}`;

before(async () => {
  nats = await startTestCluster({ nodes: 3 });
  dir = await mkdtemp(join(tmpdir(), 'hetps-api-group-'));
});

after(async () => {
  await nats?.[Symbol.asyncDispose]();
  if (dir) await rm(dir, { recursive: true, force: true });
});

test('hps: an API worker trains as a member of its sync group (rounds with a launched worker); every batch acknowledged once', { timeout: 110_000 }, async (t) => {
  const job = 'apigroup';
  // g1 [w1, w2] and g2 [w3, w4], both sync (sync_steps 4 by default); w2 is the API script.
  const cfg = await writeJobConfig(dir, { job, mode: 'hps', servers: nats.urls, runDir: join(dir, 'runs'), samples: 1280, epochs: 1, workerRecoveryTimeoutS: 10 });
  const watch = await watchAcks(nats.urls, job);
  const { acks } = watch;
  const summaryFile = join(dir, 'summary.json');
  const driver = hetps(['up', '--config', cfg, '--skip', 'w2', '--summary', summaryFile], { timeoutMs: 100_000 });
  const api = node(['--import', 'tsx', 'examples/api-worker.ts', cfg, 'g1', '1'], {
    // After its 3rd step the script saves a checkpoint through the driver's cut: it and every launched worker pause for it.
    env: { HETPS_NATS: nats.urls.join(','), HETPS_CHECKPOINT: join(dir, 'checkpoint'), HETPS_CHECKPOINT_AT_STEP: '3' }, timeoutMs: 100_000,
  });
  try {
    const r = await driver.exited;
    assert.equal(r.code, 0, explain(r));
    const a = await api.exited;
    assert.equal(a.code, 0, explain(a));
    const s = JSON.parse(await readFile(summaryFile, 'utf8')) as { batches: number; batches_acked: number; duplicate_acks: number; per_worker: Record<string, number>; per_worker_group: Record<string, Record<string, number>> };
    t.diagnostic(`per worker ${JSON.stringify(s.per_worker)}; w2 windows ${(watch.windowsOf.get('w2')?.size ?? 0)}`);
    assert.equal(s.batches_acked, s.batches);
    assert.equal(s.duplicate_acks, 0);
    assert.deepEqual([...acks.values()].filter((n) => n !== 1), [], 'each batch acknowledged exactly once');
    assert.ok((s.per_worker.w2 ?? 0) > 3, `the API worker trained batches, also after the cut at its 3rd step (${s.per_worker.w2})`);
    assert.deepEqual(Object.keys(s.per_worker_group.w2 ?? {}), ['g1'], 'in its group g1');
    assert.ok((watch.windowsOf.get('w2')?.size ?? 0) >= 2, 'its batches were trained in the group\'s windows');
    assert.match(a.stdout, /checkpoint of 2 shards .* after step 3/);
    // The same cut as ctl.checkpoint: every worker paused (w2 in its group window), the acknowledged batches recorded.
    const manifest = await verifyCheckpoint(join(dir, 'checkpoint'));
    assert.equal(manifest.trigger, 'api');
    assert.equal(manifest.kind, 'full');
    assert.ok(manifest.data !== null && manifest.data.acked.length > 0 && manifest.data.acked.length < s.batches, `a cut mid-run (${manifest.data?.acked.length} of ${s.batches} batches done)`);
    assert.ok(watch.regroupReady.get('w2')?.size, 'the API worker reported ready for the cut\'s pause');
    assert.match(r.stderr, /checkpoint \S+ \(api, full\)/);
  } finally {
    await watch.close();
    driver.kill('SIGKILL');
    api.kill('SIGKILL');
  }
});

test('hps: a regroup mid-run moves the API worker into the other group; it trains there, its batches are reported in that group, every batch acknowledged once', { timeout: 110_000 }, async (t) => {
  const job = 'apiregroup';
  const cfg = await writeJobConfig(dir, { job, mode: 'hps', servers: nats.urls, runDir: join(dir, 'runs-regroup'), samples: 2560, epochs: 1, workerRecoveryTimeoutS: 10 });
  // g1 [w1, w2] and g2 [w3, w4]; after 4 of the 64 batches are acknowledged the API worker w2 moves to g2.
  const script = join(dir, 'regroup.json');
  await writeFile(script, JSON.stringify([{
    after_batches: 4,
    command: 'regroup',
    body: {
      reason: 'test: move the API worker into g2',
      groups: [
        { name: 'g1', nodes: ['w1'], sync_mode: 'sync', sync_steps: 4 },
        { name: 'g2', nodes: ['w2', 'w3', 'w4'], sync_mode: 'sync', sync_steps: 4 },
      ],
    },
  }]));
  const watch = await watchAcks(nats.urls, job);
  const summaryFile = join(dir, 'summary-regroup.json');
  const driver = hetps(['up', '--config', cfg, '--skip', 'w2', '--summary', summaryFile, '--ctl-script', script], { timeoutMs: 100_000 });
  const api = node(['--import', 'tsx', 'examples/api-worker.ts', cfg, 'g1', '1'], {
    env: { HETPS_NATS: nats.urls.join(','), HETPS_CHECKPOINT_AT_STEP: '1000000' }, timeoutMs: 100_000,
  });
  try {
    const r = await driver.exited;
    assert.equal(r.code, 0, explain(r));
    const a = await api.exited;
    assert.equal(a.code, 0, explain(a));
    const s = JSON.parse(await readFile(summaryFile, 'utf8')) as {
      batches: number; batches_acked: number; duplicate_acks: number; per_worker_group: Record<string, Record<string, number>>;
      regroups: { groups_version: number; moved: string[]; not_ready: string[]; groups: { name: string; nodes: string[] }[] }[];
    };
    t.diagnostic(`per worker and group ${JSON.stringify(s.per_worker_group)}`);
    assert.equal(s.regroups.length, 1, 'the summary lists the regroup');
    assert.deepEqual(s.regroups[0]!.moved, ['w2']);
    assert.deepEqual(s.regroups[0]!.not_ready, [], 'every live worker, the API one too, paused for it');
    assert.deepEqual(s.regroups[0]!.groups.find((g) => g.name === 'g2')!.nodes, ['w2', 'w3', 'w4']);
    assert.equal(s.batches_acked, s.batches);
    assert.equal(s.duplicate_acks, 0);
    assert.deepEqual([...watch.acks.values()].filter((n) => n !== 1), [], 'each batch acknowledged exactly once');
    const w2 = s.per_worker_group.w2 ?? {};
    assert.ok((w2.g2 ?? 0) > 0, `the API worker trained in g2 after the regroup: ${JSON.stringify(w2)}`);
    assert.deepEqual(Object.keys(w2).filter((g) => g !== 'g1' && g !== 'g2'), [], 'in no other group');
    assert.match(a.stderr, /resumed \(groups v1\): sync in group g2 \(w2, w3, w4\)/);
  } finally {
    await watch.close();
    driver.kill('SIGKILL');
    api.kill('SIGKILL');
  }
});
