/**
 * The scheduler actor on the in-process bus, driven as any JSON NATS client
 * would: an unknown command names the known ones; status before the job
 * exists says starting; pause writes the next groups_version (groups
 * unchanged) and becomes paused once every live worker reports; regroup is
 * refused while paused; resume writes resume_version; a client's shutdown
 * reaches the driver, the driver's own does not.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  ActorRef, ActorSystem, InProcessBroker, controlAddress, JSON_CONTENT_TYPE, SeededRandom, connectTransport, controlSubject, silentLogger, systemClock, type Transport,
} from '../../runtime/mod.ts';
import type { ShardPlan } from '../../topology/mod.ts';
import { memoryJobInfoStore, type JobInfo } from '../../actors/store/job-info.ts';
import { RegroupController } from '../../actors/scheduler/regroup.ts';
import { createSchedulerActor } from '../../actors/scheduler/scheduler.actor.ts';
import type { Checkpointer } from '../../actors/scheduler/checkpointer.ts';
import { createMonitorActor } from '../../actors/monitor/monitor.actor.ts';
import { publishTelemetry } from '../../actors/monitor/telemetry.ts';
import { until } from '../support/until.ts';

const JOB = 'sj';
const info: JobInfo = {
  job: JOB, run_id: 'r1', mode: 'asp', workers: ['w1', 'w2'], total_batches: 10, rounds: 5, epochs: 1, batch_size: 32, ack_wait_ms: 60_000,
  groups: [], groups_version: 0, resume_version: 0, paused: false, rejoining: [], standbys: [],
};

interface Reply { type: string; result?: Record<string, unknown>; error?: { name: string; message: string } }
async function ctl(t: Transport, command: string, body: unknown = {}): Promise<Reply> {
  const m = await t.request(controlSubject(JOB, command), new TextEncoder().encode(JSON.stringify(body)), { timeoutMs: 5_000, headers: { 'Content-Type': JSON_CONTENT_TYPE } });
  return JSON.parse(new TextDecoder().decode(m.data)) as Reply;
}

/** A driver's system with the scheduler and the monitor spawned, a client transport, and an empty job-info store. */
async function schedulerLab(onShutdown: (reason: string) => void = () => undefined) {
  const broker = new InProcessBroker();
  const driverT = await connectTransport({ servers: null, broker, name: 'driver' });
  const clientT = await connectTransport({ servers: null, broker, name: 'client' });
  const store = memoryJobInfoStore();
  const system = new ActorSystem({ transport: driverT, job: JOB, node: 'driver', clock: systemClock, random: new SeededRandom(1), logger: silentLogger() });
  const scheduler = createSchedulerActor({ job: JOB, onShutdown, statusTimeoutMs: 300 });
  await system.spawn(scheduler);
  await system.spawn(createMonitorActor({ transport: driverT, job: JOB, clock: systemClock, log: silentLogger() }));
  return { driverT, clientT, store, system, scheduler };
}

test('scheduler: status, pause, resume, regroup refused while paused, unknown commands, shutdown', async () => {
  const shutdowns: string[] = [];
  const { driverT, clientT, store, system, scheduler } = await schedulerLab((r) => shutdowns.push(r));
  let controller: RegroupController | null = null;
  try {
    const unknown = await ctl(clientT, 'explode');
    assert.equal(unknown.type, 'error');
    assert.match(unknown.error!.message, /unknown message type "explode"/);
    for (const c of ['status', 'pause', 'resume', 'regroup', 'shutdown']) assert.match(unknown.error!.message, new RegExp(c));

    const starting = await ctl(clientT, 'status');
    assert.equal(starting.result!.state, 'starting');
    const early = await ctl(clientT, 'pause');
    assert.match(early.error!.message, /still starting/);

    await store.put(info);
    controller = new RegroupController({ transport: driverT, job: JOB, jobStore: store, info, clock: systemClock, log: silentLogger(), autoEveryMs: 0 });
    const c = controller;
    scheduler.attach({ info: () => c.jobInfo, plan: () => ({ version: 3, shards: [] }) as unknown as ShardPlan, controller: c });
    for (const w of info.workers) publishTelemetry(clientT, JOB, 'start', w, { node: w, group: 'ungrouped', mode: 'asp', emulated_speed: null });
    publishTelemetry(clientT, JOB, 'batch', 'w1', {
      node: 'w1', batch_id: 'b0', samples: 32, loss: 0.7, redelivered: false, ack_confirmed: true, staleness: 0, round: null, busy_ms: 1, emulated_step_ms: 1,
    });
    await until(async () => ((await ctl(clientT, 'status')).result!.progress as { batches_acked: number }).batches_acked === 1);
    const st = (await ctl(clientT, 'status')).result!;
    assert.equal(st.state, 'training');
    assert.equal(st.plan_version, 3);
    assert.equal(st.run_id, 'r1');
    assert.deepEqual((st.workers as { node: string; steps: number }[]).map((w) => [w.node, w.steps]), [['w1', 1], ['w2', 0]]);
    assert.deepEqual(st.progress, { samples: 32, batches_acked: 1, batches_total: 10, samples_per_s: (st.progress as { samples_per_s: number }).samples_per_s, loss: 0.7 });

    const resumeFirst = await ctl(clientT, 'resume');
    assert.match(resumeFirst.error!.message, /not paused/);
    const paused = await ctl(clientT, 'pause', { reason: 'maintenance' });
    assert.equal(paused.type, 'reply', JSON.stringify(paused));
    assert.equal(paused.result!.groups_version, 1);
    assert.equal(paused.result!.state, 'pausing');
    const written = (await store.get())!;
    assert.equal(written.groups_version, 1);
    assert.equal(written.resume_version, 0, 'paused: no resume until ctl.resume');
    assert.deepEqual(written.groups, info.groups, 'a pause leaves the groups as they are');
    assert.equal(written.paused, true, 'marked as an operator pause: workers wait for resume without a limit');
    assert.equal((await ctl(clientT, 'pause')).result!.already, true, 'a second pause is answered, not applied again');
    const regroup = await ctl(clientT, 'regroup', { groups: null });
    assert.equal(regroup.type, 'error');
    for (const w of info.workers) publishTelemetry(clientT, JOB, 'regroup', w, { node: w, groups_version: 1, state: 'ready', group: 'ungrouped' });
    await until(async () => (await ctl(clientT, 'status')).result!.state === 'paused');
    const resumed = await ctl(clientT, 'resume');
    assert.equal(resumed.type, 'reply');
    assert.equal((await store.get())!.resume_version, 1);
    assert.equal((await store.get())!.paused, false);
    assert.equal((await ctl(clientT, 'status')).result!.state, 'training');
    const events = ((await ctl(clientT, 'status', { events: 50 })).result!.events as { kind: string; text: string }[]);
    assert.ok(events.some((e) => e.kind === 'pause' && /maintenance/.test(e.text)), JSON.stringify(events));
    assert.ok(events.some((e) => e.kind === 'resume'));
    assert.ok(events.filter((e) => e.kind === 'worker').length >= 2, 'each worker pausing is an event');

    // The driver's own end-of-job shutdown is not a request to end the job early.
    const own = await new ActorRef(system, controlAddress(JOB)).request('shutdown', { run_id: 'r1', reason: 'the job is done' });
    assert.equal(own.stopping, true);
    const other = await ctl(clientT, 'shutdown', { run_id: 'another-run', reason: 'x' });
    assert.equal(other.result!.stopping, false);
    assert.deepEqual(shutdowns, []);
    const stop = await ctl(clientT, 'shutdown', { reason: 'operator' });
    assert.equal(stop.result!.stopping, true);
    assert.deepEqual(shutdowns, ['operator']);
    // A checkpoint asked for once the job is stopping (the API's saveCheckpoint after training) is refused by name.
    const late = await ctl(clientT, 'checkpoint', {});
    assert.equal(late.type, 'error');
    assert.match(late.error!.message, /the job has ended \(it is stopping\); its end-of-job checkpoint/);
  } finally {
    await system.stop();
    await controller?.dispose();
    await driverT.close();
    await clientT.close();
  }
});

