/**
 * The driver's TrainingMonitor beyond the exactly-once accounting: the
 * periodic evaluation curve (a point as training starts, every everyMs, one
 * when the last batch is in), per-worker utilisation from the workers'
 * step-time telemetry (and the nominal fallback for workers that send none),
 * and the CPU accounting helpers the summary uses.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { InProcessBroker, SimulatedClock, connectTransport, silentLogger } from '../../runtime/mod.ts';
import type { ShardPlan } from '../../topology/mod.ts';
import type { Evaluation } from '../../native-bridge/mod.ts';
import { memoryBatchQueue, type BatchDescriptor } from '../../actors/store/batch-queue.ts';
import type { PreparedJob } from '../../actors/scheduler/job.ts';
import { TrainingMonitor } from '../../actors/monitor/training-monitor.ts';
import type { JobInfo } from '../../actors/store/job-info.ts';
import { doneTelemetrySchema, publishTelemetry } from '../../actors/monitor/telemetry.ts';
import { cpuBetween, cpuSnapshot, processCpuSeconds } from '../../deploy/process-cpu.ts';

const JOB = 'mon';
const desc = (index: number): BatchDescriptor => ({ batch_id: `src/train/e0/b${index}`, epoch: 0, index, split: 'train', batch_size: 32, samples: 32 });
const flush = () => new Promise<void>((r) => setImmediate(r));

/** A driver and a worker transport on one in-process broker, a memory queue holding `batches` batches, and the prepared job of `workers`. */
async function harness(o: { batches: number; ackWaitMs: number; mode: JobInfo['mode']; workers: string[] }) {
  const clock = new SimulatedClock();
  const broker = new InProcessBroker();
  const driverT = await connectTransport({ servers: null, broker, name: 'driver' });
  const workerT = await connectTransport({ servers: null, broker, name: 'worker' });
  const queue = memoryBatchQueue({ clock, ackWaitMs: o.ackWaitMs });
  const descriptors = Array.from({ length: o.batches }, (_, i) => desc(i));
  await queue.publish(descriptors);
  const info: JobInfo = {
    job: JOB, run_id: 'r', mode: o.mode, workers: o.workers, total_batches: o.batches, rounds: Math.ceil(o.batches / o.workers.length), epochs: 1, batch_size: 32,
    ack_wait_ms: o.ackWaitMs, groups: null, groups_version: 0, resume_version: 0, paused: false, rejoining: [], standbys: [],
  };
  const prepared: PreparedJob = { plan: {} as ShardPlan, sharding: { hotness: false, warmup_batches: 0, partitions: 0, expected_loads: null, expected_imbalance: null, round_robin_imbalance: null, skipped: 'no plan' }, descriptors, info };
  return { clock, driverT, workerT, queue, prepared };
}

