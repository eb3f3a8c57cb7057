/**
 * The start-up waits on the stores' watches (job info, shard plan, worker
 * profiles), on the in-memory stores and a simulated clock: a put after the
 * wait began ends it, the timeout still fires with its message, a store that
 * cannot be watched yet is tried again every second, and every watch and
 * timer is gone however the wait ends.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { ConfigError, HetpsError, SimulatedClock, TimeoutError } from '../../runtime/mod.ts';
import { buildShardPlan, type ShardPlan } from '../../topology/mod.ts';
import { memoryJobInfoStore, waitForJobInfo, type JobInfo, type JobInfoStore } from '../../actors/store/job-info.ts';
import { memoryPlanStore, type PlanStore } from '../../actors/store/plan-store.ts';
import { memoryProfileStore, type ProfileStore } from '../../actors/store/profile-store.ts';
import { waitForPlan } from '../../actors/node/nodes.ts';
import { waitForProfiles } from '../../actors/scheduler/job.ts';
import type { ProfileTelemetry } from '../../actors/monitor/telemetry.ts';

const tick = () => new Promise((r) => setImmediate(r));

function info(runId: string): JobInfo {
  return {
    job: 'j', run_id: runId, mode: 'bsp', workers: ['w1'], total_batches: 4, rounds: 4, epochs: 1, batch_size: 8, ack_wait_ms: 5_000,
    groups: null, groups_version: 0, resume_version: 0, paused: false, rejoining: [], standbys: [],
  };
}

function planV(version: number): ShardPlan {
  return buildShardPlan({ version, shards: ['s0'], partitions: 2, maxBlockBytes: 64, denseParams: [{ name: 'w', size: 8 }], sparseTables: [] });
}

function profile(node: string): ProfileTelemetry {
  return {
    node, matmul_gflops: 100, gather_rows_per_s: 1e6, memory_gb: 8, cpus: 4, providers: ['cpu'], variance: 0.01,
    bandwidth_mbps: 1000, rtt_ms: 0.1, step_ms_variance: null, emulated: false, link: 'nats',
    phase: 'join', steps: 0, probe_ms: 400, device_from: 'node', network_from: 'node',
  };
}

/** A job info store counting its open watches, whose watch fails until `ready` (a bucket not created yet). */
function countingJobStore(inner: JobInfoStore, ready = true) {
  const s = { ready, opened: 0, active: 0, failed: 0 };
  const store: JobInfoStore = {
    put: (i) => inner.put(i),
    get: () => inner.get(),
    async watch(listener) {
      if (!s.ready) { s.failed++; throw new Error('stream not found'); }
      const stop = await inner.watch(listener);
      s.opened++; s.active++;
      let stopped = false;
      return () => { if (!stopped) { stopped = true; s.active--; } stop(); };
    },
  };
  return { store, s };
}

function capturingLogger() {
  const lines: { level: number; msg: string }[] = [];
  const log = pino({ level: 'debug' }, { write: (l: string) => { const o = JSON.parse(l) as { level: number; msg: string }; lines.push(o); } });
  return { log, lines };
}

test('waitForJobInfo: a put after the wait began ends it; another run\'s info does not; nothing is left running', async () => {
  const clock = new SimulatedClock();
  const { store, s } = countingJobStore(memoryJobInfoStore());
  await store.put(info('old-run'));
  const waits: number[] = [];
  let result: JobInfo | null = null;
  const waiting = waitForJobInfo(store, { clock, timeoutMs: 60_000, runId: 'r2', onWait: (ms) => waits.push(ms) }).then((i) => { result = i; });
  await tick();
  assert.deepEqual(waits, [0], 'told at once that it waits');
  assert.equal(s.active, 1, 'one watch open');
  clock.increment(5_000);
  await tick();
  assert.deepEqual(waits, [0, 5_000], 'a note every 5 s');
  assert.equal(s.opened, 2, 'the watch is renewed at each note');
  assert.equal(s.active, 1, 'the old watch was stopped');
  assert.equal(result, null);
  await store.put(info('r2'));
  await waiting;
  assert.equal(result!.run_id, 'r2');
  assert.equal(s.active, 0, 'the watch is stopped on success');
  assert.equal(clock.pendingTimers, 0, 'no timer left');
});

