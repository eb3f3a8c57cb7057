/**
 * communication.compression fp16: gradients leave a worker as scaled halves
 * (pushes and group slices) and arrive as float32 at every receiver.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decodeEnvelope, encodeEnvelope, silentLogger, systemClock, ValidationError } from '../../runtime/mod.ts';
import { inProcessBus } from '../support/in-process.ts';
import { parseConfig } from '../../topology/mod.ts';
import { StepSession, compressGradient, decompressGradient, streamOptions, FP16_MIN_ELEMENTS, type Fp16Gradient } from '../../native-bridge/mod.ts';
import { shardPlanFromConfig, sparseLayoutFromConfig } from '../../actors/node/config-bridge.ts';
import { modelAndData, startServerNode, workerCompressionOptions } from '../../actors/node/nodes.ts';
import { memoryPlanStore } from '../../actors/store/plan-store.ts';
import { ShardClient } from '../../actors/worker/shard-client.ts';
import { WorkerStepper } from '../../actors/worker/step.ts';
import { pushBytes } from '../../actors/worker/emulation.ts';
import { compressPush, shardMessages, type PushRequest } from '../../actors/shard/shard.messages.ts';
import { groupSyncMessages } from '../../actors/group/group-sync.messages.ts';

/** Deterministic gradient-like values over many binades (|g| from ~1e-9 to ~1e3). */
function gradientLike(n: number, seed = 1): Float32Array<ArrayBuffer> {
  const g = new Float32Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    g[i] = ((s / 4294967296) - 0.5) * 2 ** ((s % 40) - 30);
  }
  return g;
}

/** A small ctr job of one worker (w1, on a 1000 Mbit/s emulated link) over `servers`. */
function smallCtrJob(o: { mode: 'asp' | 'bsp'; servers: string; communication: string }): string {
  return `cluster:
  worker_groups: [{ name: g, nodes: [w1] }]
  server_nodes: [${o.servers}]
nodes: { w1: { emulate: { speed: 1, bandwidth_mbps: 1000 } } }
model: { type: ctr, ctr: { embedding_dim: 8, hidden: [32], pooling: mean, wide: true, hash_buckets: 5000 } }
data: { source: ctr-synthetic, batch_size: 64, samples: 640, test_samples: 64, slots: 4, dense_features: 3, vocab_size: 2000 }
optimizer: { type: adam, learning_rate: 0.01, sparse: { type: adagrad, learning_rate: 0.05 } }
training: { mode: ${o.mode}, random_seed: 7 }
communication: { ${o.communication} }
`;
}

const isCompressed = (x: Float32Array | Fp16Gradient): x is Fp16Gradient => !(x instanceof Float32Array);

test('compressGradient: half the bytes; every element within 2^-11 of the largest magnitude, large or tiny tensors alike', () => {
  for (const scale of [1, 1e6, 1e-7, 3e30]) {
    const src = gradientLike(4096).map((x) => x * scale) as Float32Array<ArrayBuffer>;
    const c = compressGradient(src);
    assert.ok(isCompressed(c), `scale ${scale}: compressed`);
    assert.equal(c.f16.byteLength * 2, src.byteLength);
    const back = decompressGradient(c);
    let max = 0;
    for (const x of src) max = Math.max(max, Math.abs(x));
    for (let i = 0; i < src.length; i++) {
      assert.ok(Number.isFinite(back[i]!), `scale ${scale}: element ${i} stays finite (${back[i]})`);
      assert.ok(Math.abs(back[i]! - src[i]!) <= max * 2 ** -11, `scale ${scale}: element ${i}: ${src[i]} came back as ${back[i]}`);
    }
    // The largest element keeps fp16's relative precision (the scale puts it in [2^14, 2^15)).
    const at = src.findIndex((x) => Math.abs(x) === max);
    assert.ok(Math.abs(back[at]! - src[at]!) <= max * 2 ** -11, `scale ${scale}: the largest element, relative error`);
  }
});

test('compressGradient leaves short, all-zero and non-finite tensors float32 (the receiver\'s NaN check still names the element)', () => {
  const short = gradientLike(FP16_MIN_ELEMENTS - 1);
  assert.equal(compressGradient(short), short);
  const zeros = new Float32Array(1000);
  assert.equal(compressGradient(zeros), zeros);
  for (const bad of [Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY]) {
    const g = gradientLike(1000);
    g[500] = bad;
    assert.equal(compressGradient(g), g, `${bad} is sent as it is`);
  }
  assert.ok(isCompressed(compressGradient(gradientLike(FP16_MIN_ELEMENTS))));
});

