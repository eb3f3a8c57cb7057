/** When to regroup (persistent slowdown only) and which nodes a regroup moves. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  INITIAL_DEGRADATION_STATE, baselineStepMs, detectDegradation, medianOf, needsRejoin, noteRegrouped, regroupPlan, slowedProfile, standbyReplacement,
  type DegradationReport, type DegradationState,
} from '../../topology/regroup.ts';
import { groupNodes, type NodeProfile } from '../../topology/grouping.ts';

/**
 * Replays a step-time series: every node takes one step per `stepMs` of its
 * own, and the detector checks once a second. Returns every report.
 */
function replay(series: Record<string, (t: number) => number>, seconds: number, policy = {}): DegradationReport[] {
  const steps: Record<string, number[]> = Object.fromEntries(Object.keys(series).map((n) => [n, []]));
  const baseline: Record<string, number> = {};
  let state: DegradationState = INITIAL_DEGRADATION_STATE;
  const reports: DegradationReport[] = [];
  const due: Record<string, number> = Object.fromEntries(Object.keys(series).map((n) => [n, 0]));
  for (let now = 0; now <= seconds * 1000; now += 10) {
    for (const [node, stepAt] of Object.entries(series)) {
      while (due[node]! <= now) {
        const ms = stepAt(due[node]!);
        steps[node]!.push(ms);
        due[node]! += ms;
      }
      if (baseline[node] === undefined) {
        const first = baselineStepMs(steps[node]!); // the first window's median
        if (first !== null) baseline[node] = first;
      }
    }
    if (now % 1000 !== 0) continue;
    const r = detectDegradation(
      Object.keys(series).map((node) => ({ node, baselineMs: baseline[node] ?? NaN, stepMs: steps[node]! })),
      now, state, policy,
    );
    state = r.state;
    reports.push(r);
  }
  return reports;
}

const steady = () => 100;

test('one very slow step does not trigger', () => {
  const reports = replay({ a: steady, b: (t) => (t >= 10_000 && t < 10_100 ? 5_000 : 100) }, 90);
  assert.ok(reports.every((r) => r.degraded.length === 0 && r.suspect.length === 0 && !r.shouldRegroup));
});

test('a short burst of slow steps (under half the window) does not trigger', () => {
  const reports = replay({ a: steady, b: (t) => (t >= 10_000 && t < 12_000 ? 400 : 100) }, 90);
  assert.ok(reports.every((r) => !r.shouldRegroup && r.degraded.length === 0));
});

test('a slowdown that passes within the sustain time is only suspected, never degraded', () => {
  // 3× slower for 20 s (< 30 s sustain), then back.
  const reports = replay({ a: steady, b: (t) => (t >= 10_000 && t < 30_000 ? 300 : 100) }, 120);
  assert.ok(reports.some((r) => r.suspect.some((s) => s.node === 'b')), 'seen as slow for a while');
  assert.ok(reports.every((r) => !r.shouldRegroup));
  assert.deepEqual(reports.at(-1)!.state.slowSince, {}, 'recovered: the slow mark is cleared');
});

test('a sustained slowdown triggers once it has lasted sustainMs', () => {
  // Throttled to 2× from t=20 s on.
  const reports = replay({ a: steady, b: (t) => (t >= 20_000 ? 200 : 100) }, 90);
  const first = reports.findIndex((r) => r.shouldRegroup);
  assert.ok(first >= 0, 'triggers');
  const firstSlow = reports.findIndex((r) => r.suspect.length > 0);
  // Median of 20 moves once 11 slow steps are in (~22 s of 200 ms steps), then 30 s of sustain.
  assert.ok(firstSlow >= 21 && firstSlow <= 24, `slow from ${firstSlow} s`);
  assert.equal(first - firstSlow, 30);
  const r = reports[first]!;
  assert.deepEqual(r.degraded.map((d) => d.node), ['b']);
  assert.equal(r.degraded[0]!.ratio, 2);
  assert.ok(r.degraded[0]!.slowForMs >= 30_000);
});

test('a slowdown below the threshold never triggers', () => {
  const reports = replay({ a: steady, b: (t) => (t >= 10_000 ? 140 : 100) }, 120);
  assert.ok(reports.every((r) => r.suspect.length === 0 && !r.shouldRegroup));
});

test('thresholds are configurable', () => {
  const reports = replay({ b: (t) => (t >= 10_000 ? 140 : 100) }, 60, { threshold: 0.2, window: 10, sustainMs: 5_000 });
  assert.ok(reports.some((r) => r.shouldRegroup));
});

test('no regroup during the cooldown after one', () => {
  const slow = [{ node: 'b', baselineMs: 100, stepMs: Array(20).fill(300) }];
  let state = detectDegradation(slow, 0).state;
  let r = detectDegradation(slow, 30_000, state);
  assert.equal(r.shouldRegroup, true);
  state = noteRegrouped(r.state, 30_000);
  // The caller did not rebaseline b: it is slow again, sustained, but inside the cooldown.
  state = detectDegradation(slow, 31_000, state).state;
  r = detectDegradation(slow, 70_000, state);
  assert.equal(r.degraded.length, 1);
  assert.equal(r.shouldRegroup, false);
  r = detectDegradation(slow, 160_000, r.state);
  assert.equal(r.shouldRegroup, true);
});

