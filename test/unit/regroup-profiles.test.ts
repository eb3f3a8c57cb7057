/**
 * Regrouping on measurements: the workers' profiles with compute scaled by
 * each node's observed slowdown (topology/regroup.ts), clustered with k =
 * the current number of groups, the groups keeping their roles by speed
 * (actors/scheduler/regroup.ts). Without a profile from every worker the controller
 * falls back to step times alone.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InProcessBroker, connectTransport, silentLogger, systemClock, type Transport } from '../../runtime/mod.ts';
import { observedSlowdown, profilesAtObservedSpeed, type NodeProfile } from '../../topology/mod.ts';
import { memoryJobInfoStore, type JobInfo } from '../../actors/store/job-info.ts';
import { memoryProfileStore } from '../../actors/store/profile-store.ts';
import { RegroupController } from '../../actors/scheduler/regroup.ts';
import { publishTelemetry, type ProfileTelemetry } from '../../actors/monitor/telemetry.ts';
import { until } from '../support/until.ts';

const JOB = 'rgp';
const g = (name: string, nodes: string[], sync_mode: 'sync' | 'async', sync_steps: number | null = null) =>
  ({ name, nodes, sync_mode, sync_steps, accumulation_steps: null, adaptive_threshold: null });
const info: JobInfo = {
  job: JOB, run_id: 'r', mode: 'hps', workers: ['w1', 'w2', 'w3', 'w4'], total_batches: 10, rounds: 3, epochs: 1, batch_size: 32, ack_wait_ms: 60_000,
  groups: [g('fast', ['w1', 'w2'], 'sync', 4), g('slow', ['w3', 'w4'], 'async')], groups_version: 0, resume_version: 0, paused: false, rejoining: [], standbys: [],
};

function profile(node: string, speed: number): NodeProfile {
  return {
    node, matmul_gflops: 200 * speed, gather_rows_per_s: 4e6 * speed, memory_gb: 32, cpus: 8, providers: ['cpu'], variance: 0.02,
    bandwidth_mbps: 5_000, rtt_ms: 0.4, step_ms_variance: null, emulated: false, link: 'nats',
  };
}
const telemetry = (p: NodeProfile): ProfileTelemetry => ({ ...p, phase: 'join', steps: 0, probe_ms: 500, device_from: 'node', network_from: 'node' });


function batch(t: Transport, w: string, i: number, ms: number): void {
  publishTelemetry(t, JOB, 'batch', w, {
    node: w, batch_id: `${w}-${i}`, samples: 32, loss: 0.5, redelivered: false, ack_confirmed: true, staleness: 0, round: null, busy_ms: ms, emulated_step_ms: ms,
  });
}

test('observedSlowdown: recent median / baseline, times what was carried; 1 (or the carried value) until judgeable', () => {
  assert.equal(observedSlowdown({ baselineMs: 100, stepMs: [100, 100, 300, 300, 300], window: 3 }), 3);
  assert.equal(observedSlowdown({ baselineMs: 100, stepMs: [100, 900, 100, 100], window: 3 }), 1, 'one slow step is not a slowdown');
  assert.equal(observedSlowdown({ baselineMs: 100, stepMs: [200, 200], window: 3 }), 1, 'too few steps');
  assert.equal(observedSlowdown({ baselineMs: null, stepMs: [200, 200, 200], window: 3 }), 1, 'no baseline');
  assert.equal(observedSlowdown({ baselineMs: null, stepMs: [], window: 3, carried: 4 }), 4);
  assert.equal(observedSlowdown({ baselineMs: 400, stepMs: [800, 800, 800], window: 3, carried: 4 }), 8);
});

test('profilesAtObservedSpeed divides compute by the slowdown and leaves the rest alone', () => {
  const [a, b] = profilesAtObservedSpeed([profile('a', 1), profile('b', 1)], new Map([['a', 4]]));
  assert.equal(a!.matmul_gflops, 50);
  assert.equal(a!.gather_rows_per_s, 1e6);
  assert.equal(a!.bandwidth_mbps, 5_000);
  assert.deepEqual(b, profile('b', 1), 'no entry: as measured');
  assert.deepEqual(profilesAtObservedSpeed([profile('a', 1)], { a: 2 })[0]!.matmul_gflops, 100, 'a plain record works too');
});

test('regroup on profiles: a node throttled to the slow nodes\' pace moves to the slow group, which keeps its name and async mode', async () => {
  const broker = new InProcessBroker();
  const driverT = await connectTransport({ servers: null, broker, name: 'driver' });
  const workerT = await connectTransport({ servers: null, broker, name: 'worker' });
  const store = memoryJobInfoStore();
  await store.put(info);
  const profiles = memoryProfileStore();
  // The start's profiles: w1, w2 fast; w3, w4 a quarter of that.
  for (const p of [profile('w1', 1), profile('w2', 1), profile('w3', 0.25), profile('w4', 0.25)]) await profiles.put(telemetry(p));
  const ctl = new RegroupController({
    transport: driverT, job: JOB, jobStore: store, info, clock: systemClock, log: silentLogger(), autoEveryMs: 0, policy: { window: 3 },
    profileStore: profiles, profiles: [profile('w1', 1), profile('w2', 1), profile('w3', 0.25), profile('w4', 0.25)],
  });
  try {
    for (const w of info.workers) publishTelemetry(workerT, JOB, 'start', w, { node: w, group: 'x', mode: 'hps', emulated_speed: null });
    const base: Record<string, number> = { w1: 100, w2: 100, w3: 400, w4: 400 };
    for (let i = 0; i < 3; i++) for (const [w, ms] of Object.entries(base)) batch(workerT, w, i, ms);
    await new Promise((r) => setTimeout(r, 30));
    assert.deepEqual(ctl.speedGroups().map((x) => [x.name, x.nodes, x.sync_mode]), [['fast', ['w1', 'w2'], 'sync'], ['slow', ['w3', 'w4'], 'async']],
      'at baseline speed the profiles give the groups the job has');
    // w2 throttles to 4× its own baseline: as slow as w3 and w4.
    for (let i = 3; i < 6; i++) batch(workerT, 'w2', i, 400);
    await new Promise((r) => setTimeout(r, 30));
    assert.deepEqual(ctl.speedGroups().map((x) => [x.name, x.nodes, x.sync_mode, x.sync_steps]), [['fast', ['w1'], 'sync', 4], ['slow', ['w2', 'w3', 'w4'], 'async', null]]);

    const reply = await ctl.regroup(null, 'test');
    assert.equal(reply.accepted, true);
    for (const w of info.workers) publishTelemetry(workerT, JOB, 'regroup', w, { node: w, groups_version: 1, state: 'ready', group: 'x' });
    await until(async () => ctl.records.length === 1);
    assert.equal(ctl.records[0]!.grouped_by, 'profiles');
    assert.deepEqual(ctl.records[0]!.moved, ['w2']);

    // After the regroup the baselines restart at the new pace; the slowdown is carried, so w2 stays slow.
    for (let i = 6; i < 9; i++) for (const [w, ms] of Object.entries({ ...base, w2: 400 })) batch(workerT, w, i, ms);
    await new Promise((r) => setTimeout(r, 30));
    assert.deepEqual(ctl.speedGroups().map((x) => [x.name, x.nodes]), [['fast', ['w1']], ['slow', ['w2', 'w3', 'w4']]]);
  } finally {
    await ctl.dispose();
    await driverT.close();
    await workerT.close();
  }
});

test('profiles arriving as telemetry count too; a worker without one means step times alone, and says so', async () => {
  const broker = new InProcessBroker();
  const driverT = await connectTransport({ servers: null, broker, name: 'driver' });
  const workerT = await connectTransport({ servers: null, broker, name: 'worker' });
  const store = memoryJobInfoStore();
  await store.put(info);
  const lines: string[] = [];
  const log = silentLogger();
  const spy = Object.assign(Object.create(log) as typeof log, { info: (...a: unknown[]) => { lines.push(a.map(String).join(' ')); } });
  const ctl = new RegroupController({ transport: driverT, job: JOB, jobStore: store, info, clock: systemClock, log: spy, autoEveryMs: 0, policy: { window: 3 } });
  try {
    // Step times alone would put w2 (150 ms) with w1 (100 ms), apart from w3/w4 (400 ms) …
    const steps: Record<string, number> = { w1: 100, w2: 150, w3: 400, w4: 400 };
    for (let i = 0; i < 3; i++) for (const [w, ms] of Object.entries(steps)) batch(workerT, w, i, ms);
    // … and so would the profiles; but only three workers published one.
    for (const p of [profile('w1', 1), profile('w2', 0.6), profile('w3', 0.25)]) publishTelemetry(workerT, JOB, 'profile', p.node, telemetry(p));
    await new Promise((r) => setTimeout(r, 30));
    assert.deepEqual(ctl.speedGroups().map((x) => [x.name, x.nodes]), [['fast', ['w1', 'w2']], ['slow', ['w3', 'w4']]]);
    assert.ok(lines.some((l) => /no profile from w4; grouping every worker on its observed step times only/.test(l)), lines.join('\n'));

    // w4's profile arrives (a republished one, with its step-time variation): now the profiles decide.
    publishTelemetry(workerT, JOB, 'profile', 'w4', { ...telemetry(profile('w4', 0.25)), phase: 'training', steps: 20, step_ms_variance: 0.01 });
    await new Promise((r) => setTimeout(r, 30));
    lines.length = 0;
    const groups = ctl.speedGroups();
    assert.ok(!lines.some((l) => /no profile/.test(l)), 'no fallback once every worker has a profile');
    assert.deepEqual(groups.map((x) => x.nodes), [['w1', 'w2'], ['w3', 'w4']]);
  } finally {
    await ctl.dispose();
    await driverT.close();
    await workerT.close();
  }
});
