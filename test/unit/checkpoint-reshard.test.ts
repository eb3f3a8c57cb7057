/**
 * Re-sharding a checkpoint for a resume onto another number of servers:
 * every dense value and optimizer state element and every row (with its
 * state and update count) lands once, on the shard the new plan gives it;
 * the layout a checkpoint already has is recognised; what cannot fit is
 * refused by name.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { buildShardPlan, denseBlocksByShard, partitionOf, type ShardPlan } from '../../topology/mod.ts';
import type { ShardSnapshot } from '../../actors/shard/shard.messages.ts';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { ValidationError } from '../../runtime/mod.ts';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { encode } from '../../runtime/mod.ts';
import { layoutMatches, reshard, restoreOntoPlan, type RestoreEvent } from '../../actors/store/checkpoint-reshard.ts';
import { CheckpointError, loadResumePoint, writeCheckpoint, type CheckpointManifest } from '../../actors/store/checkpoint.ts';

const PARAMS = [{ name: 'W1', size: 1000 }, { name: 'b1', size: 10 }, { name: 'bias', size: 1 }];
const TABLES = [{ name: 'emb', dim: 3 }, { name: 'wide', dim: 1 }];
const plan = (shards: string[], version: number, maxBlockBytes = 1024): ShardPlan => buildShardPlan({
  version, shards, denseParams: PARAMS, sparseTables: TABLES, partitions: null, maxBlockBytes, servers: shards, backupFactor: 0,
});

/** A snapshot per shard of `p`: values that say where they are (param index·1e4 + element), Adam-like 2 state slots, rows keyed by id. */
function snapshotsOf(p: ShardPlan, ids: number[]): Map<string, ShardSnapshot> {
  const blocks = denseBlocksByShard(p);
  const out = new Map<string, ShardSnapshot>();
  for (const shard of p.shards) {
    const mine = ids.filter((id) => p.partitionOwner[partitionOf(id, p.partitions)] === shard);
    const table = (name: string, dim: number) => ({
      table: name, dim, stateSlots: 1,
      ids: Uint32Array.from(mine),
      values: Float32Array.from(mine.flatMap((id) => Array.from({ length: dim }, (_, j) => id + j / 10))),
      state: Float32Array.from(mine.flatMap((id) => Array.from({ length: dim }, () => -id))),
      steps: Uint32Array.from(mine, (id) => id % 7),
    });
    out.set(shard, {
      format: 1, shard, plan_version: p.version, version: 40 + p.shards.indexOf(shard), round: 3, dense_optimizer: 'adam', sparse_optimizer: 'adagrad',
      dense: blocks.get(shard)!.map((b) => {
        const pi = PARAMS.findIndex((x) => x.name === b.param);
        const v = Float32Array.from({ length: b.length }, (_, k) => pi * 1e4 + b.offset + k);
        return { id: b.id, param: b.param, offset: b.offset, length: b.length, values: v, state: [v.map((x) => -x), v.map((x) => x / 2)], step: 5 + b.id };
      }),
      sparse: [table('emb', 3), table('wide', 1)],
    });
  }
  return out;
}

