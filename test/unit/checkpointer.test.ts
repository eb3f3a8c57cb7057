/**
 * The driver's checkpointer writes one shard at a time: each shard's frozen
 * copy is fetched (the next one while the one before is written), written —
 * in part files when it is large — and let go, so the driver never holds the
 * whole model; full checkpoints and the deltas on them read back exactly.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { silentLogger, systemClock } from '../../runtime/mod.ts';
import type { ShardPlan } from '../../topology/mod.ts';
import { Checkpointer } from '../../actors/scheduler/checkpointer.ts';
import { readCheckpointState, shardFiles, writeCheckpointFile, type CheckpointFile } from '../../actors/store/checkpoint.ts';
import { deltaOf, rowSteps, type RowSteps } from '../../actors/store/checkpoint-delta.ts';
import type { ShardSnapshot } from '../../actors/shard/shard.messages.ts';
import type { JobInfo } from '../../actors/store/job-info.ts';

const SHARDS = ['s0', 's1', 's2', 's3'];
const info = { job: 'ck', run_id: 'r1', groups: null, paused: false } as unknown as JobInfo;

/** Shard `k`'s state at checkpoint `n`: 2 000 rows of dim 4; an even row updated `n` times (its values and state say so), an odd one once. */
function state(k: number, n: number): ShardSnapshot {
  const rows = 2_000;
  return {
    format: 1, shard: SHARDS[k]!, plan_version: 1, version: 10 * n + k, round: 0, dense_optimizer: 'adam', sparse_optimizer: 'adagrad',
    dense: [{ id: k, param: 'w', offset: k * 8, length: 8, values: new Float32Array(8).fill(n + k), state: [new Float32Array(8), new Float32Array(8).fill(n)], step: n }],
    sparse: [{
      table: 'emb', dim: 4, stateSlots: 1, ids: Uint32Array.from({ length: rows }, (_, r) => r * 4 + k),
      values: Float32Array.from({ length: rows * 4 }, (_, i) => (Math.floor(i / 4) % 2 === 0 ? n : 1) + k), state: Float32Array.from({ length: rows * 4 }, (_, i) => (Math.floor(i / 4) % 2 === 0 ? n : 1)),
      steps: Uint32Array.from({ length: rows }, (_, r) => (r % 2 === 0 ? n : 1)),
    }],
    dedup: [], applied: [[`b${n}`, 1]], refused: [],
  };
}

