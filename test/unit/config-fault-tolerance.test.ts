/**
 * `fault_tolerance.heartbeat_ms` and `dead_after_ms`: defaults, the resolved
 * values, and the rule that a node is dead only after missing heartbeats.
 */
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError } from '../../runtime/errors.ts';
import { parseConfig, type ConfigIssue, type FaultToleranceConfig } from '../../topology/mod.ts';

const FILE = 'job.yaml';
const BASE = `cluster:
  worker_groups:
    - name: g1
      nodes: [w1, w2]
  server_nodes: [s1]
model: { type: ctr }
data: { source: spam }
`;

function faultTolerance(section: string): FaultToleranceConfig {
  return parseConfig(BASE + section, FILE).fault_tolerance;
}

function issuesOf(text: string): ConfigIssue[] {
  try {
    parseConfig(text, FILE);
  } catch (e) {
    assert.ok(e instanceof ConfigError, `expected a ConfigError, got ${String(e)}`);
    return (e.data as { issues: ConfigIssue[] }).issues;
  }
  assert.fail('expected the config to be rejected');
}

describe('heartbeats', () => {
  test('defaults: a heartbeat every 250 ms, dead after 1000 ms without one', () => {
    const ft = faultTolerance('');
    assert.equal(ft.heartbeat_ms, 250);
    assert.equal(ft.dead_after_ms, 1000);
  });

  test('given values are kept', () => {
    const ft = faultTolerance('fault_tolerance: { heartbeat_ms: 100, dead_after_ms: 350 }\n');
    assert.deepEqual([ft.heartbeat_ms, ft.dead_after_ms], [100, 350]);
    assert.equal(ft.worker_recovery_timeout, 30, 'the other defaults are still filled');
  });

  test('dead_after_ms not above heartbeat_ms is an error naming both keys, at the key given', () => {
    const both = issuesOf(BASE + 'fault_tolerance: { heartbeat_ms: 500, dead_after_ms: 500 }\n');
    assert.deepEqual(both.map((i) => [i.path, i.line]), [['fault_tolerance.dead_after_ms', 8]]);
    assert.match(both[0]!.message, /fault_tolerance\.dead_after_ms \(500\) must be greater than fault_tolerance\.heartbeat_ms \(500\)/);

    const deadOnly = issuesOf(BASE + 'fault_tolerance:\n  dead_after_ms: 200\n');
    assert.deepEqual(deadOnly.map((i) => [i.path, i.line]), [['fault_tolerance.dead_after_ms', 9]]);
    assert.match(deadOnly[0]!.message, /fault_tolerance\.heartbeat_ms \(250, the default\)/);

    const heartbeatOnly = issuesOf(BASE + 'fault_tolerance:\n  heartbeat_ms: 2000\n');
    assert.deepEqual(heartbeatOnly.map((i) => [i.path, i.line]), [['fault_tolerance.heartbeat_ms', 9]]);
    assert.match(heartbeatOnly[0]!.message, /fault_tolerance\.dead_after_ms \(1000, the default\) must be greater than fault_tolerance\.heartbeat_ms \(2000\)/);
  });

  test('both must be positive integers', () => {
    for (const [key, bad] of [['heartbeat_ms', '0'], ['heartbeat_ms', '2.5'], ['dead_after_ms', '-1'], ['dead_after_ms', '"1s"']] as const) {
      const issues = issuesOf(BASE + `fault_tolerance: { ${key}: ${bad} }\n`);
      const issue = issues.find((i) => i.path === `fault_tolerance.${key}`);
      assert.ok(issue, `no issue at fault_tolerance.${key} for ${bad}: ${JSON.stringify(issues)}`);
      assert.match(issue.message, /must be a positive integer/);
    }
  });
});