test('pause: a worker the health actor says is dead is not waited for', async () => {
  const broker = new InProcessBroker();
  const driverT = await connectTransport({ servers: null, broker, name: 'driver' });
  const store = memoryJobInfoStore();
  await store.put(info);
  const dead = new Set<string>();
  const c = new RegroupController({ transport: driverT, job: JOB, jobStore: store, info, clock: systemClock, log: silentLogger(), autoEveryMs: 0, isDead: (n) => dead.has(n) });
  try {
    for (const w of info.workers) publishTelemetry(driverT, JOB, 'start', w, { node: w, group: 'ungrouped', mode: 'asp', emulated_speed: null });
    await until(() => c.pausedWorkers().length === 0 && c.state === 'training');
    await c.pause('test');
    publishTelemetry(driverT, JOB, 'regroup', 'w1', { node: 'w1', groups_version: 1, state: 'ready', group: 'ungrouped' });
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(c.state, 'pausing', 'w2 is alive as far as anyone knows: waited for');
    dead.add('w2');
    await until(() => c.state === 'paused', 'paused without the dead worker');
    await c.resume();
  } finally {
    await c.dispose();
    await driverT.close();
  }
});

test('status is answered while a long command runs (a checkpoint\'s cut, a recover): commands take turns, status does not wait for them', async () => {
  const { driverT, clientT, store, system, scheduler } = await schedulerLab();
  await store.put(info);
  const controller = new RegroupController({ transport: driverT, job: JOB, jobStore: store, info, clock: systemClock, log: silentLogger(), autoEveryMs: 0 });
  // A cut that takes until the test lets it end.
  let endCut!: () => void;
  const cutEnded = new Promise<void>((r) => { endCut = r; });
  let cuts = 0;
  const checkpointer = {
    take: async () => {
      cuts++;
      await cutEnded;
      return { name: 'ckpt-1', dir: '/nowhere', files: 2, bytes: 100, batches_done: 1, pause_ms: 5, trigger: 'command' };
    },
  } as unknown as Checkpointer;
  scheduler.attach({ info: () => controller.jobInfo, plan: () => ({ version: 1, shards: [] }) as unknown as ShardPlan, controller, checkpointer });
  try {
    let checkpointAnswered = false;
    const checkpoint = ctl(clientT, 'checkpoint', {}).then((r) => { checkpointAnswered = true; return r; });
    await until(() => cuts === 1);
    // Status, several at once (the dashboard, /metrics and an operator), each answered while the cut runs.
    const statuses = await Promise.all([ctl(clientT, 'status'), ctl(clientT, 'status'), ctl(clientT, 'status', { events: 5 })]);
    for (const s of statuses) assert.equal(s.result?.state, 'training', JSON.stringify(s));
    assert.equal(checkpointAnswered, false, 'status was answered before the checkpoint');
    // Another command waits for the one in progress (commands take turns).
    let pauseAnswered = false;
    const pause = ctl(clientT, 'pause').then((r) => { pauseAnswered = true; return r; });
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(pauseAnswered, false, 'pause waits for the checkpoint command before it');
    endCut();
    assert.equal((await checkpoint).result?.name, 'ckpt-1');
    assert.equal((await pause).result?.groups_version, 1);
  } finally {
    endCut();
    await system.stop();
    await controller.dispose();
    await driverT.close();
    await clientT.close();
  }
});
