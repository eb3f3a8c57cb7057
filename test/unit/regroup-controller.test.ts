/**
 * The driver's regroup command (actors/scheduler/regroup.ts) without a training run:
 * a JSON request on hps.<job>.ctl.regroup is validated, writes the new
 * groups with the next groups_version, and resume_version follows once every
 * live worker has reported ready; bad requests get clear errors; groups: null
 * regroups on observed step times.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  ActorSystem, InProcessBroker, JSON_CONTENT_TYPE, SeededRandom, connectTransport, controlSubject, silentLogger, systemClock, type Transport,
} from '../../runtime/mod.ts';
import { memoryJobInfoStore, type JobInfo } from '../../actors/store/job-info.ts';
import { RegroupController } from '../../actors/scheduler/regroup.ts';
import { createSchedulerActor } from '../../actors/scheduler/scheduler.actor.ts';
import type { ShardPlan } from '../../topology/mod.ts';
import { publishTelemetry } from '../../actors/monitor/telemetry.ts';
import { until } from '../support/until.ts';
import { Checkpointer } from '../../actors/scheduler/checkpointer.ts';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const JOB = 'rg';
const g = (name: string, nodes: string[], sync_mode: 'sync' | 'async', sync_steps: number | null = null) =>
  ({ name, nodes, sync_mode, sync_steps, accumulation_steps: null, adaptive_threshold: null });
const info: JobInfo = {
  job: JOB, run_id: 'r', mode: 'hps', workers: ['w1', 'w2', 'w3', 'w4'], total_batches: 10, rounds: 3, epochs: 1, batch_size: 32, ack_wait_ms: 60_000,
  groups: [g('fast', ['w1', 'w2'], 'sync', 2), g('slow', ['w3', 'w4'], 'async')], groups_version: 0, resume_version: 0, paused: false, rejoining: [], standbys: [],
};

async function ask(t: Transport, body: unknown): Promise<{ type: string; result?: { accepted: boolean; groups_version: number; groups: { name: string; nodes: string[] }[] }; error?: { message: string } }> {
  const m = await t.request(controlSubject(JOB, 'regroup'), new TextEncoder().encode(JSON.stringify(body)), { timeoutMs: 5_000, headers: { 'Content-Type': JSON_CONTENT_TYPE } });
  assert.equal(m.headers?.['Content-Type'], JSON_CONTENT_TYPE, 'a JSON caller gets JSON back');
  return JSON.parse(new TextDecoder().decode(m.data));
}


test('ctl.regroup: validated, written with the next groups_version, resumed once every live worker is ready', async () => {
  const broker = new InProcessBroker();
  const driverT = await connectTransport({ servers: null, broker, name: 'driver' });
  const clientT = await connectTransport({ servers: null, broker, name: 'client' });
  const store = memoryJobInfoStore();
  await store.put(info);
  const ctl = new RegroupController({ transport: driverT, job: JOB, jobStore: store, info, clock: systemClock, log: silentLogger(), autoEveryMs: 0 });
  // The command reaches the controller through the scheduler actor, which serves hps.<job>.ctl.*.
  const system = new ActorSystem({ transport: driverT, job: JOB, node: 'driver', clock: systemClock, random: new SeededRandom(1) });
  const scheduler = createSchedulerActor({ job: JOB, onShutdown: () => undefined });
  await system.spawn(scheduler);
  scheduler.attach({ info: () => ctl.jobInfo, plan: () => ({ version: 1, shards: [] }) as unknown as ShardPlan, controller: ctl });
  try {
    for (const w of info.workers) publishTelemetry(clientT, JOB, 'start', w, { node: w, group: 'x', mode: 'hps', emulated_speed: null });

    const unknown = await ask(clientT, { reason: 'x', groups: [g('fast', ['w1', 'w2', 'w9'], 'sync', 2), g('slow', ['w3', 'w4'], 'async')] });
    assert.equal(unknown.type, 'error');
    assert.match(unknown.error!.message, /unknown node w9/);
    const missing = await ask(clientT, { reason: 'x', groups: [g('fast', ['w1', 'w2'], 'sync', 2), g('slow', ['w3'], 'async')] });
    assert.match(missing.error!.message, /w4 missing from the new groups/);
    const twice = await ask(clientT, { reason: 'x', groups: [g('fast', ['w1', 'w3'], 'sync', 2), g('slow', ['w3', 'w4', 'w2'], 'async')] });
    assert.match(twice.error!.message, /w3 is in two groups/);
    const bad = await ask(clientT, { groups: 'all' });
    assert.match(bad.error!.message, /groups/);

    const ok = await ask(clientT, { reason: 'move w3', groups: [g('fast', ['w1', 'w2', 'w3'], 'sync', 2), g('slow', ['w4'], 'async')] });
    assert.equal(ok.type, 'reply', JSON.stringify(ok));
    assert.equal(ok.result!.accepted, true);
    assert.equal(ok.result!.groups_version, 1);
    const written = (await store.get())!;
    assert.equal(written.groups_version, 1);
    assert.equal(written.resume_version, 0, 'not resumed before the workers are ready');
    const busy = await ask(clientT, { reason: 'again', groups: null });
    assert.match(busy.error!.message, /being put in place/);

    // w4's loop ended: the driver waits only for the live ones.
    publishTelemetry(clientT, JOB, 'done', 'w4', { node: 'w4', steps: 1, samples: 32, batches_acked: 1, empty_rounds: 0, reason: 'done' });
    for (const w of ['w1', 'w2', 'w3']) publishTelemetry(clientT, JOB, 'regroup', w, { node: w, groups_version: 1, state: 'ready', group: 'x' });
    await until(async () => (await store.get())!.resume_version === 1);
    await until(async () => ctl.records.length === 1);
    assert.deepEqual(ctl.records[0]!.moved, ['w3']);
    assert.deepEqual(ctl.records[0]!.not_ready, []);
    assert.equal(ctl.records[0]!.reason, 'move w3');
  } finally {
    await system.stop();
    await ctl.dispose();
    await driverT.close();
    await clientT.close();
  }
});

test('regroup on observed speed: a node that slowed down moves to the slower group', async () => {
  const broker = new InProcessBroker();
  const driverT = await connectTransport({ servers: null, broker, name: 'driver' });
  const workerT = await connectTransport({ servers: null, broker, name: 'worker' });
  const store = memoryJobInfoStore();
  await store.put(info);
  const ctl = new RegroupController({ transport: driverT, job: JOB, jobStore: store, info, clock: systemClock, log: silentLogger(), autoEveryMs: 0 });
  try {
    const ms: Record<string, number> = { w1: 100, w2: 400, w3: 390, w4: 410 };
    for (const [w, t] of Object.entries(ms)) {
      for (let i = 0; i < 5; i++) {
        publishTelemetry(workerT, JOB, 'batch', w, {
          node: w, batch_id: `${w}-${i}`, samples: 32, loss: 0.5, redelivered: false, ack_confirmed: true, staleness: 0, round: null, busy_ms: t, emulated_step_ms: t,
        });
      }
    }
    await new Promise((r) => setTimeout(r, 20));
    const groups = ctl.speedGroups();
    assert.deepEqual(groups.map((x) => [x.name, x.nodes, x.sync_mode]), [['fast', ['w1'], 'sync'], ['slow', ['w3', 'w2', 'w4'], 'async']]);
  } finally {
    await ctl.dispose();
    await driverT.close();
    await workerT.close();
  }
});

test('automatic: a node that stays slower than its baseline triggers a regroup on observed speed', async () => {
  const broker = new InProcessBroker();
  const driverT = await connectTransport({ servers: null, broker, name: 'driver' });
  const workerT = await connectTransport({ servers: null, broker, name: 'worker' });
  const store = memoryJobInfoStore();
  await store.put(info);
  const ctl = new RegroupController({
    transport: driverT, job: JOB, jobStore: store, info, clock: systemClock, log: silentLogger(), autoEveryMs: 20,
    policy: { window: 3, sustainMs: 0, cooldownMs: 60_000, threshold: 0.5 },
  });
  const batch = (w: string, i: number, t: number) => publishTelemetry(workerT, JOB, 'batch', w, {
    node: w, batch_id: `${w}-${i}`, samples: 32, loss: 0.5, redelivered: false, ack_confirmed: true, staleness: 0, round: null, busy_ms: t, emulated_step_ms: t,
  });
  try {
    const base: Record<string, number> = { w1: 100, w2: 100, w3: 400, w4: 400 };
    for (const w of info.workers) publishTelemetry(workerT, JOB, 'start', w, { node: w, group: 'x', mode: 'hps', emulated_speed: null });
    for (let i = 0; i < 3; i++) for (const [w, t] of Object.entries(base)) batch(w, i, t);
    await new Promise((r) => setTimeout(r, 100));
    assert.equal((await store.get())!.groups_version, 0, 'no regroup while every node runs at its baseline');
    // w2 throttles to 4× its baseline.
    for (let i = 3; i < 6; i++) batch('w2', i, 400);
    await until(async () => (await store.get())!.groups_version === 1);
    const groups = (await store.get())!.groups!;
    assert.deepEqual(groups.find((x) => x.name === 'slow')!.nodes.sort(), ['w2', 'w3', 'w4']);
    for (const w of info.workers) publishTelemetry(workerT, JOB, 'regroup', w, { node: w, groups_version: 1, state: 'ready', group: 'x' });
    await until(async () => ctl.records.length === 1);
    assert.equal(ctl.records[0]!.trigger, 'automatic');
    assert.match(ctl.records[0]!.reason, /w2 at 4× its baseline/);
  } finally {
    await ctl.dispose();
    await driverT.close();
    await workerT.close();
  }
});

/** Health verdicts set by the test (the HealthView interface the health watcher implements). */
function verdicts() {
  const states = new Map<string, 'alive' | 'suspect' | 'dead'>();
  const listeners = new Set<(node: string, state: 'alive' | 'suspect' | 'dead') => void>();
  return {
    stateOf: (node: string) => states.get(node) ?? null,
    onChange: (l: (node: string, state: 'alive' | 'suspect' | 'dead') => void) => { listeners.add(l); return () => { listeners.delete(l); }; },
    set(node: string, state: 'alive' | 'suspect' | 'dead') { states.set(node, state); for (const l of listeners) l(node, state); },
  };
}

