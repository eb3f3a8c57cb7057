/**
 * The shard plan in a JetStream KV bucket of a real 3-node cluster: put, get,
 * watch, version rules, and readers on other nodes.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Kvm } from '@nats-io/kv';
import { startTestCluster } from '../support/cluster.ts';
import { ConfigError, connectTransport } from '../../runtime/mod.ts';
import { buildShardPlan, type ShardPlan } from '../../topology/mod.ts';
import {
  PLAN_KEY, StalePlanError, getPlan, natsConnectionOf, natsPlanStore, planBucketName, putPlan, watchPlan,
} from '../../actors/mod.ts';
import { until } from '../support/until.ts';

function planV(version: number, shards = ['s0', 's1', 's2']): ShardPlan {
  return buildShardPlan({
    version, shards, partitions: null, maxBlockBytes: 4096,
    denseParams: [{ name: 'fc.w', size: 5000 }, { name: 'fc.b', size: 10 }], sparseTables: [{ name: 'emb', dim: 16 }, { name: 'wide', dim: 1 }],
  });
}


test('the shard plan in a KV bucket: put, get and watch across the nodes of a 3-node cluster', { timeout: 120_000 }, async (t) => {
  await using nats = await startTestCluster({ nodes: 3, jetstream: true });
  const writerT = await connectTransport({ servers: [nats.urls[0]!], name: 'plan-writer' });
  const readerT = await connectTransport({ servers: [nats.urls[2]!], name: 'plan-reader' });
  t.after(async () => { await writerT.close(); await readerT.close(); });
  const writer = natsConnectionOf(writerT)!;
  const reader = natsConnectionOf(readerT)!;
  assert.ok(writer && reader, 'NATS transports expose their connection');

  assert.equal(await getPlan(reader, 'job1'), null, 'no plan yet');

  const seen: number[] = [];
  const errors: Error[] = [];
  const stop = watchPlan(reader, 'job1', (p) => seen.push(p.version), (e) => errors.push(e));

  await putPlan(writer, 'job1', planV(1));
  assert.deepEqual(await getPlan(reader, 'job1'), planV(1), 'a reader on another node gets the plan');
  await until(() => seen.includes(1), 'the watch to see v1');

  await putPlan(writer, 'job1', planV(1)); // the same plan again: no new revision
  await assert.rejects(putPlan(writer, 'job1', planV(1, ['s0'])), StalePlanError);
  await putPlan(writer, 'job1', planV(2, ['s0', 's1']));
  await assert.rejects(putPlan(reader, 'job1', planV(1)), (e: unknown) => e instanceof StalePlanError && /older than the stored v2/.test(e.message));
  await until(() => seen.includes(2), 'the watch to see v2');
  assert.deepEqual(seen, [1, 2]);
  assert.deepEqual(await getPlan(writer, 'job1'), planV(2, ['s0', 's1']));

  // A late watcher starts from the current plan.
  const late: number[] = [];
  const stopLate = natsPlanStore(writer, 'job1').watch((p) => late.push(p.version));
  await until(() => late.length > 0, 'the late watcher');
  assert.deepEqual(late, [2]);

  const kv = await new Kvm(writer).open(planBucketName('job1'));
  const status = await kv.status();
  if (nats.cluster) assert.equal(status.replicas, 3, 'replicated over the 3 nodes');
  assert.equal(status.values, 2, 'one revision per distinct plan');

  // Garbage written by someone else: get refuses it, the watch reports it and goes on.
  await kv.put(PLAN_KEY, '{"version": 9, "shards": "nope"}');
  await assert.rejects(getPlan(reader, 'job1'), (e: unknown) => e instanceof ConfigError && /not a shard plan: shards/.test(e.message));
  await until(() => errors.length > 0, 'the watch to report the bad value');
  await putPlan(writer, 'job1', planV(3)); // a valid plan replaces the garbage
  await until(() => seen.includes(3), 'the watch to see v3 after the bad value');
  assert.deepEqual(seen, [1, 2, 3]);

  stop(); stopLate();
  assert.equal(await getPlan(reader, 'other-job'), null, 'jobs have separate buckets');
});
