/**
 * hps group sync strategies against single-process references on a small
 * deterministic ctr run (SGD, so every difference would show): members and
 * shards on the in-process bus, batches handed to each member directly.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { type ActorSystem, ValidationError, actorAddress, actorOpSubject, decode, groupMemberId, silentLogger, systemClock } from '../../runtime/mod.ts';
import { parseConfig, type HetpsConfig, type ShardPlan, type WorkerGroupConfig } from '../../topology/mod.ts';
import { StepSession, bucketCtrIds, ctrBagIndex, streamOptions, type CtrBatch } from '../../native-bridge/mod.ts';
import { shardPlanFromConfig, sparseLayoutFromConfig, type SparseLayout } from '../../actors/node/config-bridge.ts';
import { localOptimizersFromConfig, modelAndData, startServerNode, type ModelAndData } from '../../actors/node/nodes.ts';
import { memoryPlanStore } from '../../actors/store/plan-store.ts';
import { GroupInbox, GroupMember, reduceOwners, windowStepLimit, type GroupMemberOptions, type WindowOutcome, type WindowSource } from '../../actors/group/group-sync.ts';
import type { GroupState } from '../../actors/group/group.machine.ts';
import type { HealthState, HealthView } from '../../actors/health/health.types.ts';
import { allocateDense, assemblePull, planExchange, pullRequest, pushRequest } from '../../actors/worker/param-exchange.ts';
import { inProcessBus } from '../support/in-process.ts';
import { until } from '../support/until.ts';
import { ShardClient } from '../../actors/worker/shard-client.ts';
import { WorkerStepper } from '../../actors/worker/step.ts';
import type { LocalOptimizers } from '../../actors/worker/local-updates.ts';

const BATCH = 16;

function configText(maxStaleness: number | string): string {
  return `cluster:
  worker_groups: [{ name: g, nodes: [a, b, c] }]
  server_nodes: [s1, s2]
model: { type: ctr, ctr: { embedding_dim: 4, hidden: [16], pooling: mean, wide: true, hash_buckets: 3000 } }
data: { source: ctr-synthetic, batch_size: ${BATCH}, samples: 256, test_samples: 32, slots: 4, dense_features: 3, vocab_size: 1000 }
optimizer: { type: sgd, learning_rate: 0.2, sparse: { type: sgd, learning_rate: 0.5 } }
training: { mode: hps, random_seed: 9, max_staleness: ${maxStaleness} }
`;
}

let config: HetpsConfig;
let md: ModelAndData;
let plan: ShardPlan;
let layout: SparseLayout;
let batches: CtrBatch[];
const sessions: StepSession[] = [];

before(async () => {
  config = parseConfig(configText(8), 'group-sync.yaml');
  md = modelAndData(config);
  // Small blocks, so the dense parameters span both shards.
  plan = shardPlanFromConfig(config, md.model, 4096 + 16 * 1024);
  assert.equal(new Set(plan.dense.map((b) => b.shard)).size, 2);
  layout = sparseLayoutFromConfig(config, md.model);
  batches = [...md.source.batchesSync(streamOptions('train', BATCH, { epoch: 0 }))].slice(0, 7) as CtrBatch[];
  for (let i = 0; i < 4; i++) sessions.push(await StepSession.create(md.model, { graph: 'step', intraOpNumThreads: 1 }));
});

after(async () => { for (const s of sessions) await s.dispose(); });

/** The samples of several batches as one batch (its mean loss's gradient is the samples-weighted mean of theirs). */
function union(bs: readonly CtrBatch[]): CtrBatch {
  const slots = bs[0]!.slots;
  const size = bs.reduce((n, b) => n + b.size, 0);
  const offsets = new Int32Array(size * slots + 1);
  const ids = new Int32Array(bs.reduce((n, b) => n + b.ids.length, 0));
  const labels = new Float32Array(size);
  const denseDim = bs[0]!.denseDim;
  const dense = denseDim > 0 ? new Float32Array(size * denseDim) : null;
  let bag = 0; let id = 0; let sample = 0;
  for (const b of bs) {
    for (let k = 1; k <= b.size * slots; k++) offsets[bag + k] = id + b.offsets[k]!;
    ids.set(b.ids, id);
    labels.set(b.labels, sample);
    if (dense) dense.set(b.dense!, sample * denseDim);
    bag += b.size * slots; id += b.ids.length; sample += b.size;
  }
  return { kind: 'ctr', batchId: `union(${bs.map((b) => b.batchId).join('+')})`, size, slots, offsets, ids, dense, denseDim, labels };
}

interface Cluster {
  system(name: string): Promise<ActorSystem>;
  stepper(system: ActorSystem, session: StepSession, localOptimizers?: LocalOptimizers | null, compression?: 'fp16' | null): WorkerStepper;
  client(system: ActorSystem): ShardClient;
  close(): Promise<void>;
}

/** Two shards of job `job` (hps policy from `cfg`) on their own bus. */
async function cluster(job: string, cfg: HetpsConfig = config): Promise<Cluster> {
  const bus = inProcessBus(job);
  const system = (name: string) => bus.system(name);
  const planStore = memoryPlanStore(plan);
  for (const s of ['s1', 's2']) await startServerNode({ config: cfg, server: s, system: await system(s), planStore, log: silentLogger(), md });
  const client = (sys: ActorSystem) => new ShardClient(sys, { requestTimeoutMs: 5_000, log: silentLogger(), shouldStop: () => false, plans: plan });
  return {
    system,
    client,
    stepper: (sys, session, localOptimizers = null, compression = null) => new WorkerStepper({ client: client(sys), plan, model: md.model, layout, session, clock: systemClock, log: silentLogger(), emulateSpeed: null, localOptimizers, compression }),
    close: () => bus.close(),
  };
}

function group(mode: WorkerGroupConfig['sync_mode'], nodes: string[], n: number | null = null): WorkerGroupConfig {
  return {
    name: 'g', nodes, sync_mode: mode,
    sync_steps: mode === 'sync' ? n : null, accumulation_steps: mode === 'accumulation' ? n : null, adaptive_threshold: mode === 'adaptive' ? n : null,
  };
}

/** A member over the cluster, fed from a list of batches; drained once its list is empty. */
async function member(c: Cluster, g: WorkerGroupConfig, name: string, session: StepSession, more: Partial<GroupMemberOptions> = {}, adjust: (s: WorkerStepper) => void = () => {}) {
  const sys = await c.system(name);
  const stepper = c.stepper(sys, session);
  adjust(stepper);
  const m = new GroupMember({ system: sys, group: g, member: name, runId: 'run-1', plan, stepper, log: silentLogger(), shouldStop: () => false, ...more });
  await m.start();
  return m;
}

function source(list: CtrBatch[]): WindowSource {
  const queue = [...list];
  return { next: async () => queue.shift() ?? null, drained: async () => queue.length === 0 };
}

async function runUntilDone(m: GroupMember, src: WindowSource): Promise<WindowOutcome[]> {
  const out: WindowOutcome[] = [];
  for (;;) {
    const o = await m.runWindow(src);
    out.push(o);
    if (o.done) return out;
    assert.ok(out.length < 50, 'the group never agreed it was done');
  }
}

/** Every dense parameter and the rows of `ids` as the shards hold them now. */
async function readParams(client: ShardClient, ids: Int32Array): Promise<{ dense: Map<string, Float32Array>; rows: Map<string, Float32Array> }> {
  const exchanges = planExchange(plan, ids, { dense: true, allShards: false });
  const replies = await Promise.all(exchanges.map((ex) => client.pull(ex.shard, pullRequest(plan, ex, layout.tables, null))));
  const dense = allocateDense(plan);
  const rows = assemblePull(exchanges, replies, layout.tables, dense, ids.length);
  return { dense, rows };
}

function uniqueIdsOf(b: CtrBatch): Int32Array {
  return ctrBagIndex(b.offsets, bucketCtrIds(b.offsets, b.ids, b.slots, 3000)).uniqueIds;
}