test('two shards re-sharded onto three and onto one: every value, state element and row lands once where the new plan puts it', () => {
  const ids = Array.from({ length: 500 }, (_, i) => i * 7919 + 3);
  const from = plan(['s1', 's2'], 4);
  const snaps = snapshotsOf(from, ids);
  assert.equal(layoutMatches(snaps, from), true, 'a checkpoint of this very plan needs no re-sharding');
  for (const shards of [['s1', 's2', 's3'], ['solo']]) {
    const to = plan(shards, 9);
    assert.equal(layoutMatches(snaps, to), false);
    const out = reshard(snaps, to, '/ck');
    assert.deepEqual([...out.keys()], shards);
    assert.equal(layoutMatches(out, to), true, 'the result restores onto the new plan as it is');
    const want = snapshotsOf(to, ids);
    for (const shard of shards) {
      const got = out.get(shard)!; const exp = want.get(shard)!;
      assert.equal(got.version, 41, 'the largest version of the old shards');
      assert.equal(got.round, 3);
      assert.equal(got.plan_version, 9);
      assert.deepEqual(got.dense.map((b) => [b.id, b.param, b.offset, b.length, [...b.values], b.state.map((s) => [...s])]),
        exp.dense.map((b) => [b.id, b.param, b.offset, b.length, [...b.values], b.state.map((s) => [...s])]));
      for (const [i, t] of got.sparse.entries()) {
        const e = exp.sparse[i]!;
        const order = (x: typeof t) => [...x.ids].map((id, k) => [id, [...x.values.subarray(k * x.dim, (k + 1) * x.dim)], [...x.state.subarray(k * x.dim, (k + 1) * x.dim)], x.steps[k]]).sort((a, b) => (a[0] as number) - (b[0] as number));
        assert.equal(t.table, e.table);
        assert.deepEqual(order(t), order(e), `${shard}/${t.table}`);
      }
    }
    const total = [...out.values()].reduce((n, s) => n + s.sparse[0]!.ids.length, 0);
    assert.equal(total, ids.length);
    // A block's update count never goes back: the largest of the old blocks it overlaps.
    const oldSteps = [...snaps.values()].flatMap((s) => s.dense);
    for (const b of [...out.values()].flatMap((s) => s.dense)) {
      const over = oldSteps.filter((o) => o.param === b.param && o.offset < b.offset + b.length && b.offset < o.offset + o.length);
      assert.equal(b.step, Math.max(...over.map((o) => o.step)));
    }
  }
});

test('blocks cut smaller (another max_payload) with the same shards: re-sharded, the rows stay on their shards', () => {
  const ids = Array.from({ length: 50 }, (_, i) => i * 31);
  const snaps = snapshotsOf(plan(['s1', 's2'], 1, 4096), ids);
  const to = plan(['s1', 's2'], 2, 1024);
  assert.notEqual(to.dense.length, plan(['s1', 's2'], 1, 4096).dense.length);
  assert.equal(layoutMatches(snaps, to), false);
  const out = reshard(snaps, to, '/ck');
  assert.equal(layoutMatches(out, to), true);
  for (const s of ['s1', 's2']) assert.deepEqual([...out.get(s)!.sparse[0]!.ids].sort(), [...snaps.get(s)!.sparse[0]!.ids].sort());
});

test('a checkpoint of a round-robin plan resumed onto a hotness plan (the same shards, partitions placed otherwise): re-sharded, each row on the shard that owns its partition now', () => {
  const ids = Array.from({ length: 400 }, (_, i) => i * 104_729 + 11);
  const from = plan(['s1', 's2'], 1);
  const snaps = snapshotsOf(from, ids);
  // Hot partitions 0–9: the hotness plan places them otherwise than round-robin did.
  const loads = Array.from({ length: from.partitions }, (_, i) => (i < 10 ? 1_000 - i : 1));
  const to = buildShardPlan({ version: 2, shards: ['s1', 's2'], denseParams: PARAMS, sparseTables: TABLES, partitions: null, maxBlockBytes: 1024, servers: ['s1', 's2'], backupFactor: 0, partitionLoads: loads });
  assert.notDeepEqual(to.partitionOwner, from.partitionOwner);
  assert.equal(layoutMatches(snaps, to), false, 'rows sit on shards that no longer own them');
  const out = reshard(snaps, to, '/ck');
  assert.equal(layoutMatches(out, to), true);
  const want = snapshotsOf(to, ids);
  for (const s of ['s1', 's2']) assert.deepEqual([...out.get(s)!.sparse[0]!.ids].sort(), [...want.get(s)!.sparse[0]!.ids].sort(), s);
});

