import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { NODE_PROCESS_FLAGS, NodeProcesses } from '../../deploy/node-processes.ts';

test('node processes start with the V8 flags hetps tunes them with (a 64 MiB young generation semi-space)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'hetps-node-processes-'));
  const procs = new NodeProcesses(dir, () => {});
  try {
    // `launch --help` exits at once: enough to see how the process was started.
    const node = procs.start({ name: 'w1', role: 'worker', args: ['--help'] });
    await node.exited;
    for (const flag of NODE_PROCESS_FLAGS) assert.ok(node.child.spawnargs.includes(flag), `spawned with ${node.child.spawnargs.join(' ')}`);
    assert.equal(node.exit?.code, 0, readFileSync(join(dir, 'w1.log'), 'utf8'));
  } finally {
    procs.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the flags take effect: under allocation pressure the young generation grows past V8\'s default (2 × 16 MiB) to 2 × 64 MiB', () => {
  // Short-lived objects in bulk, as a shard decoding pushes makes them; then the new space's size.
  const program = "const v8 = require('node:v8'); let keep = []; for (let i = 0; i < 3e6; i++) { keep.push({ a: i, b: [i, i] }); if (keep.length > 2e5) keep = []; }"
    + " process.stdout.write(String(v8.getHeapSpaceStatistics().find((s) => s.space_name === 'new_space').space_size));";
  const newSpace = (flags: readonly string[]) => {
    const r = spawnSync(process.execPath, [...flags, '-e', program], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    return Number(r.stdout);
  };
  const tuned = newSpace(NODE_PROCESS_FLAGS);
  assert.equal(tuned, 2 * 64 * 2 ** 20);
  assert.ok(newSpace([]) < tuned);
});