/** Largest |x − y| over every parameter read; also how far `ours` moved from `initial` (the test must compare a real update). */
function compare(ours: Awaited<ReturnType<typeof readParams>>, ref: typeof ours, initial: typeof ours): { diff: number; moved: number } {
  let diff = 0; let moved = 0;
  for (const kind of ['dense', 'rows'] as const) {
    for (const [name, v] of ours[kind]) {
      const r = ref[kind].get(name)!; const i0 = initial[kind].get(name)!;
      assert.equal(v.length, r.length, name);
      for (let k = 0; k < v.length; k++) {
        diff = Math.max(diff, Math.abs(v[k]! - r[k]!));
        moved = Math.max(moved, Math.abs(v[k]! - i0[k]!));
      }
    }
  }
  return { diff, moved };
}

/** The reference's step on `u` at `factor` × its gradient (SGD: `factor` × the learning rate), pushed to every shard it touches. */
async function stepScaled(stepper: WorkerStepper, u: CtrBatch, factor: number): Promise<void> {
  const c = await stepper.compute(u, { reuseDense: false });
  const scaled = (m: ReadonlyMap<string, Float32Array>) => new Map([...m].map(([k, v]) => [k, v.map((x) => factor * x)]));
  for (const ex of planExchange(plan, c.uniqueIds, { dense: true, allShards: false })) {
    const r = await stepper.push(ex.shard, pushRequest(plan, ex, layout.tables, scaled(c.denseGrads), c.rowGrads && scaled(c.rowGrads), { round: null, expected: null, weight: c.samples, baseVersion: c.versions.get(ex.shard) ?? 0 }));
    assert.equal(r.refused, false);
  }
}

/** Runs `work` over a fresh group cluster and a reference step sequence over another; compares the parameters of `ids` to 1e-5. */
async function sameAsReference(work: (c: Cluster) => Promise<void>, reference: CtrBatch[] | ((stepper: WorkerStepper) => Promise<void>), ids: Int32Array, cfg: HetpsConfig = config): Promise<void> {
  const ours = await cluster('grp', cfg);
  const ref = await cluster('ref', cfg);
  try {
    const refSys = await ref.system('r');
    const initial = await readParams(ref.client(refSys), ids);
    await work(ours);
    const stepper = ref.stepper(refSys, sessions[3]!);
    if (typeof reference === 'function') await reference(stepper);
    else for (const b of reference) await stepper.run(b, null);
    const got = await readParams(ours.client(await ours.system('reader')), ids);
    const want = await readParams(ref.client(refSys), ids);
    const { diff, moved } = compare(got, want, initial);
    assert.ok(moved > 1e-3, `the parameters hardly moved (${moved}): the comparison would prove nothing`);
    assert.ok(diff < 1e-5, `parameters differ from the single-process reference by ${diff}`);
  } finally {
    await ours.close();
    await ref.close();
  }
}

test('training.stream_slices at the receiver: a slice that says k parts were streamed takes them from the parts received under the same owners; one lacking a part is refused naming it', () => {
  const part = (x: number) => ({ weight: x, dense: [{ block: 0, grad: new Float32Array([x]) }], sparse: [] });
  const header = { run_id: 'r', window: 3, member: 'a' };
  const slice = (streamed: number, parts: ReturnType<typeof part>[], owners = ['a', 'b']) => ({
    ...header, weight: 6, steps: 3, total_steps: 9, owners, idle: false, drained: false, groups_version: 0, base_versions: [], parts, batches: ['x', 'y', 'z'], streamed,
  });
  const inbox = new GroupInbox();
  // Parts dealt under a, b, c first, then under a, b: the later deal replaces the earlier parts.
  inbox.addPart({ ...header, index: 0, owners: ['a', 'b', 'c'], part: part(9) });
  inbox.addPart({ ...header, index: 1, owners: ['a', 'b'], part: part(2) });
  assert.throws(() => inbox.addSlice(slice(2, [part(3)])), (e: unknown) => e instanceof ValidationError
    && /slice of window 3 from a was streamed in 2 part\(s\), 1 of them never arrived under owners a, b: send the whole slice/.test((e as Error).message));
  assert.equal(inbox.window(3).slices.has('a'), false, 'nothing taken from the refused slice');
  inbox.addPart({ ...header, index: 0, owners: ['a', 'b'], part: part(1) });
  inbox.addSlice(slice(2, [part(3)]));
  const got = inbox.window(3).slices.get('a')!;
  assert.deepEqual(got.parts.map((p) => p.weight), [1, 2, 3], 'the streamed parts first, in step order, then the rest');
  assert.equal(got.streamed, 0);
  // A whole slice (streamed 0) ignores what was streamed: a window dropped for a pause sends an idle one.
  inbox.addSlice(slice(0, []));
  assert.deepEqual(inbox.window(3).slices.get('a')!.parts, []);
  // Finished windows take nothing more.
  inbox.finish(3);
  inbox.addPart({ ...header, index: 0, owners: ['a', 'b'], part: part(1) });
  assert.equal(inbox.window(3).parts.size, 0);
});

test('reduce-scatter ownership and window limits', () => {
  assert.deepEqual([...reduceOwners(['s1', 's2', 's3'], ['a', 'b'])], [['s1', 'a'], ['s2', 'b'], ['s3', 'a']]);
  assert.deepEqual([...reduceOwners(['s1'], ['a', 'b'])], [['s1', 'a']], 'a member may own no shard');
  assert.equal(windowStepLimit(group('sync', ['a'], 4)), 4);
  assert.equal(windowStepLimit(group('accumulation', ['a'], 3)), 3);
  assert.equal(windowStepLimit(group('adaptive', ['a'], 2)), 4, 'adaptive closes at 2× the threshold at the latest');
  assert.equal(windowStepLimit(group('async', ['a'])), 1);
});

test('sync group of 2, sync_steps 1: one sync equals a single-process step on the union batch (samples-weighted mean gradient)', async () => {
  const [b1, b2] = batches;
  const u = union([b1!, b2!]);
  await sameAsReference(async (c) => {
    const g = group('sync', ['a', 'b'], 1);
    const [ma, mb] = [await member(c, g, 'a', sessions[0]!), await member(c, g, 'b', sessions[1]!)];
    const [oa, ob] = await Promise.all([runUntilDone(ma, source([b1!])), runUntilDone(mb, source([b2!]))]);
    assert.deepEqual(oa.map((o) => o.steps.length), [1, 0], 'a sync window, then an idle one in which the group agrees it is done');
    assert.deepEqual(ob.map((o) => o.steps.length), [1, 0]);
    assert.ok(oa.every((o) => !o.droppedStale && o.staleness === 0));
  }, [u], uniqueIdsOf(u));
});

test('communication.compression fp16: a sync group of 2 sends its slices and pushes as halves and still equals the union step, within fp16 rounding', async () => {
  const [b1, b2] = batches;
  const u = union([b1!, b2!]);
  const ids = uniqueIdsOf(u);
  const ours = await cluster('fp16');
  const ref = await cluster('fp16-ref');
  try {
    const refSys = await ref.system('r');
    const initial = await readParams(ref.client(refSys), ids);
    const g = group('sync', ['a', 'b'], 1);
    const ms = await Promise.all(['a', 'b'].map(async (name, i) => {
      const sys = await ours.system(name);
      const m = new GroupMember({ system: sys, group: g, member: name, runId: 'run-1', plan, stepper: ours.stepper(sys, sessions[i]!, null, 'fp16'), log: silentLogger(), shouldStop: () => false });
      await m.start();
      return m;
    }));
    await Promise.all([runUntilDone(ms[0]!, source([b1!])), runUntilDone(ms[1]!, source([b2!]))]);
    await ref.stepper(refSys, sessions[3]!).run(u, null);
    const { diff, moved } = compare(await readParams(ours.client(await ours.system('reader')), ids), await readParams(ref.client(refSys), ids), initial);
    assert.ok(moved > 1e-3, `the parameters hardly moved (${moved})`);
    assert.ok(diff > 0, 'the halves rounded something: the gradients really went compressed');
    assert.ok(diff < 1e-3 * moved, `parameters differ from the float32 union step by ${diff} (moved ${moved})`);
  } finally {
    await ours.close();
    await ref.close();
  }
});

