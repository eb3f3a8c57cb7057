/**
 * communication.compression adaptive: the policy (topology/compression.ts)
 * switches a worker's gradients to fp16 while its link is busier than
 * compression_threshold, with hysteresis; a worker on a slow emulated link
 * does so within a few steps, one on a fast link keeps float32.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, silentLogger, systemClock, type Logger } from '../../runtime/mod.ts';
import { inProcessBus } from '../support/in-process.ts';
import {
  ADAPTIVE_COMPRESSION_HOLD_MS, INITIAL_ADAPTIVE_COMPRESSION_STATE, adaptiveCompression, parseConfig, type AdaptiveCompressionState,
} from '../../topology/mod.ts';
import { StepSession, streamOptions } from '../../native-bridge/mod.ts';
import { shardPlanFromConfig, sparseLayoutFromConfig } from '../../actors/node/config-bridge.ts';
import { gradientCompressionFromConfig, modelAndData, startServerNode } from '../../actors/node/nodes.ts';
import { memoryPlanStore } from '../../actors/store/plan-store.ts';
import { ShardClient } from '../../actors/worker/shard-client.ts';
import { WorkerStepper } from '../../actors/worker/step.ts';

// ---------------------------------------------------------------- the policy

/** Runs the policy over utilisations one second apart from `state`; the choice after each. */
function choices(utilisations: readonly (number | null)[], threshold: number, holdMs = 0, state: AdaptiveCompressionState = INITIAL_ADAPTIVE_COMPRESSION_STATE): string[] {
  const out: string[] = [];
  utilisations.forEach((utilisation, i) => {
    state = adaptiveCompression({ utilisation, threshold, nowMs: 1_000 * (i + 1), holdMs }, state);
    out.push(state.choice);
  });
  return out;
}

test('adaptive compression: at or below the threshold gradients stay float32; above it they switch to fp16', () => {
  assert.deepEqual(choices([0, 0.2, 0.49, 0.5], 0.5), ['none', 'none', 'none', 'none'], 'exactly the threshold is not above it');
  assert.deepEqual(choices([0.3, 0.51], 0.5), ['none', 'fp16']);
  const s = adaptiveCompression({ utilisation: 0.9, threshold: 0.5, nowMs: 7_000 }, INITIAL_ADAPTIVE_COMPRESSION_STATE);
  assert.deepEqual(s, { choice: 'fp16', sinceMs: 7_000 }, 'the state records when it switched');
  assert.equal(adaptiveCompression({ utilisation: 0.1, threshold: 0.5, nowMs: 1 }, INITIAL_ADAPTIVE_COMPRESSION_STATE), INITIAL_ADAPTIVE_COMPRESSION_STATE,
    'no change: the same state');
});

test('adaptive compression hysteresis: fp16 holds until utilisation falls below 0.8 × the threshold', () => {
  // threshold 0.5: on above 0.5, off below 0.4; in between, the current choice holds either way.
  assert.deepEqual(choices([0.6, 0.45, 0.41, 0.4, 0.5, 0.39, 0.45, 0.5, 0.55], 0.5),
    ['fp16', 'fp16', 'fp16', 'fp16', 'fp16', 'none', 'none', 'none', 'fp16']);
  // A utilisation hovering around the threshold (compressing lowers it) does not flap.
  assert.deepEqual(choices([0.52, 0.47, 0.53, 0.46, 0.52, 0.48], 0.5), ['fp16', 'fp16', 'fp16', 'fp16', 'fp16', 'fp16']);
});

test('adaptive compression holds a switch for a window before the next decision; the initial float32 is not held', () => {
  assert.equal(ADAPTIVE_COMPRESSION_HOLD_MS, 10_000);
  let s = adaptiveCompression({ utilisation: 0.9, threshold: 0.5, nowMs: 500 }, INITIAL_ADAPTIVE_COMPRESSION_STATE);
  assert.equal(s.choice, 'fp16', 'the first decision switches at once');
  s = adaptiveCompression({ utilisation: 0, threshold: 0.5, nowMs: 500 + 9_999 }, s);
  assert.equal(s.choice, 'fp16', 'held: 9.999 s after the switch');
  s = adaptiveCompression({ utilisation: 0, threshold: 0.5, nowMs: 500 + 10_000 }, s);
  assert.deepEqual(s, { choice: 'none', sinceMs: 10_500 });
  s = adaptiveCompression({ utilisation: 1, threshold: 0.5, nowMs: 10_600, holdMs: 50 }, s);
  assert.equal(s.choice, 'fp16', 'a shorter hold given');
});

