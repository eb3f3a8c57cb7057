import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  createOptimizer, createSchedule, stalenessLearningRateScale, validateOptimizerConfig,
  type OptimizerConfigInput,
} from '../../native-bridge/optimizers.ts';
import { ConfigError, InvalidTensorError } from '../../runtime/errors.ts';

/** Float32 tolerance: a few float32 ulps per step relative to the magnitude. */
function assertCloseArrays(actual: ArrayLike<number>, expected: ArrayLike<number>, msg = '', relTol = 2e-6): void {
  assert.equal(actual.length, expected.length);
  for (let i = 0; i < expected.length; i++) {
    const a = actual[i]!;
    const e = expected[i]!;
    assert.ok(Math.abs(a - e) <= relTol * Math.max(1, Math.abs(e)), `${msg}[${i}]: ${a} vs ${e}`);
  }
}

// ---------------------------------------------------------------- float64 references, written from the formulas

type Vec = number[];
function refSgd(w: Vec, grads: Vec[], lr: number, wd = 0): Vec {
  w = [...w];
  for (const g of grads) w = w.map((wi, i) => wi - lr * (g[i]! + wd * wi));
  return w;
}
function refMomentum(w: Vec, grads: Vec[], lr: number, mu: number, nesterov: boolean, wd = 0): Vec {
  w = [...w];
  let v = w.map(() => 0);
  for (const g of grads) {
    const gd = g.map((gi, i) => gi + wd * w[i]!);
    v = v.map((vi, i) => mu * vi + gd[i]!);
    w = w.map((wi, i) => wi - lr * (nesterov ? gd[i]! + mu * v[i]! : v[i]!));
  }
  return w;
}
function refAdam(w: Vec, grads: Vec[], lrs: number[], b1: number, b2: number, eps: number, wd = 0, decoupled = false): Vec {
  w = [...w];
  let m = w.map(() => 0);
  let v = w.map(() => 0);
  grads.forEach((g, k) => {
    const t = k + 1;
    const lr = lrs[k]!;
    if (decoupled) w = w.map((wi) => wi * (1 - lr * wd));
    const gd = g.map((gi, i) => gi + (decoupled ? 0 : wd * w[i]!));
    m = m.map((mi, i) => b1 * mi + (1 - b1) * gd[i]!);
    v = v.map((vi, i) => b2 * vi + (1 - b2) * gd[i]! ** 2);
    const mHat = m.map((mi) => mi / (1 - b1 ** t));
    const vHat = v.map((vi) => vi / (1 - b2 ** t));
    w = w.map((wi, i) => wi - lr * mHat[i]! / (Math.sqrt(vHat[i]!) + eps));
  });
  return w;
}
function refAdagrad(w: Vec, grads: Vec[], lr: number, eps: number, init = 0, wd = 0): Vec {
  w = [...w];
  let s = w.map(() => init);
  for (const g of grads) {
    const gd = g.map((gi, i) => gi + wd * w[i]!);
    s = s.map((si, i) => si + gd[i]! ** 2);
    w = w.map((wi, i) => wi - lr * gd[i]! / (Math.sqrt(s[i]!) + eps));
  }
  return w;
}

const w0 = [0.5, -1.25, 2, 0.1, 0];
const gradSeq = [
  [0.3, -0.2, 1.5, 0.01, -0.7],
  [0.25, 0.4, -1, 0.02, -0.6],
  [-0.1, 0.05, 0.5, 0.0, 2.5],
  [0.2, -0.3, 0.25, -0.01, 0.1],
];

function runDense(config: OptimizerConfigInput, grads: Vec[] = gradSeq, lrScales: number[] = grads.map(() => 1)): Float32Array {
  const opt = createOptimizer(config);
  const w = Float32Array.from(w0);
  const state = opt.allocateState(w.length);
  grads.forEach((g, k) => opt.updateDense(w, Float32Array.from(g), state, k + 1, lrScales[k]));
  return w;
}

// ---------------------------------------------------------------- hand-computed single values