test('sync group of 3 over 2 shards (one member reduces nothing), sync_steps 1: equals the union step', async () => {
  const [b1, b2, b3] = batches;
  const u = union([b1!, b2!, b3!]);
  await sameAsReference(async (c) => {
    const g = group('sync', ['a', 'b', 'c'], 1);
    const ms = [await member(c, g, 'a', sessions[0]!), await member(c, g, 'b', sessions[1]!), await member(c, g, 'c', sessions[2]!)];
    await Promise.all([runUntilDone(ms[0]!, source([b1!])), runUntilDone(ms[1]!, source([b2!])), runUntilDone(ms[2]!, source([b3!]))]);
  }, [u], uniqueIdsOf(u));
});

/**
 * A sync group of a, b, c (sync_steps 1) over the two shards, c on a
 * 0.2 Mbit/s emulated link with `compression` (a and b unlimited, float32),
 * 5 + 5 + 6 batches: c's bytes out and compression choice per window, its
 * info lines, how far the parameters moved.
 */
async function slowSliceSender(job: string, compression: 'adaptive' | null) {
  const all = [...md.source.batchesSync(streamOptions('train', BATCH, { epoch: 0 }))] as CtrBatch[];
  assert.equal(all.length, 16);
  const c = await cluster(job);
  try {
    const g = group('sync', ['a', 'b', 'c'], 1);
    const [a, b] = [await member(c, g, 'a', sessions[0]!), await member(c, g, 'b', sessions[1]!)];
    const sysC = await c.system('c');
    const lines: string[] = [];
    const log = silentLogger();
    log.info = ((obj: unknown, msg?: string) => { lines.push(typeof obj === 'string' ? obj : msg ?? ''); }) as typeof log.info;
    const stepperC = new WorkerStepper({
      client: c.client(sysC), plan, model: md.model, layout, session: sessions[2]!, clock: systemClock, log, node: 'c',
      emulateSpeed: null, bandwidthMbps: 0.2, compression, compressionThreshold: 0.5,
    });
    const mc = new GroupMember({ system: sysC, group: g, member: 'c', runId: 'run-1', plan, stepper: stepperC, log: silentLogger(), shouldStop: () => false });
    await mc.start();
    const perWindow: { bytes: number; choice: string }[] = [];
    const runC = async () => {
      const src = source(all.slice(10, 16));
      for (;;) {
        const before = sysC.transport.stats.bytesOut;
        const o = await mc.runWindow(src);
        if (o.steps.length > 0) perWindow.push({ bytes: sysC.transport.stats.bytesOut - before, choice: stepperC.compressionChoice });
        if (o.done) return;
        assert.ok(perWindow.length < 50, 'the group never agreed it was done');
      }
    };
    const ids = uniqueIdsOf(union(all));
    const initial = await readParams(c.client(await c.system('reader')), ids);
    await Promise.all([runUntilDone(a, source(all.slice(0, 5))), runUntilDone(b, source(all.slice(5, 10))), runC()]);
    const moved = compare(await readParams(c.client(await c.system('reader2')), ids), initial, initial).diff;
    return { perWindow, lines, moved };
  } finally {
    await c.close();
  }
}

test('communication.compression adaptive in a sync group: a member on a slow emulated link that reduces nothing (3 members, 2 shards) switches its slices to fp16 once its link is busy, and they shrink; the group trains every batch', { timeout: 60_000 }, async () => {
  assert.deepEqual([...reduceOwners(plan.shards, ['a', 'b', 'c']).values()], ['a', 'b'], 'c reduces (and pushes) nothing: its only gradients out are slices');
  const plain = await slowSliceSender('slices-f32', null);
  const r = await slowSliceSender('slices-adaptive', 'adaptive');
  assert.equal(r.perWindow.length, 6, 'c trained its 6 batches, one per window');
  assert.equal(plain.perWindow.length, 6);
  assert.ok(plain.perWindow.every((w) => w.choice === 'none'));
  const switched = r.perWindow.findIndex((w) => w.choice === 'fp16');
  // Nothing is decided before a second of link activity; each window keeps this link busy for a few hundred ms.
  assert.ok(switched >= 0 && switched <= 4, `c switched at window ${switched + 1}: ${JSON.stringify(r.perWindow)}`);
  assert.ok(r.perWindow.slice(switched).every((w) => w.choice === 'fp16'), 'and stayed on fp16');
  assert.equal(r.lines.filter((l) => /gradients now sent as fp16/.test(l)).length, 1, r.lines.join(' | '));
  // Every window after the switch against the same window in float32 (the same batches, the same sync updates): its
  // bytes out are the two slices plus small pull requests and reports, and halved gradients (ids stay int32) make them ~3/4.
  for (let k = switched + 1; k < 6; k++) {
    const ratio = r.perWindow[k]!.bytes / plain.perWindow[k]!.bytes;
    assert.ok(ratio < 0.85, `window ${k + 1}: ${r.perWindow[k]!.bytes} bytes with fp16 slices against ${plain.perWindow[k]!.bytes} in float32`);
  }
  for (let k = 0; k < switched; k++) {
    const ratio = r.perWindow[k]!.bytes / plain.perWindow[k]!.bytes;
    assert.ok(Math.abs(ratio - 1) < 0.03, `window ${k + 1}, before the switch: ${r.perWindow[k]!.bytes} bytes against ${plain.perWindow[k]!.bytes} in float32 (only headers may differ)`);
  }
  assert.ok(r.moved > 1e-3 && plain.moved > 1e-3, `the group's updates moved the parameters (${r.moved}, ${plain.moved})`);
});

/**
 * A real slow link under `sys`: everything it publishes goes out in order,
 * each message after the ones before it are through at `mbps` (a TCP
 * connection behind a rate limit). Returns what it sent.
 */
function slowLink(sys: ActorSystem, mbps: number): { subject: string; bytes: Uint8Array }[] {
  const bus = sys.transport.bus;
  const publish = bus.publish.bind(bus);
  const sent: { subject: string; bytes: Uint8Array }[] = [];
  let busyUntil = 0;
  bus.publish = (subject, data, opts) => {
    const bytes = data.slice();
    sent.push({ subject, bytes });
    const now = performance.now();
    busyUntil = Math.max(now, busyUntil) + (bytes.byteLength * 8) / (mbps * 1_000);
    setTimeout(() => { try { publish(subject, bytes, opts); } catch { /* the bus closed at the test's end */ } }, busyUntil - now);
  };
  return sent;
}