test('waitForJobInfo without a run id: a run marked ended is not joined; the job\'s next run is', async () => {
  const store = memoryJobInfoStore();
  await store.put({ ...info('earlier'), ended: true });
  let result: JobInfo | null = null;
  const waiting = waitForJobInfo(store, { clock: new SimulatedClock(), timeoutMs: 60_000, runId: null }).then((i) => { result = i; });
  await tick();
  assert.equal(result, null, 'the earlier run, over, is not taken');
  await store.put(info('next'));
  await waiting;
  assert.equal(result!.run_id, 'next');
});

test('waitForJobInfo: the info already there returns at once, without a wait note', async () => {
  const store = memoryJobInfoStore();
  await store.put(info('r1'));
  const waits: number[] = [];
  const got = await waitForJobInfo(store, { clock: new SimulatedClock(), timeoutMs: 1_000, runId: null, onWait: (ms) => waits.push(ms) });
  assert.equal(got.run_id, 'r1');
  assert.deepEqual(waits, []);
});

test('waitForJobInfo: the timeout fires with its message and stops the watch', async () => {
  const clock = new SimulatedClock();
  const { store, s } = countingJobStore(memoryJobInfoStore());
  const waiting = waitForJobInfo(store, { clock, timeoutMs: 12_000 });
  const rejected = assert.rejects(waiting, (e: unknown) => e instanceof TimeoutError
    && e.message === 'no job info after 12 s: the driver (hetps up) has not queued this job\'s batches yet');
  await tick();
  clock.increment(12_000);
  await rejected;
  await tick();
  assert.equal(s.active, 0, 'the watch is stopped on timeout');
  assert.equal(clock.pendingTimers, 0);
});

test('waitForJobInfo: a store that cannot be watched yet is tried again every second until it can', async () => {
  const clock = new SimulatedClock();
  const { store, s } = countingJobStore(memoryJobInfoStore(), false);
  const waiting = waitForJobInfo(store, { clock, timeoutMs: 60_000 });
  await tick();
  assert.equal(s.failed, 1);
  clock.increment(1_000); await tick();
  clock.increment(1_000); await tick();
  assert.equal(s.failed, 3, 'once a second');
  s.ready = true;
  await store.put(info('r1'));
  clock.increment(1_000);
  assert.equal((await waiting).run_id, 'r1');
  assert.equal(s.active, 0);
  assert.equal(clock.pendingTimers, 0);
});

test('waitForPlan: a put after the wait began ends it; the timeout keeps its message; notes every 5 s', async () => {
  const clock = new SimulatedClock();
  const store = memoryPlanStore();
  let active = 0;
  const counted: PlanStore = {
    put: (p) => store.put(p),
    get: () => store.get(),
    watch(onPlan, onError) {
      active++;
      const stop = store.watch(onPlan, onError);
      let stopped = false;
      return () => { if (!stopped) { stopped = true; active--; } stop(); };
    },
  };
  const { log, lines } = capturingLogger();
  const waiting = waitForPlan(counted, { clock, timeoutMs: 60_000, log });
  await tick();
  clock.increment(5_000);
  assert.deepEqual(lines.map((l) => l.msg), ['waiting for the shard plan (start `hetps up` for this job)']);
  await store.put(planV(3));
  assert.equal((await waiting).version, 3);
  assert.equal(active, 0, 'the watch is stopped on success');
  assert.equal(clock.pendingTimers, 0);

  const empty = memoryPlanStore();
  const late = waitForPlan(empty, { clock, timeoutMs: 30_000, log: null });
  const rejected = assert.rejects(late, (e: unknown) => e instanceof TimeoutError
    && e.message === 'no shard plan after 30 s: the driver (hetps up) has not created this job yet');
  clock.increment(30_000);
  await rejected;
  assert.equal(clock.pendingTimers, 0);
});