test('what cannot be re-sharded is refused by name: a parameter the model lacks, missing values, another table dim', () => {
  const from = plan(['s1', 's2'], 1);
  const to = plan(['s1', 's2', 's3'], 2);
  const snaps = snapshotsOf(from, [1, 2, 3]);
  const extra = new Map(snaps);
  const s1 = snaps.get('s1')!;
  extra.set('s1', { ...s1, dense: [...s1.dense, { ...s1.dense[0]!, param: 'W9' }] });
  assert.throws(() => reshard(extra, to, '/ck'), /checkpoint \/ck cannot be re-sharded onto plan v2 \(s1, s2, s3\): dense parameter W9 of shard s1 is not in the model/);
  const lost = new Map(snaps);
  lost.delete('s2');
  assert.throws(() => reshard(lost, to, '/ck'), /the shards hold \d+ of the \d+ values of dense parameter/);
  const dims = new Map(snaps);
  dims.set('s1', { ...s1, sparse: [{ ...s1.sparse[0]!, dim: 5 }] });
  assert.throws(() => reshard(dims, to, '/ck'), /sparse table emb has rows of 5, the plan 3/);
});

test('re-sharded, every new shard gets the dedup table and the applied-batch log of all the old ones', () => {
  const from = plan(['s1', 's2'], 4);
  const snaps = snapshotsOf(from, [3, 10, 17]);
  const reply = (v: number) => ({ version: v, applied: true, staleness: 0, lr_scale: 1 });
  snaps.get('s1')!.dedup = [{ from: 'w1#a', evicted_up_to: -1, seqs: [4, 5], replies: [reply(1), reply(2)] }];
  snaps.get('s2')!.dedup = [{ from: 'w1#a', evicted_up_to: 2, seqs: [6], replies: [reply(3)] }, { from: 'w2#b', evicted_up_to: -1, seqs: [1], replies: [reply(4)] }];
  // Both dense-owning shards applied b1 and b2 once; s2 also refused b3 as too stale.
  snaps.get('s1')!.applied = [['b1', 1], ['b2', 1]];
  snaps.get('s2')!.applied = [['b1', 1], ['b2', 1]];
  snaps.get('s2')!.refused = ['b3'];
  const out = reshard(snaps, plan(['s1', 's2', 's3'], 9), '/ck');
  for (const [shard, s] of out) {
    assert.deepEqual(s.dedup, [
      { from: 'w1#a', evicted_up_to: 2, seqs: [4, 5, 6], replies: [reply(1), reply(2), reply(3)] },
      { from: 'w2#b', evicted_up_to: -1, seqs: [1], replies: [reply(4)] },
    ], `${shard}: one window per sender`);
    assert.deepEqual(s.applied, [['b1', 1], ['b2', 1]], `${shard}: each batch once, not once per old shard`);
    assert.deepEqual(s.refused, ['b3']);
  }
  // A checkpoint written before the logs were kept re-shards without them.
  assert.equal(reshard(snapshotsOf(from, [3]), plan(['s1', 's2', 's3'], 9), '/ck').get('s3')!.dedup, undefined);
});

/**
 * A resume point over `snaps` that logs each shard read; `restore` logs each
 * restore. The log shows how many shards' state the caller held at once.
 */
function resumeOver(snaps: Map<string, ShardSnapshot>, log: string[]) {
  const shards = [...snaps.keys()].sort();
  const readShard = async (shard: string) => { log.push(`read ${shard}`); return snaps.get(shard)!; };
  return {
    path: '/ck', manifest: { name: 'ckpt-1', kind: 'full', chain: [] } as unknown as CheckpointManifest, shards, readShard,
    readAll: async () => { log.push('read all'); return new Map(shards.map((s) => [s, snaps.get(s)!])); },
  };
}

