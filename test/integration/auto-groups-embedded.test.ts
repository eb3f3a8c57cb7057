/**
 * `hetps up --embedded` with `cluster.worker_nodes`: the workers are listed
 * without groups, each profiles itself when it joins, and the driver groups
 * them by those profiles before training starts: the two emulated fast
 * workers together, the two slow ones together, each group with the sync
 * settings of syncSettingsForGroups. Every batch is still acknowledged once.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { hetps, smallHpsJobTail, tempDirForFile } from '../support/ps.ts';

const tempDir = tempDirForFile('hetps-autogroups-');

test('hetps up --embedded (hps) with worker_nodes: grouped by measured profiles, fast with fast and slow with slow, every batch once', { timeout: 60_000 }, async () => {
  const cfg = join(tempDir(), 'auto.yaml');
  await writeFile(cfg, `job: { name: autogrp, run_dir: ${JSON.stringify(join(tempDir(), 'runs'))} }
cluster:
  worker_nodes: [w1, w2, w3, w4]
  grouping: { k: 2, sync_steps: 8 }
  profiling: { probe_seconds: 0.3 }
  server_nodes: [s1, s2]
nodes:
  w1: { emulate: { speed: 1.0 } }
  w2: { emulate: { speed: 0.25 } }
  w3: { emulate: { speed: 1.0 } }
  w4: { emulate: { speed: 0.25 } }
${smallHpsJobTail()}`);
  const summaryFile = join(tempDir(), 'auto.json');
  const r = await hetps(['up', '--config', cfg, '--embedded', '--summary', summaryFile], { timeoutMs: 55_000 }).exited;
  assert.equal(r.code, 0, r.stderr.slice(-4000));
  const s = JSON.parse(await readFile(summaryFile, 'utf8')) as Record<string, unknown>;
  assert.equal(s.transport, 'embedded');

  type Group = { name: string; nodes: string[]; sync_mode: string; sync_steps: number | null; centroid: { matmul_gflops: number } | null };
  type Profile = { node: string; matmul_gflops: number; emulated: boolean; rtt_ms: number; bandwidth_mbps: number };
  const grouping = s.grouping as { k: number; criterion: string; score: number | null; groups: Group[]; profiles: Profile[] };
  assert.equal(grouping.criterion, 'fixed', 'grouping.k fixes the number of groups');
  assert.equal(grouping.k, 2);
  assert.deepEqual(grouping.groups.map((g) => g.nodes), [['w1', 'w3'], ['w2', 'w4']], 'fast together (first), slow together');
  assert.ok(grouping.score !== null && grouping.score > 0.5, `a clear split: silhouette ${grouping.score}`);
  // The profiles the groups came from: compute scaled by emulate.speed, labelled.
  const byNode = Object.fromEntries(grouping.profiles.map((p) => [p.node, p]));
  assert.deepEqual(Object.keys(byNode).sort(), ['w1', 'w2', 'w3', 'w4']);
  const ratio = byNode.w2!.matmul_gflops / byNode.w1!.matmul_gflops;
  assert.ok(Math.abs(ratio - 0.25) < 0.01, `speed 0.25 shows in the profile: ${ratio}`);
  assert.equal(byNode.w2!.emulated, true);
  // The sync rule: the fastest group at grouping.sync_steps, the quarter-speed one after a quarter as many steps
  // (its window about as long in wall time; not below 0.25×, so not async).
  assert.deepEqual(grouping.groups.map((g) => [g.sync_mode, g.sync_steps]), [['sync', 8], ['sync', 2]]);

  assert.equal(s.batches, 20);
  assert.equal(s.batches_acked, 20, 'every batch acknowledged');
  assert.equal(s.duplicate_acks, 0, 'and each once');
  const perGroup = s.per_worker_group as Record<string, Record<string, number>>;
  const [fast, slow] = grouping.groups;
  for (const w of ['w1', 'w3']) assert.deepEqual(Object.keys(perGroup[w] ?? {}), [fast!.name], `${w} trained in the fast group`);
  for (const w of ['w2', 'w4']) for (const gname of Object.keys(perGroup[w] ?? {})) assert.equal(gname, slow!.name, `${w} trained in the slow group`);
  assert.match(r.stderr, /waiting for profiles: \d\/4/);
  assert.match(r.stderr, /worker groups \(measured: k=2 by fixed/);
});