/** A controller over an in-process bus that follows `health` (set by the test), its job info in a memory store; every worker started and alive. */
async function followingVerdicts(jobInfo: JobInfo, more: { strandedAfterMs?: number } = {}) {
  const broker = new InProcessBroker();
  const driverT = await connectTransport({ servers: null, broker, name: 'driver' });
  const workerT = await connectTransport({ servers: null, broker, name: 'worker' });
  const store = memoryJobInfoStore();
  await store.put(jobInfo);
  const health = verdicts();
  const ctl = new RegroupController({
    transport: driverT, job: JOB, jobStore: store, info: jobInfo, clock: systemClock, log: silentLogger(), autoEveryMs: 0,
    isDead: (n) => health.stateOf(n) === 'dead', health, ...more,
  });
  for (const w of jobInfo.workers) { publishTelemetry(workerT, JOB, 'start', w, { node: w, group: 'x', mode: 'hps', emulated_speed: null }); health.set(w, 'alive'); }
  /** Every one of `workers` reports it paused for groups version `v`. */
  const ready = (v: number, workers: readonly string[]) => {
    for (const w of workers) publishTelemetry(workerT, JOB, 'regroup', w, { node: w, groups_version: v, state: 'ready', group: 'x' });
  };
  /** `w`'s progress report, naming the state of its group as it sees it. */
  const progress = (w: string, groupState: string) => publishTelemetry(workerT, JOB, 'progress', w, {
    node: w, group: 'x', steps: 1, samples: 32, loss: null, samples_per_s: 1, round: null, emulated_speed: null, group_state: groupState,
  });
  const close = async () => { await ctl.dispose(); await driverT.close(); await workerT.close(); };
  return { store, health, ctl, ready, progress, close };
}

