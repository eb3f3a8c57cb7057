/**
 * Tail dispatch (training.tail_dispatch): the rule (topology/tail-dispatch.ts),
 * the worker's gate on measured rates (actors/worker/tail-gate.ts), and whole
 * asp and hps jobs on the in-process bus where a slow worker leaves the last
 * batches to two fast ones and every batch is still trained exactly once.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InProcessBroker, SimulatedClock, connectTransport, silentLogger, systemClock } from '../../runtime/mod.ts';
import { allWorkerNodes, inactiveSettings, parseConfig, tailDecision, TAIL_FASTER_BY } from '../../topology/mod.ts';
import { modelAndData, startServerNode, startWorkerNode, type StartedWorker } from '../../actors/node/nodes.ts';
import { memoryPlanStore } from '../../actors/store/plan-store.ts';
import { memoryJobInfoStore } from '../../actors/store/job-info.ts';
import { memoryBatchQueue, type BatchQueue } from '../../actors/store/batch-queue.ts';
import { prepareJob } from '../../actors/scheduler/job.ts';
import { publishTelemetry, subscribeTelemetry } from '../../actors/monitor/telemetry.ts';
import { until } from '../support/until.ts';
import { inProcessBus } from '../support/in-process.ts';
import { TailGate } from '../../actors/worker/tail-gate.ts';

test('tailDecision: a worker leaves the waiting batches to faster workers only when they take them all before it finished one', () => {
  // Own 10 samples/s; two peers at 40: in one of its steps they finish (40 + 40) / 10 = 8 batches.
  const v = { ownRate: 10, peerRates: [40, 40] };
  assert.deepEqual(tailDecision({ ...v, undelivered: 8 }), { take: false, fasterCapacity: 8, faster: 2 });
  assert.equal(tailDecision({ ...v, undelivered: 3 }).take, false);
  assert.equal(tailDecision({ ...v, undelivered: 8.5 }).take, false, 'taking one would leave them 7.5, fewer than the 8 they finish meanwhile');
  assert.equal(tailDecision({ ...v, undelivered: 9 }).take, true, 'taking one leaves them 8, all they finish meanwhile: it does not delay the end');
  // Equally fast peers (below TAIL_FASTER_BY × own) never make a worker wait: the fastest always take.
  assert.deepEqual(tailDecision({ ownRate: 10, peerRates: [10 * TAIL_FASTER_BY - 0.01, 9], undelivered: 1 }), { take: true, fasterCapacity: 0, faster: 0 });
  assert.equal(tailDecision({ ownRate: 10, peerRates: [10 * TAIL_FASTER_BY], undelivered: 1 }).take, false, 'at TAIL_FASTER_BY a peer counts as faster');
  // A worker that does not know its own rate yet takes.
  for (const ownRate of [0, -1, Number.NaN, Number.POSITIVE_INFINITY]) assert.equal(tailDecision({ ownRate, peerRates: [100], undelivered: 1 }).take, true, `own rate ${ownRate}`);
  assert.equal(tailDecision({ ownRate: 10, peerRates: [Number.NaN, 100], undelivered: 5 }).faster, 1, 'a peer rate that is not a number is not counted');
});

test('training.tail_dispatch: on by default; set in a bsp job (every worker in every round) it is reported as inactive', () => {
  const text = (mode: 'asp' | 'hps' | 'bsp', tail: boolean | null) => {
    const t = configText(mode === 'bsp' ? 'asp' : mode, tail ?? true).replace('mode: asp', `mode: ${mode}`);
    return tail === null ? t.replace(', tail_dispatch: true', '') : t;
  };
  for (const mode of ['asp', 'hps', 'bsp'] as const) {
    assert.equal(parseConfig(text(mode, null), `${mode}.yaml`).training.tail_dispatch, true, mode);
    assert.equal(inactiveSettings(parseConfig(text(mode, true), `${mode}.yaml`)).some((l) => l.startsWith('training.tail_dispatch')), mode === 'bsp', mode);
  }
  assert.equal(parseConfig(configText('asp', false), 'off.yaml').training.tail_dispatch, false);
  assert.throws(() => parseConfig(configText('asp', true).replace('tail_dispatch: true', 'tail_dispatch: sometimes'), 'bad.yaml'), /training\.tail_dispatch/);
});

/** A queue whose undelivered count the test sets (and can make fail). */
function fakeQueue(): BatchQueue & { waiting: number; fail: boolean; asked: number } {
  const inner = memoryBatchQueue({ clock: new SimulatedClock(), ackWaitMs: 1_000 });
  const q = {
    ...inner,
    waiting: 0, fail: false, asked: 0,
    async undelivered() { q.asked++; if (q.fail) throw new Error('consumer info timed out'); return q.waiting; },
  };
  return q;
}