test('a compressed push crosses the envelope codec and is float32 for the shard; malformed compressed tensors are rejected naming the field', () => {
  const grad = gradientLike(1000, 3);
  const grads = gradientLike(8 * 16, 4);
  const req: PushRequest = {
    plan_version: 1, round: null, expected: null, weight: 32, base_version: 0,
    dense: [{ block: 0, grad }], sparse: [{ table: 'emb', ids: Int32Array.from({ length: 8 }, (_, i) => i * 7), grads }],
    later_steps: [{ dense: [{ block: 0, grad: gradientLike(1000, 5) }], sparse: [] }], lr_mult: 1, batches: ['b1'],
  };
  const wire = compressPush(req);
  assert.ok(isCompressed(wire.dense[0]!.grad as Float32Array | Fp16Gradient));
  assert.ok(isCompressed(wire.later_steps![0]!.dense[0]!.grad as Float32Array | Fp16Gradient));
  const bytes = encodeEnvelope({ type: 'push', from: 'w1', seq: 1 }, wire as unknown as Record<string, unknown>);
  const plain = encodeEnvelope({ type: 'push', from: 'w1', seq: 1 }, req as unknown as Record<string, unknown>);
  assert.ok(bytes.byteLength < 0.6 * plain.byteLength, `${bytes.byteLength} bytes compressed against ${plain.byteLength}`);
  const got = decodeEnvelope(bytes, { push: shardMessages.push }) as unknown as PushRequest;
  const d = got.dense[0]!.grad;
  assert.ok(d instanceof Float32Array && d.length === 1000);
  assert.deepEqual([...d], [...decompressGradient(wire.dense[0]!.grad as Fp16Gradient)], 'the shard sees exactly the decoded halves');
  assert.ok(got.sparse[0]!.grads instanceof Float32Array && got.later_steps[0]!.dense[0]!.grad instanceof Float32Array);
  // Uncompressed pushes are untouched.
  assert.deepEqual([...(decodeEnvelope(plain, { push: shardMessages.push }) as unknown as PushRequest).dense[0]!.grad], [...grad]);

  const bad = (grad: unknown) => encodeEnvelope({ type: 'push', from: 'w1', seq: 2 }, { ...req, dense: [{ block: 0, grad }], later_steps: [] } as unknown as Record<string, unknown>);
  const compressedForm = /must be a Float32Array, or a compressed gradient \{ f16: Uint16Array, exp: an integer with \|exp\| < 200 \}/;
  for (const [what, g, says] of [
    ['a fractional exp', { f16: new Uint16Array(100), exp: 1.5 }, compressedForm],
    ['an exp out of range', { f16: new Uint16Array(100), exp: 400 }, /\.exp: Too big/],
    ['halves that are not a Uint16Array', { f16: new Float32Array(100), exp: 0 }, compressedForm],
    ['an unknown key', { f16: new Uint16Array(100), exp: 0, scale: 2 }, /Unrecognized key: "scale"/],
    ['a string', 'x', compressedForm],
  ] as const) {
    assert.throws(() => decodeEnvelope(bad(g), { push: shardMessages.push }), (e: unknown) => {
      const m = (e as Error).message;
      return e instanceof ValidationError && /dense\[0\]\.grad/.test(m) && says.test(m);
    }, what);
  }
});

test('a compressed group slice arrives as float32', () => {
  const grad = gradientLike(512, 9);
  const c = compressGradient(grad);
  const slice = {
    run_id: 'r', window: 0, member: 'a', weight: 32, steps: 1, total_steps: 1, owners: ['a', 'b'], idle: false, drained: false, groups_version: 0,
    base_versions: [{ shard: 's1', version: 0 }], parts: [{ weight: 32, dense: [{ block: 0, grad: c }], sparse: [] }], batches: ['b1'],
  };
  const got = decodeEnvelope(encodeEnvelope({ type: 'slice', from: 'a', seq: 1 }, slice), { slice: groupSyncMessages.slice }) as unknown as typeof slice;
  const g = got.parts[0]!.dense[0]!.grad as unknown as Float32Array;
  assert.ok(g instanceof Float32Array);
  assert.deepEqual([...g], [...decompressGradient(c as Fp16Gradient)]);
});