test('TrainingMonitor: the curve starts when the first worker does, has a point every everyMs and one after the last batch; utilisation comes from step-time telemetry', async () => {
  const { clock, driverT, workerT, queue, prepared } = await harness({ batches: 6, ackWaitMs: 60_000, mode: 'asp', workers: ['w1', 'w2'] });
  const monitor = new TrainingMonitor(driverT, JOB, clock, silentLogger());

  let evaluations = 0;
  const samplesSeen: number[] = [];
  const run = async (): Promise<Evaluation> => {
    evaluations++;
    return { kind: 'ctr', auc: 0.5 + 0.05 * evaluations, logloss: 0.7 - 0.05 * evaluations, samples: 100 };
  };
  const edges: string[] = [];
  const supervised = monitor.supervise({
    queue, prepared, onProgress: (p) => samplesSeen.push(p.samples), progressEveryMs: 1_000,
    evaluation: { everyMs: 1_000, run },
    // w2 sends no step times (an older worker): its busy time is steps × 150 ms.
    nominalStepMs: (node) => (node === 'w2' ? 150 : null),
    onTrainingStart: () => edges.push('start'), onTrainingEnd: () => edges.push('end'),
  });
  const advance = async (ms: number) => {
    for (let t = 0; t < ms; t += 50) { clock.increment(50); await flush(); await flush(); }
  };

  await advance(1_000);
  assert.equal(evaluations, 0, 'no evaluation before a worker has started (the shards may not serve yet)');
  for (const w of ['w1', 'w2']) publishTelemetry(workerT, JOB, 'start', w, { node: w, group: 'g', mode: 'asp', emulated_speed: w === 'w1' ? 0.5 : null });
  await advance(300);
  assert.deepEqual(edges, ['start']);
  assert.equal(evaluations, 1, 'the first point is taken as training starts');
  // Progress says when each worker's first step began: the run's first step is the earliest (w1's, 100 ms ago, at t = 1.2 s), 0.15 s after the monitor saw the first loop start (the tick after it was published, t = 1.05 s).
  const progress = (node: string, ago: number | null) => ({
    node, group: 'g', steps: 1, samples: 32, loss: 0.5, samples_per_s: 10, round: null, emulated_speed: null, first_step_ago_ms: ago,
  });
  publishTelemetry(workerT, JOB, 'progress', 'w2', progress('w2', 50));
  publishTelemetry(workerT, JOB, 'progress', 'w1', progress('w1', 100));
  publishTelemetry(workerT, JOB, 'progress', 'w1', progress('w1', null));
  await flush();

  // w1 takes four batches (emulated step 200 ms, 3 ms of real compute each), w2 two.
  for (const [i, node] of ['w1', 'w1', 'w2', 'w1', 'w2', 'w1'].entries()) {
    const item = (await queue.next(0))!;
    assert.equal(await item.ack(), true);
    publishTelemetry(workerT, JOB, 'batch', node, {
      node, batch_id: item.desc.batch_id, samples: 32, loss: 0.5, redelivered: false, ack_confirmed: true, staleness: 0, round: null,
      ...(node === 'w1' ? { busy_ms: 3, emulated_step_ms: 200 } : {}),
    });
    await advance(i < 5 ? 500 : 50);
  }
  // The report waits for the workers' end-of-loop telemetry (hps window phases ride on it).
  for (const w of ['w1', 'w2']) {
    publishTelemetry(workerT, JOB, 'done', w, {
      node: w, steps: w === 'w1' ? 4 : 2, samples: 0, batches_acked: 0, empty_rounds: 0, reason: 'done',
      windows: 2, window_phases_ms: w === 'w1' ? { steps: 800, inputs: 120, slices: 10, round: 20, gather: 0, push: 30, reports: 40 } : null,
      ...(w === 'w2' ? { tail_declined: 3 } : {}),
    });
  }
  await advance(500);
  const report = await supervised;
  monitor.dispose();

  assert.deepEqual(edges, ['start', 'end']);
  assert.equal(report.batches_acked, 6);
  assert.ok(report.first_step_s !== null && Math.abs(report.first_step_s - 0.15) < 1e-9, `first step at ${report.first_step_s} s`);
  assert.deepEqual(report.utilisation.per_node.w1!.window_phases_s, { steps: 0.8, inputs: 0.12, slices: 0.01, round: 0.02, gather: 0, push: 0.03, reports: 0.04 });
  assert.equal(report.utilisation.per_node.w1!.windows, 2);
  assert.equal(report.utilisation.per_node.w2!.window_phases_s, null, 'asp / bsp workers have no windows');
  assert.equal(report.utilisation.per_node.w2!.tail_declined, 3, 'the batches w2 left to faster workers (training.tail_dispatch)');
  assert.equal(report.utilisation.per_node.w1!.tail_declined, 0, 'absent from older workers\' done telemetry: 0');
  assert.ok(report.curve.length >= 4, `points: ${JSON.stringify(report.curve)}`);
  assert.equal(report.curve[0]!.samples, 0);
  assert.ok(report.curve[0]!.t_s < 0.3, 'the first point is at the start of training');
  assert.equal(report.curve.at(-1)!.samples, 6 * 32, 'the last point is after every batch');
  for (let k = 1; k < report.curve.length; k++) {
    assert.ok(report.curve[k]!.t_s > report.curve[k - 1]!.t_s, 'points are in time order');
    assert.ok(report.curve[k]!.samples >= report.curve[k - 1]!.samples);
  }
  assert.equal(report.curve[0]!.test_auc, 0.55);
  assert.equal(report.curve[0]!.test_accuracy, null);

  const u = report.utilisation;
  assert.equal(u.wall_s, report.train_s);
  const w1 = u.per_node.w1!;
  assert.equal(w1.busy_from, 'telemetry');
  assert.equal(w1.steps, 4);
  assert.ok(Math.abs(w1.busy_s - 0.8) < 1e-9, `w1 busy ${w1.busy_s}`);
  assert.ok(Math.abs(w1.compute_s! - 0.012) < 1e-9);
  assert.equal(w1.emulated_speed, 0.5);
  assert.ok(Math.abs(w1.utilisation - 0.8 / u.wall_s) < 1e-9);
  const w2 = u.per_node.w2!;
  assert.equal(w2.busy_from, 'nominal');
  assert.ok(Math.abs(w2.busy_s - 0.3) < 1e-9);
  assert.equal(w2.compute_s, null);
  assert.ok(Math.abs(u.mean - (w1.utilisation + w2.utilisation) / 2) < 1e-12);

  await driverT.close();
  await workerT.close();
});

