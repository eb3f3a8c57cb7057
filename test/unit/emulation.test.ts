import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  ActorSystem, ConfigError, InProcessBroker, SeededRandom, SimulatedClock, connectTransport, silentLogger, systemClock, type Logger, type Transport,
} from '../../runtime/mod.ts';
import { parseConfig } from '../../topology/mod.ts';
import { StepSession, streamOptions } from '../../native-bridge/mod.ts';
import { shardPlanFromConfig, sparseLayoutFromConfig } from '../../actors/node/config-bridge.ts';
import { modelAndData, startServerNode } from '../../actors/node/nodes.ts';
import { memoryPlanStore } from '../../actors/store/plan-store.ts';
import { ComputePacer, EmulatedLink } from '../../actors/worker/emulation.ts';
import { LinkUsage } from '../../actors/worker/link-usage.ts';
import { ShardClient } from '../../actors/worker/shard-client.ts';
import { WorkerStepper } from '../../actors/worker/step.ts';

/** A logger that keeps the warnings. */
function warnings(): { log: Logger; lines: string[] } {
  const lines: string[] = [];
  const log = silentLogger();
  log.warn = ((obj: unknown, msg?: string) => { lines.push(typeof obj === 'string' ? obj : msg ?? ''); }) as Logger['warn'];
  return { log, lines };
}

/** Lets pending promise callbacks run, then moves the simulated clock by `ms` (timers fire on the way). */
async function advance(clock: SimulatedClock, ms: number): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
  clock.increment(ms);
}

test('emulated compute: a speed-0.5 node\'s step takes 2× the reference step, the real compute inside it', async () => {
  const clock = new SimulatedClock(1_000);
  const { log, lines } = warnings();
  const pacer = new ComputePacer({ clock, log, node: 'slow', speed: 0.5, referenceStepMs: 100 });
  assert.equal(pacer.targetStepMs, 200);

  // 30 ms of real compute: the pacer sleeps the other 170.
  const start = clock.monotonic();
  clock.increment(30);
  let timing: { computeMs: number; stepMs: number } | null = null;
  const p = pacer.finish(start).then((t) => { timing = t; });
  await advance(clock, 169);
  assert.equal(timing, null, 'still inside the emulated step');
  await advance(clock, 1);
  await p;
  assert.deepEqual(timing, { computeMs: 30, stepMs: 200 });
  assert.equal(clock.monotonic() - start, 200);

  // A real step longer than the emulated one: no sleep, the real time, one warning only.
  for (let i = 0; i < 2; i++) {
    const s = clock.monotonic();
    clock.increment(250);
    assert.deepEqual(await pacer.finish(s), { computeMs: 250, stepMs: 250 });
  }
  assert.equal(lines.length, 1);
  assert.match(lines[0]!, /emulation cannot keep up: a real step took 250 ms, longer than the emulated 200 ms/);

  // Not emulated: the real time, nothing slept.
  const real = new ComputePacer({ clock, log, node: 'fast', speed: null, referenceStepMs: 100 });
  const s = clock.monotonic();
  clock.increment(7);
  assert.deepEqual(await real.finish(s), { computeMs: 7, stepMs: 7 });
});

test('emulated link: a transfer takes bytes·8/bandwidth, and transfers queue behind each other', async () => {
  const clock = new SimulatedClock(0);
  const link = new EmulatedLink(clock, 8); // 8 Mbit/s = 1000 bytes per ms
  assert.equal(link.transferMs(5_000), 5);
  const done: string[] = [];
  const a = link.transfer(5_000).then(() => done.push(`a@${clock.monotonic()}`));
  const b = link.transfer(2_000).then(() => done.push(`b@${clock.monotonic()}`));
  for (let t = 0; t < 8; t++) await advance(clock, 1);
  await Promise.all([a, b]);
  assert.deepEqual(done, ['a@5', 'b@7']);
  assert.equal(link.totalDelayMs, 5 + 7);
  const open = new EmulatedLink(clock, null);
  await open.transfer(1 << 20);
  assert.equal(open.totalDelayMs, 0, 'no bandwidth set: not limited');
});

test('emulated link busy time: each transfer\'s bytes·8/bandwidth, queueing not counted, overlap never counted twice', async () => {
  const clock = new SimulatedClock(0);
  const link = new EmulatedLink(clock, 8); // 1000 bytes per ms
  const a = link.transfer(5_000);
  const b = link.transfer(2_000); // queued behind a: busy [5, 7]
  for (let t = 0; t < 8; t++) await advance(clock, 1);
  await Promise.all([a, b]);
  assert.equal(link.busy.between(0, 1_000), 7, 'the link carried bytes for 5 + 2 ms');
  assert.equal(link.totalDelayMs, 12, 'b waited 7 ms, 2 of them its own transfer');
  assert.equal(link.busy.between(0, 7), 7);
  assert.equal(link.busy.between(6, 100), 1);
  assert.equal(link.busy.between(7, 100), 0);
  const open = new EmulatedLink(clock, null);
  await open.transfer(1 << 20);
  assert.equal(open.busy.between(0, 1_000), 0, 'not limited: never busy');
});

