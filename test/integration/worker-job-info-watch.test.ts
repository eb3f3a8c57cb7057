/**
 * The job info watch on a real nats-server (JetStream KV): a reader's watch
 * gets the info written before it and each later write, in order, and ends
 * on `stop`.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startTestCluster } from '../support/cluster.ts';
import { connectTransport } from '../../runtime/mod.ts';
import { natsConnectionOf } from '../../actors/store/plan-store.ts';
import { natsJobInfoStore, resetNatsJobInfo, type JobInfo } from '../../actors/store/job-info.ts';
import { until } from '../support/until.ts';


test('NATS job info store: a watch on another connection gets the current info, then every put, until stopped', { timeout: 120_000 }, async (t) => {
  await using nats = await startTestCluster({ nodes: 1, jetstream: true });
  const writerT = await connectTransport({ servers: [nats.urls[0]!], name: 'job-writer' });
  const readerT = await connectTransport({ servers: [nats.urls[0]!], name: 'job-reader' });
  t.after(async () => { await writerT.close(); await readerT.close(); });
  const job = `watch${process.pid}`;
  await resetNatsJobInfo(natsConnectionOf(writerT)!, job);
  const writer = natsJobInfoStore(natsConnectionOf(writerT)!, job);
  const reader = natsJobInfoStore(natsConnectionOf(readerT)!, job);
  const info: JobInfo = {
    job, run_id: 'r1', mode: 'bsp', workers: ['w1', 'w2'], total_batches: 8, rounds: 4, epochs: 1, batch_size: 8, ack_wait_ms: 5_000,
    groups: null, groups_version: 0, resume_version: 0, paused: false, rejoining: [], standbys: [],
  };
  await writer.put(info);

  const seen: [number, number][] = [];
  const stop = await reader.watch((i) => seen.push([i.groups_version, i.resume_version]));
  await until(() => seen.length >= 1, 'the current info');
  assert.deepEqual(seen[0], [0, 0]);

  await writer.put({ ...info, groups_version: 1 });
  await writer.put({ ...info, groups_version: 1, resume_version: 1 });
  await until(() => seen.length >= 3, 'both writes');
  assert.deepEqual(seen, [[0, 0], [1, 0], [1, 1]], 'in order, each once');

  stop();
  await writer.put({ ...info, groups_version: 2, resume_version: 1 });
  // A second watch seeing the write shows it reached the bucket; the stopped one never gets it.
  const after: number[] = [];
  const stop2 = await reader.watch((i) => after.push(i.groups_version));
  await until(() => after.includes(2), 'the later write at a new watch');
  stop2();
  assert.deepEqual(seen, [[0, 0], [1, 0], [1, 1]], 'a stopped watch delivers nothing more');
});