test('hand-computed steps: sgd, momentum, nesterov, adam, adagrad, weight decay', () => {
  const one = (config: OptimizerConfigInput, grads: number[]): number => {
    const opt = createOptimizer(config);
    const w = new Float32Array([1]);
    const st = opt.allocateState(1);
    grads.forEach((g, k) => opt.updateDense(w, new Float32Array([g]), st, k + 1));
    return w[0]!;
  };
  const near = (a: number, b: number) => assert.ok(Math.abs(a - b) < 1e-6, `${a} vs ${b}`);
  near(one({ type: 'sgd', learningRate: 0.1 }, [0.5]), 0.95);
  near(one({ type: 'sgd', learningRate: 0.1, weightDecay: 0.1 }, [0.5]), 0.94); // 1 − 0.1·(0.5 + 0.1)
  // v1 = 1, w1 = 0.9; v2 = 1.9, w2 = 0.71
  near(one({ type: 'momentum', learningRate: 0.1, momentum: 0.9 }, [1, 1]), 0.71);
  // nesterov: w1 = 1 − 0.1·(1 + 0.9) = 0.81; v2 = 1.9, w2 = 0.81 − 0.1·(1 + 1.71) = 0.539
  near(one({ type: 'momentum', learningRate: 0.1, momentum: 0.9, nesterov: true }, [1, 1]), 0.539);
  // Adam's first step moves by lr·g/(|g| + ε) ≈ lr whatever the gradient's size
  near(one({ type: 'adam', learningRate: 0.001 }, [0.5]), 0.999);
  near(one({ type: 'adam', learningRate: 0.001 }, [-1e-4]), 1.001);
  // AdamW: w·(1 − lr·λ) = 0.99, then − 0.1
  near(one({ type: 'adam', learningRate: 0.1, weightDecay: 0.1, decoupledWeightDecay: true }, [0.5]), 0.89);
  // adagrad: s = 4, w = 1 − 0.1·2/2 = 0.9; s = 5, w = 0.9 − 0.1/√5
  near(one({ type: 'adagrad', learningRate: 0.1 }, [2, 1]), 0.9 - 0.1 / Math.sqrt(5));
  near(one({ type: 'adagrad', learningRate: 0.1, initialAccumulator: 5 }, [2]), 1 - 0.2 / 3);
});

// ---------------------------------------------------------------- multi-step sequences against the references

test('sgd matches its formula over several steps (with and without weight decay)', () => {
  assertCloseArrays(runDense({ type: 'sgd', learningRate: 0.05 }), refSgd(w0, gradSeq, 0.05), 'sgd');
  assertCloseArrays(runDense({ type: 'sgd', learningRate: 0.05, weightDecay: 0.01 }), refSgd(w0, gradSeq, 0.05, 0.01), 'sgd+wd');
});

test('sgd without decay updates every element of blocks and rows of any length (eight-at-a-time loop and its remainder), each as w − lr·g in float32', () => {
  const opt = createOptimizer({ type: 'sgd', learningRate: 0.05 });
  const expect = (w: number, g: number, lr: number) => Math.fround(w - lr * g);
  for (const n of [1, 7, 8, 9, 16, 21, 67]) {
    const w = Float32Array.from({ length: n }, (_, i) => Math.cos(i + n));
    const g = Float32Array.from({ length: n }, (_, i) => Math.sin(3 * i + 1));
    const before = w.slice();
    opt.updateDense(w, g, [], 1, 0.5);
    for (let i = 0; i < n; i++) assert.equal(w[i], expect(before[i]!, g[i]!, 0.025), `block of ${n}, element ${i}`);
  }
  // Table rows of dim 12 (one block of eight and a remainder of four), updated in place in slot order 3, 0, 2.
  const dim = 12;
  const values = Float32Array.from({ length: 4 * dim }, (_, i) => Math.cos(i));
  const before = values.slice();
  const slots = Int32Array.from([3, 0, 2]);
  const grads = Float32Array.from({ length: 3 * dim }, (_, i) => Math.sin(i) + 0.5);
  const rowSteps = new Uint32Array(4);
  opt.updateTableRows({ values, state: new Float32Array(0), rowSteps, slots, count: 3, grads, dim, scheduleStep: 1, lrScale: 1 });
  slots.forEach((s, r) => {
    for (let j = 0; j < dim; j++) assert.equal(values[s * dim + j], expect(before[s * dim + j]!, grads[r * dim + j]!, 0.05), `row ${s}, element ${j}`);
  });
  assert.deepEqual([...values.subarray(dim, 2 * dim)], [...before.subarray(dim, 2 * dim)], 'row 1 was not in the update');
  assert.deepEqual([...rowSteps], [1, 0, 1, 1]);
});