test('link utilisation on an emulated link: the busy fraction of the last window, null until the link has been in use for the minimum span (simulated clock)', async () => {
  const clock = new SimulatedClock(0);
  const link = new EmulatedLink(clock, 8); // 1000 bytes per ms
  const usage = new LinkUsage(clock, link, { network: false, windowMs: 100, minSpanMs: 20 }); // judged after 20 ms
  assert.equal(usage.measure, 'emulated link');
  assert.equal(usage.utilisation(), null, 'no transfer yet');
  const first = link.transfer(30_000); // busy [0, 30]
  await advance(clock, 10);
  assert.equal(usage.utilisation(), null, '10 ms of activity: not judged yet');
  await advance(clock, 10);
  assert.equal(usage.utilisation(), 1, 'busy for all of the 20 ms seen so far');
  for (let t = 20; t < 100; t += 10) await advance(clock, 10);
  await first;
  assert.equal(clock.monotonic(), 100);
  assert.equal(usage.utilisation(), 0.3, '30 of 100 ms');
  const second = link.transfer(50_000); // busy [100, 150]
  for (let t = 100; t < 150; t += 10) await advance(clock, 10);
  await second;
  assert.equal(usage.utilisation(), 0.5, 'the window [50, 150]: the first transfer has left it');
  await advance(clock, 100);
  assert.equal(usage.utilisation(), 0, 'idle for the whole window');
});

test('link utilisation over NATS without an emulated link: the time requests are in flight, overlapping ones counted once (simulated clock)', async () => {
  const clock = new SimulatedClock(0);
  const usage = new LinkUsage(clock, new EmulatedLink(clock, null), { network: true, windowMs: 100, minSpanMs: 20 });
  assert.equal(usage.measure, 'waits on pulls, pushes and slices');
  let endA!: () => void;
  let endB!: () => void;
  const a = usage.waitOn(() => new Promise<string>((r) => { endA = () => r('a'); }));
  clock.increment(10);
  const b = usage.waitOn(() => new Promise<string>((r) => { endB = () => r('b'); }));
  clock.increment(20);
  endA();
  assert.equal(await a, 'a', 'waitOn hands back the request\'s answer');
  clock.increment(10);
  assert.equal(usage.utilisation(), 1, 'at 40 ms: a request has been in flight all along');
  clock.increment(10);
  endB();
  await b;
  clock.increment(50);
  assert.equal(usage.utilisation(), 0.5, 'in flight [0, 50] of [0, 100]: a and b overlap on [10, 30] and count once');
  // A failed request counts too (its time was spent waiting on the link), and its error is passed on.
  const failing = usage.waitOn(async () => { clock.increment(25); throw new Error('no responders'); });
  await assert.rejects(failing, /no responders/);
  assert.equal(usage.utilisation(), 0.5, 'the window [25, 125]: [25, 50] and [100, 125]');

  // The embedded bus without an emulated link has no link: its waits are never taken for link time.
  const embedded = new LinkUsage(clock, new EmulatedLink(clock, null), { network: false, windowMs: 100, minSpanMs: 20 });
  assert.equal(embedded.measure, 'none (embedded bus, no link)');
  await embedded.waitOn(async () => { clock.increment(60); });
  clock.increment(40);
  assert.equal(embedded.utilisation(), null);
});

test('link utilisation over NATS with the link\'s bandwidth measured: the bytes carried at that rate, queued one after another; the time a request waits on its receiver is not counted (simulated clock)', async () => {
  const clock = new SimulatedClock(0);
  const usage = new LinkUsage(clock, new EmulatedLink(clock, null), { network: true, measuredMbps: 8, windowMs: 100, minSpanMs: 20 }); // 1000 bytes per ms
  assert.equal(usage.measure, 'bytes over the measured bandwidth');
  // A request answered after 60 ms (a busy shard) that moved 10 000 bytes: 10 ms of link time, not 60.
  let answer!: () => void;
  const slow = usage.waitOn(() => new Promise<void>((r) => { answer = r; }));
  usage.carried(10_000); // sent at 0: busy [0, 10]
  clock.increment(60);
  answer();
  await slow;
  usage.carried(5_000); // a reply at 60: busy [60, 65]
  usage.carried(5_000); // queued behind it: busy [65, 70]
  clock.increment(40);
  assert.equal(usage.utilisation(), 0.2, '20 of the 100 ms: [0, 10] and [60, 70]; the 60 ms wait on the answer is not link time');
  clock.increment(100);
  assert.equal(usage.utilisation(), 0, 'nothing carried for the whole window');
  // Neither a nonsensical bandwidth nor carried bytes without one: the embedded bus and an emulated link ignore carried().
  assert.throws(() => new LinkUsage(clock, new EmulatedLink(clock, null), { network: true, measuredMbps: 0 }), /measured link bandwidth must be a positive number of Mbit\/s, got 0/);
  assert.throws(() => new LinkUsage(clock, new EmulatedLink(clock, null), { network: true, measuredMbps: Number.NaN }), /got NaN/);
  const emulated = new LinkUsage(clock, new EmulatedLink(clock, 8), { network: true, measuredMbps: 1, windowMs: 100, minSpanMs: 20 });
  assert.equal(emulated.measure, 'emulated link', 'an emulated link is exact: it wins over a measured bandwidth');
  emulated.carried(1_000_000);
  clock.increment(50);
  assert.equal(emulated.utilisation(), null, 'carried() does not touch the emulated link: nothing was transferred on it');
  const embedded = new LinkUsage(clock, new EmulatedLink(clock, null), { network: false, measuredMbps: 8, windowMs: 100, minSpanMs: 20 });
  assert.equal(embedded.measure, 'none (embedded bus, no link)');
  embedded.carried(50_000);
  clock.increment(50);
  assert.equal(embedded.utilisation(), null);
});