test('a slice slower than an attempt on its link: the attempt is sized to the bytes under way at the link\'s measured rate, so the slice is sent once, not re-sent behind itself, and the window completes', { timeout: 60_000 }, async () => {
  const [b1, b2] = batches;
  const c = await cluster('slow-slices');
  try {
    const g = group('sync', ['a', 'b'], 1);
    // Attempts of 200 ms (requestTimeoutMs) for a link that takes ~1 s for b's slice.
    const ma = await member(c, g, 'a', sessions[0]!, { requestTimeoutMs: 200 });
    const sysB = await c.system('b');
    const mbps = 0.04;
    const sent = slowLink(sysB, mbps);
    const stepperB = new WorkerStepper({
      client: c.client(sysB), plan, model: md.model, layout, session: sessions[1]!, clock: systemClock, log: silentLogger(), node: 'b',
      emulateSpeed: null, measuredBandwidthMbps: mbps,
    });
    const mb = new GroupMember({ system: sysB, group: g, member: 'b', runId: 'run-1', plan, stepper: stepperB, log: silentLogger(), shouldStop: () => false, requestTimeoutMs: 200 });
    await mb.start();
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<never>((_r, reject) => { timer = setTimeout(() => reject(new Error('the window did not complete in 30 s: b\'s slice never got through')), 30_000); });
    try {
      const [oa, ob] = await Promise.race([Promise.all([runUntilDone(ma, source([b1!])), runUntilDone(mb, source([b2!]))]), deadline]);
      assert.deepEqual([oa.map((o) => o.steps.length), ob.map((o) => o.steps.length)], [[1, 0], [1, 0]]);
    } finally {
      clearTimeout(timer);
    }
    const toPeer = sent.filter((m) => /\.(slice|part)$/.test(m.subject));
    const biggest = Math.max(...toPeer.map((m) => m.bytes.byteLength));
    assert.ok((biggest * 8) / (mbps * 1_000) > 2 * 200, `b's largest message to a (${biggest} bytes) takes longer than two attempts of 200 ms on the link`);
    const copies = new Map<string, number>();
    for (const m of toPeer) { const k = `${m.subject} ${Buffer.from(m.bytes).toString('base64')}`; copies.set(k, (copies.get(k) ?? 0) + 1); }
    assert.deepEqual([...copies.values()].filter((n) => n > 1), [], `every slice and part sent once (${toPeer.length} messages: ${toPeer.map((m) => `${m.subject.split('.').at(-1)} ${m.bytes.byteLength} B`).join(', ')})`);
    assert.equal(stepperB.peerAttemptMs(200), 200, 'nothing under way on the link any more: the base attempt');
  } finally {
    await c.close();
  }
});

/**
 * The fixed-step reference, computed without any group code: every batch's
 * gradient at the window's starting parameters, then one SGD update per
 * batch, in order (gradients delayed by up to N − 1 steps).
 */
function delayedSteps(bs: readonly CtrBatch[]) {
  return async (stepper: WorkerStepper) => {
    const computed = [];
    for (const b of bs) computed.push(await stepper.compute(b, { reuseDense: false }));
    for (const [k, c] of computed.entries()) {
      for (const ex of planExchange(plan, c.uniqueIds, { dense: true, allShards: false })) {
        // The group's own earlier steps of the window are its designed delay, not staleness: each update is applied at the full rate.
        const baseVersion = (c.versions.get(ex.shard) ?? 0) + k;
        const r = await stepper.push(ex.shard, pushRequest(plan, ex, layout.tables, c.denseGrads, c.rowGrads, { round: null, expected: null, weight: c.samples, baseVersion }));
        assert.equal(r.refused, false);
      }
    }
  };
}

for (const streamSlices of [false, true]) {
  test(`sync group of 2, sync_steps 2 (fixed-step): a window is 2 updates — step k averages both members' k-th batches, computed at the window's parameters${streamSlices ? ' (training.stream_slices: each step\'s part reaches its owner before the member takes its next batch)' : ''}`, async () => {
    const [b1, b2, b3, b4, b5] = batches;
    await sameAsReference(async (c) => {
      const g = group('sync', ['a', 'b'], 2);
      const [ma, mb] = [await member(c, g, 'a', sessions[0]!, { streamSlices }), await member(c, g, 'b', sessions[1]!, { streamSlices })];
      // Streaming: a's second batch is handed out only once b holds a's first part, so the part went out while a's window was still stepping.
      const sa = source([b1!, b2!]);
      let handed = 0;
      const ahead: WindowSource = streamSlices ? {
        ...sa,
        next: async () => {
          if (handed++ === 1) await until(() => mb.inbox.window(0).parts.get('a')?.parts[0] !== undefined, 'a\'s first part at b', 5_000);
          return sa.next();
        },
      } : sa;
      const [oa, ob] = await Promise.all([runUntilDone(ma, ahead), runUntilDone(mb, source([b3!, b4!]))]);
      assert.deepEqual(oa.map((o) => o.steps.length), [2, 0]);
      assert.deepEqual(oa[0]!.members, ['a', 'b']);
      assert.deepEqual([oa[0]!.streamed, ob[0]!.streamed], streamSlices ? [2, 2] : [0, 0], 'parts the slices said were streamed');
      const st = await c.client(await c.system('reader')).stats('s1');
      assert.equal(st.version, 2, 'one window of 2 steps = 2 updates on the shard');
    }, delayedSteps([union([b1!, b3!]), union([b2!, b4!])]), uniqueIdsOf(union([b1!, b2!, b3!, b4!, b5!])));
  });
}

test('local updates (training.local_updates), a lone sync member, sync_steps 3: each step computes from the member\'s own updated copy, so with SGD the window equals 3 sequential single-process steps', async () => {
  const [b1, b2, b3] = batches;
  const local = localOptimizersFromConfig(config);
  assert.ok(local !== null && local.sparse !== null, 'hps ctr: dense and row optimizers');
  await sameAsReference(async (c) => {
    const g = group('sync', ['a'], 3);
    const sys = await c.system('a');
    const m = new GroupMember({ system: sys, group: g, member: 'a', runId: 'run-1', plan, stepper: c.stepper(sys, sessions[0]!, local), log: silentLogger(), shouldStop: () => false });
    await m.start();
    const out = await runUntilDone(m, source([b1!, b2!, b3!]));
    assert.equal(out[0]!.steps.length, 3);
  }, [b1!, b2!, b3!], uniqueIdsOf(union([b1!, b2!, b3!])));
});

test('window phases: `inputs` is the part of `steps` the window waited for its next batch after the step before was done', async () => {
  const c = await cluster('phases');
  try {
    const m = await member(c, group('sync', ['a'], 3), 'a', sessions[0]!);
    const queue = batches.slice(0, 3);
    let calls = 0;
    // The 2nd and 3rd batches come 300 ms after they are asked for: a step (no emulation) is far shorter, so the window waits ~600 ms.
    const slow: WindowSource = {
      next: async () => { if (calls++ > 0 && queue.length > 0) await new Promise((r) => setTimeout(r, 300)); return queue.shift() ?? null; },
      drained: async () => queue.length === 0,
    };
    const out = await m.runWindow(slow);
    assert.equal(out.steps.length, 3);
    assert.ok(out.phases.inputs >= 550, `waited ${out.phases.inputs} ms for inputs`);
    assert.ok(out.phases.inputs <= out.phases.steps, `inputs ${out.phases.inputs} ms within steps ${out.phases.steps} ms`);
    const fast = await m.runWindow(source(batches.slice(3, 6)));
    assert.equal(fast.steps.length, 3);
    assert.ok(fast.phases.inputs < out.phases.inputs - 400, `no wait when batches are at hand: ${fast.phases.inputs} ms`);
    await m.stop('stopped');
  } finally {
    await c.close();
  }
});

test('local updates, a lone adaptive member (threshold 2): the same path, its window equals sequential single-process SGD steps', async () => {
  const [b1, b2, b3] = batches;
  const local = localOptimizersFromConfig(config);
  await sameAsReference(async (c) => {
    const sys = await c.system('a');
    const m = new GroupMember({ system: sys, group: group('adaptive', ['a'], 2), member: 'a', runId: 'run-1', plan, stepper: c.stepper(sys, sessions[0]!, local), log: silentLogger(), shouldStop: () => false });
    await m.start();
    const out = await runUntilDone(m, source([b1!, b2!, b3!]));
    assert.ok(out.some((o) => o.steps.length > 1), 'a window of several steps');
  }, [b1!, b2!, b3!], uniqueIdsOf(union([b1!, b2!, b3!])));
});