test('a resume onto the same layout reads and restores one shard at a time; onto another it reads the whole checkpoint and re-shards it first', async () => {
  const ids = Array.from({ length: 300 }, (_, i) => i * 7919 + 3);
  const from = plan(['s1', 's2', 's3'], 4);
  const snaps = snapshotsOf(from, ids);
  const log: string[] = [];
  const events: RestoreEvent[] = [];
  const restored = new Map<string, ShardSnapshot>();
  const restore = async (shard: string, snap: ShardSnapshot) => { log.push(`restore ${shard}`); restored.set(shard, snap); return { version: snap.version }; };

  await restoreOntoPlan(resumeOver(snaps, log), from, restore, (e) => events.push(e));
  assert.deepEqual(log, ['read s1', 'restore s1', 'read s2', 'restore s2', 'read s3', 'restore s3'], 'never two shards read before the first is restored');
  assert.deepEqual(events, [40, 41, 42].map((version, i) => ({ kind: 'restored', shard: `s${i + 1}`, version, by: 'driver' })));
  for (const s of from.shards) assert.equal(restored.get(s), snaps.get(s), 'the checkpoint\'s state as it is');

  // Another number of servers: read whole, re-sharded, then restored; nothing restored before the re-shard.
  log.length = 0; events.length = 0; restored.clear();
  const four = plan(['s1', 's2', 's3', 's4'], 5);
  await restoreOntoPlan(resumeOver(snaps, log), four, restore, (e) => events.push(e));
  assert.deepEqual(log, ['read all', 'restore s1', 'restore s2', 'restore s3', 'restore s4']);
  const re = events[0]!;
  assert.equal(re.kind, 'reshard');
  assert.match((re as { reason: string }).reason, /holds shards s1, s2, s3, plan v5 has s1, s2, s3, s4/);
  assert.equal((re as { rows: { rows: number }[] }).rows.reduce((n, r) => n + r.rows, 0), 2 * ids.length, 'every row of both tables');
  assert.equal(layoutMatches(restored, four), true);
});