test('momentum and nesterov match their formulas over several steps', () => {
  assertCloseArrays(runDense({ type: 'momentum', learningRate: 0.05, momentum: 0.8 }), refMomentum(w0, gradSeq, 0.05, 0.8, false), 'momentum');
  assertCloseArrays(runDense({ type: 'momentum', learningRate: 0.05, momentum: 0.8, nesterov: true, weightDecay: 0.02 }), refMomentum(w0, gradSeq, 0.05, 0.8, true, 0.02), 'nesterov');
  assertCloseArrays(runDense({ type: 'momentum', learningRate: 0.05 }), refMomentum(w0, gradSeq, 0.05, 0.9, false), 'default μ 0.9');
});

test('adam (bias-corrected), L2 and decoupled weight decay match their formulas over several steps', () => {
  const lrs = gradSeq.map(() => 0.01);
  assertCloseArrays(runDense({ type: 'adam', learningRate: 0.01 }), refAdam(w0, gradSeq, lrs, 0.9, 0.999, 1e-8), 'adam defaults');
  assertCloseArrays(runDense({ type: 'adam', learningRate: 0.01, beta1: 0.5, beta2: 0.9, epsilon: 1e-3, weightDecay: 0.1 }), refAdam(w0, gradSeq, lrs, 0.5, 0.9, 1e-3, 0.1), 'adam L2');
  assertCloseArrays(runDense({ type: 'adam', learningRate: 0.01, weightDecay: 0.1, decoupledWeightDecay: true }), refAdam(w0, gradSeq, lrs, 0.9, 0.999, 1e-8, 0.1, true), 'adamw');
});

test('adagrad matches its formula over several steps', () => {
  assertCloseArrays(runDense({ type: 'adagrad', learningRate: 0.1 }), refAdagrad(w0, gradSeq, 0.1, 1e-10), 'adagrad');
  assertCloseArrays(runDense({ type: 'adagrad', learningRate: 0.1, epsilon: 1e-3, initialAccumulator: 0.1, weightDecay: 0.05 }), refAdagrad(w0, gradSeq, 0.1, 1e-3, 0.1, 0.05), 'adagrad opts');
});

test('lrScale multiplies the learning rate of that call (staleness scaling)', () => {
  assert.equal(stalenessLearningRateScale(0), 1);
  assert.equal(stalenessLearningRateScale(3), 0.25);
  const scales = [1, stalenessLearningRateScale(1), stalenessLearningRateScale(4), 0];
  const expected = [...w0];
  gradSeq.forEach((g, k) => { for (let i = 0; i < g.length; i++) expected[i]! -= 0.05 * scales[k]! * g[i]!; });
  assertCloseArrays(runDense({ type: 'sgd', learningRate: 0.05 }, gradSeq, scales), expected, 'sgd lrScale');
  const lrs = scales.map((s) => 0.01 * s);
  assertCloseArrays(runDense({ type: 'adam', learningRate: 0.01 }, gradSeq, scales), refAdam(w0, gradSeq, lrs, 0.9, 0.999, 1e-8), 'adam lrScale');
  const opt = createOptimizer({ type: 'sgd', learningRate: 0.1 });
  assert.throws(() => opt.updateDense(new Float32Array(1), new Float32Array(1), [], 1, -1), RangeError);
  assert.throws(() => opt.updateDense(new Float32Array(1), new Float32Array(1), [], 0), RangeError);
});

// ---------------------------------------------------------------- schedules