test('nodes without a full window or a baseline are not judged', () => {
  const r = detectDegradation([
    { node: 'new', baselineMs: 100, stepMs: Array(5).fill(1_000) },
    { node: 'nobase', baselineMs: NaN, stepMs: Array(30).fill(1_000) },
  ], 0);
  assert.deepEqual([r.degraded, r.suspect], [[], []]);
  assert.equal(baselineStepMs([1, 2, 3], 20), null);
  assert.equal(medianOf([5, 1, 3, 100]), 4);
});

function p(node: string, gflops: number): NodeProfile {
  return {
    node, matmul_gflops: gflops, gather_rows_per_s: gflops * 2e4, memory_gb: 32, cpus: 8, providers: ['cpu'], variance: 0.02,
    bandwidth_mbps: 10_000, rtt_ms: 0.3, step_ms_variance: null, emulated: false, link: 'nats',
  };
}

test('regroupPlan: renamed but identical groups move nothing', () => {
  const plan = regroupPlan(
    [{ name: 'g0', nodes: ['a', 'b'], centroid: null }, { name: 'g1', nodes: ['c'], centroid: null }],
    [{ name: 'g1', nodes: ['a', 'b'], centroid: null }, { name: 'g0', nodes: ['c'], centroid: null }],
  );
  assert.deepEqual(plan, { moves: [], stay: ['a', 'b', 'c'], continues: { g0: 'g1', g1: 'g0' }, changed: false });
});

test('regroupPlan: a throttled fast node moves to the slow group, others stay', () => {
  const profiles = [p('f1', 400), p('f2', 410), p('f3', 390), p('m1', 100), p('m2', 95), p('m3', 105), p('s1', 20), p('s2', 21)];
  const before = groupNodes(profiles, { seed: 1 });
  assert.deepEqual(before.groups.map((g) => g.nodes), [['f1', 'f2', 'f3'], ['m1', 'm2', 'm3'], ['s1', 's2']]);
  // The detector says f2 runs 20× slower now.
  const after = groupNodes(profiles.map((x) => (x.node === 'f2' ? slowedProfile(x, 20) : x)), { seed: 1 });
  const plan = regroupPlan(before, after);
  assert.deepEqual(plan.moves, [{ node: 'f2', from: 'g0', to: 'g2' }]);
  assert.equal(plan.changed, true);
  assert.deepEqual(plan.stay, ['f1', 'f3', 'm1', 'm2', 'm3', 's1', 's2']);
});

test('regroupPlan: nodes that join or leave show as moves from or to null', () => {
  const plan = regroupPlan(
    [{ name: 'g0', nodes: ['a', 'gone'], centroid: null }],
    [{ name: 'g0', nodes: ['a', 'new'], centroid: null }],
  );
  assert.deepEqual(plan.moves, [{ node: 'gone', from: 'g0', to: null }, { node: 'new', from: null, to: 'g0' }]);
  assert.deepEqual(plan.stay, ['a']);
});

test('needsRejoin: only a member of a group that reduces together, with others in it, is taken back by a re-form', () => {
  const groups = [
    { name: 'fast', nodes: ['w1', 'w2'], sync_mode: 'sync' },
    { name: 'mid', nodes: ['w3', 'w4'], sync_mode: 'adaptive' },
    { name: 'slow', nodes: ['w5', 'w6'], sync_mode: 'async' },
    { name: 'solo', nodes: ['w7'], sync_mode: 'sync' },
  ];
  assert.deepEqual(['w1', 'w2', 'w3', 'w4', 'w5', 'w6', 'w7', 'w9'].map((n) => needsRejoin(groups, n)), [true, true, true, true, false, false, false, false]);
});

test('standbyReplacement: the first live standby takes the dead member\'s place in its group; the dead one becomes a standby', () => {
  const m = {
    groups: [{ name: 'fast', nodes: ['w1', 'w2'], sync_mode: 'sync' }, { name: 'slow', nodes: ['w3', 'w4'], sync_mode: 'async' }],
    workers: ['w1', 'w2', 'w3', 'w4'],
    standbys: ['s5', 's6'],
  };
  const r = standbyReplacement(m, 'w2', (n) => n !== 's5');
  assert.ok(r);
  assert.equal(r.standby, 's6');
  assert.equal(r.group, 'fast');
  assert.deepEqual(r.membership.groups.map((g) => [g.name, g.nodes, g.sync_mode]), [['fast', ['w1', 's6'], 'sync'], ['slow', ['w3', 'w4'], 'async']]);
  assert.deepEqual(r.membership.workers, ['w1', 's6', 'w3', 'w4']);
  assert.deepEqual(r.membership.standbys, ['s5', 'w2']);
  assert.deepEqual(m.groups[0]!.nodes, ['w1', 'w2'], 'the input is not changed');
  assert.equal(standbyReplacement(m, 'w2', () => false), null, 'no live standby');
  assert.equal(standbyReplacement(m, 'w9', () => true), null, 'not a member of any group');
  assert.equal(standbyReplacement({ ...m, standbys: [] }, 'w1', () => true), null, 'no standby at all');
});