test('pushBytes counts every step of a window\'s push (later_steps) and compressed gradients at 2 bytes an element', () => {
  const step = { dense: [{ block: 0, grad: gradientLike(1000) }], sparse: [{ table: 'emb', ids: new Int32Array(10), grads: gradientLike(160) }] };
  const one = 1000 * 4 + 10 * 4 + 160 * 4;
  const req: PushRequest = { plan_version: 1, round: null, expected: null, weight: 1, base_version: 0, ...step, later_steps: [step, step], lr_mult: 1, batches: [] };
  assert.equal(pushBytes(req), 3 * one);
  assert.equal(pushBytes(compressPush(req)), 3 * (1000 * 2 + 10 * 4 + 160 * 2));
});

test('an asp worker with compression fp16 trains over real shards like one without, within fp16\'s rounding, and its emulated link carries about half the bytes', async () => {
  const run = async (compression: string, compressPulls = false) => {
    const config = parseConfig(smallCtrJob({ mode: 'asp', servers: 's1, s2', communication: `compression: ${compression}, compress_pulls: ${compressPulls}` }), 'job.yaml');
    const md = modelAndData(config);
    const plan = shardPlanFromConfig(config, md.model, 4096 + 16 * 1024);
    const bus = inProcessBus('fp16test');
    const planStore = memoryPlanStore(plan);
    for (const s of ['s1', 's2']) await startServerNode({ config, server: s, system: await bus.system(s), planStore, log: silentLogger(), md });
    const session = await StepSession.create(md.model, { graph: 'step', intraOpNumThreads: 1 });
    const stepper = new WorkerStepper({
      client: new ShardClient(await bus.system('w1'), { requestTimeoutMs: 5_000, log: silentLogger(), shouldStop: () => false, plans: plan }),
      plan, model: md.model, layout: sparseLayoutFromConfig(config, md.model), session, clock: systemClock, log: silentLogger(),
      emulateSpeed: null, bandwidthMbps: 1000, ...workerCompressionOptions(config),
    });
    const losses: number[] = [];
    const pullsSeen: (string | null)[] = [];
    const pull = stepper.pull.bind(stepper);
    stepper.pull = async (shard, req, expected) => { const r = await pull(shard, req, expected); pullsSeen.push(req.compression); return r; };
    try {
      for (const batch of md.source.batchesSync(streamOptions('train', 64, { epoch: 0 }))) {
        losses.push((await stepper.run(batch, null)).loss!);
      }
      // Time the link carried bytes (bytes·8/bandwidth, exact): the run is far shorter than
      // the intervals' keep window, so none are forgotten. Not totalDelayMs, which adds queueing
      // behind a prefetch's pull and so depends on timing.
      return { losses, linkMs: stepper.link.busy.between(Number.NEGATIVE_INFINITY, Number.POSITIVE_INFINITY), pullsSeen };
    } finally {
      await session.dispose();
      await bus.close();
    }
  };
  const plain = await run('none');
  const fp16 = await run('fp16');
  assert.equal(plain.losses.length, 10);
  assert.equal(fp16.losses.length, 10);
  assert.equal(fp16.losses[0], plain.losses[0], 'the first step computes from the same initial parameters');
  for (let i = 1; i < 10; i++) assert.ok(Math.abs(fp16.losses[i]! - plain.losses[i]!) < 2e-3, `step ${i + 1}: loss ${fp16.losses[i]} with fp16, ${plain.losses[i]} without`);
  assert.ok(fp16.losses.some((l, i) => l !== plain.losses[i]), 'the pushes were compressed (fp16 rounding changed the trajectory)');
  // Pulls (parameters) stay float32; only the push half of the link's bytes shrinks.
  assert.ok(fp16.linkMs < 0.85 * plain.linkMs, `link time ${fp16.linkMs.toFixed(2)} ms with fp16 against ${plain.linkMs.toFixed(2)} ms without`);
  assert.ok(fp16.pullsSeen.length > 0 && fp16.pullsSeen.every((c) => c === null), 'without compress_pulls every pull asks for float32');

  // communication.compress_pulls: the pulls come as halves too, so the link carries about half of everything.
  const both = await run('fp16', true);
  assert.equal(both.losses.length, 10);
  assert.ok(both.pullsSeen.length > 0 && both.pullsSeen.every((c) => c === 'fp16'), 'every pull asked for fp16');
  assert.ok(Math.abs(both.losses[0]! - plain.losses[0]!) < 2e-3, `the first step from parameters rounded to halves: loss ${both.losses[0]} against ${plain.losses[0]}`);
  assert.notEqual(both.losses[0], plain.losses[0], 'the first step computed from halves (the rounding shows)');
  for (let i = 1; i < 10; i++) assert.ok(Math.abs(both.losses[i]! - plain.losses[i]!) < 5e-3, `step ${i + 1}: loss ${both.losses[i]} with fp16 pulls, ${plain.losses[i]} without`);
  assert.ok(both.linkMs < 0.6 * plain.linkMs, `link time ${both.linkMs.toFixed(2)} ms with fp16 pulls and pushes against ${plain.linkMs.toFixed(2)} ms without`);
  assert.ok(both.linkMs < 0.8 * fp16.linkMs, `fp16 pulls save on top of fp16 pushes: ${both.linkMs.toFixed(2)} ms against ${fp16.linkMs.toFixed(2)} ms`);
  // With compression none the setting has nothing to act on (listed as not active at start).
  const none = await run('none', true);
  assert.ok(none.pullsSeen.every((c) => c === null));
});

