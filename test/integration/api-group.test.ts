/**
 * A training script (the API, `HeterogeneousParameterServer`) as a member of
 * an hps sync group over a real 3-node NATS cluster: its steps take part in
 * the group's rounds with a launched worker, and every batch is acknowledged
 * exactly once.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
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
