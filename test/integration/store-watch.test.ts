/**
 * The start-up waits on a real nats-server (JetStream KV): a node waiting
 * before the driver has created the job's buckets resolves as soon as the
 * value is put, and a wait survives the driver emptying an earlier run's
 * bucket (destroyed and made again) under it.
 */
import { test, type TestContext } from 'node:test';
import type { NatsConnection } from '@nats-io/nats-core';
import assert from 'node:assert/strict';
import { startTestCluster } from '../support/cluster.ts';
import { connectTransport, systemClock } from '../../runtime/mod.ts';
import { buildShardPlan } from '../../topology/mod.ts';
import { natsConnectionOf, natsPlanStore } from '../../actors/store/plan-store.ts';
import { createJobInfoBucket, natsJobInfoStore, resetNatsJobInfo, waitForJobInfo, type JobInfo } from '../../actors/store/job-info.ts';
import { natsProfileStore, resetNatsProfiles } from '../../actors/store/profile-store.ts';
import { waitForPlan } from '../../actors/node/nodes.ts';
import { waitForProfiles } from '../../actors/scheduler/job.ts';
import type { ProfileTelemetry } from '../../actors/monitor/telemetry.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function info(job: string, runId: string): JobInfo {
  return {
    job, run_id: runId, mode: 'bsp', workers: ['w1'], total_batches: 4, rounds: 4, epochs: 1, batch_size: 8, ack_wait_ms: 5_000,
    groups: null, groups_version: 0, resume_version: 0, paused: false, rejoining: [], standbys: [],
  };
}

function profile(node: string): ProfileTelemetry {
  return {
    node, matmul_gflops: 100, gather_rows_per_s: 1e6, memory_gb: 8, cpus: 4, providers: ['cpu'], variance: 0.01,
    bandwidth_mbps: 1000, rtt_ms: 0.1, step_ms_variance: null, emulated: false, link: 'nats',
    phase: 'join', steps: 0, probe_ms: 400, device_from: 'node', network_from: 'node',
  };
}

/** Two connections to one server, the driver's and a node's, closed after the test. */
async function driverAndNode(t: TestContext, url: string): Promise<{ driver: NatsConnection; node: NatsConnection }> {
  const driverT = await connectTransport({ servers: [url], name: 'driver' });
  const nodeT = await connectTransport({ servers: [url], name: 'node' });
  t.after(async () => { await driverT.close(); await nodeT.close(); });
  return { driver: natsConnectionOf(driverT)!, node: natsConnectionOf(nodeT)! };
}

test('start-up waits over NATS: started before the buckets exist, each resolves when its value is put', { timeout: 120_000 }, async (t) => {
  await using nats = await startTestCluster({ nodes: 1, jetstream: true });
  const { driver, node } = await driverAndNode(t, nats.urls[0]!);
  const job = `early${process.pid}`;
  await resetNatsJobInfo(driver, job);
  await resetNatsProfiles(driver, job);

  // Job info: the node waits first; the bucket appears 1.5 s later, then the info.
  const waits: number[] = [];
  const jobWait = waitForJobInfo(natsJobInfoStore(node, job), { clock: systemClock, timeoutMs: 30_000, runId: 'r1', onWait: (ms) => waits.push(ms) });
  await sleep(1_500);
  await createJobInfoBucket(driver, job);
  const putAt = performance.now();
  await natsJobInfoStore(driver, job).put(info(job, 'r1'));
  assert.equal((await jobWait).run_id, 'r1');
  assert.deepEqual(waits, [0]);
  // A watch that is in place hears the put at once; a retried open within its second.
  assert.ok(performance.now() - putAt < 2_000, `resolved ${Math.round(performance.now() - putAt)} ms after the put`);

  // Profiles: the driver waits before any worker has made the bucket.
  const progress: string[] = [];
  const profileWait = waitForProfiles(natsProfileStore(driver, job), ['w1', 'w2'], {
    clock: systemClock, timeoutMs: 30_000, onProgress: (have, missing) => progress.push(`${have}:${missing.join(',')}`),
  });
  await sleep(1_200);
  await natsProfileStore(node, job).put(profile('w1'));
  await natsProfileStore(node, job).put(profile('w2'));
  const found = await profileWait;
  assert.deepEqual([...found.keys()].sort(), ['w1', 'w2']);
  assert.equal(progress[0], '0:w1,w2');
  assert.equal(progress.at(-1), '2:');

  // The plan: the node waits, the driver stores it.
  const planWait = waitForPlan(natsPlanStore(node, job), { clock: systemClock, timeoutMs: 30_000, log: null });
  await sleep(300);
  const plan = buildShardPlan({ version: 1, shards: ['s0'], partitions: 2, maxBlockBytes: 64, denseParams: [{ name: 'w', size: 8 }], sparseTables: [] });
  await natsPlanStore(driver, job).put(plan);
  assert.equal((await planWait).version, 1);
});

test('waitForJobInfo over NATS: the driver emptying an earlier run\'s bucket under the wait does not hide the new run', { timeout: 120_000 }, async (t) => {
  await using nats = await startTestCluster({ nodes: 1, jetstream: true });
  const { driver, node } = await driverAndNode(t, nats.urls[0]!);
  const job = `reset${process.pid}`;
  await resetNatsJobInfo(driver, job);
  const earlier = natsJobInfoStore(driver, job);
  // The earlier run wrote several times, so its stream is ahead of the new one's.
  for (const v of [0, 1, 2]) await earlier.put({ ...info(job, 'r1'), groups_version: v, resume_version: v });

  const jobWait = waitForJobInfo(natsJobInfoStore(node, job), { clock: systemClock, timeoutMs: 30_000, runId: 'r2' });
  await sleep(500);
  await resetNatsJobInfo(driver, job);
  await createJobInfoBucket(driver, job);
  await natsJobInfoStore(driver, job).put(info(job, 'r2'));
  assert.equal((await jobWait).run_id, 'r2');
});