test('group_lr_scaling linear, no warm-up: a sync window of 2 members is the union step at twice the learning rate (SGD: the union gradient doubled)', async () => {
  const [b1, b2] = batches;
  const u = union([b1!, b2!]);
  await sameAsReference(async (c) => {
    const g = group('sync', ['a', 'b'], 1);
    const groupLr = { scaling: 'linear' as const, warmupWindows: 0 };
    const [ma, mb] = [await member(c, g, 'a', sessions[0]!, { groupLr }), await member(c, g, 'b', sessions[1]!, { groupLr })];
    await Promise.all([runUntilDone(ma, source([b1!])), runUntilDone(mb, source([b2!]))]);
  }, (stepper) => stepScaled(stepper, u, 2), uniqueIdsOf(u));
});

for (const [n, windows] of [[1, 2], [2, 1]] as const) test(`training.group_update direct, sync group of 2, sync_steps ${n}, ${windows} window(s): each member pushes its own window (no gradient crosses between the members) and the next window starts only after both: with SGD, every step's gradient at its window's parameters, i.e. per window the union step at ${2 * n}× the rate`, async () => {
  const mine = { a: batches.slice(0, n * windows), b: batches.slice(n * windows, 2 * n * windows) };
  const perWindow = Array.from({ length: windows }, (_, k) => union([...mine.a.slice(k * n, (k + 1) * n), ...mine.b.slice(k * n, (k + 1) * n)]));
  // Pushes up to 4 updates stale at the full rate: the second member's push is 1 stale (computed at the window's start).
  const tolerant = parseConfig(configText(8).replace('max_staleness: 8', 'max_staleness: 8, staleness_tolerance: 4'), 'group-sync.yaml');
  const sliceParts: number[] = [];
  await sameAsReference(async (c) => {
    const g = group('sync', ['a', 'b'], n);
    // What reaches each member's mailbox as a slice: the round's bookkeeping, no gradient parts.
    const spy = await c.system('spy');
    for (const m of ['a', 'b']) {
      spy.transport.subscribe(actorOpSubject(actorAddress('grp', 'group', groupMemberId('g', m)), 'slice'), (msg) => {
        sliceParts.push((decode(msg.data) as { parts: unknown[] }).parts.length);
      });
    }
    // a's pushes take a while to land: b's next window must still start from parameters holding them.
    const ma = await member(c, g, 'a', sessions[0]!, { directPush: true }, (stepper) => {
      const push = stepper.push.bind(stepper);
      stepper.push = async (shard, body) => { await new Promise((r) => setTimeout(r, 150)); return push(shard, body); };
    });
    const mb = await member(c, g, 'b', sessions[1]!, { directPush: true });
    const [oa, ob] = await Promise.all([runUntilDone(ma, source(mine.a)), runUntilDone(mb, source(mine.b))]);
    const shape = [...Array.from({ length: windows }, () => n), 0];
    assert.deepEqual(oa.map((o) => o.steps.length), shape, 'the windows, then an idle one in which the group agrees it is done');
    assert.deepEqual(ob.map((o) => o.steps.length), shape);
    assert.ok([...oa, ...ob].every((o) => !o.droppedStale && o.lostShards.length === 0));
    // Every shard took one update per member step, where a reduced window is one per step of the group.
    const client = c.client(spy);
    for (const ex of planExchange(plan, new Int32Array(0), { dense: true, allShards: true })) {
      const r = await client.pull(ex.shard, pullRequest(plan, ex, layout.tables, null));
      assert.equal(r.version, 2 * n * windows, `${ex.shard}: one update per member step`);
    }
  }, async (stepper) => {
    for (const u of perWindow) await stepScaled(stepper, u, 2 * n);
  }, uniqueIdsOf(union([...mine.a, ...mine.b])), tolerant);
  assert.ok(sliceParts.length >= 2 * windows, `slices were exchanged (${sliceParts.length})`);
  assert.deepEqual([...new Set(sliceParts)], [0], 'no slice carried gradient parts');
});

test('training.stream_slices: an owner that lost the streamed parts refuses the slice that counts on them, and the sender sends the whole slice; the update is unchanged', async () => {
  const [b1, b2, b3, b4, b5] = batches;
  await sameAsReference(async (c) => {
    const g = group('sync', ['a', 'b'], 2);
    const [ma, mb] = [await member(c, g, 'a', sessions[0]!, { streamSlices: true }), await member(c, g, 'b', sessions[1]!, { streamSlices: true })];
    // b's mailbox takes a's parts but keeps none of them (as if it had lost them).
    let lost = 0;
    mb.inbox.addPart = () => { lost++; };
    const [oa] = await Promise.all([runUntilDone(ma, source([b1!, b2!])), runUntilDone(mb, source([b3!, b4!]))]);
    assert.equal(lost, 2, 'a streamed both of its steps to b');
    assert.deepEqual(oa.map((o) => o.steps.length), [2, 0]);
  }, delayedSteps([union([b1!, b3!]), union([b2!, b4!])]), uniqueIdsOf(union([b1!, b2!, b3!, b4!, b5!])));
});

test('sync group of 2, sync_steps 2, one member runs short: step 2 is the other member\'s batch alone', async () => {
  const [b1, b2, b3] = batches;
  await sameAsReference(async (c) => {
    const g = group('sync', ['a', 'b'], 2);
    const [ma, mb] = [await member(c, g, 'a', sessions[0]!), await member(c, g, 'b', sessions[1]!)];
    const [oa, ob] = await Promise.all([runUntilDone(ma, source([b1!, b2!])), runUntilDone(mb, source([b3!]))]);
    assert.deepEqual(oa.map((o) => o.steps.length), [2, 0]);
    assert.deepEqual(ob.map((o) => o.steps.length), [1, 0], 'b was ready with one step (no batch left)');
  }, delayedSteps([union([b1!, b3!]), b2!]), uniqueIdsOf(union([b1!, b2!, b3!])));
});

test('accumulation group of 2 (accumulation_steps 2): a round is one update on the union of all 4 batches', async () => {
  const [b1, b2, b3, b4, b5] = batches;
  const u = union([b1!, b2!, b3!, b4!]);
  await sameAsReference(async (c) => {
    const g = group('accumulation', ['a', 'b'], 2);
    const [ma, mb] = [await member(c, g, 'a', sessions[0]!), await member(c, g, 'b', sessions[1]!)];
    const [oa] = await Promise.all([runUntilDone(ma, source([b1!, b2!])), runUntilDone(mb, source([b3!, b4!]))]);
    assert.deepEqual(oa.map((o) => o.steps.length), [2, 0]);
    const st = await c.client(await c.system('reader')).stats('s1');
    assert.equal(st.version, 1, 'one round = one update');
  }, [u], uniqueIdsOf(union([u, b5!])));
});

test('a lone accumulation member (accumulation_steps 2) pushes once: equals the union of its 2 batches; async members equal sequential application', async () => {
  const [b1, b2, b3, b4] = batches;
  const acc = union([b1!, b2!]);
  await sameAsReference(async (c) => {
    const m = await member(c, group('accumulation', ['a'], 2), 'a', sessions[0]!);
    const out = await runUntilDone(m, source([b1!, b2!]));
    assert.deepEqual(out.map((o) => o.steps.length), [2, 0]);
  }, [acc], uniqueIdsOf(acc));

  // Two async members, one after the other: every step is its own update, exactly like asp.
  await sameAsReference(async (c) => {
    const g = group('async', ['a', 'b']);
    const [ma, mb] = [await member(c, g, 'a', sessions[0]!), await member(c, g, 'b', sessions[1]!)];
    for (const [m, b] of [[ma, b3!], [mb, b4!], [ma, b1!]] as const) {
      const o = await m.runWindow(source([b]));
      assert.equal(o.steps.length, 1);
      assert.equal(o.staleness, 0);
    }
  }, [b3!, b4!, b1!], uniqueIdsOf(union([b1!, b3!, b4!])));
});