test('rejoin: a member of a reducing group dead and then alive again is taken back by a re-form with the groups unchanged', async () => {
  const { store, health, ctl, ready, close } = await followingVerdicts(info);
  try {
    // Alive without a dead verdict before it, or a member of an async group: nothing to re-form.
    health.set('w3', 'dead');
    health.set('w3', 'alive');
    await new Promise((r) => setTimeout(r, 50));
    assert.equal((await store.get())!.groups_version, 0, 'w3 pushes on its own (async): its group never waited for it');

    health.set('w1', 'suspect');
    health.set('w1', 'dead');
    await new Promise((r) => setTimeout(r, 50));
    assert.equal((await store.get())!.groups_version, 0, 'a dead verdict alone re-forms nothing');
    health.set('w1', 'alive');
    await until(async () => (await store.get())!.groups_version === 1);
    const written = (await store.get())!;
    assert.deepEqual(written.rejoining, ['w1']);
    assert.deepEqual(written.groups, info.groups, 'the groups are unchanged');
    assert.equal(written.resume_version, 0, 'not resumed before the workers are ready');
    ready(1, info.workers);
    await until(async () => (await store.get())!.resume_version === 1);
    await until(async () => ctl.records.length === 1);
    assert.equal(ctl.records[0]!.trigger, 'rejoin');
    assert.deepEqual(ctl.records[0]!.rejoined, ['w1']);
    assert.equal(ctl.records[0]!.grouped_by, 'unchanged');
    assert.match(ctl.records[0]!.reason, /w1 alive again/);

    // A later pause is not a rejoin: nobody gives up a window for it.
    await ctl.pause('operator');
    assert.deepEqual((await store.get())!.rejoining, []);
  } finally {
    await close();
  }
});

