/**
 * A shard's state in segments (actors/shard/snapshot-segments.ts): split to
 * a byte budget — dense blocks by element ranges, tables by row ranges — and
 * rebuilt exactly; each segment's message fits the limit it was cut for; a
 * receiver names what is out of order, unknown or missing.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { encode, encodeEnvelope, ValidationError } from '../../runtime/mod.ts';
import { mergeSeedLogs, splitSeedLogs, type SeedLogs } from '../../actors/shard/replica.ts';
import { SnapshotAssembler, segmentBudget, segmentBytes, splitSnapshot } from '../../actors/shard/snapshot-segments.ts';
import type { PushReply, ReplicationEntry, ShardSnapshot } from '../../actors/shard/shard.messages.ts';

function snapshot(denseLengths: number[], rows: number, dim = 8, slots = 1): ShardSnapshot {
  let x = 0;
  const f = (n: number) => Float32Array.from({ length: n }, () => (x++ % 1000) / 7);
  return {
    format: 1, shard: 's0', plan_version: 3, version: 41, round: 5, dense_optimizer: 'adam', sparse_optimizer: 'adagrad',
    dense: denseLengths.map((length, id) => ({ id, param: 'w', offset: id * 100_000, length, values: f(length), state: Array.from({ length: 2 }, () => f(length)), step: 40 + id })),
    sparse: [
      { table: 'emb', dim, stateSlots: slots, ids: Uint32Array.from({ length: rows }, (_, i) => i * 7 + 1), values: f(rows * dim), state: f(rows * dim * slots), steps: Uint32Array.from({ length: rows }, (_, i) => i % 9) },
      { table: 'empty', dim: 4, stateSlots: slots, ids: new Uint32Array(0), values: new Float32Array(0), state: new Float32Array(0), steps: new Uint32Array(0) },
    ],
  };
}

function rebuild(snap: ShardSnapshot, budget: number): { out: ShardSnapshot; segments: number; largest: number } {
  const { head, segments } = splitSnapshot(snap, budget);
  const asm = new SnapshotAssembler(structuredClone(head), 'test');
  let largest = 0;
  for (const s of segments) {
    // As sent: encoded, then decoded by the receiver (its own arrays).
    const wire = encode({ segment: s });
    largest = Math.max(largest, wire.byteLength);
    asm.add(structuredClone(s));
  }
  return { out: asm.finish(), segments: segments.length, largest };
}

test('a state split to a budget is rebuilt exactly, every segment within the message limit, blocks and tables cut across segments', () => {
  const snap = snapshot([30_000, 5, 70_000], 20_000);
  const limit = 1024 * 1024;
  const budget = segmentBudget(limit);
  const { out, segments, largest } = rebuild(snap, budget);
  assert.deepEqual(out, snap);
  // 3 blocks × 3 arrays and 20 000 rows of 8 values and 8 state floats: ~2.4 MB in ≥ 3 segments, none over the limit.
  assert.ok(segments >= 3, `${segments} segments`);
  assert.ok(largest <= limit, `largest segment message ${largest} bytes for a ${limit}-byte limit`);
  const sizes = splitSnapshot(snap, budget).segments.map(segmentBytes);
  assert.ok(sizes.every((n) => n <= budget), `segment bytes ${sizes.join(', ')} within the budget ${budget}`);
  assert.ok(sizes.slice(0, -1).every((n) => n > budget * 0.9), `every segment but the last is nearly full: ${sizes.join(', ')}`);
});

test('one segment when everything fits; a budget below one row still makes progress, a row at a time', () => {
  const snap = snapshot([10], 3, 4, 0);
  assert.equal(splitSnapshot(snap, segmentBudget(1024 * 1024)).segments.length, 1);
  const tiny = rebuild(snap, 16);
  assert.deepEqual(tiny.out, snap);
  assert.equal(tiny.segments, 10 + 3, 'each element of the block and each row alone');
  // An empty state: a head and no segments.
  const empty = rebuild({ ...snap, dense: [], sparse: [] }, 1024);
  assert.equal(empty.segments, 0);
  assert.deepEqual(empty.out, { ...snap, dense: [], sparse: [] });
});

test('segmentBudget leaves room for the message around the segment, and caps a segment at 64 MiB', () => {
  assert.equal(segmentBudget(1024 * 1024), 1024 * 1024 - 64 * 1024);
  assert.equal(segmentBudget(4 * 1024 ** 3), 64 * 1024 * 1024 - 64 * 1024);
  assert.equal(segmentBudget(2048), 1536);
});

test('the receiver names a segment out of order, an unknown block or table, mismatched rows, and what is missing at the end', () => {
  const snap = snapshot([2_000], 500);
  const { head, segments } = splitSnapshot(snap, 4096);
  assert.ok(segments.length > 3);
  const fresh = () => new SnapshotAssembler(head, 'seed t1 from n1');
  const err = (fn: () => unknown, re: RegExp) => assert.throws(fn, (e: unknown) => e instanceof ValidationError && re.test((e as Error).message));

  let a = fresh();
  err(() => a.add(segments[1]!), /seed t1 from n1: segment 1: dense block 0 continues at element \d+, expected 0/);
  a = fresh();
  err(() => a.add({ dense: [{ id: 9, from: 0, values: new Float32Array(1), state: [new Float32Array(1), new Float32Array(1)] }], sparse: [] }), /dense block 9, which the head does not list/);
  err(() => a.add({ dense: [], sparse: [{ table: 'other', from: 0, ids: new Uint32Array(1), values: new Float32Array(8), state: new Float32Array(8), steps: new Uint32Array(1) }] }), /sparse table other, which the head does not list/);
  err(() => a.add({ dense: [], sparse: [{ table: 'emb', from: 0, ids: new Uint32Array(2), values: new Float32Array(8), state: new Float32Array(16), steps: new Uint32Array(2) }] }), /2 rows with 8 values, 16 state floats and 2 steps do not match dim 8/);
  err(() => a.add({ dense: [{ id: 0, from: 0, values: new Float32Array(3), state: [new Float32Array(3)] }], sparse: [] }), /dense block 0 has 1 state slot\(s\) of 3 elements for 2 of 3/);
  err(() => a.add({ dense: [{ id: 0, from: 0, values: new Float32Array(2001), state: [new Float32Array(2001), new Float32Array(2001)] }], sparse: [] }), /gets elements up to 2001 of 2000/);
  a = fresh();
  for (const s of segments.slice(0, -1)) a.add(s);
  err(() => a.finish(), /sparse table emb has \d+ of 500 rows after \d+ segment\(s\)/);
  a.add(segments.at(-1)!);
  assert.deepEqual(a.finish(), snap);
});

test('a seed\'s logs cut to the message limit: every seed_logs message fits it, a sender\'s dedup window cut across chunks is one again, and the chunks put back together are the logs', () => {
  const reply = (v: number): PushReply => ({ version: v, applied: true, staleness: 3, lr_scale: 0.5, sparse_lr_scale: 0.25, dropped: 'dense' });
  const window = (from: string, n: number) => ({ from, evicted_up_to: n > 100 ? 17 : -1, seqs: Array.from({ length: n }, (_, i) => 18 + i), replies: Array.from({ length: n }, (_, i) => reply(i)) });
  const entry = (k: number): ReplicationEntry => ({
    rseq: 100 + k, kind: 'push', from: `w${k}#ab12`, seq: k, lr_scale: 1, reply: null,
    push: {
      plan_version: 3, round: 7, expected: 2, weight: 1, base_version: 4, later_steps: [], lr_mult: 1, batches: [`b-${k}`],
      dense: [{ block: 0, grad: new Float32Array(40).fill(k) }], sparse: [{ table: 'emb', ids: Int32Array.from([1, 2, 3]), grads: new Float32Array(6).fill(k) }],
    },
  });
  const logs: SeedLogs = {
    dedup: [window('w1#aa', 2_000), window('w2#bb', 3), window('w3#cc', 0)],
    applied: Array.from({ length: 3_000 }, (_, i) => [`epoch-${i % 3}/batch-${i}-${'é'.repeat(i % 17)}`, 1 + (i % 2)] as [string, number]),
    refused: Array.from({ length: 50 }, (_, i) => `stale-${i}`),
    open_rounds: [1, 2, 3, 4, 5].map(entry),
  };
  for (const limit of [1_536, 64 * 1024]) {
    const chunks = splitSeedLogs(logs, segmentBudget(limit));
    assert.ok(chunks.length > (limit === 1_536 ? 300 : 2), `${chunks.length} chunks at a ${limit}-byte limit`);
    for (const [index, c] of chunks.entries()) {
      const bytes = encodeEnvelope({ type: 'seed_logs', from: 'n1#1a2b3c', seq: 99 }, { epoch: 3, primary: 'server-1', transfer: 'server-1>server-2:3:1f', index, ...c }).byteLength;
      assert.ok(bytes <= limit, `chunk ${index}: ${bytes} bytes over the ${limit}-byte limit`);
    }
    assert.ok(chunks.filter((c) => c.dedup.some((w) => w.from === 'w1#aa')).length > 1, 'the big window is cut across chunks');
    assert.deepEqual(mergeSeedLogs(chunks), logs);
  }
  // Nothing to send: one empty chunk. An item larger than the budget goes alone (its message is then refused by the transport).
  assert.deepEqual(splitSeedLogs({ dedup: [], applied: [], refused: [], open_rounds: [] }, 1_000), [{ dedup: [], applied: [], refused: [], open_rounds: [] }]);
  const big = splitSeedLogs({ dedup: [], applied: [['a', 1], ['x'.repeat(5_000), 1], ['b', 1]], refused: [], open_rounds: [] }, 1_000);
  assert.deepEqual(big.map((c) => c.applied.map(([id]) => id.length)), [[1], [5_000], [1]]);
});
