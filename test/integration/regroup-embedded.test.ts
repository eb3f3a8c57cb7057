/**
 * Regrouping during training: `hetps up --embedded` (hps) with a control
 * script that sends `hps.<job>.ctl.regroup` as a JSON NATS client would,
 * moving w3 from the async group into the sync group mid-training. The
 * command is accepted, the summary lists the regroup, every batch is still
 * acknowledged exactly once, and w3 trains in its new group afterwards.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { FAST_AND_LOOSE_CLUSTER, hetps, smallHpsJobTail, tempDirForFile } from '../support/ps.ts';

const tempDir = tempDirForFile('hetps-regroup-');

test('hetps up --embedded (hps): a ctl.regroup command mid-training moves a node; no batch is lost or trained twice', { timeout: 120_000 }, async () => {
  const cfg = join(tempDir(), 'regroup.yaml');
  await writeFile(cfg, `job: { name: embregroup, run_dir: ${JSON.stringify(join(tempDir(), 'runs'))} }
${FAST_AND_LOOSE_CLUSTER}nodes:
  w1: { emulate: { speed: 1 } }
  w2: { emulate: { speed: 1 } }
  w3: { emulate: { speed: 1 } }
  w4: { emulate: { speed: 0.5 } }
${smallHpsJobTail({ hidden: '[16]', samples: 2560, maxTokens: 128, seed: 7, referenceStepMs: 100 })}`);
  const script = join(tempDir(), 'ctl.json');
  await writeFile(script, JSON.stringify([{
    after_batches: 4,
    command: 'regroup',
    body: {
      reason: 'test: move w3 into the sync group',
      groups: [
        { name: 'fast', nodes: ['w1', 'w2', 'w3'], sync_mode: 'sync', sync_steps: 2 },
        { name: 'loose', nodes: ['w4'], sync_mode: 'async' },
      ],
    },
  }]));
  const summaryFile = join(tempDir(), 'regroup.json');
  const r = await hetps(['up', '--config', cfg, '--embedded', '--summary', summaryFile, '--ctl-script', script], { timeoutMs: 110_000 }).exited;
  assert.equal(r.code, 0, r.stderr.slice(-4000));
  const s = JSON.parse(await readFile(summaryFile, 'utf8')) as Record<string, unknown>;
  const replies = s.control_replies as { command: string; reply: { type: string; result?: { accepted: boolean; groups_version: number } } }[];
  assert.equal(replies.length, 1, 'the command was sent');
  assert.equal(replies[0]!.reply.type, 'reply', JSON.stringify(replies[0]!.reply));
  assert.equal(replies[0]!.reply.result!.accepted, true);
  assert.equal(replies[0]!.reply.result!.groups_version, 1);
  const regroups = s.regroups as { reason: string; groups_version: number; groups: { name: string; nodes: string[] }[]; moved: string[]; not_ready: string[] }[];
  assert.equal(regroups.length, 1, 'the summary lists the regroup');
  assert.equal(regroups[0]!.reason, 'test: move w3 into the sync group');
  assert.deepEqual(regroups[0]!.moved, ['w3']);
  assert.deepEqual(regroups[0]!.not_ready, [], 'every live worker paused');
  assert.deepEqual(regroups[0]!.groups.find((g) => g.name === 'fast')!.nodes, ['w1', 'w2', 'w3']);
  assert.equal(s.batches, 80);
  assert.equal(s.batches_acked, 80, 'every batch acknowledged');
  assert.equal(s.duplicate_acks, 0, 'and each once');
  const byGroup = s.per_worker_group as Record<string, Record<string, number>>;
  assert.ok((byGroup.w3?.fast ?? 0) > 0, `w3 trained in group fast after the regroup: ${JSON.stringify(byGroup)}`);
  assert.match(r.stderr, /regrouped \(groups v1\): now sync inside group fast \(w1, w2, w3\)/);
});