test('stranded: a reducing group its members report degraded while every member is alive (a verdict this driver never saw) is re-formed unchanged; async groups, dead members and short spells are left alone', async () => {
  const { store, health, ctl, ready, progress, close } = await followingVerdicts(info, { strandedAfterMs: 400 });
  const reportEvery = (ms: number, reports: () => void) => { reports(); return setInterval(reports, ms); };
  try {
    // An async group's members push alone anyway, and a group with a member dead by the verdicts waits for its rejoin or
    // recovery timeout (the dead verdict seen here): neither is stranded.
    health.set('w1', 'dead');
    let t = reportEvery(100, () => { progress('w2', 'degraded'); progress('w3', 'degraded'); });
    await new Promise((r) => setTimeout(r, 1_200));
    clearInterval(t);
    assert.equal((await store.get())!.groups_version, 0, 'nothing re-formed for an async group or a member dead by the verdicts');
    // A standby driver's view: w1 alive (it never saw it dead); w2 still reports its group degraded, w1 that it runs in sync.
    // A spell shorter than strandedAfterMs re-forms nothing.
    const fresh = await followingVerdicts(info, { strandedAfterMs: 400 });
    try {
      t = reportEvery(100, () => { fresh.progress('w2', 'degraded'); fresh.progress('w1', 'running.sync.stepping'); });
      await new Promise((r) => setTimeout(r, 250));
      fresh.progress('w2', 'running.sync.reducing');
      clearInterval(t);
      await new Promise((r) => setTimeout(r, 600));
      assert.equal((await fresh.store.get())!.groups_version, 0, 'a short spell of degraded re-forms nothing');
      const t0 = Date.now();
      t = reportEvery(100, () => { fresh.progress('w2', 'degraded'); fresh.progress('w1', 'running.sync.stepping'); });
      await until(async () => (await fresh.store.get())!.groups_version === 1);
      assert.ok(Date.now() - t0 >= 400, `re-formed after ${Date.now() - t0} ms of degraded reports, before strandedAfterMs`);
      const written = (await fresh.store.get())!;
      assert.deepEqual([written.groups, written.rejoining], [info.groups, []], 'the groups re-form unchanged; nobody gives up a window');
      clearInterval(t);
      fresh.ready(1, info.workers);
      await until(async () => (await fresh.store.get())!.resume_version === 1);
      await until(async () => fresh.ctl.records.length === 1);
      assert.equal(fresh.ctl.records[0]!.trigger, 'stranded');
      assert.match(fresh.ctl.records[0]!.reason, /group fast degraded for [0-9.]+ s with every member alive/);
      // Still degraded after it (a member cut off from its mates but not from the health actor): the next re-form waits twice as long.
      const t1 = Date.now();
      t = reportEvery(100, () => fresh.progress('w2', 'degraded'));
      await until(async () => (await fresh.store.get())!.groups_version === 2);
      assert.ok(Date.now() - t1 >= 800, `the second re-form came ${Date.now() - t1} ms after the first, not after twice strandedAfterMs`);
      clearInterval(t);
      fresh.ready(2, info.workers);
      await until(async () => (await fresh.store.get())!.resume_version === 2);
    } finally {
      clearInterval(t);
      await fresh.close();
    }
  } finally {
    await close();
  }
});

