/**
 * The job info watch the workers pause and resume on (memory store): the
 * current info first, then every write in order, nothing after `stop`.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { memoryJobInfoStore, type JobInfo } from '../../actors/store/job-info.ts';

const info: JobInfo = {
  job: 'watch', run_id: 'r1', mode: 'asp', workers: ['w1'], total_batches: 4, rounds: 4, epochs: 1, batch_size: 8, ack_wait_ms: 1_000,
  groups: null, groups_version: 0, resume_version: 0, paused: false, rejoining: [], standbys: [],
};

/** Lets queued deliveries run. */
const settle = () => new Promise((r) => setImmediate(r));

test('memory job info store: a watcher gets the current info, then each put in order, and nothing once stopped', async () => {
  const store = memoryJobInfoStore();
  const early: number[] = [];
  const stopEarly = await store.watch((i) => early.push(i.groups_version));
  await settle();
  assert.deepEqual(early, [], 'nothing written yet: nothing delivered');

  await store.put(info);
  const late: JobInfo[] = [];
  const stopLate = await store.watch((i) => late.push(i));
  await store.put({ ...info, groups_version: 1 });
  await store.put({ ...info, groups_version: 1, resume_version: 1 });
  await settle();
  assert.deepEqual(early, [0, 1, 1]);
  assert.deepEqual(late.map((i) => [i.groups_version, i.resume_version]), [[0, 0], [1, 0], [1, 1]], 'the current info first, then the writes');

  late[0]!.workers.push('mutated');
  assert.deepEqual((await store.get())!.workers, ['w1'], 'a watcher gets its own copy');

  stopEarly();
  await store.put({ ...info, groups_version: 2, resume_version: 1 });
  await settle();
  assert.deepEqual(early, [0, 1, 1], 'a stopped watch delivers nothing more');
  assert.equal(late.at(-1)!.groups_version, 2, 'the other watch goes on');
  stopLate();
});

test('memory job info store: a listener that throws does not end its watch', async () => {
  const store = memoryJobInfoStore();
  const seen: number[] = [];
  const stop = await store.watch((i) => { seen.push(i.groups_version); throw new Error('listener bug'); });
  await store.put(info);
  await store.put({ ...info, groups_version: 1 });
  await settle();
  assert.deepEqual(seen, [0, 1]);
  stop();
});
