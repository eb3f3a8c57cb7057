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
