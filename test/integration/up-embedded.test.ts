/**
 * `hetps up` without NATS: every node of the YAML in one process on the
 * in-process bus, forced with --embedded or chosen because no nats-server is
 * installed (with a warning).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { hetps, writeJobConfig, tempDirForFile } from '../support/ps.ts';

const tempDir = tempDirForFile('hetps-embedded-');

test('hetps up --embedded (bsp) runs the shards and workers in one process and writes the summary', { timeout: 60_000 }, async () => {
  const cfg = await writeJobConfig(tempDir(), { job: 'embbsp', mode: 'bsp', servers: null, runDir: join(tempDir(), 'runs'), samples: 640, epochs: 1, workerRecoveryTimeoutS: 10 });
  const summaryFile = join(tempDir(), 'bsp.json');
  const r = await hetps(['up', '--config', cfg, '--embedded', '--summary', summaryFile], { timeoutMs: 50_000 }).exited;
  assert.equal(r.code, 0, r.stderr.slice(-3000));
  const s = JSON.parse(await readFile(summaryFile, 'utf8')) as Record<string, unknown>;
  assert.equal(s.transport, 'embedded');
  assert.equal(s.mode, 'bsp');
  assert.equal(s.batches, 20);
  assert.equal(s.batches_acked, 20);
  assert.equal(s.duplicate_acks, 0);
  assert.equal(s.samples, 640);
  assert.ok((s.test_auc as number) > 0.9, `AUC ${String(s.test_auc)}`);
  for (const k of ['samples_per_s', 'test_logloss', 'wall_s']) assert.ok(typeof s[k] === 'number' && (s[k] as number) > 0, k);
  assert.match(r.stdout, /done \(bsp over embedded\)/);
  const inRunDir = JSON.parse(await readFile(join(s.run_dir as string, 'summary.json'), 'utf8')) as Record<string, unknown>;
  assert.equal(inRunDir.run_id, s.run_id, 'the summary is also written to the run dir');
  // The training loss of the last batches, each scored before its update: a held-out estimate with one epoch.
  assert.ok(typeof s.final_train_loss === 'number' && s.final_train_loss > 0 && s.final_train_loss < 0.7, `final_train_loss ${String(s.final_train_loss)}`);
  // The monitor's telemetry log (hetps report reads it): a snapshot a second, the last one marked ended.
  const snaps = (await readFile(join(s.run_dir as string, 'telemetry.jsonl'), 'utf8')).trim().split('\n').map((l) => JSON.parse(l) as { ended: boolean; job: string });
  assert.ok(snaps.length >= 1);
  assert.equal(snaps.at(-1)!.ended, true);
  assert.equal(snaps[0]!.job, 'embbsp');
});

test('without a nats-server binary hetps up falls back to the embedded bus and warns', { timeout: 60_000 }, async () => {
  const cfg = await writeJobConfig(tempDir(), { job: 'embasp', mode: 'asp', servers: null, runDir: join(tempDir(), 'runs'), samples: 320, epochs: 1, workerRecoveryTimeoutS: 10 });
  const env = { PATH: dirname(process.execPath), NATS_SERVER_BIN: '' };
  const r = await hetps(['up', '--config', cfg, '--json'], { env, timeoutMs: 50_000 }).exited;
  assert.equal(r.code, 0, r.stderr.slice(-3000));
  assert.match(r.stderr, /WARNING: .*nats-server was not found/);
  assert.match(r.stderr, /WARNING: running the job embedded/);
  const s = JSON.parse(r.stdout.trim().split('\n').pop()!) as Record<string, unknown>;
  assert.equal(s.transport, 'embedded');
  assert.equal(s.batches_acked, s.batches);
});