for (const streamSlices of [false, true]) test(`adaptive group: members step freely, a window closes on the progress gap or the step cap, every batch is trained once and the group ends together${streamSlices ? ' (training.stream_slices)' : ''}`, async () => {
  const c = await cluster('adaptive');
  try {
    const g = group('adaptive', ['a', 'b'], 1);
    const [ma, mb] = [await member(c, g, 'a', sessions[0]!, { streamSlices }), await member(c, g, 'b', sessions[1]!, { streamSlices })];
    const [oa, ob] = await Promise.all([runUntilDone(ma, source(batches.slice(0, 5))), runUntilDone(mb, source(batches.slice(5, 6)))]);
    const steps = (os: WindowOutcome[]) => os.reduce((n, o) => n + o.steps.length, 0);
    assert.equal(steps(oa), 5);
    assert.equal(steps(ob), 1);
    assert.equal(oa.length, ob.length, 'both members went through the same windows');
    for (const o of oa) assert.ok(o.steps.length <= 2, 'never more than 2× the threshold in one window');
    assert.ok(oa[oa.length - 1]!.done && ob[ob.length - 1]!.done);
  } finally {
    await c.close();
  }
});

/** A sync group of one (a) whose window is overtaken by an async group's (b) update before it pushes. */
async function overtakenWindow(c: Awaited<ReturnType<typeof cluster>>) {
  const [b1, b2, b3] = batches;
  let otherPushed!: () => void;
  const pushed = new Promise<void>((r) => { otherPushed = r; });
  const slow = await member(c, group('sync', ['a'], 2), 'a', sessions[0]!);
  const fast = await member(c, { ...group('async', ['b']), name: 'h' }, 'b', sessions[1]!);
  // a computes its first step, then another group's update lands before a's window closes.
  let given = 0;
  const slowSource: WindowSource = {
    next: async () => {
      if (given++ === 0) return b1!;
      await pushed;
      return null;
    },
    drained: async () => false,
  };
  const window = slow.runWindow(slowSource);
  await new Promise((r) => setTimeout(r, 50));
  await fast.runWindow(source([b2!]));
  otherPushed();
  return { o: await window, next: () => slow.runWindow(source([b3!])) };
}

test('max_staleness { dense, sparse }: a group update past the dense bound has its rows applied and its dense part dropped; the window is not dropped', async () => {
  const c = await cluster('split', parseConfig(configText('{ dense: 0, sparse: 8 }'), 'split.yaml'));
  try {
    const { o } = await overtakenWindow(c);
    assert.equal(o.droppedStale, false, 'rows within their bound: applied, the batches count');
    assert.equal(o.partDropped, true, 'the window knows its update was applied without its dense part (the owner\'s report says which shards)');
    assert.ok(o.staleness >= 1);
    const reader = c.client(await c.system('reader'));
    const st = await Promise.all(['s1', 's2'].map((s) => reader.stats(s)));
    assert.equal(st.reduce((n, x) => n + x.stale_refused, 0), 0);
    assert.ok(st.reduce((n, x) => n + x.stale_dense_dropped, 0) >= 1, 'the dense part was dropped where it was one update behind');
    assert.deepEqual(st.map((x) => [x.max_staleness, x.sparse_max_staleness]), [[0, 8], [0, 8]]);
  } finally {
    await c.close();
  }
});

test('a group update staler than max_staleness is refused and dropped; the member goes on from fresh parameters', async () => {
  const strict = parseConfig(configText(0), 'strict.yaml');
  const c = await cluster('strict', strict);
  try {
    const { o, next: nextWindow } = await overtakenWindow(c);
    assert.equal(o.steps.length, 1);
    assert.equal(o.droppedStale, true, 'one update behind with max_staleness 0: refused');
    assert.equal(o.partDropped, false, 'refused whole, not applied in part');
    assert.ok(o.staleness >= 1);
    const next = await nextWindow();
    assert.equal(next.droppedStale, false, 'the next window pulled fresh parameters');
    const st = await c.client(await c.system('reader')).stats('s1');
    assert.ok(st.stale_refused >= 1);
  } finally {
    await c.close();
  }
});

for (const streamSlices of [false, true]) test(`the group machine drives membership: a member that dies is reported lost, dropped after the recovery timeout, and the round goes on among the others${streamSlices ? ' (training.stream_slices: the parts streamed under the old membership are not used; the slices are dealt anew)' : ''}`, async () => {
  const [b1, b2, b3, b4, b5] = batches;
  const timeouts = { lostAfterMs: 300, recoveryTimeoutMs: 600, stallNoteMs: 60_000, streamSlices };
  const statesOfA: GroupState[] = [];
  await sameAsReference(async (c) => {
    const g = group('sync', ['a', 'b', 'c'], 1);
    const ma = await member(c, g, 'a', sessions[0]!, { ...timeouts, onState: (st) => statesOfA.push(st) });
    const mb = await member(c, g, 'b', sessions[1]!, timeouts);
    const mc = await member(c, g, 'c', sessions[2]!, timeouts);
    const w0 = await Promise.all([ma.runWindow(source([b1!])), mb.runWindow(source([b2!])), mc.runWindow(source([b3!]))]);
    assert.deepEqual(w0.map((o) => o.members), [['a', 'b', 'c'], ['a', 'b', 'c'], ['a', 'b', 'c']]);
    await mc.stop('killed'); // c's process dies: its mailbox is gone, it sends nothing more
    const t0 = Date.now();
    const [oa, ob] = await Promise.all([runUntilDone(ma, source([b4!])), runUntilDone(mb, source([b5!]))]);
    assert.deepEqual(oa[0]!.members, ['a', 'b'], 'the round after the drop is a and b only');
    assert.deepEqual(ob[0]!.members, ['a', 'b']);
    if (streamSlices) {
      assert.equal(w0[0]!.streamed, 1, 'a streamed its step to its co-owner in the full group');
      assert.deepEqual([oa[0]!.streamed, ob[0]!.streamed], [0, 0], 'the window after the drop was dealt anew: its streamed parts were not used');
    }
    assert.ok(Date.now() - t0 >= 600, 'the group waited for the recovery timeout before going on');
    assert.deepEqual(ma.members, ['a', 'b']);
    for (const st of ['forming', 'running.sync.stepping', 'running.sync.reducing', 'degraded', 'resyncing'] as const) {
      assert.ok(statesOfA.includes(st), `a's replica went through ${st} (saw ${statesOfA.join(' → ')})`);
    }
  }, [union([b1!, b2!, b3!]), union([b4!, b5!])], uniqueIdsOf(union([b1!, b2!, b3!, b4!, b5!])));
});

/** A member's view of the health verdicts, set by the test. */
function verdicts(): HealthView & { set(node: string, state: HealthState): void } {
  const states = new Map<string, HealthState>();
  const listeners = new Set<(node: string, state: HealthState) => void>();
  return {
    stateOf: (node) => states.get(node) ?? null,
    onChange: (f) => { listeners.add(f); return () => { listeners.delete(f); }; },
    set(node, state) { states.set(node, state); for (const f of listeners) f(node, state); },
  };
}

/**
 * A sync group of `names` (every `syncSteps` steps), each member with its own view of the verdicts and no timeout that
 * would drop a member in these tests; window 0 trained in sync on `first[i]` for member i.
 */
async function syncedWithVerdicts<const N extends readonly string[]>(c: Cluster, names: N, first: CtrBatch[][], syncSteps = 1, more: Partial<GroupMemberOptions> = {}) {
  const g = group('sync', [...names], syncSteps);
  const timeouts = { lostAfterMs: 60_000, recoveryTimeoutMs: 60_000, stallNoteMs: 60_000, ...more };
  const views = names.map(() => verdicts());
  const members = await Promise.all(names.map((n, i) => member(c, g, n, sessions[i]!, { ...timeouts, health: views[i]! })));
  const w0 = await Promise.all(members.map((m, i) => m.runWindow(source(first[i]!))));
  assert.deepEqual(w0.map((o) => o.members), names.map(() => [...names]), 'window 0 in sync');
  return { g, timeouts, members: members as { [K in keyof N]: GroupMember }, views: views as { [K in keyof N]: ReturnType<typeof verdicts> } };
}

