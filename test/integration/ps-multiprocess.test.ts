/**
 * The parameter server end to end over a real 3-node NATS cluster: 2 shard
 * processes and 4 worker processes, compared with `hetps train-local` on the
 * same data and seed; and a worker SIGKILLed mid-epoch losing no batch.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { startTestCluster, type TestCluster } from '../support/cluster.ts';
import { hetps, lastJson, node, watchAcks, writeJobConfig, type Child, type Exited } from '../support/ps.ts';
import { verifyCheckpoint } from '../../actors/store/checkpoint.ts';

const SAMPLES = 1200;
const EPOCHS = 2;
let nats: TestCluster;
let dir: string;
let localAuc: number;

function explain(r: Exited): string {
  return `exit ${r.code ?? r.signal}; stderr (tail):\n${r.stderr.split('\n').slice(-40).join('\n')}`;
}

before(async () => {
  nats = await startTestCluster({ nodes: 3 });
  dir = await mkdtemp(join(tmpdir(), 'hetps-ps-'));
  const cfg = await writeJobConfig(dir, { job: 'pslocal', mode: 'asp', servers: null, runDir: join(dir, 'runs'), samples: SAMPLES, epochs: EPOCHS, workerRecoveryTimeoutS: 10 });
  const r = await hetps(['train-local', '--config', cfg, '--json'], { timeoutMs: 60_000 }).exited;
  assert.equal(r.code, 0, explain(r));
  localAuc = lastJson(r.stdout).test_auc as number;
  assert.ok(localAuc > 0.95, `train-local AUC ${localAuc}`);
});

after(async () => {
  await nats?.[Symbol.asyncDispose]();
  if (dir) await rm(dir, { recursive: true, force: true });
});

test('bsp: hetps up with 2 shard and 4 worker processes on NATS trains to train-local\'s AUC (±0.01), every batch acknowledged once', { timeout: 110_000 }, async (t) => {
  const cfg = await writeJobConfig(dir, { job: 'psbsp', mode: 'bsp', servers: nats.urls, runDir: join(dir, 'runs'), samples: SAMPLES, epochs: EPOCHS, workerRecoveryTimeoutS: 10 });
  const summaryFile = join(dir, 'bsp-summary.json');
  const r = await hetps(['up', '--config', cfg, '--summary', summaryFile], { timeoutMs: 100_000 }).exited;
  assert.equal(r.code, 0, explain(r));
  const s = JSON.parse(await readFile(summaryFile, 'utf8')) as Record<string, number | string | null>;
  t.diagnostic(`bsp: AUC ${s.test_auc} (train-local ${localAuc}), ${Math.round(s.samples_per_s as number)} samples/s, ${(s.wall_s as number).toFixed(1)} s wall`);
  assert.equal(s.transport, 'nats');
  assert.equal(s.mode, 'bsp');
  assert.equal(s.samples, SAMPLES * EPOCHS);
  assert.equal(s.batches_acked, s.batches);
  assert.equal(s.duplicate_acks, 0);
  assert.ok(Math.abs((s.test_auc as number) - localAuc) <= 0.01, `bsp AUC ${s.test_auc} vs train-local ${localAuc}`);
  assert.match(r.stdout, /done \(bsp over nats\)/);
  assert.match(r.stderr, /\[w3\] /, 'node output is prefixed with the node name');
});

test('hps with communication.compression fp16: slices and pushes go as halves over NATS; 2 shard and 4 worker processes train to train-local\'s AUC (±0.01), every batch acknowledged once', { timeout: 110_000 }, async (t) => {
  const cfg = await writeJobConfig(dir, { job: 'psfp16', mode: 'hps', servers: nats.urls, runDir: join(dir, 'runs'), samples: SAMPLES, epochs: EPOCHS, workerRecoveryTimeoutS: 10, compression: 'fp16' });
  const summaryFile = join(dir, 'fp16-summary.json');
  const r = await hetps(['up', '--config', cfg, '--summary', summaryFile], { timeoutMs: 100_000 }).exited;
  assert.equal(r.code, 0, explain(r));
  const s = JSON.parse(await readFile(summaryFile, 'utf8')) as Record<string, number | string | null>;
  t.diagnostic(`hps fp16: AUC ${s.test_auc} (train-local ${localAuc}), ${Math.round(s.samples_per_s as number)} samples/s`);
  assert.equal(s.transport, 'nats');
  assert.equal(s.mode, 'hps');
  assert.equal(s.batches_acked, s.batches);
  assert.equal(s.duplicate_acks, 0);
  assert.ok(Math.abs((s.test_auc as number) - localAuc) <= 0.01, `hps fp16 AUC ${s.test_auc} vs train-local ${localAuc}`);
  assert.doesNotMatch(r.stdout + r.stderr, /communication\.compression=fp16 \(not active/, 'fp16 is not reported as inactive');
  assert.doesNotMatch(r.stdout + r.stderr, /invalid message/, 'every compressed message passed validation');
});

test('hps with cluster.shards_per_server 2: 4 shards on the 2 server processes (each primary on its own server, backed up on the other), every shard updated, every batch applied once, AUC within 0.01 of train-local', { timeout: 110_000 }, async (t) => {
  const cfg = await writeJobConfig(dir, { job: 'ps4shards', mode: 'hps', servers: nats.urls, runDir: join(dir, 'runs'), samples: SAMPLES, epochs: EPOCHS, workerRecoveryTimeoutS: 10, shardsPerServer: 2 });
  const summaryFile = join(dir, 'shards4-summary.json');
  const r = await hetps(['up', '--config', cfg, '--summary', summaryFile], { timeoutMs: 100_000 }).exited;
  assert.equal(r.code, 0, explain(r));
  const s = JSON.parse(await readFile(summaryFile, 'utf8')) as Record<string, unknown> & {
    integrity: { lost: number; duplicated: number; replicas_equal: boolean | null; per_shard: Record<string, { primary: string; replicas: number; equal: boolean | null; version: number }> };
  };
  t.diagnostic(`hps, 4 shards: AUC ${s.test_auc} (train-local ${localAuc}), ${Math.round(s.samples_per_s as number)} samples/s; shard versions ${JSON.stringify(Object.fromEntries(Object.entries(s.integrity.per_shard).map(([k, v]) => [k, v.version])))}`);
  assert.equal(s.mode, 'hps');
  assert.deepEqual(Object.keys(s.integrity.per_shard).sort(), ['s1', 's1~2', 's2', 's2~2']);
  assert.deepEqual(Object.fromEntries(Object.entries(s.integrity.per_shard).map(([k, v]) => [k, v.primary])), { s1: 's1', s2: 's2', 's1~2': 's1', 's2~2': 's2' });
  for (const [shard, v] of Object.entries(s.integrity.per_shard)) {
    assert.equal(v.replicas, 2, `${shard}: primary and one backup (backup_factor 1)`);
    assert.equal(v.equal, true, `${shard}: its backup equals its primary`);
    assert.ok(v.version > 0, `${shard} was updated`);
  }
  assert.deepEqual([s.integrity.lost, s.integrity.duplicated, s.integrity.replicas_equal], [0, 0, true]);
  assert.equal(s.batches_acked, s.batches);
  assert.equal(s.duplicate_acks, 0);
  assert.ok(Math.abs((s.test_auc as number) - localAuc) <= 0.01, `AUC ${s.test_auc} vs train-local ${localAuc}`);
  // Hotness sharding (on by default): the warm-up's plan, its expected loads no further apart than round-robin's.
  const sh = s.sharding as { hotness: boolean; warmup_batches: number; partitions: number; expected_loads: Record<string, number>; expected_imbalance: number; round_robin_imbalance: number };
  t.diagnostic(`sharding ${JSON.stringify(sh)}`);
  // 64 batches by default, at most an epoch's (SAMPLES of 32).
  assert.deepEqual([sh.hotness, sh.warmup_batches, sh.partitions, Object.keys(sh.expected_loads).sort()], [true, Math.ceil(SAMPLES / 32), 256, ['s1', 's1~2', 's2', 's2~2']]);
  assert.ok(sh.expected_imbalance <= sh.round_robin_imbalance, JSON.stringify(sh));
  assert.match(r.stderr, /hotness sharding: 38 warm-up batches; floats per batch by shard s1 \d+, s2 \d+, s1~2 \d+, s2~2 \d+: imbalance [\d.]+ \(round-robin [\d.]+\)/);
});

test('asp: nodes started before the driver, one worker SIGKILLed mid-epoch — every batch acknowledged exactly once, AUC within 0.01', { timeout: 110_000 }, async (t) => {
  const job = 'psasp';
  const cfg = await writeJobConfig(dir, { job, mode: 'asp', servers: nats.urls, runDir: join(dir, 'runs'), samples: SAMPLES, epochs: EPOCHS, workerRecoveryTimeoutS: 3 });
  // Our own view of the acknowledgements, independent of the driver's.
  const watch = await watchAcks(nats.urls, job);
  const { acks, byNode } = watch;
  const children: Child[] = [];
  try {
    // Nodes first, the driver last: start order must not matter.
    for (const s of ['s1', 's2']) children.push(hetps(['launch', '--role', 'server', '--config', cfg, '--server-id', s], { timeoutMs: 100_000 }));
    const victim = hetps(['launch', '--role', 'worker', '--config', cfg, '--group', 'g1', '--node-rank', '0'], { timeoutMs: 100_000 });
    const w2 = hetps(['launch', '--role', 'worker', '--config', cfg, '--group', 'g1', '--node-rank', '1'], { timeoutMs: 100_000 });
    const w3 = hetps(['launch', '--role', 'worker', '--config', cfg, '--group', 'g2', '--node-rank', '0'], { timeoutMs: 100_000 });
    // The fourth worker is the API example (HeterogeneousParameterServer), which also saves a checkpoint.
    const checkpoint = join(dir, 'checkpoint');
    // After its 3rd step it saves a checkpoint through the driver's cut, pausing at its step boundary with the others.
    const api = node(['--import', 'tsx', 'examples/api-worker.ts', cfg, 'g2', '1'], { env: { HETPS_CHECKPOINT: checkpoint, HETPS_CHECKPOINT_AT_STEP: '3' }, timeoutMs: 100_000 });
    children.push(victim, w2, w3, api);
    // Wait until every worker has its data and model, so all four start training together when the job appears.
    const ready = Date.now() + 60_000;
    for (const w of [victim, w2, w3, api]) {
      while (!/ready; waiting for the job/.test(w.stderr())) {
        assert.ok(Date.now() < ready && (w.child.exitCode === null), `a worker did not get ready:\n${w.stderr().slice(-2000)}`);
        await sleep(50);
      }
    }
    const summaryFile = join(dir, 'asp-summary.json');
    const driver = hetps(['up', '--config', cfg, '--no-launch', '--summary', summaryFile], { timeoutMs: 100_000 });

    // Kill w1 once it is training for real: it then holds a batch (and maybe a pull in flight) it never acknowledges.
    const deadline = Date.now() + 60_000;
    while ((byNode.get('w1') ?? 0) < 3) {
      assert.ok(Date.now() < deadline, `w1 never acknowledged 3 batches; driver stderr:\n${driver.stderr().slice(-3000)}`);
      await sleep(20);
    }
    victim.kill('SIGKILL');
    const killedAt = byNode.get('w1')!;

    const r = await driver.exited;
    assert.equal(r.code, 0, explain(r));
    const s = JSON.parse(await readFile(summaryFile, 'utf8')) as Record<string, number | string | null>;
    t.diagnostic(`asp: AUC ${s.test_auc} (train-local ${localAuc}), ${Math.round(s.samples_per_s as number)} samples/s, ${(s.wall_s as number).toFixed(1)} s wall; `
      + `w1 killed after ${killedAt} acks; ${s.redelivered} redelivered; per worker ${JSON.stringify(Object.fromEntries(byNode))}`);
    assert.equal(s.transport, 'nats');
    assert.equal(s.batches_acked, s.batches, 'the summary counts every batch acknowledged');
    assert.equal(s.duplicate_acks, 0);
    assert.equal(acks.size, s.batches, 'every batch id was acknowledged');
    assert.deepEqual([...acks.entries()].filter(([, n]) => n !== 1), [], 'and each exactly once');
    assert.ok(Math.abs((s.test_auc as number) - localAuc) <= 0.01, `asp AUC ${s.test_auc} vs train-local ${localAuc}`);

    for (const c of [w2, w3, api, ...children.slice(0, 2)]) {
      const e = await c.exited;
      assert.equal(e.code, 0, `a surviving node exited badly: ${explain(e)}`);
    }
    const v = await victim.exited;
    assert.equal(v.signal, 'SIGKILL');
    assert.match((await api.exited).stdout, /checkpoint of 2 shards/);
    assert.ok(existsSync(join(checkpoint, 'manifest.json')) && existsSync(join(checkpoint, 's1.msgpack')), 'the API wrote the checkpoint');
    const manifest = await verifyCheckpoint(checkpoint);
    assert.deepEqual([manifest.trigger, manifest.files.map((f) => f.shard).sort()], ['api', ['s1', 's2']], 'every file matches its size and SHA-256');
    assert.ok(manifest.data !== null && manifest.data.acked.length > 0 && manifest.data.acked.length < (s.batches as number), `a cut mid-run (${manifest.data?.acked.length} of ${s.batches})`);
    assert.ok(watch.regroupReady.get('w4')?.size, 'the API worker paused for the cut');
  } finally {
    await watch.close();
    for (const c of children) c.kill('SIGKILL');
  }
});
