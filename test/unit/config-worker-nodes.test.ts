/**
 * `cluster.worker_nodes`, `cluster.grouping` and `cluster.profiling`: workers
 * listed without groups (hps groups them by their measured profiles at
 * start), the grouping settings, and every way to get them wrong, each
 * reported at its place in the file.
 */
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import {
  DEFAULT_GROUPING_CONFIG, DEFAULT_PROFILING_CONFIG, allWorkerNodes, groupingOptionsFromConfig, groupsMeasuredAtStart, inactiveSettings, loadConfig,
  nodeOverrides, parseConfig,
  type HetpsConfig,
} from '../../topology/mod.ts';
import { lineOf, rejectedConfig } from '../support/config.ts';

const FILE = 'job.yaml';
const MODEL_AND_DATA = `model: { type: ctr }
data: { source: spam }
`;

/** Workers without groups, every grouping key set. */
const MEASURED = `cluster:
  worker_nodes: [a, b, c, d]
  grouping:
    k: 2
    seed: 7
    sync_steps: 3
    async_below: 0.3
  profiling: { probe_seconds: 0.2, republish_seconds: 10 }
  server_nodes: [s1]
nodes:
  c: { emulate: { speed: 0.25 } }
${MODEL_AND_DATA}`;

function parse(text: string): HetpsConfig { return parseConfig(text, FILE); }



/** The config is rejected with an issue at `path` containing every word, on `line`, shown as `job.yaml:line:col: path: message`. */
function expectIssue(text: string, want: { path: string; words: string[]; line: number }): void {
  const { error, issues } = rejectedConfig(text);
  const issue = issues.find((i) => i.path === want.path && want.words.every((w) => i.message.includes(w)));
  assert.ok(issue, `no issue at ${want.path} with ${JSON.stringify(want.words)}; got:\n${error.message}`);
  assert.equal(issue.line, want.line, `line of ${want.path}: ${error.message}`);
  assert.ok(error.message.includes(`${FILE}:${issue.line}:${issue.column}: ${issue.path}: ${issue.message}`), `shown in place:\n${error.message}`);
}

describe('accepted', () => {
  test('worker_nodes with every grouping and profiling key', () => {
    const c = parse(MEASURED);
    assert.deepEqual(c.cluster.worker_nodes, ['a', 'b', 'c', 'd']);
    assert.deepEqual(c.cluster.worker_groups, []);
    assert.deepEqual(c.cluster.grouping, { k: 2, k_range: [3, 5], seed: 7, sync_steps: 3, async_below: 0.3 });
    assert.deepEqual(c.cluster.profiling, { probe_seconds: 0.2, republish_seconds: 10 });
    assert.equal(groupsMeasuredAtStart(c), true);
    assert.deepEqual(groupingOptionsFromConfig(c), { k: 2, kRange: [3, 5], seed: 7 });
    assert.deepEqual(nodeOverrides(c, 'c').emulate, { speed: 0.25, bandwidth_mbps: null, link: 'hold' }, 'overrides for a worker of worker_nodes');
  });

  test('ungrouped workers are workers: allWorkerNodes lists them with null group fields', () => {
    const c = parse(MEASURED);
    assert.deepEqual(allWorkerNodes(c).map((w) => [w.name, w.group, w.rank, w.groupSize, w.syncMode]), [
      ['a', null, null, null, null], ['b', null, null, null, null], ['c', null, null, null, null], ['d', null, null, null, null],
    ]);
  });

  test('defaults: k by silhouette in 3–5, sync_steps 4, async below 0.25, a 0.5 s probe republished every 30 s', () => {
    const c = parse(`cluster: { worker_nodes: [a, b], server_nodes: [s1] }\n${MODEL_AND_DATA}`);
    assert.deepEqual(c.cluster.grouping, { ...DEFAULT_GROUPING_CONFIG, k_range: [3, 5] });
    assert.equal(c.cluster.grouping.k, null);
    assert.equal(c.cluster.grouping.sync_steps, 4);
    assert.deepEqual(c.cluster.profiling, { ...DEFAULT_PROFILING_CONFIG });
  });

  test('k: null means "choose it", and k_range may be given then', () => {
    const c = parse(`cluster:\n  worker_nodes: [a, b, c]\n  grouping: { k: null, k_range: [2, 4] }\n  server_nodes: [s1]\n${MODEL_AND_DATA}`);
    assert.equal(c.cluster.grouping.k, null);
    assert.deepEqual(c.cluster.grouping.k_range, [2, 4]);
  });

  test('a k_range reaching past the number of workers is fine (clamped when grouping), k equal to it too', () => {
    assert.deepEqual(parse(`cluster:\n  worker_nodes: [a, b]\n  grouping: { k_range: [3, 5] }\n  server_nodes: [s1]\n${MODEL_AND_DATA}`).cluster.grouping.k_range, [3, 5]);
    assert.equal(parse(`cluster:\n  worker_nodes: [a, b]\n  grouping: { k: 2 }\n  server_nodes: [s1]\n${MODEL_AND_DATA}`).cluster.grouping.k, 2);
  });

  test('worker_nodes next to worker_groups is fine when every one of them is in a group: the YAML groups win', () => {
    const c = parse(`cluster:
  worker_groups:
    - { name: g1, nodes: [a, b] }
    - { name: g2, nodes: [c] }
  worker_nodes: [a, c]
  server_nodes: [s1]
${MODEL_AND_DATA}`);
    assert.deepEqual(allWorkerNodes(c).map((w) => [w.name, w.group]), [['a', 'g1'], ['b', 'g1'], ['c', 'g2']]);
    assert.equal(groupsMeasuredAtStart(c), false);
  });

  test('examples/auto-groups.yaml parses: five workers to group by measurement, nothing inactive', async () => {
    const c = await loadConfig('examples/auto-groups.yaml');
    assert.equal(c.cluster.worker_nodes.length, 5);
    assert.deepEqual(c.cluster.worker_groups, []);
    assert.equal(groupsMeasuredAtStart(c), true);
    assert.deepEqual(inactiveSettings(c), []);
  });

  test('asp and bsp take worker_nodes too (no groups; the workers still publish profiles)', () => {
    const c = parse(`cluster: { worker_nodes: [a, b], server_nodes: [s1] }\ntraining: { mode: asp }\n${MODEL_AND_DATA}`);
    assert.equal(allWorkerNodes(c).length, 2);
    assert.equal(groupsMeasuredAtStart(c), false, 'only hps groups');
  });
});