test('a worker step under emulation: compute paced to reference / speed and pulls held on the link (simulated clock)', async () => {
  const config = parseConfig(`cluster:
  worker_groups: [{ name: g, nodes: [w1] }]
  server_nodes: [s1]
nodes:
  w1: { emulate: { speed: 0.5, bandwidth_mbps: 8 } }
model: { type: ctr, ctr: { embedding_dim: 4, hidden: [8], pooling: mean, wide: true, hash_buckets: 1000 } }
data: { source: ctr-synthetic, batch_size: 16, samples: 64, test_samples: 16, slots: 3, dense_features: 2, vocab_size: 500 }
optimizer: { type: sgd, learning_rate: 0.1 }
training: { mode: hps, random_seed: 5, emulation_reference_step_ms: 40 }
`, 'emu.yaml');
  assert.equal(config.training.emulation_reference_step_ms, 40);
  const md = modelAndData(config);
  const plan = shardPlanFromConfig(config, md.model, 1 << 20);
  const broker = new InProcessBroker();
  const transports: Transport[] = [];
  const sys = async (name: string) => {
    const t = await connectTransport({ servers: null, broker, name });
    transports.push(t);
    return new ActorSystem({ transport: t, job: 'emu', node: name, clock: systemClock, random: new SeededRandom(1), logger: silentLogger() });
  };
  const [s1, w1] = [await sys('s1'), await sys('w1')];
  await startServerNode({ config, server: 's1', system: s1, planStore: memoryPlanStore(plan), log: silentLogger(), md });
  const session = await StepSession.create(md.model, { graph: 'step', intraOpNumThreads: 1 });
  const clock = new SimulatedClock(0);
  const stepper = new WorkerStepper({
    client: new ShardClient(w1, { requestTimeoutMs: 5_000, log: silentLogger(), shouldStop: () => false, plans: plan }),
    plan, model: md.model, layout: sparseLayoutFromConfig(config, md.model), session, clock, log: silentLogger(),
    emulateSpeed: 0.5, referenceStepMs: config.training.emulation_reference_step_ms, bandwidthMbps: 8,
  });
  try {
    const batch = md.source.batchesSync(streamOptions('train', 16, { epoch: 0 })).next().value!;
    let result: Awaited<ReturnType<WorkerStepper['compute']>> | null = null;
    const p = stepper.compute(batch, { reuseDense: false }).then((r) => { result = r; });
    // The simulated clock only moves here, so the real compute reads as 0 ms and the whole emulated step is slept.
    while (result === null) await advance(clock, 1);
    await p;
    const r = result as unknown as { computeMs: number; stepMs: number };
    assert.equal(r.computeMs, 0);
    assert.equal(r.stepMs, 80, 'reference 40 ms at speed 0.5');
    assert.ok(stepper.link.totalDelayMs > 0, 'the pull was held on the 8 Mbit/s link');
  } finally {
    await session.dispose();
    for (const s of [w1, s1]) await s.stop();
    for (const t of transports) await t.close();
  }
});

test('training.emulation_reference_step_ms defaults to 100 and must be a number > 0', () => {
  const base = `cluster:
  worker_groups: [{ name: g, nodes: [w1] }]
  server_nodes: [s1]
model: { type: ctr }
data: { source: spam }
`;
  assert.equal(parseConfig(base, 'a.yaml').training.emulation_reference_step_ms, 100);
  assert.equal(parseConfig(`${base}training: { emulation_reference_step_ms: 12.5 }\n`, 'b.yaml').training.emulation_reference_step_ms, 12.5);
  for (const bad of ['0', '-5', 'fast']) {
    assert.throws(() => parseConfig(`${base}training: { emulation_reference_step_ms: ${bad} }\n`, 'c.yaml'), (e: unknown) => {
      assert.ok(e instanceof ConfigError);
      assert.match(e.message, /training\.emulation_reference_step_ms: must be a number > 0/);
      return true;
    });
  }
});