test('standby: a dead member\'s place goes to the first live standby (a regroup); the dead one becomes a standby; with none alive, nothing changes', async () => {
  const { store, health, ctl, ready, close } = await followingVerdicts({ ...info, standbys: ['w5', 'w6'] });
  try {
    health.set('w6', 'alive'); // w5 never sent a heartbeat: not a live standby
    health.set('w2', 'dead');
    await until(async () => (await store.get())!.groups_version === 1);
    const written = (await store.get())!;
    assert.deepEqual(written.groups!.map((x) => [x.name, x.nodes]), [['fast', ['w1', 'w6']], ['slow', ['w3', 'w4']]]);
    assert.deepEqual(written.workers, ['w1', 'w6', 'w3', 'w4']);
    assert.deepEqual(written.standbys, ['w5', 'w2']);
    assert.deepEqual(written.rejoining, []);
    // The dead worker and the standby are not waited for: the others' ready is enough.
    ready(1, ['w1', 'w3', 'w4']);
    await until(async () => (await store.get())!.resume_version === 1);
    await until(async () => ctl.records.length === 1);
    assert.equal(ctl.records[0]!.trigger, 'standby');
    assert.deepEqual(ctl.records[0]!.replaced, [{ dead: 'w2', standby: 'w6', group: 'fast' }]);

    // w2 comes back: it is a standby now, nothing to rejoin. w3 dies: w5 is still not alive, w2 is.
    health.set('w2', 'alive');
    health.set('w3', 'dead');
    await until(async () => (await store.get())!.groups_version === 2);
    const again = (await store.get())!;
    assert.deepEqual(again.groups!.map((x) => [x.name, x.nodes]), [['fast', ['w1', 'w6']], ['slow', ['w2', 'w4']]]);
    assert.deepEqual(again.standbys, ['w5', 'w3']);
    ready(2, ['w1', 'w6', 'w4']);
    await until(async () => ctl.records.length === 2);

    // No live standby left: a death changes nothing.
    health.set('w4', 'dead');
    await new Promise((r) => setTimeout(r, 100));
    assert.equal((await store.get())!.groups_version, 2);
  } finally {
    await close();
  }
});

test('recovery timeout: a member of a reducing group dead for recovery_timeout_ms makes the driver re-form the groups unchanged; one alive again before it is a rejoin instead', async () => {
  const { store, health, ctl, ready, close } = await followingVerdicts({ ...info, recovery_timeout_ms: 300 });
  try {
    // w1 dead, back within the timeout: its group was async meanwhile; it is taken back (a rejoin), no timeout re-form.
    health.set('w1', 'dead');
    await new Promise((r) => setTimeout(r, 100));
    health.set('w1', 'alive');
    await until(async () => (await store.get())!.groups_version === 1);
    ready(1, info.workers);
    await until(async () => ctl.records.length === 1);
    await new Promise((r) => setTimeout(r, 400));
    assert.deepEqual(ctl.records.map((r) => r.trigger), ['rejoin'], 'the cancelled timeout re-formed nothing');

    // w2 dead for good: after the timeout its group re-forms unchanged (w2 left out by the members on the verdicts).
    const t0 = Date.now();
    health.set('w2', 'dead');
    await until(async () => (await store.get())!.groups_version === 2, 'the re-form after the recovery timeout', 5_000);
    assert.ok(Date.now() - t0 >= 290, `not before the recovery timeout (${Date.now() - t0} ms)`);
    const written = (await store.get())!;
    assert.deepEqual([written.groups, written.rejoining], [info.groups, []]);
    ready(2, ['w1', 'w3', 'w4']);
    await until(async () => ctl.records.length === 2, 'the dead w2 is not waited for');
    assert.equal(ctl.records[1]!.trigger, 'recovery-timeout');
    assert.match(ctl.records[1]!.reason, /w2 dead for longer than the worker recovery timeout \(0\.3 s\)/);
    // A member of an async group: nobody waits for it, nothing to re-form.
    health.set('w3', 'dead');
    await new Promise((r) => setTimeout(r, 500));
    assert.equal((await store.get())!.groups_version, 2);
  } finally {
    await close();
  }
});