test('TrainingMonitor: a stall\'s warning names who holds the unacknowledged batches, where their loops are, and the ones no worker holds', async () => {
  const { clock, driverT, workerT, queue, prepared } = await harness({ batches: 5, ackWaitMs: 30_000, mode: 'hps', workers: ['w1', 'w2', 'w3'] });
  const lines: string[] = [];
  const fields: Record<string, unknown>[] = [];
  const log = silentLogger();
  log.warn = ((obj: unknown, msg?: string) => { lines.push(typeof obj === 'string' ? obj : msg ?? ''); if (typeof obj === 'object' && obj !== null) fields.push(obj as Record<string, unknown>); }) as typeof log.warn;
  const monitor = new TrainingMonitor(driverT, JOB, clock, log);
  const supervised = monitor.supervise({ queue, prepared, onProgress: () => undefined, stallWarnMs: 10_000, telemetryGraceMs: 100 });
  const advance = async (ms: number) => { for (let t = 0; t < ms; t += 250) { clock.increment(250); await flush(); await flush(); } };
  for (const w of ['w1', 'w2', 'w3']) publishTelemetry(workerT, JOB, 'start', w, { node: w, group: 'fast', mode: 'hps', emulated_speed: null });
  // b0 acknowledged by w2; w1 takes b1 and b2 and is stuck in its group's round; b3 was delivered to w3, which lost it (it holds nothing); b4 is not delivered.
  const b0 = (await queue.next(0))!;
  assert.equal(await b0.ack(), true);
  publishTelemetry(workerT, JOB, 'batch', 'w2', { node: 'w2', batch_id: b0.desc.batch_id, samples: 32, loss: 0.5, redelivered: false, ack_confirmed: true, staleness: 0, round: null });
  for (let i = 0; i < 3; i++) assert.ok(await queue.next(0));
  await advance(500);
  const progress = (node: string, held: string[] | null, extra: Record<string, unknown> = {}) => ({
    node, group: 'fast', steps: 1, samples: 32, loss: 0.5, samples_per_s: 0, round: null, emulated_speed: null, first_step_ago_ms: 100,
    ...(held !== null ? { held, held_count: held.length, loop_state: 'training', group_state: 'running.sync.reducing', windows: 7, last_ack_ago_ms: 2_000 } : {}), ...extra,
  });
  publishTelemetry(workerT, JOB, 'progress', 'w1', progress('w1', [desc(1).batch_id, desc(2).batch_id, desc(0).batch_id]));
  publishTelemetry(workerT, JOB, 'progress', 'w2', progress('w2', [], { group_state: 'degraded', windows: 40 }));
  publishTelemetry(workerT, JOB, 'progress', 'w3', progress('w3', null)); // an older worker: reports no holdings
  await advance(1_000);
  assert.equal(lines.filter((l) => l.startsWith('no batch acknowledged')).length, 0, 'no warning before stallWarnMs');
  await advance(9_000);
  const warned = lines.filter((l) => l.startsWith('no batch acknowledged'));
  assert.equal(warned.length, 1, lines.join('\n'));
  const w = warned[0]!;
  assert.match(w, /4 unacknowledged batch\(es\)/);
  // b0 is acknowledged: w1 still naming it (its telemetry trails) does not make it a held unacknowledged batch.
  assert.match(w, /w1 holds 2 \(src\/train\/e0\/b1, src\/train\/e0\/b2; loop training, group fast: running\.sync\.reducing after 7 window\(s\), its last acknowledgement (11|12) s ago, reported (9|10) s ago\)/, w);
  assert.doesNotMatch(w, /w2 holds/);
  // w2 holds none of them: where its loop and group are is said all the same (a mate left behind by its group shows).
  assert.match(w, /; holding none: w2 \(loop training, group fast: degraded after 40 window\(s\)\); workers still running/, w);
  assert.match(w, /held by no worker that reports: 2 \(src\/train\/e0\/b3, src\/train\/e0\/b4; the queue has 1 not delivered yet; a delivered batch that nobody holds goes back to the queue after ack_wait, 30 s\); no holdings reported by w3/, w);
  assert.match(w, /workers still running: w1, w2, w3$/);
  const f = fields.find((x) => Array.isArray(x.holders))!;
  assert.deepEqual((f.holders as { node: string; held: string[] }[]).map((h) => [h.node, h.held]), [['w1', [desc(1).batch_id, desc(2).batch_id]]]);
  assert.deepEqual(f.unheld, [desc(3).batch_id, desc(4).batch_id]);
  assert.deepEqual((f.idle as { node: string; group_state: string; windows: number }[]).map((i) => [i.node, i.group_state, i.windows]), [['w2', 'degraded', 40]]);
  assert.equal(f.undelivered, 1);
  // ctl.status and the dashboard read the same holdings.
  const live = monitor.liveFigures(5).workers;
  assert.deepEqual([live.w1!.held_count, live.w2!.held, live.w3!.held], [3, [], null]);

  // The stall ends: the delivered ones come back after ack_wait, every batch is acknowledged, and supervise returns.
  await advance(31_000);
  for (let i = 1; i < 5; i++) {
    const item = (await queue.next(0))!;
    assert.equal(await item.ack(), true);
    publishTelemetry(workerT, JOB, 'batch', 'w2', { node: 'w2', batch_id: item.desc.batch_id, samples: 32, loss: 0.5, redelivered: true, ack_confirmed: true, staleness: 0, round: null });
  }
  await advance(500);
  const report = await supervised;
  assert.equal(report.batches_acked, 5);
  monitor.dispose();
  await driverT.close();
  await workerT.close();
});