test('TailGate: measured rates decide; far from the tail it asks the queue rarely; a faster peer whose reports stop drops out, and the slow worker takes again', async () => {
  const clock = new SimulatedClock(0);
  const queue = fakeQueue();
  const transport = await connectTransport({ servers: null, broker: new InProcessBroker(), name: 'gate' });
  try {
    const gate = new TailGate({ transport, job: 'j', node: 'slow', queue, clock, log: silentLogger(), windowMs: 10_000, minSpanMs: 3_000, askEveryMs: 500, samplesPerBatch: () => 10 });
    // Reports every second: slow 10 samples/s, fast-1 and fast-2 40 each (capacity 8 batches).
    const report = (s: number) => { gate.note('slow', 10 * s, s * 1000); gate.note('fast-1', 40 * s, s * 1000); gate.note('fast-2', 40 * s, s * 1000); };
    report(0);
    clock.increment(1_000); report(1);
    queue.waiting = 3;
    assert.equal(await gate.allows(), true, 'rates not known yet (reports span 1 s < 3 s): take');
    assert.equal(queue.asked, 0, 'and no question to the queue');
    for (let s = 2; s <= 4; s++) { clock.increment(1_000); report(s); }
    assert.equal(Math.round(gate.rate('fast-1')!), 40);
    assert.equal(Math.round(gate.rate('slow')!), 10);
    assert.equal(gate.mayDecline(), true, 'faster peers and no count yet: no batch fetched ahead');
    queue.waiting = 100;
    assert.equal(await gate.allows(), true, '100 waiting, 8 taken meanwhile by the faster ones: take');
    assert.equal(gate.mayDecline(), false, 'far from the tail: fetching ahead is fine');
    clock.increment(1_000); report(5);
    assert.equal(await gate.allows(), true);
    assert.equal(queue.asked, 1, 'far from the tail the last count, less what the workers took since by their rates, is used again');
    clock.increment(1_500); report(6.5);
    queue.waiting = 8;
    assert.equal(await gate.allows(), false, '8 waiting, all taken by the faster ones before this worker finished one: leave them');
    assert.equal(gate.declined, 1);
    assert.equal(queue.asked, 2);
    queue.waiting = 0;
    clock.increment(400);
    assert.equal(await gate.allows(), false, 'near the tail the count is asked again only after askEveryMs');
    clock.increment(200);
    assert.equal(await gate.allows(), true, 'nothing waiting: take (the queue answers null and the loop ends)');
    // The fast workers stop reporting (dead, or done): after the window they no longer count.
    queue.waiting = 5;
    for (let s = 8; s <= 18; s++) { clock.increment(1_000); gate.note('slow', 10 * s, clock.monotonic()); }
    assert.equal(gate.rate('fast-1'), null, 'no report for over the window: not counted');
    assert.equal(await gate.allows(), true, 'no faster peer left: the slow worker takes');
    // A queue that cannot say how many wait: take, as without the gate.
    for (let s = 19; s <= 23; s++) { clock.increment(1_000); report(s); }
    queue.waiting = 1;
    queue.fail = true;
    clock.increment(600);
    assert.equal(await gate.allows(), true);
  } finally {
    await transport.close();
  }
});

// ---------------------------------------------------------------- whole jobs on the in-process bus

type Mode = 'asp' | 'hps';

/** One real worker, w3, at speed 0.1 (400 ms steps); the faster workers are the test's (progress telemetry only). */
function configText(mode: Mode, tail: boolean): string {
  const groups = mode === 'hps' ? '[{ name: slow, nodes: [w3], sync_mode: async }]' : '[{ name: g, nodes: [w3] }]';
  return `job: { name: tail${mode} }
cluster:
  worker_groups: ${groups}
  server_nodes: [s1]
nodes:
  w3: { emulate: { speed: 0.1 } }
model: { type: ctr, ctr: { embedding_dim: 4, hidden: [8], pooling: mean, wide: true, hash_buckets: 2000 } }
data: { source: ctr-synthetic, batch_size: 16, samples: 320, test_samples: 32, slots: 4, dense_features: 3, vocab_size: 1000 }
optimizer: { type: sgd, learning_rate: 0.1, sparse: { type: sgd, learning_rate: 0.1 } }
training: { mode: ${mode}, random_seed: 3, emulation_reference_step_ms: 40, tail_dispatch: ${tail} }
`;
}

