/**
 * `hetps up --embedded` in hps mode: a sync group and an async group in one
 * process, with one emulated slow node. Every batch is acknowledged exactly
 * once, the model learns, and the summary reports the shards' staleness.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { FAST_AND_LOOSE_CLUSTER, hetps, smallHpsJobTail, tempDirForFile } from '../support/ps.ts';

const tempDir = tempDirForFile('hetps-hps-');

test('hetps up --embedded (hps): a sync group and an async group train every batch exactly once to a useful model', { timeout: 90_000 }, async () => {
  const cfg = join(tempDir(), 'hps.yaml');
  await writeFile(cfg, `job: { name: embhps, run_dir: ${JSON.stringify(join(tempDir(), 'runs'))} }
${FAST_AND_LOOSE_CLUSTER}nodes:
  w4: { emulate: { speed: 0.5 } }
${smallHpsJobTail()}`);
  const summaryFile = join(tempDir(), 'hps.json');
  const r = await hetps(['up', '--config', cfg, '--embedded', '--summary', summaryFile], { timeoutMs: 80_000 }).exited;
  assert.equal(r.code, 0, r.stderr.slice(-4000));
  const s = JSON.parse(await readFile(summaryFile, 'utf8')) as Record<string, unknown>;
  assert.equal(s.mode, 'hps');
  assert.equal(s.transport, 'embedded');
  assert.equal(s.batches, 20);
  assert.equal(s.batches_acked, 20, 'every batch acknowledged');
  assert.equal(s.duplicate_acks, 0, 'and each once');
  assert.equal(s.samples, 640);
  assert.ok((s.test_auc as number) > 0.85, `AUC ${String(s.test_auc)}`);
  const perWorker = s.per_worker as Record<string, number>;
  assert.deepEqual(Object.keys(perWorker).sort(), ['w1', 'w2', 'w3', 'w4'], 'every worker trained');
  assert.ok(!(s.not_active as string[]).some((l) => l.startsWith('training.mode') || l.startsWith('training.max_staleness')), 'hps and max_staleness are active');
  const st = s.staleness as { count: number; max_staleness: number | null; le: number[]; counts: number[]; refused: number };
  assert.ok(st !== null && st.count > 0, 'the summary has the shards\' staleness histogram');
  assert.equal(st.max_staleness, 8);
  assert.equal(st.counts.reduce((a, b) => a + b, 0), st.count);
  assert.deepEqual(s.emulated, { w4: 0.5 }, 'emulation is labelled in the results');
  assert.match(r.stderr, /hps: sync inside group fast \(w1, w2\)/);
  assert.match(r.stderr, /EMULATED heterogeneity \(not real hardware\)/);
});

test('hetps up --embedded (hps), max_staleness { dense: 0, sparse: 8 }: pushes behind the shard apply their rows without their dense part; the summary, the workers and the end-of-job line count them', { timeout: 90_000 }, async () => {
  const cfg = join(tempDir(), 'split.yaml');
  await writeFile(cfg, `job: { name: embsplit, run_dir: ${JSON.stringify(join(tempDir(), 'runs'))} }
${FAST_AND_LOOSE_CLUSTER}nodes:
  w4: { emulate: { speed: 0.5 } }
${smallHpsJobTail({ maxStaleness: '{ dense: 0, sparse: 8 }' })}`);
  const summaryFile = join(tempDir(), 'split.json');
  const r = await hetps(['up', '--config', cfg, '--embedded', '--summary', summaryFile], { timeoutMs: 80_000 }).exited;
  assert.equal(r.code, 0, r.stderr.slice(-4000));
  const s = JSON.parse(await readFile(summaryFile, 'utf8')) as Record<string, unknown>;
  assert.equal(s.batches_acked, 20, 'every batch acknowledged');
  assert.equal(s.duplicate_acks, 0);
  const st = s.staleness as { count: number; refused: number; dense_dropped: number; sparse_dropped: number; max_staleness: number; sparse_max_staleness: number };
  assert.deepEqual([st.max_staleness, st.sparse_max_staleness], [0, 8]);
  assert.ok(st.dense_dropped > 0, `some pushes were behind the shard and lost their dense part (${JSON.stringify(st)})`);
  assert.equal(st.sparse_dropped, 0);
  const perNode = (s.utilisation as { per_node: Record<string, { part_dropped: number; dropped_stale: number }> }).per_node;
  const partDropped = Object.values(perNode).reduce((n, w) => n + w.part_dropped, 0);
  assert.ok(partDropped > 0, `the workers' telemetry names the batches applied in part: ${JSON.stringify(perNode)}`);
  assert.match(r.stdout + r.stderr, /\d+ applied without their dense part and 0 without their rows/);
});