test('recover (ctl.recover): every group re-forms unchanged; refused while paused and outside hps', async () => {
  const { ctl, ready, close } = await followingVerdicts(info);
  const other = await followingVerdicts({ ...info, mode: 'asp' });
  try {
    const r = await ctl.recover('after a partition');
    assert.deepEqual([r.accepted, r.groups_version, r.groups], [true, 1, info.groups]);
    ready(1, info.workers);
    await until(async () => ctl.records.length === 1);
    assert.deepEqual([ctl.records[0]!.trigger, ctl.records[0]!.reason, ctl.records[0]!.grouped_by], ['recover', 'after a partition', 'unchanged']);
    await ctl.pause('operator');
    await assert.rejects(ctl.recover('x'), /the job is paused; resume it first/);
    await assert.rejects(other.ctl.recover('x'), /training\.mode asp has no groups to re-form \(hps only\)/);
  } finally {
    await close();
    await other.close();
  }
});

test('a checkpoint\'s cut (pauseUntilPaused) is not a pause of the operator: recover and ctl.pause sent during it wait for its resume instead of being refused or undone', async () => {
  const { ctl, ready, close } = await followingVerdicts(info);
  const cutAt = async (v: number) => {
    const cut = ctl.pauseUntilPaused('checkpoint (periodic)', 5_000);
    await until(async () => ctl.jobInfo.groups_version === v, 'the cut\'s pause written');
    ready(v, info.workers);
    assert.equal((await cut).already, false);
  };
  try {
    await cutAt(1);
    let recovered = false;
    const recover = ctl.recover('during the cut').then((r) => { recovered = true; return r; });
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(recovered, false, 'recover waits while the cut holds the pause');
    await ctl.resume(); // the checkpointer lifts its pause
    const r = await recover;
    assert.deepEqual([r.accepted, r.groups_version], [true, 2]);
    ready(2, info.workers);
    await until(async () => ctl.records.length === 1, 'the recover re-form done');

    await cutAt(3);
    let paused = false;
    const operatorPause = ctl.pause('operator').then((p) => { paused = true; return p; });
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(paused, false, 'ctl.pause waits while the cut holds the pause');
    await ctl.resume();
    const p = await operatorPause;
    assert.deepEqual([p.already, p.groups_version], [false, 4], 'the operator\'s pause is its own, not the cut\'s (which the checkpointer lifts)');
    assert.equal(ctl.jobInfo.paused, true);
  } finally {
    await close();
  }
});

test('a cut sent while a recover is still re-forming the groups gives up within its timeout, naming the worker not paused; nothing is paused for it', async () => {
  const { ctl, ready, close } = await followingVerdicts(info);
  try {
    const r = await ctl.recover('partition healed');
    assert.equal(r.groups_version, 1);
    ready(1, ['w1', 'w2', 'w3']); // w4 is still in its window
    const t0 = performance.now();
    await assert.rejects(ctl.pauseUntilPaused('checkpoint (command)', 400),
      /checkpoint \(command\): groups v1 were still being put in place after 0 s \(w4 not paused for them yet\); nothing was paused for it/);
    const waited = performance.now() - t0;
    assert.ok(waited >= 380 && waited < 3_000, `gave up at its timeout, not when the re-form ended (${waited.toFixed(0)} ms)`);
    assert.deepEqual([ctl.jobInfo.groups_version, ctl.jobInfo.paused, ctl.state], [1, false, 'regrouping'], 'no pause of its own written');
    // Once w4 pauses, the re-form completes and a cut goes through.
    ready(1, ['w4']);
    await until(async () => ctl.records.length === 1, 'the recover re-form done');
    const cut = ctl.pauseUntilPaused('checkpoint (command)', 5_000);
    await until(async () => ctl.jobInfo.groups_version === 2, 'the cut\'s pause written');
    ready(2, info.workers);
    assert.equal((await cut).already, false);
    await ctl.resume();
  } finally {
    await close();
  }
});