test('waitForPlan with a server: an earlier run\'s plan that does not name it is waited past, the next one naming it ends the wait; past the timeout the error names the plan seen', async () => {
  const clock = new SimulatedClock();
  const twoServers = (version: number) => buildShardPlan({ version, shards: ['server-1', 'server-2'], partitions: 4, maxBlockBytes: 64, denseParams: [{ name: 'w', size: 8 }], sparseTables: [] });
  const threeServers = (version: number) => buildShardPlan({ version, shards: ['server-1', 'server-2', 'server-3'], partitions: 4, maxBlockBytes: 64, denseParams: [{ name: 'w', size: 8 }], sparseTables: [] });
  const store = memoryPlanStore();
  await store.put(twoServers(4));
  const { log, lines } = capturingLogger();
  let ended: ShardPlan | null = null;
  const waiting = waitForPlan(store, { clock, timeoutMs: 60_000, log, server: 'server-3' }).then((p) => { ended = p; return p; });
  await tick();
  clock.increment(5_000);
  await tick();
  assert.equal(ended, null, 'the stored plan without server-3 does not end the wait');
  assert.deepEqual(lines.map((l) => l.msg), ['waiting for a shard plan with server server-3: plan v4 (servers: server-1, server-2) is an earlier run\'s, or `hetps up` runs another config']);
  await store.put(threeServers(5));
  assert.equal((await waiting).version, 5);
  assert.equal(clock.pendingTimers, 0);
  // A server the stored plan names takes it at once, as without `server`.
  assert.equal((await waitForPlan(store, { clock, timeoutMs: 60_000, log: null, server: 'server-1' })).version, 5);

  const old = memoryPlanStore();
  await old.put(twoServers(2));
  const never = waitForPlan(old, { clock, timeoutMs: 30_000, log: null, server: 'server-3' });
  const rejected = assert.rejects(never, (e: unknown) => e instanceof ConfigError
    && e.message === 'server "server-3" is not a server node of plan v2 (servers: server-1, server-2), and no plan naming it came within 30 s: '
      + 'start `hetps up` with the config this node has, or leave the node out of cluster.server_nodes');
  await tick();
  clock.increment(30_000);
  await rejected;
  assert.equal(clock.pendingTimers, 0);
});

test('memory profile store: a watch gets every stored profile, then each put, until stopped', async () => {
  const store = memoryProfileStore();
  await store.put(profile('a'));
  const seen: string[] = [];
  const stop = await store.watch((p) => seen.push(`${p.node}:${p.phase}`));
  await tick();
  assert.deepEqual(seen, ['a:join']);
  await store.put({ ...profile('b'), phase: 'training' });
  await tick();
  assert.deepEqual(seen, ['a:join', 'b:training']);
  stop();
  await store.put(profile('c'));
  await tick();
  assert.deepEqual(seen, ['a:join', 'b:training'], 'a stopped watch hears nothing more');
});

test('waitForProfiles: profiles put after the wait began end it, with progress as they arrive', async () => {
  const clock = new SimulatedClock();
  const inner = memoryProfileStore();
  let active = 0;
  const store: ProfileStore = {
    put: (p) => inner.put(p),
    getMany: (n) => inner.getMany(n),
    async watch(listener) {
      const stop = await inner.watch(listener);
      active++;
      let stopped = false;
      return () => { if (!stopped) { stopped = true; active--; } stop(); };
    },
  };
  await store.put(profile('a'));
  const progress: string[] = [];
  const waiting = waitForProfiles(store, ['a', 'b', 'c'], { clock, timeoutMs: 60_000, onProgress: (have, missing) => progress.push(`${have}:${missing.join(',')}`) });
  await tick();
  await store.put(profile('x')); // not one of the workers
  await store.put(profile('b'));
  await store.put({ ...profile('b'), phase: 'training' }); // a newer profile of a worker already counted
  await tick();
  clock.increment(5_000);
  await store.put(profile('c'));
  const found = await waiting;
  assert.deepEqual([...found.keys()].sort(), ['a', 'b', 'c']);
  assert.equal(found.get('b')!.phase, 'training', 'the latest profile');
  assert.deepEqual(progress, ['1:b,c', '2:c', '2:c', '3:']);
  assert.equal(active, 0, 'the watch is stopped on success');
  assert.equal(clock.pendingTimers, 0);
});

test('waitForProfiles: the timeout names the missing workers; check ends the wait within 500 ms', async () => {
  const clock = new SimulatedClock();
  const store = memoryProfileStore();
  await store.put(profile('a'));
  const timedOut = assert.rejects(waitForProfiles(store, ['a', 'c', 'd'], { clock, timeoutMs: 20_000 }),
    (e: unknown) => e instanceof TimeoutError && /^no profile from c, d after 20 s \(1\/3 workers profiled\)\. /.test(e.message)
      && /hetps launch --role worker --node NAME/.test(e.message));
  await tick();
  clock.increment(20_000);
  await timedOut;
  assert.equal(clock.pendingTimers, 0);

  let dead: string | null = null;
  const aborted = assert.rejects(waitForProfiles(store, ['a', 'c'], { clock, timeoutMs: 60_000, check: () => dead }),
    (e: unknown) => e instanceof HetpsError && e.message === 'waiting for the workers\' profiles: worker c exited (code 1) (missing: c)');
  await tick();
  clock.increment(1_000);
  dead = 'worker c exited (code 1)';
  clock.increment(500);
  await aborted;
  assert.equal(clock.pendingTimers, 0);
});
