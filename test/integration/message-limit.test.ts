/**
 * `communication.max_message_bytes` reaches every process of a job: over a
 * real 3-node NATS cluster (`hetps up`, every node its own process), a shard
 * whose state is larger than the limit cannot send its frozen copy, so each
 * checkpoint fails at once with a PayloadTooLargeError naming the setting
 * (the shard process answers with it; the driver does not wait out a
 * timeout) while training goes on and every batch is learned once; the same
 * job with the limit raised writes its end-of-job checkpoint.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { clusterAndDirForFile, explainExit, hetps } from '../support/ps.ts';

const env = clusterAndDirForFile('hetps-msglimit-');

/** One server (its shard holds every embedding row: ~4.8 MB after the run), two asp workers, a small tower. */
async function jobWithLimit(job: string, limit: number): Promise<{ cfg: string; ckpt: string; summary: string }> {
  const dir = env.dir();
  const ckpt = join(dir, `${job}-ckpt`);
  const cfg = join(dir, `${job}.yaml`);
  await writeFile(cfg, `job: { name: ${job}, run_dir: ${JSON.stringify(join(dir, 'runs'))} }
nats: { servers: [${env.nats().urls.join(', ')}] }
cluster:
  worker_groups:
    - name: g1
      nodes: [w1, w2]
  server_nodes: [s1]
model:
  type: ctr
  ctr: { embedding_dim: 8, hidden: [32, 16], pooling: mean, wide: true, hash_buckets: 65536 }
data: { source: spam, batch_size: 32, epochs: 1, samples: 640, test_fraction: 0.2, vocab_size: 65536, max_tokens: 256 }
optimizer:
  type: adam
  learning_rate: 0.003
  sparse: { type: adagrad, learning_rate: 0.05 }
training: { mode: asp, random_seed: 42 }
communication: { max_message_bytes: ${limit} }
checkpoint: { dir: ${JSON.stringify(ckpt)}, every_s: 1 }
logging: { level: info }
`);
  return { cfg, ckpt, summary: join(dir, `${job}-summary.json`) };
}

interface Summary { batches: number; batches_acked: number; duplicate_acks: number; checkpoints: { trigger: string; bytes: number }[] }

test('a shard state over communication.max_message_bytes fails each checkpoint at once, by name, while training goes on; raised, the job checkpoints', { timeout: 240_000 }, async () => {
  const limited = await jobWithLimit('msglimit', 2 * 1024 * 1024);
  const r = await hetps(['up', '--config', limited.cfg, '--summary', limited.summary], { timeoutMs: 110_000 }).exited;
  assert.equal(r.code, 0, explainExit(r));
  const tooLarge = /checkpoint failed: hps\.msglimit\.shard\.s1@s1: its reply could not be sent: message of (\d+) bytes .* exceeds the 2097152-byte limit \(communication\.max_message_bytes\); raise communication\.max_message_bytes/;
  const end = /the end-of-job checkpoint failed: .*exceeds the 2097152-byte limit \(communication\.max_message_bytes\)/.exec(r.stderr);
  assert.ok(end, `the end-of-job checkpoint fails naming the setting:\n${r.stderr.slice(-3000)}`);
  const m = tooLarge.exec(r.stderr);
  assert.ok(m && Number(m[1]) > 2 * 1024 * 1024, `the shard's state (${m?.[1]} bytes) is over the limit`);
  // Not a timeout: the driver heard the shard's answer.
  assert.doesNotMatch(r.stderr, /checkpoint failed: .*(no reply|timed out)/);
  const s = JSON.parse(await readFile(limited.summary, 'utf8')) as Summary;
  assert.equal(s.batches_acked, s.batches, 'every batch learned');
  assert.equal(s.duplicate_acks, 0);
  assert.deepEqual(s.checkpoints, []);
  assert.deepEqual(await readdir(limited.ckpt).catch(() => []), [], 'nothing half-written');

  const raised = await jobWithLimit('msgraised', 16 * 1024 * 1024);
  const r2 = await hetps(['up', '--config', raised.cfg, '--summary', raised.summary], { timeoutMs: 110_000 }).exited;
  assert.equal(r2.code, 0, explainExit(r2));
  assert.doesNotMatch(r2.stderr, /checkpoint failed/);
  const s2 = JSON.parse(await readFile(raised.summary, 'utf8')) as Summary;
  assert.equal(s2.batches_acked, s2.batches);
  const last = s2.checkpoints.at(-1);
  assert.ok(last !== undefined && last.trigger === 'end' && last.bytes > 2 * 1024 * 1024, JSON.stringify(s2.checkpoints));
});
