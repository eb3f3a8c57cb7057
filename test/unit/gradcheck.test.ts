/**
 * Every gradient output of the step graphs against central finite
 * differences of the loss, run through the same ONNX session.
 *
 * Tolerances (float32 everywhere inside ORT): the loss is O(1) and carries a
 * rounding error of a few ulps, ~1e-7 absolute. With a step eps = 1e-2 the
 * difference quotient's rounding error is ~1e-7 / 1e-2 = 1e-5 and its
 * truncation error eps²·f'''/6 is of the same order for these smooth,
 * O(1)-curvature losses. So each element must satisfy
 *   |analytic − numeric| ≤ 2e-4 + 1e-2 · max(|analytic|, |numeric|):
 * a 1 % relative error with an absolute floor that covers gradients near 0.
 * A wrong sign, a missing 1/B, a dropped shared-row contribution or a wrong
 * mean divisor is off by ≥ 30 % and fails.
 *
 * ReLU kinks: if a ±eps step moves any hidden pre-activation across 0, the
 * finite difference straddles a kink and means nothing. The float64
 * reference forward tells us (its ReLU sign pattern changes); such elements
 * are skipped and counted, and the test asserts they stay rare.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import {
  ctrModel, f32, i32, initDenseParams, mlpModel, StepSession, syntheticCtrFeeds, syntheticMlpFeeds,
  type CtrModel, type HostTensor, type MlpModel,
} from '../../native-bridge/mod.ts';
import { SeededRandom } from '../../runtime/random.ts';
import { ctrReference, mlpReference, type ReferenceForward } from '../support/reference-models.ts';

type Feeds = Record<string, HostTensor>;

/**
 * Initial params with non-zero biases. Zero biases put a pre-activation at
 * exactly 0 whenever a sample's previous layer is all zero, i.e. on a kink.
 */
function params(model: MlpModel | CtrModel, seed: number): Map<string, Float32Array> {
  const p = initDenseParams(model, seed);
  const rng = new SeededRandom(seed ^ 0xb1a5);
  for (const spec of model.denseParams) {
    if (spec.dims.length === 1) p.set(spec.name, Float32Array.from(p.get(spec.name)!, () => 0.3 * rng.normal()));
  }
  return p;
}

const EPS = 3e-3;
const ATOL = 2e-4;
const RTOL = 1e-2;

interface GradcheckReport {
  checked: number;
  skippedAtKinks: number;
  maxAbsErr: number;
  failures: string[];
}

async function gradcheck(
  session: StepSession, feeds: Feeds, reference: (f: Feeds) => ReferenceForward,
  targets: readonly { input: string; grad: string }[],
): Promise<{ report: GradcheckReport; analytic: Map<string, Float32Array> }> {
  const out = await session.run(feeds);
  const baseSignature = reference(feeds).reluSignature;
  const report: GradcheckReport = { checked: 0, skippedAtKinks: 0, maxAbsErr: 0, failures: [] };
  const analytic = new Map<string, Float32Array>();
  for (const { input, grad } of targets) {
    const t = feeds[input]!;
    const a = out.f32(grad);
    analytic.set(grad, a);
    assert.deepEqual(out.tensor(grad).dims, t.dims, `${grad} has the shape of ${input}`);
    const base = t.data as Float32Array;
    for (let i = 0; i < base.length; i++) {
      const plus = Float32Array.from(base); plus[i] = base[i]! + EPS;
      const minus = Float32Array.from(base); minus[i] = base[i]! - EPS;
      const fPlus = { ...feeds, [input]: f32(plus, t.dims) };
      const fMinus = { ...feeds, [input]: f32(minus, t.dims) };
      if (reference(fPlus).reluSignature !== baseSignature || reference(fMinus).reluSignature !== baseSignature) {
        report.skippedAtKinks++;
        continue;
      }
      const lPlus = (await session.run(fPlus, ['loss'])).scalar('loss');
      const lMinus = (await session.run(fMinus, ['loss'])).scalar('loss');
      const numeric = (lPlus - lMinus) / (plus[i]! - minus[i]!);
      const analyticValue = a[i]!;
      const err = Math.abs(analyticValue - numeric);
      report.checked++;
      report.maxAbsErr = Math.max(report.maxAbsErr, err);
      if (err > ATOL + RTOL * Math.max(Math.abs(analyticValue), Math.abs(numeric))) {
        report.failures.push(`${grad}[${i}]: analytic ${analyticValue.toExponential(4)} vs numeric ${numeric.toExponential(4)}`);
      }
    }
  }
  return { report, analytic };
}

function assertReport(report: GradcheckReport, total: number): void {
  assert.deepEqual(report.failures, [], `gradient mismatches:\n${report.failures.join('\n')}`);
  assert.equal(report.checked + report.skippedAtKinks, total);
  assert.ok(report.skippedAtKinks <= total * 0.05, `${report.skippedAtKinks} of ${total} elements sit on ReLU kinks; pick another seed`);
}

function denseTargets(model: MlpModel | CtrModel) {
  return model.denseParams.map((p) => ({ input: p.name, grad: p.gradName }));
}
const sizeOf = (feeds: Feeds, names: readonly string[]) => names.reduce((n, k) => n + feeds[k]!.data.length, 0);

function assertMatchesReference(actual: Float32Array, expected: Float64Array, what: string): void {
  assert.equal(actual.length, expected.length);
  for (let i = 0; i < actual.length; i++) {
    assert.ok(Math.abs(actual[i]! - expected[i]!) <= 1e-5 + 1e-5 * Math.abs(expected[i]!), `${what}[${i}]: ${actual[i]} vs reference ${expected[i]}`);
  }
}

