/**
 * What hetps relies on for durability (deploy/local-cluster.ts explains why
 * not fsync): the job's batch work queue and its KV buckets are R3 on a
 * 3-node cluster, so an acknowledged write survives one server being
 * SIGKILLed. Made exactly as the driver makes them (createJobStores), then
 * the leader of the batch stream is killed and everything written before is
 * read back through the two servers left, which also take new writes.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { NatsConnection } from '@nats-io/nats-core';
import { jetstreamManager, type StreamInfo } from '@nats-io/jetstream';
import { startTestCluster } from '../support/cluster.ts';
import { connectTransport, type Transport } from '../../runtime/mod.ts';
import { buildShardPlan, type ShardPlan } from '../../topology/mod.ts';
import { batchStreamName, natsBatchQueue, type BatchDescriptor } from '../../actors/store/batch-queue.ts';
import { jobInfoBucket, natsJobInfoStore, type JobInfo } from '../../actors/store/job-info.ts';
import { natsConnectionOf, natsPlanStore, planBucketName } from '../../actors/store/plan-store.ts';
import { createJobStores } from '../../deploy/nats-backend.ts';

const BATCHES = 24;

function descriptor(index: number): BatchDescriptor {
  return { batch_id: `spam/train/e0/b${index}`, epoch: 0, index, split: 'train', batch_size: 32, samples: 32 };
}

function plan(version: number): ShardPlan {
  return buildShardPlan({
    version, shards: ['s0', 's1'], partitions: null, maxBlockBytes: 4096,
    denseParams: [{ name: 'fc.w', size: 300 }], sparseTables: [{ name: 'emb', dim: 8 }],
  });
}

function jobInfo(job: string, runId: string): JobInfo {
  return {
    job, run_id: runId, mode: 'hps', workers: ['w1', 'w2'], total_batches: BATCHES, rounds: 12, epochs: 1, batch_size: 32, ack_wait_ms: 30_000,
    groups: null, groups_version: 0, resume_version: 0, paused: false, rejoining: [], standbys: [],
  };
}

/** Retries `fn` while the cluster elects new leaders after a kill (JetStream answers time out meanwhile). */
async function eventually<T>(what: string, fn: () => Promise<T>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await fn();
    } catch (e) {
      if (Date.now() > deadline) throw new Error(`${what} still failing after ${timeoutMs / 1000} s: ${(e as Error).message}`, { cause: e });
      await new Promise((r) => setTimeout(r, 250));
    }
  }
}