test('a pull with compression fp16: the shard answers with halves (deferred bsp pulls too), the worker\'s client hands back float32 within fp16 rounding and counts the bytes as sent', async () => {
  const config = parseConfig(smallCtrJob({ mode: 'bsp', servers: 's1', communication: 'compression: none' }), 'job.yaml');
  const md = modelAndData(config);
  const plan = shardPlanFromConfig(config, md.model, 1024 * 1024);
  const bus = inProcessBus('fp16pull');
  try {
    await startServerNode({ config, server: 's1', system: await bus.system('s1'), planStore: memoryPlanStore(plan), log: silentLogger(), md });
    const client = new ShardClient(await bus.system('w1'), { requestTimeoutMs: 5_000, log: silentLogger(), shouldStop: () => false, plans: plan });
    const ids = Int32Array.from({ length: 300 }, (_, i) => i * 7);
    const req = (compression: 'fp16' | null, minRound: number | null = null) => ({
      plan_version: plan.version, dense: Int32Array.from(plan.dense, (b) => b.id), sparse: [{ table: 'emb', ids }], min_round: minRound, compression,
    });
    const plain = await client.pull('s1', req(null));
    const half = await client.pull('s1', req('fp16'));
    assert.equal(plain.wireBytes, undefined);
    const f32Bytes = [...plain.dense, ...plain.sparse].reduce((n, t) => n + t.byteLength, 0);
    const big = [...plain.dense, ...plain.sparse].filter((t) => t.length >= FP16_MIN_ELEMENTS);
    const small = [...plain.dense, ...plain.sparse].filter((t) => t.length < FP16_MIN_ELEMENTS);
    assert.ok(big.length > 0 && small.length > 0, 'the reply has tensors of both kinds');
    const expected = big.reduce((n, t) => n + t.byteLength / 2, 0) + small.reduce((n, t) => n + t.byteLength, 0);
    assert.equal(half.wireBytes, expected, 'halves for the tensors long enough, float32 for the short ones');
    assert.ok(half.wireBytes! < 0.6 * f32Bytes);
    for (const [k, t] of [...half.dense, ...half.sparse].entries()) {
      const ref = [...plain.dense, ...plain.sparse][k]!;
      assert.ok(t instanceof Float32Array && t.length === ref.length);
      let max = 0; let err = 0;
      for (let i = 0; i < t.length; i++) { max = Math.max(max, Math.abs(ref[i]!)); err = Math.max(err, Math.abs(t[i]! - ref[i]!)); }
      assert.ok(err <= max * 2 ** -10, `tensor ${k}: error ${err} against largest ${max}`);
    }
    // A pull that waits for bsp round 1 is answered once round 0 is applied, compressed as it asked.
    const waiting = client.pull('s1', req('fp16', 1), 1);
    await new Promise((r) => setTimeout(r, 50));
    await client.push('s1', { plan_version: plan.version, round: 0, expected: 1, weight: 1, base_version: 0, dense: [], sparse: [], later_steps: [], lr_mult: 1, batches: [] });
    const deferred = await waiting;
    assert.equal(deferred.round, 1);
    assert.equal(deferred.wireBytes, expected);
  } finally {
    await bus.close();
  }
});