test('adaptive compression: no decision before utilisation is measured (null); threshold 1 never compresses, 0 compresses on any use', () => {
  assert.deepEqual(choices([null, null], 0.5), ['none', 'none']);
  const on: AdaptiveCompressionState = { choice: 'fp16', sinceMs: 0 };
  assert.deepEqual(choices([null, null], 0.5, 0, on), ['fp16', 'fp16'], 'null keeps fp16 too');
  assert.deepEqual(choices([1, 1, 1], 1), ['none', 'none', 'none']);
  assert.deepEqual(choices([0, 0.001, 0], 0), ['none', 'fp16', 'fp16']);
});

test('adaptive compression: a bad utilisation or threshold is an error naming it', () => {
  const decide = (utilisation: number | null, threshold: number) => () => adaptiveCompression({ utilisation, threshold, nowMs: 0 }, INITIAL_ADAPTIVE_COMPRESSION_STATE);
  for (const u of [Number.NaN, -0.1, 1.5, Number.POSITIVE_INFINITY]) {
    assert.throws(decide(u, 0.5), (e: unknown) => e instanceof RangeError && /link utilisation must be a number in \[0, 1\]/.test(e.message) && e.message.includes(`got ${u}`), `utilisation ${u}`);
  }
  for (const t of [Number.NaN, -0.5, 1.2]) {
    assert.throws(decide(0.7, t), (e: unknown) => e instanceof ConfigError && /communication\.compression_threshold must be a number in \[0, 1\]/.test(e.message) && e.message.includes(`got ${t}`), `threshold ${t}`);
    assert.throws(decide(null, t), ConfigError, `threshold ${t} is checked even before utilisation is measured`);
  }
  assert.throws(() => adaptiveCompression({ utilisation: 0.7, threshold: 0.5, nowMs: Number.NaN }, INITIAL_ADAPTIVE_COMPRESSION_STATE), /nowMs/);
});

test('gradientCompressionFromConfig: the mode and the threshold; adaptive (the default) at 0.5', () => {
  const base = `cluster:
  worker_groups: [{ name: g, nodes: [w1] }]
  server_nodes: [s1]
model: { type: ctr }
data: { source: spam }
`;
  const of = (extra: string) => gradientCompressionFromConfig(parseConfig(base + extra, 'job.yaml'));
  assert.deepEqual(of(''), { mode: 'adaptive', threshold: 0.5 });
  assert.deepEqual(of('communication: { compression: adaptive, compression_threshold: 0.8 }\n'), { mode: 'adaptive', threshold: 0.8 });
  assert.deepEqual(of('communication: { compression: fp16 }\n'), { mode: 'fp16', threshold: 0.5 });
  assert.deepEqual(of('communication: { compression: none }\n'), { mode: null, threshold: 0.5 });
});

// ---------------------------------------------------------------- a worker over real shards

/** A logger that keeps the info lines. */
function infoLines(): { log: Logger; lines: string[] } {
  const lines: string[] = [];
  const log = silentLogger();
  log.info = ((obj: unknown, msg?: string) => { lines.push(typeof obj === 'string' ? obj : msg ?? ''); }) as Logger['info'];
  return { log, lines };
}

interface StepRecord { loss: number; bytesOut: number; choice: string }

/**
 * `steps` asp steps of worker w1 (emulated: 40 ms steps, `bandwidthMbps`
 * link) with communication.compression adaptive over two real shards on the
 * in-process bus; per step its loss, the bytes its transport sent (pull
 * requests and pushes: the pushes' gradients are most of them) and its
 * compression choice after the step's pushes.
 */
