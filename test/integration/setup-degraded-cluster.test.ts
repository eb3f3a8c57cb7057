/**
 * Setting a job up on a 3-node cluster with a server down: the batch stream
 * and the KV buckets fall back to the replicas the cluster can place and say
 * so; a set-up step that cannot succeed at all names the step, the servers
 * and what to check. Real nats-servers (the harness starts its own: these
 * tests stop nodes).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { jetstreamManager } from '@nats-io/jetstream';
import { startTestCluster } from '../support/cluster.ts';
import { ConnectionError, HetpsError, TimeoutError, connectTransport } from '../../runtime/mod.ts';
import { createJobStores } from '../../deploy/nats-backend.ts';
import { connectCheck, setupStep } from '../../deploy/setup-step.ts';
import { natsPlanStore } from '../../actors/store/plan-store.ts';
import { buildShardPlan } from '../../topology/mod.ts';

/**
 * Until JetStream's meta group has seen the stopped server leave, a 3-replica
 * stream is still placed on it: wait until a probe says "no suitable peers",
 * so the test exercises the fallback and not that race.
 */
async function untilPlacementSeesServerGone(nc: NatsConnection, timeoutMs = 30_000): Promise<void> {
  const jsm = await jetstreamManager(nc, { timeout: 2_000 });
  const end = Date.now() + timeoutMs;
  for (;;) {
    try {
      await jsm.streams.add({ name: 'PLACEMENT_PROBE', subjects: ['placement.probe'], num_replicas: 3 });
      await jsm.streams.delete('PLACEMENT_PROBE').catch(() => undefined);
    } catch (e) {
      if (/no suitable peers|insufficient resources/i.test((e as Error).message)) return;
    }
    if (Date.now() > end) assert.fail('JetStream still places 3 replicas with a server stopped');
    await new Promise((r) => setTimeout(r, 300));
  }
}

test('with one of 3 servers stopped the batch stream and KV buckets get 2 replicas, and the fallback is reported', { timeout: 60_000 }, async (t) => {
  await using nats = await startTestCluster({ nodes: 3 });
  if (nats.cluster === null) { t.skip('reusing NATS_URL: cannot stop a node'); return; }
  const nc = await connect({ servers: nats.urls[0]! });
  t.after(() => nc.close());
  // A graceful stop tells the others at once, like an operator taking a server down.
  await nats.cluster.kill('n3', 'SIGTERM');
  await untilPlacementSeesServerGone(nc);

  const notices: string[] = [];
  const { replicas } = await createJobStores(nc, 'degraded', {
    servers: nats.urls, natsDir: null, ackWaitMs: 30_000, notice: (l) => notices.push(l),
  });
  assert.deepEqual(replicas, { HPS_degraded_batches: 2, HPS_degraded_plan: 2, HPS_degraded_job: 2, HPS_degraded_profiles: 2 });
  assert.ok(notices.includes('JetStream: 2 of 3 servers reachable; creating HPS_degraded_batches with 2 replicas instead of 3'), notices.join('\n'));
  assert.equal(notices.length, 4, notices.join('\n'));
  for (const l of notices) t.diagnostic(l);

  const info = await (await jetstreamManager(nc)).streams.info('HPS_degraded_batches');
  assert.equal(info.config.num_replicas, 2);
  // The degraded stores work: the plan goes in and comes back.
  const plan = buildShardPlan({
    version: 1, shards: ['s0'], partitions: null, maxBlockBytes: 4096, denseParams: [{ name: 'w', size: 8 }], sparseTables: [],
  });
  const store = natsPlanStore(nc, 'degraded');
  await store.put(plan);
  assert.equal((await store.get())?.version, 1);
});

test('a set-up step that cannot succeed names the step, the servers and what to check', { timeout: 60_000 }, async (t) => {
  await using nats = await startTestCluster({ nodes: 3 });
  if (nats.cluster === null) { t.skip('reusing NATS_URL: cannot stop the nodes'); return; }
  const urls = nats.urls;
  const nc = await connect({ servers: urls, maxReconnectAttempts: -1, reconnectTimeWait: 200 });
  t.after(() => nc.close());
  for (const n of ['n1', 'n2', 'n3']) await nats.kill(n);

  const err = await createJobStores(nc, 'nowhere', {
    servers: urls, natsDir: '/run/x/nats', ackWaitMs: 30_000, timeoutMs: 500, notice: () => undefined,
  }).then(() => null, (e: unknown) => e);
  assert.ok(err instanceof TimeoutError, `a TimeoutError, got ${String(err)}`);
  t.diagnostic(err.message);
  assert.ok(err.cause !== undefined, 'the cause is passed on');
  assert.match(err.message, /^creating the batch work queue \(JetStream stream HPS_nowhere_batches, replicas 3\) on /);
  assert.ok(err.message.includes(` on ${urls.join(',')} failed: `), err.message);
  assert.match(err.message, /check that a JetStream quorum of the cluster is up \(nats-server logs in \/run\/x\/nats\)/);

  const connectErr = await setupStep({ what: 'connecting to NATS', servers: urls, check: connectCheck(null) },
    () => connectTransport({ servers: urls, name: 'setup-test', connectTimeoutMs: 1_000 })).then(() => null, (e: unknown) => e);
  assert.ok(connectErr instanceof HetpsError, `a HetpsError, got ${String(connectErr)}`);
  t.diagnostic(connectErr.message);
  assert.ok(connectErr instanceof ConnectionError || connectErr instanceof TimeoutError, connectErr.name);
  assert.ok(connectErr.message.startsWith(`connecting to NATS on ${urls.join(',')} failed: `), connectErr.message);
  assert.match(connectErr.message, /check the addresses in nats\.servers/);
});