test('the checkpointer fetches and writes one shard at a time, large ones in part files; full and delta checkpoints read back exactly', async () => {
  const root = await mkdtemp(join(tmpdir(), 'hetps-ck-stream-'));
  let n = 0;
  const takes: { shard: string; written: string[] }[] = [];
  const k = new Checkpointer({
    root, keep: 10, fullEvery: 2, job: 'ck', model: null, filePartBytes: 8 * 1024,
    controller: { pauseUntilPaused: async () => ({ already: false }), resume: async () => undefined, jobInfo: info },
    plan: () => ({ version: 1, shards: SHARDS }) as unknown as ShardPlan,
    frozen: {
      freeze: async () => undefined,
      take: async (shard) => {
        // What the driver has written of this checkpoint when it asks for the next shard.
        const tmp = (await readdir(root)).find((e) => e.startsWith('.tmp-'));
        takes.push({ shard, written: tmp === undefined ? [] : (await readdir(join(root, tmp))).filter((f) => /^s\d\.msgpack$/.test(f)).sort() });
        return state(SHARDS.indexOf(shard), n);
      },
    },
    acked: () => [], totalBatches: 10, clock: systemClock, log: silentLogger(),
  });
  try {
    n = 1;
    const full = await k.take('command');
    assert.equal(full.kind, 'full');
    // s2 is asked for once s0 is written (s1 is fetched while s0 is written), s3 once s1 is: never the whole model at once.
    assert.deepEqual(takes.map((t) => t.shard), SHARDS);
    assert.ok(takes[2]!.written.includes('s0.msgpack') && takes[3]!.written.includes('s1.msgpack'), JSON.stringify(takes));
    // 2 000 rows × 36 bytes per shard in parts of 8 KiB: a head file and ≥ 9 parts each.
    assert.ok(full.files >= 4 * 10, `${full.files} files`);
    const first = await readCheckpointState(full.path);
    assert.deepEqual(first.manifest.optimizer, { dense: 'adam', sparse: 'adagrad' });
    for (const [i, s] of SHARDS.entries()) assert.deepEqual(first.snapshots.get(s), state(i, 1));

    n = 2;
    const delta = await k.take('command');
    assert.equal(delta.kind, 'delta');
    assert.equal(delta.rows, 4 * 1_000, 'only the rows updated since the full one (the even ones)');
    const second = await readCheckpointState(delta.path);
    for (const [i, s] of SHARDS.entries()) assert.deepEqual(second.snapshots.get(s), state(i, 2));
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test('checkpoint.written_by shards: every shard writes its own files at once into the checkpoint\'s directory, nothing is fetched; deltas on the chain, full where a shard did not write the one before; a file missing or of another size fails it by name and leaves nothing', async () => {
  const root = await mkdtemp(join(tmpdir(), 'hetps-ck-shards-'));
  let n = 0;
  let inFlight = 0;
  let most = 0;
  let spoil: ((dir: string, files: CheckpointFile[]) => Promise<void>) | null = null;
  // Each shard's own chain, as ShardState.writeFrozen keeps it: the last checkpoint it wrote and its rows' steps then.
  const bases = new Map<string, { name: string; steps: RowSteps }>();
  const asked: { shard: string; name?: string; base: string | null }[] = [];
  const k = new Checkpointer({
    root, keep: 10, fullEvery: 3, job: 'ck', model: null,
    controller: { pauseUntilPaused: async () => ({ already: false }), resume: async () => undefined, jobInfo: info },
    plan: () => ({ version: 1, shards: SHARDS }) as unknown as ShardPlan,
    frozen: {
      freeze: async () => undefined,
      take: async (shard) => { throw new Error(`${shard} fetched: nothing should be`); },
      write: async (shard, _token, dir, chain) => {
        asked.push({ shard, ...chain });
        inFlight++;
        most = Math.max(most, inFlight);
        await new Promise((r) => setTimeout(r, 20));
        const snap = state(SHARDS.indexOf(shard), n);
        const base = bases.get(shard);
        const d = chain.base !== null && base?.name === chain.base ? deltaOf(snap, base.steps) : null;
        const files: CheckpointFile[] = [];
        for (const f of shardFiles(shard, d?.delta ?? snap, 8 * 1024)) files.push(await writeCheckpointFile(dir, f));
        await spoil?.(dir, files);
        if (chain.name !== undefined) bases.set(shard, { name: chain.name, steps: d !== null ? base!.steps : rowSteps(snap) });
        inFlight--;
        const held = snap.sparse[0]!.ids.length;
        return { files, kind: d !== null ? 'delta' : 'full', rows: d?.rows ?? held, rows_held: held, dense_optimizer: snap.dense_optimizer, sparse_optimizer: snap.sparse_optimizer };
      },
    },
    acked: () => [], totalBatches: 10, clock: systemClock, log: silentLogger(),
  });
  try {
    const kinds: string[] = [];
    const rows: number[] = [];
    const names: string[] = [];
    for (n = 1; n <= 4; n++) {
      // Before the third, s2's primary moved: the new one never wrote the chain's last checkpoint.
      if (n === 3) bases.delete('s2');
      const taken = await k.take('command');
      assert.equal(taken.written_by, 'shards');
      kinds.push(taken.kind); rows.push(taken.rows); names.push(taken.name);
      const back = await readCheckpointState(taken.path);
      assert.deepEqual(back.manifest.optimizer, { dense: 'adam', sparse: 'adagrad' });
      for (const [i, s] of SHARDS.entries()) assert.deepEqual(back.snapshots.get(s), state(i, n), `checkpoint ${n}, ${s}: its chain read back`);
    }
    assert.deepEqual(kinds, ['full', 'delta', 'delta', 'full'], 'full_every 3');
    // The second: each shard the 1 000 even rows updated since; the third: s2 whole (2 000), the others 1 000.
    assert.deepEqual(rows, [4 * 2_000, 4 * 1_000, 2_000 + 3 * 1_000, 4 * 2_000]);
    assert.deepEqual(asked.filter((a) => a.shard === 's0').map((a) => a.base), [null, names[0], names[1], null], 'each delta asked on the chain\'s last checkpoint');
    assert.equal(most, SHARDS.length, 'the shards wrote at once');

    const before = (await readdir(root)).sort();
    spoil = async (dir, files) => { if (files[0]!.shard === 's2') await rm(join(dir, files[1]!.name)); };
    await assert.rejects(k.take('command'), new RegExp(`s2\\.part-\\d+\\.msgpack was to be written into .* but is not there; the writer and this process must see the same directory`));
    spoil = async (dir, files) => { if (files[0]!.shard === 's1') files[0]!.bytes += 1; };
    await assert.rejects(k.take('command'), /s1\.msgpack was to be written into .* \(\d+ bytes\) but has \d+ bytes/);
    assert.deepEqual((await readdir(root)).sort(), before, 'no checkpoint and no temporary directory left');
    spoil = null;
    assert.equal((await k.take('command')).kind, 'full', 'after a failed one the chain starts again');
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});