test('an acknowledged write to the R3 batch queue and KV buckets survives a SIGKILLed server', { timeout: 180_000 }, async (t) => {
  await using nats = await startTestCluster({ nodes: 3, jetstream: true });
  if (!nats.cluster) {
    t.skip('NATS_URL is set: this test kills a server of its own cluster');
    return;
  }
  const transports: Transport[] = [];
  t.after(async () => { await Promise.all(transports.map((x) => x.close().catch(() => undefined))); });
  const open = async (servers: string[], name: string): Promise<NatsConnection> => {
    const tr = await connectTransport({ servers, name });
    transports.push(tr);
    return natsConnectionOf(tr)!;
  };

  const job = `durable${process.pid.toString(36)}`;
  const driver = await open(nats.urls, 'driver');
  const notices: string[] = [];
  const { replicas } = await createJobStores(driver, job, { servers: nats.urls, natsDir: null, ackWaitMs: 30_000, notice: (l) => notices.push(l) });
  assert.deepEqual(notices, [], 'every stream and bucket placed as asked');

  const jsm = await jetstreamManager(driver);
  const streams = [batchStreamName(job), `KV_${planBucketName(job)}`, `KV_${jobInfoBucket(job)}`];
  for (const s of streams) {
    const info = await jsm.streams.info(s);
    assert.equal(info.config.num_replicas, 3, `${s} is configured with 3 replicas`);
    assert.equal(replicas[s.replace(/^KV_/, '')], 3, `createJobStores reports 3 replicas for ${s}`);
    assert.equal(1 + (info.cluster?.replicas?.length ?? 0), 3, `${s} has a leader and 2 followers: ${JSON.stringify(info.cluster)}`);
    // A KV get is answered by the leader, not by a follower that may not have applied the last put yet (the read-back after the kill below).
    if (s.startsWith('KV_')) assert.equal(info.config.allow_direct, false, `${s} takes no direct (any-replica) gets`);
  }

  // Written and acknowledged before the kill.
  const queue = natsBatchQueue(driver, job);
  await queue.publish(Array.from({ length: BATCHES }, (_, i) => descriptor(i)));
  assert.equal(await queue.pending(), BATCHES);
  assert.equal(await queue.undelivered(), BATCHES, 'none handed to a worker yet (the consumer\'s num_pending)');
  await natsPlanStore(driver, job).put(plan(1));
  await natsJobInfoStore(driver, job).put(jobInfo(job, 'r1'));

  // Kill the server leading the batch stream: the worst one to lose.
  const victim = (await jsm.streams.info(batchStreamName(job))).cluster!.leader!;
  const victimIndex = nats.cluster.nodes.findIndex((n) => n.name === victim);
  assert.ok(victimIndex >= 0, `the batch stream's leader ${victim} is one of ours`);
  await nats.kill(victim);
  const killedAt = Date.now();
  assert.equal(nats.cluster.isRunning(victim), false);

  // Read back through the two servers left only.
  const survivors = nats.urls.filter((_, i) => i !== victimIndex);
  const reader = await open(survivors, 'reader');
  // Account info goes to the meta leader, which may have been the victim too: wait for a new one.
  const rjsm = await eventually('JetStream through the survivors', () => jetstreamManager(reader));
  const after: StreamInfo = await eventually('the batch stream with a new leader', async () => {
    const info = await rjsm.streams.info(batchStreamName(job));
    if (!info.cluster?.leader || info.cluster.leader === victim) throw new Error(`leader is ${info.cluster?.leader ?? 'none'}`);
    return info;
  });
  t.diagnostic(`SIGKILLed ${victim}, the leader of ${batchStreamName(job)}; ${after.cluster!.leader} leads it ${Date.now() - killedAt} ms later`);
  assert.equal(after.state.messages, BATCHES, 'every descriptor is still in the stream');
  assert.equal(after.config.num_replicas, 3);

  const rqueue = natsBatchQueue(reader, job);
  assert.equal(await eventually('pending()', () => rqueue.pending()), BATCHES);
  const taken = new Set<string>();
  while (taken.size < BATCHES) {
    // The durable consumer elects a leader of its own after the stream's: the first delivery may wait for it.
    const b = await eventually(`descriptor ${taken.size + 1} of ${BATCHES} delivered through the survivors`, async () => {
      const x = await rqueue.next(2_000);
      if (x === null) throw new Error('nothing delivered yet');
      return x;
    });
    assert.equal(await b.ack(), true, `ack of ${b.desc.batch_id} confirmed`);
    taken.add(b.desc.batch_id);
  }
  assert.deepEqual([...taken].sort(), Array.from({ length: BATCHES }, (_, i) => descriptor(i).batch_id).sort());
  assert.equal(await rqueue.undelivered(), 0, 'every descriptor was handed out');

  const planStore = natsPlanStore(reader, job);
  const infoStore = natsJobInfoStore(reader, job);
  assert.deepEqual(await eventually('plan get', () => planStore.get()), plan(1), 'the plan written before the kill');
  assert.deepEqual(await eventually('job info get', () => infoStore.get().then((i) => i ?? Promise.reject(new Error('no job info')))), jobInfo(job, 'r1'));

  // New writes go through on the two servers left (a quorum of 3).
  await eventually('publish after the kill', () => rqueue.publish([descriptor(BATCHES)]));
  assert.equal(await rqueue.pending(), 1, 'the acknowledged descriptors are gone, the new one is queued');
  await eventually('plan put after the kill', () => planStore.put(plan(2)));
  assert.equal((await planStore.get())?.version, 2);
  await eventually('job info put after the kill', () => infoStore.put(jobInfo(job, 'r2')));
  assert.equal((await infoStore.get())?.run_id, 'r2');
});
