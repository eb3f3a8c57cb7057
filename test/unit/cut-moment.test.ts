/**
 * When a checkpoint's cut is taken in hps (topology/cut-moment.ts, and the
 * driver's tracker actors/scheduler/cut-moment.ts): at a moment when every
 * active worker is early in its window (stepping), not exchanging one.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InProcessBroker, SimulatedClock, connectTransport } from '../../runtime/mod.ts';
import { cutMomentWaitMs, msUntilNextIdle, nextCadence, workersExchanging, type WorkerCadence } from '../../topology/mod.ts';
import { CutMoment } from '../../actors/scheduler/cut-moment.ts';
import { publishTelemetry } from '../../actors/monitor/telemetry.ts';
import { until } from '../support/until.ts';

test('workersExchanging: a worker past the stepping part of its cycle holds the cut back; an idle one or one without a period does not', () => {
  const c = new Map<string, WorkerCadence>([
    ['fast', { lastBoundaryMs: 1000, periodMs: 400 }], // stepping until 1100
    ['slow', { lastBoundaryMs: 600, periodMs: 1000 }], // stepping until 850, idle after 2600
    ['new', { lastBoundaryMs: 1000, periodMs: null }],
    ['gone', { lastBoundaryMs: 0, periodMs: 300 }], // no boundary for over 2 periods: paused or done
  ]);
  assert.deepEqual(workersExchanging(1050, c), ['slow']);
  assert.deepEqual(workersExchanging(1200, c), ['fast', 'slow']);
  c.set('slow', { lastBoundaryMs: 1030, periodMs: 1000 });
  assert.deepEqual(workersExchanging(1050, c), [], 'both early in their windows');
  assert.deepEqual(workersExchanging(1050, c, { fraction: 0.01, idleAfterPeriods: 2 }), ['fast', 'slow']);
  assert.throws(() => workersExchanging(0, c, { fraction: 1, idleAfterPeriods: 2 }), /fraction must be in \(0, 1\)/);
  assert.throws(() => workersExchanging(0, c, { fraction: 0.2, idleAfterPeriods: 0 }), /idleAfterPeriods must be ≥ 1/);
});

test('cutMomentWaitMs: two of the longest active period, capped; 0 without a known cadence', () => {
  const c = new Map<string, WorkerCadence>([['a', { lastBoundaryMs: 0, periodMs: 400 }], ['b', { lastBoundaryMs: 0, periodMs: 900 }]]);
  assert.equal(cutMomentWaitMs(100, c, 5000), 1800);
  assert.equal(cutMomentWaitMs(100, c, 1000), 1000);
  assert.equal(cutMomentWaitMs(1000, c, 5000), 1800, 'a is idle now (over 2 periods); b still counts');
  assert.equal(cutMomentWaitMs(5000, c, 5000), 0, 'every worker idle');
  assert.equal(cutMomentWaitMs(0, new Map([['a', { lastBoundaryMs: 0, periodMs: null }]]), 5000), 0);
  // When the next active worker goes idle (the tracker re-checks then): a at 800, b at 1800.
  assert.equal(msUntilNextIdle(100, c), 701);
  assert.equal(msUntilNextIdle(1000, c), 801);
  assert.equal(msUntilNextIdle(5000, c), Infinity);
});

test('nextCadence: the period smoothed over boundaries; a long gap (a pause) restarts it', () => {
  let c = nextCadence(undefined, 100);
  assert.deepEqual(c, { lastBoundaryMs: 100, periodMs: null });
  c = nextCadence(c, 500);
  assert.deepEqual(c, { lastBoundaryMs: 500, periodMs: 400 });
  c = nextCadence(c, 1000);
  assert.equal(c.periodMs, 0.7 * 400 + 0.3 * 500);
  c = nextCadence(c, 1000 + 3 * c.periodMs! + 1);
  assert.equal(c.periodMs, null, 'over three periods: not an interval of the worker\'s cadence');
  assert.throws(() => nextCadence(c, 0, 0), /alpha must be in \(0, 1\]/);
});

async function tracker() {
  const broker = new InProcessBroker();
  const driverT = await connectTransport({ servers: null, broker, name: 'driver' });
  const workerT = await connectTransport({ servers: null, broker, name: 'worker' });
  const clock = new SimulatedClock(10_000);
  const moment = new CutMoment({ transport: driverT, job: 'cm', clock });
  let n = 0;
  /** One window's batch reports of `node` (two batches: the second is the same boundary). */
  const boundary = async (node: string, group: string | null, window: number | null) => {
    const before = moment.known.get(node)?.lastBoundaryMs ?? null;
    for (let k = 0; k < 2; k++) {
      publishTelemetry(workerT, 'cm', 'batch', node, {
        node, batch_id: `b${n++}`, samples: 32, loss: 0.5, redelivered: false, ack_confirmed: true, staleness: 0, round: null,
        busy_ms: 10, emulated_step_ms: 40, window, group,
      });
    }
    await workerT.flush();
    if (window !== null) await until(() => moment.known.get(node)?.lastBoundaryMs === clock.monotonic() && before !== clock.monotonic(), `${node}'s boundary heard`);
  };
  return { moment, clock, boundary, close: async () => { moment.dispose(); await driverT.close(); await workerT.close(); } };
}