describe('mlp gradients match finite differences', () => {
  const model = mlpModel({ layers: [8, 6, 5, 3] });

  it('checks every dense parameter (W1..W3, b1..b3)', async (t) => {
    const session = await StepSession.create(model);
    const feeds = syntheticMlpFeeds(model, params(model, 11), 7, 12);
    const targets = denseTargets(model);
    const { report } = await gradcheck(session, feeds, (f) => mlpReference(model, f), targets);
    assertReport(report, sizeOf(feeds, targets.map((t) => t.input)));
    t.diagnostic(`mlp gradcheck: ${report.checked} checked, ${report.skippedAtKinks} at kinks, max |err| ${report.maxAbsErr.toExponential(2)}`);
    await session.dispose();
  });

  it('loss and predictions match the plain-TypeScript reference forward', async () => {
    const session = await StepSession.create(model);
    const feeds = syntheticMlpFeeds(model, params(model, 21), 9, 22);
    const out = await session.run(feeds);
    const ref = mlpReference(model, feeds);
    assert.ok(Math.abs(out.scalar('loss') - ref.loss) <= 1e-5 * Math.max(1, ref.loss), `loss ${out.scalar('loss')} vs ${ref.loss}`);
    assertMatchesReference(out.f32('predictions'), ref.predictions, 'predictions');
    await session.dispose();
  });
});

/**
 * A hand-made CTR batch: B = 4, S = 3, U = 7. Sample 2 has only empty bags,
 * samples 0, 1 and 3 each have one, and the last bag of the batch is empty
 * (a trailing empty bag has its start at N). Row 0 appears twice in one bag
 * and in two samples; rows 1 and 2 appear in two slots; row 6 is never used.
 */
function handMadeCtrFeeds(model: CtrModel, seed: number): Feeds {
  const counts = Int32Array.of(2, 0, 1, /**/ 1, 3, 0, /**/ 0, 0, 0, /**/ 2, 1, 0);
  const rows = Int32Array.of(0, 1, 2, /**/ 3, 0, 4, 0, /**/ 2, 5, 1);
  const base = syntheticCtrFeeds(model, params(model, seed), { batch: 4, uniqueRows: 7, meanBagSize: 1, emptyBags: true }, seed + 1);
  return {
    ...base,
    bag_counts: i32(counts, [4, 3]),
    bag_rows: i32(rows, [rows.length]),
    labels: f32(Float32Array.of(1, 0, 1, 0), [4]),
  };
}

for (const pooling of ['sum', 'mean'] as const) {
  describe(`ctr gradients match finite differences (${pooling} pooling)`, () => {
    const model = ctrModel({ slots: 3, embeddingDim: 4, denseFeatures: 2, hidden: [6, 5], pooling });
    const targets = [...denseTargets(model), { input: 'emb_rows', grad: 'emb_rows_grad' }, { input: 'wide_rows', grad: 'wide_rows_grad' }];

    it('checks dense params and embedding/wide row grads, with shared rows and empty bags', async (t) => {
      const session = await StepSession.create(model);
      const feeds = handMadeCtrFeeds(model, 31);
      const { report, analytic } = await gradcheck(session, feeds, (f) => ctrReference(model, f), targets);
      assertReport(report, sizeOf(feeds, targets.map((t) => t.input)));
      t.diagnostic(`ctr/${pooling} gradcheck (hand-made): ${report.checked} checked, ${report.skippedAtKinks} at kinks, max |err| ${report.maxAbsErr.toExponential(2)}`);
      // The never-gathered row gets exactly zero; a shared row gets a non-zero sum.
      const D = model.config.embeddingDim;
      assert.deepEqual([...analytic.get('emb_rows_grad')!.subarray(6 * D, 7 * D)], [0, 0, 0, 0]);
      assert.equal(analytic.get('wide_rows_grad')![6], 0);
      assert.notEqual(analytic.get('wide_rows_grad')![0], 0);
      await session.dispose();
    });

    it('checks a random batch with many rows shared across samples and slots', async (t) => {
      const session = await StepSession.create(model);
      const feeds = syntheticCtrFeeds(model, params(model, 41), { batch: 6, uniqueRows: 5, meanBagSize: 2, emptyBags: true }, 42);
      const { report } = await gradcheck(session, feeds, (f) => ctrReference(model, f), targets);
      assertReport(report, sizeOf(feeds, targets.map((t) => t.input)));
      t.diagnostic(`ctr/${pooling} gradcheck (random): ${report.checked} checked, ${report.skippedAtKinks} at kinks, max |err| ${report.maxAbsErr.toExponential(2)}`);
      await session.dispose();
    });

    it('loss and predictions match the plain-TypeScript reference forward', async () => {
      const session = await StepSession.create(model);
      const feeds = syntheticCtrFeeds(model, params(model, 51), { batch: 9, uniqueRows: 11, meanBagSize: 2, emptyBags: true }, 52);
      const out = await session.run(feeds);
      const ref = ctrReference(model, feeds);
      assert.ok(Math.abs(out.scalar('loss') - ref.loss) <= 1e-5 * Math.max(1, ref.loss), `loss ${out.scalar('loss')} vs ${ref.loss}`);
      assertMatchesReference(out.f32('predictions'), ref.predictions, 'predictions');
      const hand = handMadeCtrFeeds(model, 53);
      const handOut = await session.run(hand);
      assertMatchesReference(handOut.f32('predictions'), ctrReference(model, hand).predictions, 'predictions (empty bags)');
      await session.dispose();
    });
  });
}
