/**
 * `workerGroupSchema`: the one declaration of a worker group, read from the
 * YAML and from a group as the job runs it (job info, regrouping).
 */
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { parseConfig, workerGroupSchema, type WorkerGroupConfig } from '../../topology/mod.ts';

describe('workerGroupSchema', () => {
  test('each sync_mode gets its own setting, defaulting to 4; the others are null', () => {
    const parse = (g: object): WorkerGroupConfig => workerGroupSchema.parse({ name: 'g', nodes: ['a'], ...g });
    assert.deepEqual(parse({}), { name: 'g', nodes: ['a'], sync_mode: 'sync', sync_steps: 4, accumulation_steps: null, adaptive_threshold: null });
    assert.equal(parse({ sync_mode: 'accumulation' }).accumulation_steps, 4);
    assert.equal(parse({ sync_mode: 'adaptive', adaptive_threshold: 2 }).adaptive_threshold, 2);
    assert.deepEqual(parse({ sync_mode: 'async' }), { name: 'g', nodes: ['a'], sync_mode: 'async', sync_steps: null, accumulation_steps: null, adaptive_threshold: null });
  });

  test('a group as the job runs it (null settings written out) parses to itself', () => {
    const running: WorkerGroupConfig = { name: 'slow', nodes: ['w3', 'w4'], sync_mode: 'sync', sync_steps: 6, accumulation_steps: null, adaptive_threshold: null };
    assert.deepEqual(workerGroupSchema.parse(running), running);
  });

  test('the config\'s groups are what the schema makes of the YAML\'s', () => {
    const c = parseConfig(`cluster:
  worker_groups:
    - { name: a, nodes: [a1, a2], sync_steps: 8 }
    - { name: b, nodes: [b1], sync_mode: adaptive }
  server_nodes: [s1]
model: { type: ctr }
data: { source: spam }
`, 'job.yaml');
    assert.deepEqual(c.cluster.worker_groups, [
      workerGroupSchema.parse({ name: 'a', nodes: ['a1', 'a2'], sync_steps: 8 }),
      workerGroupSchema.parse({ name: 'b', nodes: ['b1'], sync_mode: 'adaptive' }),
    ]);
  });

  test('unknown keys, empty node lists and names that are no subject tokens are refused', () => {
    assert.equal(workerGroupSchema.safeParse({ name: 'g', nodes: ['a'], syncSteps: 2 }).success, false);
    assert.equal(workerGroupSchema.safeParse({ name: 'g', nodes: [] }).success, false);
    assert.equal(workerGroupSchema.safeParse({ name: 'g.1', nodes: ['a'] }).success, false);
    assert.equal(workerGroupSchema.safeParse({ name: 'g', nodes: ['a'], sync_mode: 'bsp' }).success, false);
  });
});