describe('rejected, each at its place', () => {
  test('no workers at all', () => {
    const text = `cluster:\n  server_nodes: [s1]\n${MODEL_AND_DATA}`;
    expectIssue(text, { path: 'cluster.worker_groups', words: ['is required', 'cluster.worker_nodes'], line: 1 });
  });

  test('an empty worker_nodes', () => {
    const text = `cluster:\n  worker_nodes: []\n  server_nodes: [s1]\n${MODEL_AND_DATA}`;
    expectIssue(text, { path: 'cluster.worker_nodes', words: ['at least one node'], line: 2 });
  });

  test('a node listed twice in worker_nodes, or also as a server', () => {
    const twice = `cluster:\n  worker_nodes: [a, b, a]\n  server_nodes: [s1]\n${MODEL_AND_DATA}`;
    expectIssue(twice, { path: 'cluster.worker_nodes[2]', words: ['duplicate node name "a"', 'cluster.worker_nodes[0]'], line: 2 });
    const server = `cluster:\n  worker_nodes: [a, b]\n  server_nodes: [b]\n${MODEL_AND_DATA}`;
    expectIssue(server, { path: 'cluster.server_nodes[0]', words: ['duplicate node name "b"', 'cluster.worker_nodes[1]'], line: 3 });
  });

  test('a bad node name in worker_nodes', () => {
    const text = `cluster:\n  worker_nodes: [a, "b.c"]\n  server_nodes: [s1]\n${MODEL_AND_DATA}`;
    expectIssue(text, { path: 'cluster.worker_nodes[1]', words: ['"b.c"', 'subject tokens'], line: 2 });
  });

  test('worker_nodes and worker_groups with a worker in no group: both keys named', () => {
    const text = `cluster:
  worker_groups:
    - { name: g1, nodes: [a, b] }
  worker_nodes: [a, x]
  server_nodes: [s1]
${MODEL_AND_DATA}`;
    expectIssue(text, { path: 'cluster.worker_nodes[1]', words: ['"x" is in no group', 'cluster.worker_groups', 'cluster.worker_nodes'], line: lineOf(text, 'worker_nodes') });
  });

  test('grouping with worker_groups (the YAML groups are used as written)', () => {
    const text = `cluster:
  worker_groups:
    - { name: g1, nodes: [a, b] }
  grouping: { k: 2 }
  server_nodes: [s1]
${MODEL_AND_DATA}`;
    expectIssue(text, { path: 'cluster.grouping', words: ['only applies to workers grouped by measurement'], line: lineOf(text, 'grouping') });
  });

  test('grouping outside hps', () => {
    const text = `cluster:\n  worker_nodes: [a, b]\n  grouping: { k: 2 }\n  server_nodes: [s1]\ntraining: { mode: bsp }\n${MODEL_AND_DATA}`;
    expectIssue(text, { path: 'cluster.grouping', words: ['training.mode hps', 'bsp'], line: 3 });
  });

  test('k larger than the number of workers is refused', () => {
    const text = `cluster:\n  worker_nodes: [a, b, c]\n  grouping:\n    k: 4\n  server_nodes: [s1]\n${MODEL_AND_DATA}`;
    expectIssue(text, { path: 'cluster.grouping.k', words: ['k 4', '3 workers', 'at most 3'], line: 4 });
  });

  test('k that is not a positive integer', () => {
    for (const bad of ['0', '1.5', '"two"']) {
      const text = `cluster:\n  worker_nodes: [a, b, c]\n  grouping:\n    k: ${bad}\n  server_nodes: [s1]\n${MODEL_AND_DATA}`;
      expectIssue(text, { path: 'cluster.grouping.k', words: ['must be a positive integer'], line: 4 });
    }
  });

  test('k and k_range together', () => {
    const text = `cluster:\n  worker_nodes: [a, b, c]\n  grouping:\n    k: 2\n    k_range: [2, 3]\n  server_nodes: [s1]\n${MODEL_AND_DATA}`;
    expectIssue(text, { path: 'cluster.grouping.k_range', words: ['only applies when k is left out'], line: 5 });
  });

  test('k_range: not two positive integers, or low above high', () => {
    const three = `cluster:\n  worker_nodes: [a, b, c]\n  grouping:\n    k_range: [2, 3, 4]\n  server_nodes: [s1]\n${MODEL_AND_DATA}`;
    expectIssue(three, { path: 'cluster.grouping.k_range', words: ['two positive integers'], line: 4 });
    const zero = `cluster:\n  worker_nodes: [a, b, c]\n  grouping:\n    k_range: [0, 3]\n  server_nodes: [s1]\n${MODEL_AND_DATA}`;
    expectIssue(zero, { path: 'cluster.grouping.k_range[0]', words: ['positive integer'], line: 4 });
    const backwards = `cluster:\n  worker_nodes: [a, b, c]\n  grouping:\n    k_range: [5, 3]\n  server_nodes: [s1]\n${MODEL_AND_DATA}`;
    expectIssue(backwards, { path: 'cluster.grouping.k_range', words: ['low ≤ high', '[5, 3]'], line: 4 });
  });

  test('sync_steps, async_below, seed out of range', () => {
    const base = (kv: string) => `cluster:\n  worker_nodes: [a, b, c]\n  grouping:\n    ${kv}\n  server_nodes: [s1]\n${MODEL_AND_DATA}`;
    expectIssue(base('sync_steps: 0'), { path: 'cluster.grouping.sync_steps', words: ['positive integer'], line: 4 });
    expectIssue(base('async_below: 1'), { path: 'cluster.grouping.async_below', words: ['[0, 1)'], line: 4 });
    expectIssue(base('seed: -1'), { path: 'cluster.grouping.seed', words: ['integer from 0'], line: 4 });
  });

  test('an unknown grouping key gets a suggestion', () => {
    const text = `cluster:\n  worker_nodes: [a, b, c]\n  grouping:\n    sync_step: 2\n  server_nodes: [s1]\n${MODEL_AND_DATA}`;
    expectIssue(text, { path: 'cluster.grouping.sync_step', words: ['unknown key', 'did you mean `sync_steps`'], line: 4 });
  });

  test('profiling out of range', () => {
    const base = (kv: string) => `cluster:\n  worker_nodes: [a, b]\n  profiling:\n    ${kv}\n  server_nodes: [s1]\n${MODEL_AND_DATA}`;
    expectIssue(base('probe_seconds: 0'), { path: 'cluster.profiling.probe_seconds', words: ['(0, 30]'], line: 4 });
    expectIssue(base('probe_seconds: 60'), { path: 'cluster.profiling.probe_seconds', words: ['(0, 30]'], line: 4 });
    expectIssue(base('republish_seconds: -1'), { path: 'cluster.profiling.republish_seconds', words: ['≥ 0'], line: 4 });
  });

  test('overrides for a node that is in no list name worker_nodes among the places looked', () => {
    const text = `cluster:\n  worker_nodes: [a, b]\n  server_nodes: [s1]\nnodes:\n  z: { threads: 1 }\n${MODEL_AND_DATA}`;
    expectIssue(text, { path: 'nodes.z', words: ['unknown node "z"', 'cluster.worker_nodes'], line: 5 });
  });
});