async function adaptiveWorker(bandwidthMbps: number, steps: number) {
  const config = parseConfig(`cluster:
  worker_groups: [{ name: g, nodes: [w1] }]
  server_nodes: [s1, s2]
nodes: { w1: { emulate: { speed: 1, bandwidth_mbps: ${bandwidthMbps} } } }
model: { type: ctr, ctr: { embedding_dim: 8, hidden: [32], pooling: mean, wide: true, hash_buckets: 5000 } }
data: { source: ctr-synthetic, batch_size: 64, samples: ${64 * steps}, test_samples: 64, slots: 4, dense_features: 3, vocab_size: 2000 }
optimizer: { type: adam, learning_rate: 0.01, sparse: { type: adagrad, learning_rate: 0.05 } }
training: { mode: asp, random_seed: 7, emulation_reference_step_ms: 40 }
communication: { compression: adaptive, compression_threshold: 0.5 }
`, 'job.yaml');
  const md = modelAndData(config);
  const plan = shardPlanFromConfig(config, md.model, 4096 + 16 * 1024);
  const bus = inProcessBus('adaptive');
  const planStore = memoryPlanStore(plan);
  for (const s of ['s1', 's2']) await startServerNode({ config, server: s, system: await bus.system(s), planStore, log: silentLogger(), md });
  const session = await StepSession.create(md.model, { graph: 'step', intraOpNumThreads: 1 });
  const w1 = await bus.system('w1');
  const { log, lines } = infoLines();
  const compression = gradientCompressionFromConfig(config);
  const stepper = new WorkerStepper({
    client: new ShardClient(w1, { requestTimeoutMs: 5_000, log: silentLogger(), shouldStop: () => false, plans: plan }),
    plan, model: md.model, layout: sparseLayoutFromConfig(config, md.model), session, clock: systemClock, log, node: 'w1',
    emulateSpeed: 1, referenceStepMs: config.training.emulation_reference_step_ms, bandwidthMbps,
    compression: compression.mode, compressionThreshold: compression.threshold,
  });
  const records: StepRecord[] = [];
  let firstDense: Float32Array[] | null = null;
  try {
    for (const batch of md.source.batchesSync(streamOptions('train', 64, { epoch: 0 }))) {
      const before = w1.transport.stats.bytesOut;
      const outcome = await stepper.run(batch, null);
      records.push({ loss: outcome.loss!, bytesOut: w1.transport.stats.bytesOut - before, choice: stepper.compressionChoice });
      // The parameters the first step computed from (the shards' initial ones).
      firstDense ??= [...stepper.denseParams.values()].map((p) => p.slice());
    }
    const lastDense = [...stepper.denseParams.values()];
    return { records, lines, firstDense: firstDense!, lastDense, utilisation: stepper.linkUtilisation, choice: stepper.compressionChoice };
  } finally {
    await session.dispose();
    await bus.close();
  }
}

function assertTrained(r: Awaited<ReturnType<typeof adaptiveWorker>>, what: string): void {
  assert.ok(r.records.every((s) => Number.isFinite(s.loss)), `${what}: every loss finite (${r.records.map((s) => s.loss.toFixed(3)).join(', ')})`);
  const moved = r.firstDense.some((p, i) => p.some((x, j) => x !== r.lastDense[i]![j]));
  assert.ok(moved, `${what}: the dense parameters pulled at the end differ from the initial ones`);
}

const mean = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

test('adaptive: a worker on a 1 Mbit/s emulated link (transfers take most of a step) switches to fp16 within a few steps and its pushes shrink', async () => {
  const r = await adaptiveWorker(1, 12);
  assert.equal(r.records.length, 12);
  assertTrained(r, '1 Mbit/s');
  const switchedAt = r.records.findIndex((s) => s.choice === 'fp16');
  // Utilisation is judged once the link has been in use for a second: ~4 steps of ~300 ms here.
  assert.ok(switchedAt >= 1 && switchedAt <= 7, `switched to fp16 at step ${switchedAt + 1}: ${r.records.map((s) => s.choice).join(', ')}`);
  assert.ok(r.records.slice(switchedAt).every((s) => s.choice === 'fp16'), 'and stays fp16 (no flapping)');
  assert.equal(r.choice, 'fp16');
  assert.ok(r.utilisation !== null && r.utilisation > 0.4, `link utilisation ${r.utilisation} at the end`);
  const float32 = mean(r.records.slice(0, switchedAt).map((s) => s.bytesOut));
  const fp16 = mean(r.records.slice(switchedAt).map((s) => s.bytesOut));
  // Ids and headers are not compressed: about 2/3 of the float32 bytes here.
  assert.ok(fp16 < 0.75 * float32, `bytes sent per step: ${fp16.toFixed(0)} with fp16 against ${float32.toFixed(0)} before`);
  assert.equal(r.lines.filter((l) => /gradients now sent/.test(l)).length, 1, `one switch, said once: ${r.lines.join(' | ')}`);
  assert.ok(r.lines.some((l) => /^node w1: link utilisation (0\.\d\d|1\.00) > compression_threshold 0\.5: gradients now sent as fp16$/.test(l)), r.lines.join(' | '));
});

test('adaptive: a worker on a 1000 Mbit/s emulated link measures its link as nearly idle and keeps sending float32', async () => {
  const r = await adaptiveWorker(1000, 36);
  assert.equal(r.records.length, 36);
  assertTrained(r, '1000 Mbit/s');
  assert.ok(r.utilisation !== null, 'the link was in use for over a second: utilisation was measured and judged');
  assert.ok(r.utilisation < 0.1, `link utilisation ${r.utilisation}`);
  assert.ok(r.records.every((s) => s.choice === 'none'), r.records.map((s) => s.choice).join(', '));
  assert.deepEqual(r.lines.filter((l) => /gradients now sent/.test(l)), []);
});