test('CutMoment: window boundaries from the batch telemetry; a cut waits for the moment every worker is stepping, then goes at once', async () => {
  const { moment, clock, boundary, close } = await tracker();
  try {
    // No cadence yet: nothing to wait for.
    assert.deepEqual(await moment.wait(5000), { waited_ms: 0, aligned: false, exchanging: [] });
    // fast: a window every 400 ms; slow: every 1000 ms (a sync group's members share boundaries; one member each here).
    await boundary('fast', 'fast', 0); await boundary('slow', 'slow', 0);
    clock.increment(400); await boundary('fast', 'fast', 1);
    clock.increment(400); await boundary('fast', 'fast', 2);
    clock.increment(200); await boundary('slow', 'slow', 1);
    clock.increment(200); await boundary('fast', 'fast', 3);
    // asp / bsp reports (no window) and a window's second batch are no boundaries.
    await boundary('asp', null, null);
    assert.equal(moment.known.has('asp'), false);
    assert.deepEqual([moment.known.get('fast')!.periodMs, moment.known.get('slow')!.periodMs], [400, 1000]);

    // Now (t = +1200): fast is 0 ms into its window, slow 200 ms into its 1000: both stepping (fraction 0.25).
    assert.deepEqual(await moment.wait(5000), { waited_ms: 0, aligned: true, exchanging: [] });

    // 150 ms later fast is exchanging (past 100 of its 400): the cut waits for fast's next boundary.
    clock.increment(150);
    let done: Awaited<ReturnType<CutMoment['wait']>> | null = null;
    void moment.wait(5000).then((r) => { done = r; });
    await new Promise((r) => setTimeout(r, 30));
    assert.equal(done, null, 'fast is exchanging: no cut yet');
    // At fast's boundary slow is 600 ms in (exchanging): still no cut.
    clock.increment(250); await boundary('fast', 'fast', 4);
    await new Promise((r) => setTimeout(r, 30));
    assert.equal(done, null, 'slow is exchanging now');
    // slow's boundary: fast is 200 ms in (exchanging); fast's next boundary then, with slow 200 ms in: both stepping.
    clock.increment(200); await boundary('slow', 'slow', 2);
    await new Promise((r) => setTimeout(r, 30));
    assert.equal(done, null);
    clock.increment(200); await boundary('fast', 'fast', 5);
    await until(() => done !== null, 'the cut once every worker is stepping');
    assert.deepEqual(done, { waited_ms: 650, aligned: true, exchanging: [] });
  } finally {
    await close();
  }
});

test('CutMoment: the wait is bounded (two of the longest period, at most the cap) and names who was still exchanging; idle workers do not count', async () => {
  const { moment, clock, boundary, close } = await tracker();
  try {
    await boundary('a', 'g', 0);
    clock.increment(500); await boundary('a', 'g', 1);
    await boundary('b', 'g2', 7);
    clock.increment(300); await boundary('b', 'g2', 8);
    // a: period 500, 300 ms in (exchanging); b: period 300, 0 ms in. b's next boundary would be at +300, a's at +200.
    clock.increment(150);
    let done: Awaited<ReturnType<CutMoment['wait']>> | null = null;
    void moment.wait(400).then((r) => { done = r; });
    await new Promise((r) => setTimeout(r, 30));
    assert.equal(done, null);
    clock.increment(400); // no boundary at all: the cap (400 < 2 × 500) ends the wait
    await until(() => done !== null, 'the bounded wait');
    assert.equal(done!.aligned, false);
    assert.equal(done!.waited_ms, 400);
    assert.deepEqual(done!.exchanging, ['a', 'b']);
    // Much later every worker is idle (paused, done): the cut goes at once.
    clock.increment(5_000);
    assert.deepEqual(await moment.wait(5000), { waited_ms: 0, aligned: false, exchanging: [] });
    // The same window number in another group after a regroup is a new boundary.
    await boundary('a', 'g3', 1);
    assert.equal(moment.known.get('a')!.lastBoundaryMs, clock.monotonic());
  } finally {
    await close();
  }
});