test('built-in schedules give the documented multipliers', () => {
  const at = (cfg: Parameters<typeof createSchedule>[0], ts: number[]) => ts.map(createSchedule(cfg));
  const near = (a: number[], b: number[]) => a.forEach((x, i) => assert.ok(Math.abs(x - b[i]!) < 1e-12, `${a} vs ${b}`));
  near(at(null, [1, 1000]), [1, 1]);
  near(at({ type: 'constant' }, [1, 50]), [1, 1]);
  near(at({ type: 'step', stepSize: 2, gamma: 0.5 }, [1, 2, 3, 4, 5]), [1, 1, 0.5, 0.5, 0.25]);
  near(at({ type: 'exponential', gamma: 0.5, decaySteps: 2 }, [1, 2, 3, 5]), [1, Math.SQRT1_2, 0.5, 0.25]);
  near(at({ type: 'exponential', gamma: 0.9, decaySteps: null }, [1, 3]), [1, 0.81]);
  near(at({ type: 'warmup-cosine', warmupSteps: 4, totalSteps: 12, minMultiplier: 0.1 }, [1, 2, 4, 8, 12, 100]), [0.25, 0.5, 1, 0.55, 0.1, 0.1]);
  near(at({ type: 'warmup-cosine', warmupSteps: 0, totalSteps: 10, minMultiplier: null }, [1, 10]), [0.5 * (1 + Math.cos(Math.PI / 10)), 0]);
});

test('the schedule drives the learning rate of each update; a custom schedule hook replaces it', () => {
  const cfg: OptimizerConfigInput = { type: 'sgd', learningRate: 0.1, schedule: { type: 'step', stepSize: 2, gamma: 0.5 } };
  const lrs = [0.1, 0.1, 0.05, 0.05];
  const expected = [...w0];
  gradSeq.forEach((g, k) => { for (let i = 0; i < g.length; i++) expected[i]! -= lrs[k]! * g[i]!; });
  assertCloseArrays(runDense(cfg), expected, 'step-scheduled sgd');
  const adamCfg: OptimizerConfigInput = { type: 'adam', learningRate: 0.01, schedule: { type: 'warmup-cosine', warmupSteps: 2, totalSteps: 4, minMultiplier: null } };
  const sched = createSchedule(adamCfg.schedule!);
  assertCloseArrays(runDense(adamCfg), refAdam(w0, gradSeq, [1, 2, 3, 4].map((t) => 0.01 * sched(t)), 0.9, 0.999, 1e-8), 'warmup-cosine adam');
  const custom = createOptimizer({ type: 'sgd', learningRate: 1 }, { schedule: (t) => 1 / t });
  assert.equal(custom.learningRateAt(4), 0.25);
  assert.equal(custom.learningRateAt(4, 0.5), 0.125);
});

// ---------------------------------------------------------------- lazy sparse rows

test('sparse adam is lazy: untouched rows and their state stay bit-identical, touched rows bias-correct with their own step', () => {
  const dim = 3;
  const rows = 6;
  const opt = createOptimizer({ type: 'adam', learningRate: 0.01 });
  const table = Float32Array.from({ length: rows * dim }, (_, i) => Math.sin(i + 1));
  const before = table.slice();
  const state = opt.allocateState(table.length);
  const rowSteps = new Uint32Array(rows);
  const g1 = [0.3, -0.2, 1.5, /**/ 0.5, 0.25, -0.125];
  const g2 = [0.1, 0.2, -0.3];
  // global step 7: rows 1 and 4; global step 9: row 4 again
  opt.updateSparse({ table, state, rowSteps, rows: Int32Array.from([1, 4]), grads: Float32Array.from(g1), dim, scheduleStep: 7, lrScale: 1, tensorName: 'emb' });
  opt.updateSparse({ table, state, rowSteps, rows: [4], grads: Float32Array.from(g2), dim, scheduleStep: 9, lrScale: 1, tensorName: 'emb' });
  assert.deepEqual([...rowSteps], [0, 1, 0, 0, 2, 0]);
  for (const r of [0, 2, 3, 5]) {
    for (let j = 0; j < dim; j++) {
      assert.ok(Object.is(table[r * dim + j], before[r * dim + j]), `row ${r} changed`);
      assert.equal(state[0]![r * dim + j], 0);
      assert.equal(state[1]![r * dim + j], 0);
    }
  }
  const row = (r: number) => [...before.subarray(r * dim, (r + 1) * dim)];
  // row 1 saw one update: t = 1 even though the global step was 7
  assertCloseArrays(table.subarray(dim, 2 * dim), refAdam(row(1), [g1.slice(0, 3)], [0.01], 0.9, 0.999, 1e-8), 'row 1');
  // row 4 saw two: t = 1, 2
  assertCloseArrays(table.subarray(4 * dim, 5 * dim), refAdam(row(4), [g1.slice(3), g2], [0.01, 0.01], 0.9, 0.999, 1e-8), 'row 4');
});

