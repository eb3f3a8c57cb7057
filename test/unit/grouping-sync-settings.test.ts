/**
 * Sync settings for measured groups (syncSettingsForGroups) and the groups a
 * job starts with (planJobGroups): the fastest group syncs every
 * sync_steps, slower sync groups after proportionally fewer steps (every
 * group's window about the same wall time), and a much slower last group
 * runs async.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError } from '../../runtime/errors.ts';
import { groupNodes, groupSpeed, parseConfig, syncSettingsForGroups, type GroupCentroid, type NodeGroup, type NodeProfile } from '../../topology/mod.ts';
import { planJobGroups } from '../../actors/scheduler/job.ts';

function centroid(matmul: number, gather: number): GroupCentroid {
  return { matmul_gflops: matmul, gather_rows_per_s: gather, bandwidth_mbps: 10_000, memory_gb: 64, rtt_ms: 0.2, variance: 0.02 };
}
const group = (name: string, nodes: string[], matmul: number, gather = matmul * 10_000): NodeGroup => ({ name, nodes, centroid: centroid(matmul, gather) });

function profile(node: string, speed: number): NodeProfile {
  return {
    node, matmul_gflops: 200 * speed, gather_rows_per_s: 4e6 * speed, memory_gb: 64, cpus: 16, providers: ['cpu'], variance: 0.02,
    bandwidth_mbps: 10_000, rtt_ms: 0.3, step_ms_variance: null, emulated: speed !== 1, link: 'nats',
  };
}

test('the article\'s cluster: A100s sync every 4, V100s (2/3 as fast) every 3 (windows of about the same wall time), CPUs (a tenth) async', () => {
  const s = syncSettingsForGroups([group('g1', ['v1', 'v2'], 200), group('g0', ['a1', 'a2'], 300), group('g2', ['c1'], 30)], { syncSteps: 4 });
  assert.deepEqual(s.map((g) => [g.name, g.sync_mode, g.sync_steps]), [['g0', 'sync', 4], ['g1', 'sync', 3], ['g2', 'async', null]]);
  assert.deepEqual(s[0]!.nodes, ['a1', 'a2']);
  for (const g of s) assert.equal(g.accumulation_steps, null);
});

test('slower sync groups: round(base × relative speed), never below 1', () => {
  const s = syncSettingsForGroups([group('f', ['a'], 100), group('m', ['b'], 45), group('x', ['c'], 99), group('s', ['d'], 26)], { syncSteps: 8, asyncBelow: 0.25 });
  // 99/100 → round(7.92) = 8; 45/100 → round(3.6) = 4; 26/100 (slowest, above 0.25) → round(2.08) = 2.
  assert.deepEqual(s.map((g) => [g.name, g.sync_mode, g.sync_steps]), [['f', 'sync', 8], ['x', 'sync', 8], ['m', 'sync', 4], ['s', 'sync', 2]]);
  // The windows' wall time: steps / speed, within half a step of the fastest group's.
  for (const [g, speed] of [[s[1]!, 99], [s[2]!, 45], [s[3]!, 26]] as const) {
    assert.ok(Math.abs(g.sync_steps! / speed - 8 / 100) <= 0.5 / speed, `${g.name}: ${g.sync_steps} steps at speed ${speed}`);
  }
  const floor = syncSettingsForGroups([group('f', ['a'], 100), group('s', ['b'], 12)], { syncSteps: 2, asyncBelow: 0 });
  assert.deepEqual(floor.map((g) => [g.sync_mode, g.sync_steps]), [['sync', 2], ['sync', 1]], 'asyncBelow 0: never async; 0.12 × 2 rounds to 0, synced every step');
  const one = syncSettingsForGroups([group('f', ['a'], 100), group('m', ['b'], 60)], { syncSteps: 1 });
  assert.deepEqual(one.map((g) => g.sync_steps), [1, 1], 'a fastest group syncing every step: every group does');
});

test('only the slowest group goes async, and only below asyncBelow', () => {
  const s = syncSettingsForGroups([group('f', ['a'], 100), group('m', ['b'], 20), group('s', ['c'], 10)], { syncSteps: 4, asyncBelow: 0.25 });
  assert.deepEqual(s.map((g) => [g.name, g.sync_mode, g.sync_steps]), [['f', 'sync', 4], ['m', 'sync', 1], ['s', 'async', null]]);
  const atThreshold = syncSettingsForGroups([group('f', ['a'], 100), group('s', ['b'], 25)], { syncSteps: 4, asyncBelow: 0.25 });
  assert.deepEqual(atThreshold.map((g) => g.sync_mode), ['sync', 'sync'], 'exactly 0.25× is not below 0.25');
  const one = syncSettingsForGroups([group('only', ['a', 'b'], 5)], { syncSteps: 3 });
  assert.deepEqual(one.map((g) => [g.sync_mode, g.sync_steps]), [['sync', 3]], 'a single group syncs at base');
});

test('speed is the geometric mean of matmul and gather, as groups are ordered', () => {
  assert.equal(groupSpeed(centroid(100, 400)), 200);
  // Twice the matmul, half the gather: as fast.
  const s = syncSettingsForGroups([group('a', ['a'], 100, 400), group('b', ['b'], 200, 200)], { syncSteps: 4 });
  assert.deepEqual(s.map((g) => g.sync_steps), [4, 4]);
});

test('groups without a centroid (the YAML\'s) and bad options are ConfigErrors', () => {
  assert.throws(() => syncSettingsForGroups([{ name: 'g', nodes: ['a'], centroid: null }]), (e: Error) => e instanceof ConfigError && /no measured centroid/.test(e.message));
  assert.throws(() => syncSettingsForGroups([group('f', ['a'], 1)], { syncSteps: 0 }), ConfigError);
  assert.throws(() => syncSettingsForGroups([group('f', ['a'], 1)], { asyncBelow: 1 }), ConfigError);
});

test('measured groups from profiles: fast with fast, slow with slow, fed straight into the sync rule', () => {
  const g = groupNodes([profile('a', 1), profile('b', 1), profile('c', 0.25), profile('d', 0.25)], { k: 2 });
  const s = syncSettingsForGroups(g, { syncSteps: 8, asyncBelow: 0.2 });
  assert.deepEqual(s.map((x) => [x.nodes, x.sync_mode, x.sync_steps]), [[['a', 'b'], 'sync', 8], [['c', 'd'], 'sync', 2]]);
});

test('planJobGroups: the YAML\'s groups as written, else cluster.grouping applied to the profiles', () => {
  const md = 'model: { type: ctr }\ndata: { source: spam }\n';
  const yamlGroups = parseConfig(`cluster:\n  worker_groups:\n    - { name: fast, nodes: [a, b], sync_steps: 3 }\n  server_nodes: [s]\n${md}`, 'j.yaml');
  const fromYaml = planJobGroups(yamlGroups, []);
  assert.equal(fromYaml.criterion, 'config');
  assert.deepEqual(fromYaml.groups.map((x) => [x.name, x.nodes, x.sync_steps, x.centroid]), [['fast', ['a', 'b'], 3, null]]);

  const measured = parseConfig(`cluster:\n  worker_nodes: [a, b, c, d]\n  grouping: { k_range: [2, 3], sync_steps: 3, async_below: 0.5 }\n  server_nodes: [s]\n${md}`, 'j.yaml');
  const profiles = [profile('d', 0.3), profile('a', 1), profile('c', 0.3), profile('b', 1)];
  const p = planJobGroups(measured, profiles);
  assert.equal(p.criterion, 'silhouette');
  assert.equal(p.k, 2, p.reason);
  assert.deepEqual(p.groups.map((x) => [x.name, x.nodes, x.sync_mode, x.sync_steps]), [['g0', ['a', 'b'], 'sync', 3], ['g1', ['c', 'd'], 'async', null]]);
  assert.ok(p.groups.every((x) => x.centroid !== null));
  assert.deepEqual(p.profiles.map((x) => x.node), ['a', 'b', 'c', 'd']);
});