test('a dead verdict degrades the group to async: windows are pushed alone, and a member that began its window in sync pushes alone too', { timeout: 60_000 }, async () => {
  const [b1, b2, b3, b4, b5, b6, b7] = batches;
  await sameAsReference(async (c) => {
    const { members: [ma, mb, mc], views: [ha, hb] } = await syncedWithVerdicts(c, ['a', 'b', 'c'], [[b1!], [b2!], [b3!]]);
    await mc.stop('killed');
    // The verdict reaches b first: b's next window is its own, and b tells a so.
    hb.set('c', 'dead');
    assert.equal(mb.state, 'degraded');
    assert.ok(mb.alone);
    const ob = await mb.runWindow(source([b5!]));
    assert.deepEqual([ob.members, ob.steps.length], [['b'], 1]);
    // a has no verdict yet: it begins window 1 in sync, sends its slices (c's is given up with the verdict), then
    // finds b pushed the window alone, so no round of it can start: it pushes its own gradient.
    assert.equal(ma.alone, false);
    const oa = ma.runWindow(source([b4!]));
    await new Promise((r) => setTimeout(r, 300));
    ha.set('c', 'dead');
    const o1 = await oa;
    assert.deepEqual([o1.members, o1.steps.length, o1.lostShards], [['a'], 1, []]);
    assert.equal(ma.state, 'degraded');
    // From now on a's windows are its own.
    assert.ok(ma.alone);
    const o2 = await ma.runWindow(source([b6!]));
    assert.deepEqual(o2.members, ['a']);
    assert.deepEqual(ma.members, ['a', 'b', 'c'], 'the dead member is not dropped by the replica: the driver re-forms the group');
    // b pauses for a re-form (its mailbox is gone): a's next window alone does not wait for b to take its notice.
    await mb.stop('regrouped');
    const t0 = Date.now();
    const o3 = await ma.runWindow(source([b7!]));
    assert.deepEqual(o3.members, ['a']);
    assert.ok(Date.now() - t0 < 5_000, `a window alone waited ${Date.now() - t0} ms for a peer that left`);
    await ma.stop();
  }, [union([b1!, b2!, b3!]), b5!, b4!, b6!, b7!], uniqueIdsOf(union([b1!, b2!, b3!, b4!, b5!, b6!, b7!])));
});

test('the group\'s last round done, a member that leaves (its process ends, the health actor says dead) is not lost: nobody degrades or warns', { timeout: 60_000 }, async () => {
  const [b1, b2] = batches;
  const c = await cluster('leave-at-end');
  try {
    const g = group('sync', ['a', 'b'], 1);
    const [ha, hb] = [verdicts(), verdicts()];
    const warnings: string[] = [];
    const log = silentLogger();
    log.warn = ((obj: unknown, msg?: string) => { warnings.push(typeof obj === 'string' ? obj : msg ?? ''); }) as typeof log.warn;
    const ma = await member(c, g, 'a', sessions[0]!, { health: ha, log });
    const mb = await member(c, g, 'b', sessions[1]!, { health: hb });
    const [oa, ob] = await Promise.all([runUntilDone(ma, source([b1!])), runUntilDone(mb, source([b2!]))]);
    assert.ok(oa.at(-1)!.done && ob.at(-1)!.done, 'the group agreed it was done');
    await mb.stop('done');
    ha.set('b', 'dead');
    assert.equal(ma.state === 'degraded', false, `a's replica is ${ma.state}`);
    assert.deepEqual(warnings, [], 'a warns about nobody');
    await ma.stop();
  } finally {
    await c.close();
  }
});

test('forming: a member that never starts is dropped after the forming timeout; the others train without it', async () => {
  const [b1, b2] = batches;
  await sameAsReference(async (c) => {
    const g = group('sync', ['a', 'b'], 1);
    const ma = await member(c, g, 'a', sessions[0]!, { formingTimeoutMs: 300, lostAfterMs: 60_000, stallNoteMs: 60_000 });
    assert.equal(ma.state, 'forming');
    const out = await runUntilDone(ma, source([b1!, b2!]));
    assert.deepEqual(out.map((o) => o.members), [['a'], ['a'], ['a']]);
    assert.deepEqual(ma.members, ['a']);
  }, [b1!, b2!], uniqueIdsOf(union([b1!, b2!])));
});

for (const streamSlices of [false, true]) test(`discardOnPause: a pause that arrives while the members step drops the window's steps (nothing reaches a shard, the batches are reported discarded); after the pause every batch is trained${streamSlices ? ' (training.stream_slices: a part already streamed is not used either)' : ''}`, async () => {
  const c = await cluster('discard');
  try {
    const g = group('sync', ['a', 'b'], 4);
    let pausing = false;
    const [b1, b2, b3, b4] = batches;
    const ma = await member(c, g, 'a', sessions[0]!, { closeEarly: () => pausing, discardOnPause: true, streamSlices });
    const mb = await member(c, g, 'b', sessions[1]!, { closeEarly: () => pausing, discardOnPause: true, streamSlices });
    const sa = source([b1!, b2!, b3!]);
    // The pause arrives once a has stepped its first batch.
    const pa: WindowSource = { ...sa, stepped: () => { pausing = true; } };
    const taken: CtrBatch[] = [];
    // b has one batch; it asks for its next only once the pause is pending, so neither member has sent its slices by then.
    const sb: WindowSource = {
      next: async () => {
        if (taken.length === 0) { taken.push(b4!); return b4!; }
        while (!pausing) await new Promise((r) => setTimeout(r, 5));
        return null;
      },
      drained: async () => taken.length > 0,
    };
    const [wa, wb] = await Promise.all([ma.runWindow(pa), mb.runWindow(sb)]);
    assert.deepEqual([wa.steps.length, wb.steps.length], [0, 0], 'no step kept');
    assert.deepEqual([wa.streamed, wb.streamed], [0, 0], 'no streamed part used');
    assert.ok(wa.discarded >= 1, `a dropped the step it took (${wa.discarded})`);
    assert.equal(wa.done || wb.done, false, 'the job is not done: the dropped batches go back');
    const reader = c.client(await c.system('reader'));
    for (const shard of ['s1', 's2']) assert.equal((await reader.stats(shard)).version, 0, `${shard}: nothing pushed for the dropped window`);
    // After the pause the batches (handed in again) are trained as usual.
    pausing = false;
    const [ra] = await Promise.all([runUntilDone(ma, source([b1!, b2!, b3!])), runUntilDone(mb, source([b4!]))]);
    assert.equal(ra.reduce((n, o) => n + o.steps.length, 0), 3);
    assert.ok((await reader.stats('s1')).version > 0, 'trained after the pause');
  } finally {
    await c.close();
  }
});

test('discardOnPause with closeEarlyChanged: a member waiting for its next batch does not poll closeEarly; it drops the window when told that it may have changed', async () => {
  const c = await cluster('discard-signalled');
  try {
    const g = group('sync', ['a'], 4);
    let pausing = false;
    let wake: (() => void) | null = null;
    let waits = 0;
    // The signal only this test gives (its `ms` fallback ignored): were the member polling, it would see the pause without it.
    const closeEarlyChanged = () => new Promise<void>((r) => { waits++; wake = r; });
    const ma = await member(c, g, 'a', sessions[0]!, { closeEarly: () => pausing, discardOnPause: true, closeEarlyChanged });
    const [b1] = batches;
    let asked = 0;
    // The first batch, then a fetch that never completes (a batch still on its way when the pause comes).
    const src: WindowSource = { next: () => (asked++ === 0 ? Promise.resolve(b1!) : new Promise<never>(() => undefined)), drained: async () => false };
    let finished: WindowOutcome | null = null;
    const running = ma.runWindow(src).then((o) => { finished = o; return o; });
    await until(() => asked >= 2 && waits > 0, 'the member waiting for its second batch', 10_000);
    pausing = true;
    await new Promise((r) => setTimeout(r, 150));
    assert.equal(finished, null, 'the pause is not seen before the member is told');
    (wake as (() => void) | null)?.();
    const out = await running;
    assert.equal(out.steps.length, 0, 'the step taken is dropped');
    assert.ok(out.discarded >= 1, `a dropped the batch it took (${out.discarded})`);
    const reader = c.client(await c.system('reader'));
    for (const shard of ['s1', 's2']) assert.equal((await reader.stats(shard)).version, 0, `${shard}: nothing pushed for the dropped window`);
  } finally {
    await c.close();
  }
});