test('updateRow on subarray slices equals updateSparse, for every optimizer', () => {
  const configs: OptimizerConfigInput[] = [
    { type: 'sgd', learningRate: 0.1, weightDecay: 0.01 },
    { type: 'momentum', learningRate: 0.1, nesterov: true },
    { type: 'adam', learningRate: 0.01 },
    { type: 'adagrad', learningRate: 0.1, initialAccumulator: 0.1 },
  ];
  for (const cfg of configs) {
    const opt = createOptimizer(cfg);
    const dim = 4;
    const a = Float32Array.from({ length: 5 * dim }, (_, i) => Math.cos(i));
    const b = a.slice();
    const sa = opt.allocateState(a.length);
    const sb = opt.allocateState(b.length);
    const stepsA = new Uint32Array(5);
    const stepsB = new Uint32Array(5);
    for (let step = 1; step <= 3; step++) {
      const rows = step === 2 ? [2] : [0, 2];
      const grads = Float32Array.from({ length: rows.length * dim }, (_, i) => Math.sin(step * 10 + i));
      opt.updateSparse({ table: a, state: sa, rowSteps: stepsA, rows, grads, dim, scheduleStep: step, lrScale: 0.5, tensorName: 'e' });
      rows.forEach((r, k) => {
        stepsB[r]!++;
        opt.updateRow(b.subarray(r * dim, (r + 1) * dim), grads.subarray(k * dim, (k + 1) * dim), sb.map((s) => s.subarray(r * dim, (r + 1) * dim)), stepsB[r]!, step, 0.5, 'e');
      });
    }
    assert.deepEqual([...a], [...b], cfg.type);
    sa.forEach((s, k) => assert.deepEqual([...s], [...sb[k]!], `${cfg.type} state ${k}`));
  }
});

// ---------------------------------------------------------------- rejection of bad gradients

test('a NaN or Inf gradient is rejected, naming tensor and index, with params and state untouched', () => {
  for (const type of ['sgd', 'momentum', 'adam', 'adagrad'] as const) {
    const opt = createOptimizer({ type, learningRate: 0.1 });
    const w = Float32Array.from(w0);
    const st = opt.allocateState(w.length);
    opt.updateDense(w, Float32Array.from(gradSeq[0]!), st, 1);
    const wBefore = w.slice();
    const stBefore = st.map((s) => s.slice());
    const bad = Float32Array.from(gradSeq[1]!);
    bad[3] = NaN;
    assert.throws(() => opt.updateDense(w, bad, st, 2, 1, 'fc1.weight'), (e: unknown) => {
      assert.ok(e instanceof InvalidTensorError);
      assert.match(e.message, /fc1\.weight/);
      assert.match(e.message, /NaN at index 3/);
      assert.deepEqual(e.data, { tensor: 'fc1.weight', index: 3, value: 'NaN' });
      return true;
    });
    bad[3] = 0; bad[4] = -Infinity;
    assert.throws(() => opt.updateDense(w, bad, st, 2), /-Infinity at index 4/);
    assert.deepEqual([...w], [...wBefore], `${type} params`);
    st.forEach((s, k) => assert.deepEqual([...s], [...stBefore[k]!], `${type} state ${k}`));
  }
});

