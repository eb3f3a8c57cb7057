/**
 * Creating the job's replicated stream and buckets: the fallback to fewer
 * replicas when JetStream cannot place them, and the retry of a create that
 * nats-server 2.9 answers "stream not found" while it still applies an
 * earlier delete of the same name.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { NatsConnection } from '@nats-io/nats-core';
import { createWithReplicaFallback, isTransientNotFound } from '../../actors/store/replicas.ts';

const clusterOf3 = { info: { cluster: 'c', connect_urls: ['a', 'b', 'c'] } } as unknown as NatsConnection;

function notFound(): Error {
  return Object.assign(new Error('stream not found'), { api_error: { code: 404, err_code: 10059, description: 'stream not found' } });
}

test('a create answered "stream not found" is tried again with the same replicas until it succeeds', async () => {
  const asked: number[] = [];
  const notices: string[] = [];
  let discarded = 0;
  const out = await createWithReplicaFallback(clusterOf3, 'HPS_x_batches', { replicas: 3, notice: (l) => notices.push(l) },
    async (r) => { asked.push(r); if (asked.length <= 2) throw notFound(); return 'made'; },
    async () => { discarded++; }, [1, 1, 1]);
  assert.deepEqual(out, { value: 'made', replicas: 3 });
  assert.deepEqual(asked, [3, 3, 3]);
  assert.deepEqual(notices, []);
  assert.equal(discarded, 0);
});

test('a create that keeps answering "stream not found" fails with that error once the waits are spent', async () => {
  const asked: number[] = [];
  await assert.rejects(
    createWithReplicaFallback(clusterOf3, 'HPS_x_batches', { replicas: 3 },
      async (r) => { asked.push(r); throw notFound(); }, async () => undefined, [1, 1]),
    /stream not found/);
  assert.deepEqual(asked, [3, 3, 3]);
});

test('a placement refusal still falls back to fewer replicas and says so; other errors are not retried', async () => {
  const asked: number[] = [];
  const notices: string[] = [];
  const out = await createWithReplicaFallback(clusterOf3, 'HPS_x_batches', { replicas: 3, servers: 3, notice: (l) => notices.push(l) },
    async (r) => { asked.push(r); if (r === 3) throw new Error('no suitable peers for placement'); return r; },
    async () => undefined, [1]);
  assert.deepEqual(out, { value: 2, replicas: 2 });
  assert.deepEqual(asked, [3, 2]);
  assert.equal(notices.length, 1);
  assert.match(notices[0]!, /creating HPS_x_batches with 2 replicas instead of 3/);

  let calls = 0;
  await assert.rejects(
    createWithReplicaFallback(clusterOf3, 'HPS_x_batches', { replicas: 3 },
      async () => { calls++; throw new Error('subjects overlap with an existing stream'); }, async () => undefined, [1, 1]),
    /subjects overlap/);
  assert.equal(calls, 1);
});

test('isTransientNotFound: the API error code 10059 or its text, nothing else', () => {
  assert.equal(isTransientNotFound(notFound()), true);
  assert.equal(isTransientNotFound(new Error('nats: stream not found')), true);
  assert.equal(isTransientNotFound(new Error('no suitable peers for placement')), false);
  assert.equal(isTransientNotFound(new Error('timeout')), false);
});
