/**
 * A worker's profile on join and while training (actors/node/profile-reporter.ts),
 * the profile store (actors/store/profile-store.ts) and the driver's wait for every
 * worker's profile — on the in-process bus, with a given device profile so
 * no ONNX Runtime runs.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InProcessBroker, SimulatedClock, TimeoutError, connectTransport, silentLogger, systemClock, telemetryWildcard } from '../../runtime/mod.ts';
import { decode } from '../../runtime/codec.ts';
import { coefficientOfVariation, type DeviceProfile } from '../../native-bridge/mod.ts';
import { parseNodeProfiles } from '../../topology/mod.ts';
import { waitForProfiles } from '../../actors/scheduler/job.ts';
import { ProfileReporter, probeSettings } from '../../actors/node/profile-reporter.ts';
import { memoryProfileStore, profileKey } from '../../actors/store/profile-store.ts';
import { nodeProfileOf, profileTelemetrySchema, subscribeTelemetry, type ProfileTelemetry } from '../../actors/monitor/telemetry.ts';

const JOB = 'prof';
const device: DeviceProfile = { node: 'host', matmul_gflops: 120, gather_rows_per_s: 8e6, memory_gb: 16, cpus: 4, providers: ['cpu'], variance: 0.05 };

test('join: measured (emulation applied and labelled), published on tel.profile.<node>, stored; valid for grouping', async () => {
  const broker = new InProcessBroker();
  const nodeT = await connectTransport({ servers: null, broker, name: 'w1' });
  const watchT = await connectTransport({ servers: null, broker, name: 'watch' });
  const raw: { subject: string; body: unknown }[] = [];
  const sub = watchT.subscribe(telemetryWildcard(JOB, 'profile'), (m) => raw.push({ subject: m.subject, body: decode(m.data) }));
  const store = memoryProfileStore();
  const reporter = await ProfileReporter.join({
    transport: nodeT, job: JOB, node: 'w1', emulate: { speed: 0.5, bandwidth_mbps: 200 , link: 'hold' }, provider: 'cpu', store, clock: systemClock, log: silentLogger(),
    probeSeconds: 0.2, republishMs: 0, device: async () => device,
  });
  try {
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(raw.length, 1);
    assert.equal(raw[0]!.subject, `hps.${JOB}.tel.profile.w1`);
    const t = profileTelemetrySchema.parse(raw[0]!.body);
    assert.equal(t.phase, 'join');
    assert.equal(t.matmul_gflops, 60, 'emulate.speed 0.5 halves compute');
    assert.equal(t.gather_rows_per_s, 4e6);
    assert.equal(t.bandwidth_mbps, 200);
    assert.equal(t.link, 'emulated');
    assert.equal(t.emulated, true);
    assert.ok(t.rtt_ms >= 0);
    assert.equal(t.step_ms_variance, null);
    assert.equal(t.device_from, 'host', 'a given device profile is the host\'s');
    assert.equal(t.network_from, 'node');
    assert.ok(t.probe_ms < 2_000, `the join probe took ${t.probe_ms} ms`);
    assert.deepEqual((await store.getMany(['w1', 'w9'])).get('w1'), t, 'stored, and only for nodes that have one');
    assert.equal((await store.getMany(['w1', 'w9'])).size, 1);
    assert.deepEqual(parseNodeProfiles([nodeProfileOf(t)], 'published'), [nodeProfileOf(t)], 'what is published passes the profile checks');
  } finally {
    reporter.stop();
    sub.unsubscribe();
    await nodeT.close();
    await watchT.close();
  }
});

test('training: re-published on the clock with step_ms_variance = the coefficient of variation of the recent step times; not without new steps', async () => {
  const broker = new InProcessBroker();
  const nodeT = await connectTransport({ servers: null, broker, name: 'w2' });
  const seen: ProfileTelemetry[] = [];
  const unsubscribe = subscribeTelemetry(nodeT, JOB, { profile: (t) => seen.push(t) });
  const clock = new SimulatedClock();
  const store = memoryProfileStore();
  const reporter = await ProfileReporter.join({
    transport: nodeT, job: JOB, node: 'w2', emulate: null, provider: 'cpu', store, clock, log: silentLogger(),
    probeSeconds: 0.2, republishMs: 30_000, device: async () => device,
  });
  try {
    reporter.startTraining();
    const steps = [100, 110, 90, 105, 95, 300];
    for (const ms of steps) reporter.noteStep(ms);
    reporter.noteStep(null); // a step without a time is skipped
    clock.increment(29_999);
    await new Promise((r) => setTimeout(r, 10));
    assert.equal(seen.filter((t) => t.phase === 'training').length, 0, 'not before republish_seconds');
    clock.increment(1);
    await new Promise((r) => setTimeout(r, 10));
    const training = seen.filter((t) => t.phase === 'training');
    assert.equal(training.length, 1);
    assert.equal(training[0]!.steps, 6);
    assert.equal(training[0]!.step_ms_variance, +coefficientOfVariation(steps).toFixed(4));
    assert.equal(training[0]!.matmul_gflops, 120, 'compute stays as measured at join');
    assert.equal((await store.getMany(['w2'])).get('w2')!.phase, 'training', 'the store has the latest');
    clock.increment(30_000);
    await new Promise((r) => setTimeout(r, 10));
    assert.equal(seen.filter((t) => t.phase === 'training').length, 1, 'no new steps: nothing new to say');
    reporter.stop();
    reporter.noteStep(100);
    clock.increment(60_000);
    await new Promise((r) => setTimeout(r, 10));
    assert.equal(seen.filter((t) => t.phase === 'training').length, 1, 'stopped');
  } finally {
    reporter.stop();
    unsubscribe();
    await nodeT.close();
  }
});

test('waiting for the job, the profile is put again (a driver starting later empties the store first)', async () => {
  const broker = new InProcessBroker();
  const nodeT = await connectTransport({ servers: null, broker, name: 'w3' });
  const clock = new SimulatedClock();
  let puts = 0;
  const inner = memoryProfileStore();
  const store = { put: async (p: ProfileTelemetry) => { puts++; await inner.put(p); }, getMany: (n: readonly string[]) => inner.getMany(n), watch: inner.watch };
  const reporter = await ProfileReporter.join({
    transport: nodeT, job: JOB, node: 'w3', emulate: null, provider: 'cpu', store, clock, log: silentLogger(), probeSeconds: 0.2, republishMs: 0, device: async () => device,
  });
  try {
    assert.equal(puts, 1);
    reporter.keepStored();
    clock.increment(6_000);
    await new Promise((r) => setTimeout(r, 10));
    assert.equal(puts, 4, 'every 2 s');
    reporter.startTraining(); // stops the refresh
    clock.increment(6_000);
    await new Promise((r) => setTimeout(r, 10));
    assert.equal(puts, 4);
  } finally {
    reporter.stop();
    await nodeT.close();
  }
});

test('probe settings: 70% of probeSeconds to the device, the network at least 300 ms a round, three rounds ~300 ms apart', () => {
  const p = probeSettings(0.5);
  assert.equal(p.network.rounds, 3);
  assert.equal(p.network.roundGapMs, 300);
  assert.equal(p.device.repeats, 3);
  assert.ok(Math.abs((p.device.repeats! + 1) * p.device.secondsPerRepeat! - 0.35) < 1e-9);
  assert.equal(p.network.timeoutMs, 300);
  assert.equal(probeSettings(4).network.timeoutMs, 1_200);
});

test('profile keys: plain names as they are, others encoded, never colliding', () => {
  assert.equal(profileKey('w-1_a'), 'n.w-1_a');
  assert.match(profileKey('a100-node-1:8080'), /^x\.[-_A-Za-z0-9]+$/);
  assert.notEqual(profileKey('a@b'), profileKey('a_b'));
});

test('waitForProfiles: progress as profiles arrive; a timeout names the missing workers and what to do', async () => {
  const store = memoryProfileStore();
  const t = (node: string): ProfileTelemetry => ({
    ...device, node, providers: ['cpu'], bandwidth_mbps: 1000, rtt_ms: 0.1, step_ms_variance: null, emulated: false, link: 'nats',
    phase: 'join', steps: 0, probe_ms: 400, device_from: 'node', network_from: 'node',
  });
  await store.put(t('a'));
  const progress: string[] = [];
  const waiting = waitForProfiles(store, ['a', 'b'], { clock: systemClock, timeoutMs: 5_000, onProgress: (have, missing) => progress.push(`${have}:${missing.join(',')}`) });
  setTimeout(() => { void store.put(t('b')); }, 50);
  const found = await waiting;
  assert.deepEqual([...found.keys()].sort(), ['a', 'b']);
  assert.deepEqual(progress, ['1:b', '2:']);

  await assert.rejects(waitForProfiles(store, ['a', 'c', 'd'], { clock: systemClock, timeoutMs: 300 }),
    (e: Error) => e instanceof TimeoutError && /no profile from c, d after 0 s \(1\/3 workers profiled\)/.test(e.message) && /hetps launch --role worker --node NAME/.test(e.message));
  await assert.rejects(waitForProfiles(store, ['c'], { clock: systemClock, timeoutMs: 5_000, check: () => 'worker c exited (code 1)' }),
    (e: Error) => /worker c exited \(code 1\) \(missing: c\)/.test(e.message));
});