test('closeEarly (a pause pending): the window ends after the step in progress, not after sync_steps; the batches left are trained in the windows after', async () => {
  const c = await cluster('close-early');
  try {
    const g = group('sync', ['a', 'b'], 4);
    let pausing = true;
    const [b1, b2, b3, b4] = batches;
    const ma = await member(c, g, 'a', sessions[0]!, { closeEarly: () => pausing });
    const mb = await member(c, g, 'b', sessions[1]!, { closeEarly: () => pausing });
    const sa = source([b1!, b2!, b3!]);
    const sb = source([b4!]);
    const [wa, wb] = await Promise.all([ma.runWindow(sa), mb.runWindow(sb)]);
    assert.deepEqual([wa.steps.length, wb.steps.length], [1, 1], 'one step each, though a holds 3 batches and sync_steps is 4');
    pausing = false;
    const [ra, rb] = await Promise.all([runUntilDone(ma, sa), runUntilDone(mb, sb)]);
    assert.deepEqual(ra.map((o) => o.steps.length), [2, 0], 'the 2 batches left, in one window once the pause is over');
    assert.deepEqual(rb.map((o) => o.steps.length), [0, 0]);
  } finally {
    await c.close();
  }
});

test('a dead verdict that its mates see come and go, and the member itself never sees: it is not left waiting for a round they will not start', { timeout: 60_000 }, async () => {
  const [b1, b2, b3, b4, b5, b6, b7, b8, b9] = [...batches, ...batches];
  const c = await cluster('verdict-flap');
  try {
    const { members: [ma, mb, mc], views: [, hb, hc] } = await syncedWithVerdicts(c, ['a', 'b', 'c'], [[b1!], [b2!], [b3!]]);
    // b and c see a dead for a moment (a heartbeat late past the dead timeout), then alive; a ignores verdicts about itself.
    for (const h of [hb, hc]) { h.set('a', 'dead'); h.set('a', 'alive'); }
    assert.equal(mb.state, 'degraded');
    assert.equal(ma.state, 'running.sync.stepping');
    const deadline = (what: string) => new Promise<never>((_r, reject) => { setTimeout(() => reject(new Error(`${what} did not end in 15 s`)), 15_000).unref(); });
    // b and c push their windows alone until the driver re-forms the group; a must not wait for rounds they will not start,
    // whether they are a window ahead of it (their notices wait in its inbox) or behind (it waits for their notices).
    const [o1b, o1c] = await Promise.all([mb.runWindow(source([b5!])), mc.runWindow(source([b6!]))]);
    const o1a = await Promise.race([ma.runWindow(source([b4!])), deadline('a\'s window behind its mates')]);
    const o2a = ma.runWindow(source([b7!]));
    await new Promise((r) => setTimeout(r, 300));
    const o2 = await Promise.race([Promise.all([o2a, mb.runWindow(source([b8!])), mc.runWindow(source([b9!]))]), deadline('a\'s window ahead of its mates')]);
    assert.deepEqual([o1a, o1b, o1c, ...o2].map((o) => [o.window, o.members]), [[1, ['a']], [1, ['b']], [1, ['c']], [2, ['a']], [2, ['b']], [2, ['c']]]);
    await Promise.all([ma.stop(), mb.stop(), mc.stop()]);
  } finally {
    await c.close();
  }
});

test('a member whose mate finished a window\'s round without it (a verdict it never heard of) pushes that window alone on the mate\'s notice: nothing is applied twice', { timeout: 60_000 }, async () => {
  const [b1, b2, b3, b4, b5, b6] = batches;
  await sameAsReference(async (c) => {
    const { members: [ma, mb], views: [, hb] } = await syncedWithVerdicts(c, ['a', 'b'], [[b1!], [b2!]]);
    // b begins window 1, sends a its slice and waits for a's; a dead verdict for a reaches b (not a): b finishes the
    // round without it, alone, and the verdict turns alive again.
    const o1b = mb.runWindow(source([b3!]));
    await new Promise((r) => setTimeout(r, 300));
    hb.set('a', 'dead');
    hb.set('a', 'alive');
    assert.deepEqual((await o1b).members, ['b']);
    // a begins window 1 in sync with b's slice in its mailbox: reducing it would apply b's gradient a second time on
    // a's shards. b told a it took no part: a pushes its own gradient alone (the reference applies b3, then b4).
    const deadline = new Promise<never>((_r, reject) => { setTimeout(() => reject(new Error('a\'s window 1 did not end in 15 s')), 15_000).unref(); });
    const o1a = await Promise.race([ma.runWindow(source([b4!])), deadline]);
    assert.deepEqual([o1a.window, o1a.members], [1, ['a']]);
    const o2b = await mb.runWindow(source([b5!]));
    assert.deepEqual([o2b.window, o2b.members], [2, ['b']]);
    const o2a = await Promise.race([ma.runWindow(source([b6!])), deadline]);
    assert.deepEqual([o2a.window, o2a.members], [2, ['a']]);
    await Promise.all([ma.stop(), mb.stop()]);
  }, [union([b1!, b2!]), b3!, b4!, b5!, b6!], uniqueIdsOf(union([b1!, b2!, b3!, b4!, b5!, b6!])));
});

test('GroupInbox: a member that pushes a window or a later one alone takes no part in its round; a finished window\'s notices are forgotten', () => {
  const inbox = new GroupInbox();
  inbox.addOwn('b', 3);
  assert.deepEqual([inbox.aloneFrom('b', 2), inbox.aloneFrom('b', 3), inbox.aloneFrom('b', 4), inbox.aloneFrom('c', 2)], [true, true, false, false]);
  inbox.finish(3);
  assert.equal(inbox.aloneFrom('b', 0), false);
  inbox.addOwn('b', 2);
  assert.equal(inbox.aloneFrom('b', 0), false, 'a notice for a finished window is dropped');
});

test('streamed parts to a mate that ended the window without this member and re-formed since stop on its notice: the window is pushed alone, not retried forever', { timeout: 60_000 }, async () => {
  const [b1, b2, b3, b4, b5] = batches;
  const c = await cluster('verdict-flap-streamed');
  try {
    const { g, members: [ma, mb], views: [, hb], timeouts } = await syncedWithVerdicts(c, ['a', 'b'], [[b1!, b2!], [b3!]], 2, { streamSlices: true });
    // b cuts a on a verdict that comes and goes, pushes window 1 alone (telling a), and re-forms for the driver's
    // regroup: its new mailbox refuses the old membership's messages ("re-forming; send again").
    hb.set('a', 'dead');
    hb.set('a', 'alive');
    assert.deepEqual((await mb.runWindow(source([b4!]))).members, ['b']);
    await mb.stop('regrouped');
    const mb2 = await member(c, g, 'b', sessions[1]!, { ...timeouts, health: hb, runId: 'run-1/g1' });
    // a's window 1 streams its first step to b as a part: b's new mailbox never takes it, and b's notice says it need not.
    const deadline = new Promise<never>((_r, reject) => { setTimeout(() => reject(new Error('a\'s window 1 did not end in 15 s')), 15_000).unref(); });
    const o1a = await Promise.race([ma.runWindow(source([b5!, b2!])), deadline]);
    assert.deepEqual([o1a.window, o1a.members], [1, ['a']]);
    await Promise.all([ma.stop(), mb2.stop()]);
  } finally {
    await c.close();
  }
});