test('CPU accounting: a busy process shows its CPU seconds, the fraction is CPU over wall × cores', { skip: !existsSync('/proc/self/stat') && 'no /proc' }, () => {
  const t0 = Date.now();
  while (Date.now() - t0 < 150) { /* burn CPU */ }
  const mine = processCpuSeconds(process.pid);
  assert.ok(mine !== null && mine > 0, `own CPU seconds: ${mine}`);
  assert.equal(processCpuSeconds(2 ** 31 - 2), null, 'a process that is not there reads as null');

  const procs = [{ name: 'driver', pid: null }, { name: 'self', pid: process.pid }, { name: 'gone', pid: 2 ** 31 - 2 }];
  const a = cpuSnapshot(procs);
  const t1 = Date.now();
  while (Date.now() - t1 < 300) { /* burn CPU */ }
  const b = cpuSnapshot(procs);
  const r = cpuBetween(a, b, 4);
  assert.ok(r.window_s >= 0.29 && r.window_s < 5);
  assert.ok(r.per_process.driver! > 0.01, `driver CPU ${r.per_process.driver}`);
  assert.equal(r.per_process.gone, null);
  assert.ok(Math.abs(r.process_cpu_s - (r.per_process.driver! + (r.per_process.self ?? 0))) < 1e-9);
  assert.ok(Math.abs(r.cpu_busy_fraction - r.process_cpu_s / (r.window_s * 4)) < 1e-9);
  assert.ok(r.machine_busy_fraction !== null && r.machine_busy_fraction > 0 && r.machine_busy_fraction <= 1);
});

test('done telemetry from a worker without the windows\' inputs phase is still read (inputs 0); a phase that is not a number is refused', () => {
  const base = { node: 'w1', steps: 2, samples: 64, batches_acked: 2, empty_rounds: 0, reason: 'done' };
  const old = doneTelemetrySchema.parse({ ...base, window_phases_ms: { steps: 800, slices: 10, round: 20, gather: 0, push: 30, reports: 40 } });
  assert.deepEqual(old.window_phases_ms, { steps: 800, inputs: 0, slices: 10, round: 20, gather: 0, push: 30, reports: 40 });
  assert.equal(doneTelemetrySchema.safeParse({ ...base, window_phases_ms: { steps: 800, inputs: 'x', slices: 10, round: 20, gather: 0, push: 30, reports: 40 } }).success, false);
});