test('sparse update with one bad row changes no row and no row step', () => {
  const opt = createOptimizer({ type: 'adam', learningRate: 0.01 });
  const dim = 2;
  const table = Float32Array.from([1, 2, 3, 4, 5, 6]);
  const state = opt.allocateState(6);
  const rowSteps = new Uint32Array(3);
  const grads = Float32Array.from([0.1, 0.2, 0.3, Infinity]);
  assert.throws(
    () => opt.updateSparse({ table, state, rowSteps, rows: [0, 2], grads, dim, scheduleStep: 1, lrScale: 1, tensorName: 'emb.user' }),
    (e: unknown) => e instanceof InvalidTensorError && /emb\.user/.test(e.message) && /table row 2\), element 1/.test(e.message),
  );
  assert.throws(
    () => opt.updateSparse({ table, state, rowSteps, rows: [0, 3], grads: new Float32Array(4), dim, scheduleStep: 1, lrScale: 1, tensorName: 'emb.user' }),
    /row index 3/,
  );
  assert.deepEqual([...table], [1, 2, 3, 4, 5, 6]);
  assert.deepEqual([...rowSteps], [0, 0, 0]);
  assert.ok(state.every((s) => s.every((x) => x === 0)));
});

test('shape mismatches are InvalidTensorError', () => {
  const opt = createOptimizer({ type: 'adam', learningRate: 0.01 });
  assert.equal(opt.stateSlots(), 2);
  assert.throws(() => opt.updateDense(new Float32Array(3), new Float32Array(2), opt.allocateState(3), 1), InvalidTensorError);
  assert.throws(() => opt.updateDense(new Float32Array(3), new Float32Array(3), opt.allocateState(2), 1), InvalidTensorError);
  assert.throws(() => opt.updateDense(new Float32Array(3), new Float32Array(3), [new Float32Array(3)], 1), InvalidTensorError);
  assert.deepEqual(['sgd', 'momentum', 'adam', 'adagrad'].map((type) => createOptimizer({ type, learningRate: 1 } as OptimizerConfigInput).stateSlots()), [0, 1, 2, 1]);
});

// ---------------------------------------------------------------- config validation

test('config validation names the offending field', () => {
  const rejects = (raw: unknown, field: string) => assert.throws(() => validateOptimizerConfig(raw), (e: unknown) => {
    assert.ok(e instanceof ConfigError, String(e));
    assert.ok(e.message.startsWith(field + ' '), `${e.message} should name ${field}`);
    assert.equal(e.data?.field, field);
    return true;
  });
  rejects({ type: 'adam' }, 'optimizer.learningRate');
  rejects({ type: 'adam', learningRate: -1 }, 'optimizer.learningRate');
  rejects({ type: 'adam', learningRate: NaN }, 'optimizer.learningRate');
  rejects({ type: 'adam', learningRate: 0.1, beta1: 1 }, 'optimizer.beta1');
  rejects({ type: 'adam', learningRate: 0.1, epsilon: 0 }, 'optimizer.epsilon');
  rejects({ type: 'momentum', learningRate: 0.1, nesterov: 'yes' }, 'optimizer.nesterov');
  rejects({ type: 'sgd', learningRate: 0.1, momentum: 0.9 }, 'optimizer.momentum');
  rejects({ type: 'sgd', learning_rate: 0.1 }, 'optimizer.learning_rate');
  rejects({ type: 'rmsprop', learningRate: 0.1 }, 'optimizer.type');
  rejects(null, 'optimizer');
  rejects({ type: 'sgd', learningRate: 0.1, weightDecay: -0.1 }, 'optimizer.weightDecay');
  rejects({ type: 'sgd', learningRate: 0.1, schedule: { type: 'warmup-cosine', warmupSteps: 10, totalSteps: 5 } }, 'optimizer.schedule.totalSteps');
  rejects({ type: 'sgd', learningRate: 0.1, schedule: { type: 'step', stepSize: 0, gamma: 0.5 } }, 'optimizer.schedule.stepSize');
  rejects({ type: 'sgd', learningRate: 0.1, schedule: { type: 'linear' } }, 'optimizer.schedule.type');
  assert.throws(() => createOptimizer({ type: 'adam', learningRate: 0.1, beta2: 2 }), ConfigError);
  assert.deepEqual(validateOptimizerConfig({ type: 'adam', learningRate: 0.1 }), {
    type: 'adam', learningRate: 0.1, weightDecay: null, schedule: null, beta1: null, beta2: null, epsilon: null, decoupledWeightDecay: null,
  });
});