/**
 * Runs the one-worker job while two "faster workers" (f1, f2: progress
 * telemetry at 5 000 samples/s each, a capacity of ~600 batches per step of
 * w3) report; `whileFaster` sees the job while they do, then they stop and
 * the job runs to its end.
 */
async function runJob(mode: Mode, tail: boolean, whileFaster: (j: { worker: StartedWorker; acked: () => number }) => Promise<void>) {
  const config = parseConfig(configText(mode, tail), `tail-${mode}.yaml`);
  const md = modelAndData(config);
  const bus = inProcessBus(config.job.name);
  const mk = (name: string) => bus.system(name);
  const driver = await mk('driver');
  const queue = memoryBatchQueue({ clock: systemClock, ackWaitMs: 30_000 });
  const planStore = memoryPlanStore();
  const jobStore = memoryJobInfoStore();
  const acks = new Map<string, number>();
  let reported: number | null = null;
  const unsubscribe = subscribeTelemetry(driver.transport, config.job.name, {
    batch: (t) => { if (t.ack_confirmed) acks.set(t.batch_id, (acks.get(t.batch_id) ?? 0) + 1); },
    done: (t) => { reported = t.tail_declined; },
  });
  const t0 = Date.now();
  const fakes = setInterval(() => {
    const samples = Math.round(5 * (Date.now() - t0));
    for (const node of ['f1', 'f2']) {
      publishTelemetry(driver.transport, config.job.name, 'progress', node, { node, group: 'fast', steps: samples >> 4, samples, loss: 0.5, samples_per_s: 5_000, round: null, emulated_speed: null });
    }
  }, 100);
  try {
    const prepared = await prepareJob({ config, runId: `run-${mode}`, maxPayload: 1024 * 1024, md, planStore, jobStore, queue, ackWaitMs: 30_000 });
    for (const s of config.cluster.server_nodes) await startServerNode({ config, server: s, system: await mk(s), planStore, log: silentLogger(), md });
    const [node] = allWorkerNodes(config);
    const worker = await startWorkerNode({ config, node: node!, system: await mk(node!.name), planStore, jobStore, queue, log: silentLogger(), md, runId: `run-${mode}`, progressIntervalMs: 200 });
    await whileFaster({ worker, acked: () => acks.size });
    clearInterval(fakes);
    const end = await worker.def.done;
    assert.equal(end.state, 'done', end.error ?? '');
    assert.equal(acks.size, prepared.info.total_batches, 'every batch acknowledged');
    assert.ok([...acks.values()].every((n) => n === 1), 'and each once');
    await driver.transport.flush();
    assert.equal(reported, end.tail_declined, 'the done telemetry carries the count (the summary\'s utilisation.per_node.<node>.tail_declined)');
    return end;
  } finally {
    clearInterval(fakes);
    unsubscribe();
    await bus.close({ stop: { timeoutMs: 15_000 }, beforeFirst: () => queue.close() });
  }
}

for (const mode of ['asp', 'hps'] as const) {
  test(`${mode}: a slow worker leaves the last batches to faster workers while they report, and takes them once they stop (nothing lost, nothing twice)`, { timeout: 120_000 }, async () => {
    const end = await runJob(mode, true, async ({ worker, acked }) => {
      // Its own rate is known after three progress reports of its own; from then on the 18 or so batches left are the faster workers'.
      await until(() => worker.def.stats().tail_declined > 0, 'the slow worker to leave a batch to the faster ones', 30_000);
      const before = acked();
      const declined = worker.def.stats().tail_declined;
      await new Promise((r) => setTimeout(r, 1_500));
      assert.equal(acked(), before, 'it takes nothing while they report');
      assert.ok(worker.def.stats().tail_declined > declined, 'and keeps looking (every 500 ms)');
      assert.ok(before < 20, `batches were left: ${before} of 20 trained`);
    });
    assert.ok(end.tail_declined > 0);
  });
}

test('asp with training.tail_dispatch: false: the worker takes every batch, faster workers or not', { timeout: 120_000 }, async () => {
  const end = await runJob('asp', false, async ({ worker }) => { await worker.def.done; });
  assert.equal(end.tail_declined, 0);
});