test('checkpoints: a command behind a checkpoint stuck in its pause answers by its own deadline and is not taken later; the stuck one names the worker', async () => {
  const { ctl, ready, close } = await followingVerdicts(info);
  const root = await mkdtemp(join(tmpdir(), 'hetps-ck-'));
  const froze: string[] = [];
  const k = new Checkpointer({
    root, keep: 10, job: JOB, model: null, controller: ctl, plan: () => ({ version: 1, shards: ['s0'] }) as unknown as ShardPlan,
    frozen: { freeze: async (s) => { froze.push(s); }, take: () => Promise.reject(new Error('not reached')) },
    acked: () => [], totalBatches: 10, clock: systemClock, log: silentLogger(), pauseTimeoutMs: 800,
  });
  try {
    const periodic = k.take('periodic');
    const periodicFailed = assert.rejects(periodic, /checkpoint \(periodic\): w4 did not pause within 1 s; training goes on/);
    await until(async () => ctl.jobInfo.groups_version === 1, 'the periodic cut\'s pause written');
    ready(1, ['w1', 'w2', 'w3']);
    const t0 = performance.now();
    await assert.rejects(k.take('command', undefined, { pauseWithinMs: 300 }),
      /checkpoint \(command\): the periodic checkpoint before it was still being taken after 0 s; nothing was paused for this one; try again/);
    const waited = performance.now() - t0;
    assert.ok(waited >= 280 && waited < 700, `answered by its own deadline, before the periodic one's (${waited.toFixed(0)} ms)`);
    await periodicFailed;
    assert.deepEqual([ctl.jobInfo.paused, froze], [false, []], 'the periodic cut undid its pause; no shard was frozen');
    await new Promise((r) => setTimeout(r, 200));
    assert.deepEqual([ctl.jobInfo.groups_version, ctl.jobInfo.paused], [1, false], 'the command that gave up did not pause the job afterwards');
  } finally {
    await close();
    await rm(root, { recursive: true, force: true });
  }
});

test('checkpoints and load-balancing handovers never overlap: a cut waits for a handover under way, and a handover for a cut and its fetch', async () => {
  const events: string[] = [];
  const gate = () => { let open!: () => void; const p = new Promise<void>((r) => { open = r; }); return { p, open }; };
  const pauseGate = gate();
  const root = await mkdtemp(join(tmpdir(), 'hetps-ck-'));
  const k = new Checkpointer({
    root, keep: 10, job: JOB, model: null,
    controller: {
      pauseUntilPaused: async () => { events.push('pause'); await pauseGate.p; return { already: false }; },
      resume: async () => { events.push('resume'); }, jobInfo: info,
    },
    plan: () => ({ version: 1, shards: ['s0'] }) as unknown as ShardPlan,
    frozen: { freeze: async () => { events.push('freeze'); }, take: async () => { events.push('take'); throw new Error('fetch failed (test)'); } },
    acked: () => [], totalBatches: 10, clock: systemClock, log: silentLogger(), pauseTimeoutMs: 5_000,
  });
  try {
    // A handover under way: the checkpoint asked for meanwhile does not pause anything until it is done.
    const handover = gate();
    const first = k.exclusive(async () => { events.push('handover 1'); await handover.p; events.push('handover 1 done'); });
    const cut = k.take('command');
    const cutFailed = assert.rejects(cut, /fetch failed \(test\)/);
    await new Promise((r) => setTimeout(r, 100));
    assert.deepEqual(events, ['handover 1']);
    handover.open();
    await first;
    await until(async () => events.includes('pause'), 'the cut pauses once the handover is done');
    // A cut under way (paused, not yet frozen or fetched): the next handover waits for all of it.
    const second = k.exclusive(async () => { events.push('handover 2'); });
    await new Promise((r) => setTimeout(r, 100));
    assert.ok(!events.includes('handover 2'), events.join(', '));
    pauseGate.open();
    await cutFailed;
    await second;
    assert.deepEqual(events, ['handover 1', 'handover 1 done', 'pause', 'freeze', 'resume', 'take', 'handover 2']);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});