test('a resume whose layout differs only from its second shard on: the first restored as read, then every shard again from the re-sharded state', async () => {
  const ids = Array.from({ length: 200 }, (_, i) => i * 104_729 + 11);
  const from = plan(['s1', 's2'], 1);
  const snaps = snapshotsOf(from, ids);
  // The same shards and blocks; partitions placed otherwise, so that s1 keeps exactly its rows and s2's do not fit.
  const owner = [...from.partitionOwner];
  const s1Parts = new Set(ids.filter((id) => from.partitionOwner[partitionOf(id, from.partitions)] === 's1').map((id) => partitionOf(id, from.partitions)));
  const moveFrom = ids.map((id) => partitionOf(id, from.partitions)).find((p) => owner[p] === 's2' && !s1Parts.has(p))!;
  assert.notEqual(moveFrom, undefined);
  owner[moveFrom] = 's1';
  const to: ShardPlan = { ...from, version: 2, partitionOwner: owner };
  const log: string[] = [];
  const events: RestoreEvent[] = [];
  const restored = new Map<string, ShardSnapshot>();
  await restoreOntoPlan(resumeOver(snaps, log), to, async (shard, snap) => { log.push(`restore ${shard}`); restored.set(shard, snap); return { version: snap.version }; }, (e) => events.push(e));
  assert.deepEqual(log, ['read s1', 'restore s1', 'read s2', 'read all', 'restore s1', 'restore s2']);
  assert.deepEqual(events.map((e) => e.kind), ['restored', 'reshard', 'restored', 'restored']);
  assert.match((events[1] as { reason: string }).reason, /shard s2's blocks or rows are laid out otherwise than in plan v2/);
  assert.equal(layoutMatches(restored, to), true, 'the last restore of each shard fits the plan');
  assert.equal([...restored.values()].reduce((n, s) => n + s.sparse[0]!.ids.length, 0), ids.length);
});

test('a resume from files reads a shard\'s files only when that shard is asked for: a file spoiled after the checks fails its own shard, by name', async () => {
  const root = await mkdtemp(join(tmpdir(), 'hetps-resume-'));
  try {
    const p = plan(['s1', 's2', 's3'], 3);
    const snaps = snapshotsOf(p, Array.from({ length: 90 }, (_, i) => i * 13));
    const ck = await writeCheckpoint(root, {
      files: p.shards.map((s) => ({ name: `${s}.msgpack`, bytes: encode(snaps.get(s)), shard: s })),
      manifest: {
        kind: 'full', chain: [], job: 'j', run_id: 'r', trigger: 'periodic', plan: { version: 3, shards: p.shards, placement: null }, groups: null,
        optimizer: { dense: 'adam', sparse: 'adagrad' }, data: { total_batches: 9, acked: ['b1'] },
      },
    });
    const r = await loadResumePoint('latest', root, 'j');
    assert.deepEqual(r.shards, ['s1', 's2', 's3']);
    const f = join(ck.path, 's3.msgpack');
    const bytes = await readFile(f);
    bytes[bytes.length - 1] = bytes[bytes.length - 1]! ^ 1;
    await writeFile(f, bytes);
    assert.deepEqual((await r.readShard('s1')).sparse[0]!.ids, snaps.get('s1')!.sparse[0]!.ids);
    assert.equal((await r.readShard('s2')).version, snaps.get('s2')!.version);
    await assert.rejects(r.readShard('s3'), (e: unknown) => e instanceof CheckpointError && /s3\.msgpack has SHA-256/.test(e.message));
    await assert.rejects(r.readShard('s9'), /holds no state of shard s9 \(it holds s1, s2, s3\)/);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test('checkpoint.written_by shards: each shard reads its own files, all at once, nothing read here; one refusing its layout sends the resume through the re-shard here; any other failure fails it', async () => {
  const ids = Array.from({ length: 120 }, (_, i) => i * 7919 + 3);
  const from = plan(['s1', 's2', 's3'], 4);
  const snaps = snapshotsOf(from, ids);
  const log: string[] = [];
  const events: RestoreEvent[] = [];
  let inFlight = 0;
  let most = 0;
  const byShard = (refuse: Record<string, Error> = {}) => async (shard: string) => {
    inFlight++; most = Math.max(most, inFlight);
    await new Promise((r) => setTimeout(r, 10));
    inFlight--;
    log.push(`files ${shard}`);
    if (refuse[shard]) throw refuse[shard];
    return { version: snaps.get(shard)!.version };
  };
  const restore = async (shard: string, snap: ShardSnapshot) => { log.push(`restore ${shard}`); return { version: snap.version }; };

  await restoreOntoPlan(resumeOver(snaps, log), from, restore, (e) => events.push(e), byShard());
  assert.deepEqual(log.sort(), ['files s1', 'files s2', 'files s3'], 'nothing read or sent from here');
  assert.equal(most, 3, 'the shards read at once');
  assert.deepEqual(events, [40, 41, 42].map((version, i) => ({ kind: 'restored', shard: `s${i + 1}`, version, by: 'shard' })));

  // s2 refuses its state as laid out for another plan: read whole here, re-sharded, every shard restored from here.
  log.length = 0; events.length = 0;
  await restoreOntoPlan(resumeOver(snaps, log), from, restore, (e) => events.push(e),
    byShard({ s2: new ValidationError('shard s2: restore: dense block 7 is not owned by this shard in plan v4; nothing was restored') }));
  assert.deepEqual(log.filter((l) => !l.startsWith('files')), ['read all', 'restore s1', 'restore s2', 'restore s3']);
  assert.equal(events[0]!.kind, 'reshard');
  assert.match((events[0] as { reason: string }).reason, /shard s2 refused its files: shard s2: restore: dense block 7 is not owned/);
  assert.deepEqual(events.slice(1).map((e) => (e as { by: string }).by), ['driver', 'driver', 'driver']);

  // A shard that cannot read the checkpoint (another storage, a spoiled file): the resume fails with its reason.
  log.length = 0;
  await assert.rejects(restoreOntoPlan(resumeOver(snaps, log), from, restore, () => undefined, byShard({ s3: new CheckpointError('checkpoint /ck: s3.msgpack has SHA-256 x, the manifest says y', '/ck', []) })),
    /s3\.msgpack has SHA-256 x/);
  assert.deepEqual(log.filter((l) => !l.startsWith('files')), [], 'nothing read or restored from here');
});
