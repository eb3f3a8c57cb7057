/**
 * A shard's state over `communication.max_message_bytes`, over a real 3-node
 * NATS cluster (`hetps up`, every node its own process): the limit reaches
 * every process, and checkpoints and resumes do not have to fit it — the
 * driver fetches each frozen copy in segments that do, writes it, and a
 * resume (`--resume`) sends it back in segments; every batch is learned once.
 * With `checkpoint.written_by: shards` the shard writes its own files and
 * the state does not cross the network at all.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { clusterAndDirForFile, explainExit, hetps } from '../support/ps.ts';
import { listCheckpoints, readCheckpointState } from '../../actors/store/checkpoint.ts';
import { encode } from '../../runtime/mod.ts';

const env = clusterAndDirForFile('hetps-msglimit-');
const LIMIT = 2 * 1024 * 1024;

/** One server (its shard holds every embedding row: ~4.8 MB after the run), two asp workers, a small tower. */
async function jobWithLimit(job: string, limit: number, checkpointExtra = ''): Promise<{ cfg: string; ckpt: string; summary: string }> {
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
checkpoint: { dir: ${JSON.stringify(ckpt)}, every_s: 1${checkpointExtra} }
logging: { level: info }
`);
  return { cfg, ckpt, summary: join(dir, `${job}-summary.json`) };
}

interface Summary {
  batches: number; batches_acked: number; duplicate_acks: number; checkpoints: { trigger: string; bytes: number; kind: string; written_by: string }[];
  resumed_from?: { checkpoint: string; batches_done: number };
}

test('a shard state over communication.max_message_bytes is checkpointed and resumed in segments that fit it, while training goes on; every batch learned once', { timeout: 240_000 }, async () => {
  const job = await jobWithLimit('msglimit', LIMIT);
  const r = await hetps(['up', '--config', job.cfg, '--summary', job.summary], { timeoutMs: 110_000 }).exited;
  assert.equal(r.code, 0, explainExit(r));
  assert.doesNotMatch(r.stderr, /checkpoint failed|exceeds the \d+-byte limit/);
  const s = JSON.parse(await readFile(job.summary, 'utf8')) as Summary;
  assert.equal(s.batches_acked, s.batches, 'every batch learned');
  assert.equal(s.duplicate_acks, 0);
  const last = s.checkpoints.at(-1);
  assert.ok(last !== undefined && last.trigger === 'end', JSON.stringify(s.checkpoints));
  // The end-of-job checkpoint holds the shard's whole state, which one message could not carry.
  const newest = (await listCheckpoints(job.ckpt)).at(-1)!;
  const state = (await readCheckpointState(newest.path)).snapshots.get('s1')!;
  const whole = encode(state).byteLength;
  assert.ok(whole > LIMIT, `the shard's state (${whole} bytes as one message) is over the ${LIMIT}-byte limit`);
  assert.ok(state.sparse[0]!.ids.length > 0);

  // Resumed from it: the state goes back to the shard in segments (the queue holds nothing more to train).
  const resumedSummary = join(env.dir(), 'resumed-summary.json');
  const r2 = await hetps(['up', '--config', job.cfg, '--resume', newest.path, '--summary', resumedSummary], { timeoutMs: 110_000 }).exited;
  assert.equal(r2.code, 0, explainExit(r2));
  assert.match(r2.stderr, new RegExp(`resume: shard s1 restored from ${newest.name} \\(version ${state.version}\\)`));
  assert.doesNotMatch(r2.stderr, /exceeds the \d+-byte limit/);
  const s2 = JSON.parse(await readFile(resumedSummary, 'utf8')) as Summary;
  assert.equal(s2.resumed_from?.batches_done, s.batches);
  assert.equal(s2.resumed_from.batches_done + s2.batches_acked, s2.batches, 'nothing trained twice');
});

test('checkpoint.written_by shards: the shard writes its own checkpoint files and reads them back at a resume (a state over the message limit, which never crosses the network); they verify', { timeout: 240_000 }, async () => {
  const job = await jobWithLimit('msgshards', LIMIT, ', written_by: shards, full_every: 3');
  const r = await hetps(['up', '--config', job.cfg, '--summary', job.summary], { timeoutMs: 110_000 }).exited;
  assert.equal(r.code, 0, explainExit(r));
  assert.doesNotMatch(r.stderr, /checkpoint failed|exceeds the \d+-byte limit/);
  assert.match(r.stderr, /checkpoint ckpt-\S+ \(\w+, full\): \d+ files, .* written by the shards in \d+ ms/);
  const s = JSON.parse(await readFile(job.summary, 'utf8')) as Summary;
  assert.equal(s.batches_acked, s.batches, 'every batch learned');
  // full_every 3: a full one, then deltas the shard builds on the checkpoints it wrote.
  assert.ok(s.checkpoints.length >= 2 && s.checkpoints.every((c) => c.written_by === 'shards'), JSON.stringify(s.checkpoints));
  assert.deepEqual(s.checkpoints.slice(0, 3).map((c) => c.kind), ['full', 'delta', 'delta'].slice(0, Math.min(3, s.checkpoints.length)));
  const newest = (await listCheckpoints(job.ckpt)).at(-1)!;
  const state = (await readCheckpointState(newest.path)).snapshots.get('s1')!;
  assert.ok(encode(state).byteLength > LIMIT, 'the state is over the limit as one message');
  assert.ok(state.sparse[0]!.ids.length > 0 && (state.applied ?? []).length === s.batches, 'with the replica\'s applied-batch log');

  const resumedSummary = join(env.dir(), 'resumed-shards-summary.json');
  const r2 = await hetps(['up', '--config', job.cfg, '--resume', newest.path, '--summary', resumedSummary], { timeoutMs: 110_000 }).exited;
  assert.equal(r2.code, 0, explainExit(r2));
  assert.match(r2.stderr, new RegExp(`resume: shard s1 restored from ${newest.name}( \\(a delta on \\S+\\))? \\(version ${state.version}\\), read by the shard itself`));
  const s2 = JSON.parse(await readFile(resumedSummary, 'utf8')) as Summary;
  assert.equal(s2.resumed_from?.batches_done, s.batches);
});
