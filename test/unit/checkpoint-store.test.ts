import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  CheckpointError, listCheckpoints, writeCheckpointAt, newestValidCheckpoint, pruneCheckpoints, readCheckpointFile, readCheckpointState, sha256, shardFiles, verifyCheckpoint, writeCheckpoint, type CheckpointContent, type CheckpointFileContent, type ManifestFields,
} from '../../actors/store/checkpoint.ts';
import type { ShardSnapshot } from '../../actors/shard/shard.messages.ts';

async function withRoot(f: (root: string) => Promise<void>): Promise<void> {
  const root = await mkdtemp(join(tmpdir(), 'hetps-ckpt-'));
  try { await f(root); } finally { await rm(root, { recursive: true, force: true }); }
}

function content(tag: string, files = 2): CheckpointContent & { files: CheckpointFileContent[]; manifest: ManifestFields } {
  return {
    files: Array.from({ length: files }, (_, i) => ({ name: `s${i + 1}.msgpack`, bytes: new TextEncoder().encode(`${tag} state of s${i + 1} `.repeat(50)), shard: `s${i + 1}`, version: 10 + i, round: 0 })),
    manifest: {
      job: 'j', run_id: 'run-1', trigger: 'command', plan: { version: 3, shards: ['s1', 's2'], placement: null }, groups: null,
      optimizer: { dense: 'adam', sparse: 'adagrad' }, data: { total_batches: 10, acked: ['b1', 'b2'] },
    },
  };
}

test('a checkpoint is written into place with a manifest of sizes and SHA-256 that verifies', async () => {
  await withRoot(async (root) => {
    const c = content('first');
    const { path, manifest } = await writeCheckpoint(root, c);
    assert.match(manifest.name, /^ckpt-000001-/);
    assert.equal(path, join(root, manifest.name));
    assert.deepEqual(await readdir(root), [manifest.name], 'no temporary directory left behind');
    assert.deepEqual(manifest.files.map((f) => [f.name, f.bytes, f.sha256, f.shard]), c.files.map((f) => [f.name, f.bytes.byteLength, sha256(f.bytes), f.shard]));
    assert.equal(manifest.bytes, c.files.reduce((n, f) => n + f.bytes.byteLength, 0));
    assert.deepEqual(manifest.data, { total_batches: 10, acked: ['b1', 'b2'] });
    assert.deepEqual(await verifyCheckpoint(path), manifest);
    assert.deepEqual(new Uint8Array(await readCheckpointFile(path, manifest.files[1]!)), new Uint8Array(c.files[1]!.bytes));
    const second = await writeCheckpoint(root, content('second'));
    assert.equal(second.manifest.sequence, 2);
    assert.deepEqual((await listCheckpoints(root)).map((l) => [l.sequence, l.error]), [[1, null], [2, null]]);
  });
});

test('one flipped byte: verify names the file and both checksums, and the newest valid checkpoint is the one before', async () => {
  await withRoot(async (root) => {
    const older = await writeCheckpoint(root, content('older'));
    const newer = await writeCheckpoint(root, content('newer'));
    const file = join(newer.path, 's2.msgpack');
    const bytes = await readFile(file);
    bytes[17] = bytes[17]! ^ 0x01;
    await writeFile(file, bytes);
    const want = newer.manifest.files[1]!.sha256;
    await assert.rejects(verifyCheckpoint(newer.path), (e: unknown) => e instanceof CheckpointError
      && e.problems.length === 1 && e.problems[0] === `s2.msgpack: SHA-256 ${sha256(bytes)}, the manifest says ${want}`);
    await assert.rejects(readCheckpointFile(newer.path, newer.manifest.files[1]!), /s2\.msgpack has SHA-256/);
    const pick = await newestValidCheckpoint(root);
    assert.equal(pick?.path, older.path);
    assert.equal(pick?.refused.length, 1);
    assert.equal(pick?.refused[0]?.path, newer.path);
    assert.match(pick!.refused[0]!.reason, /s2\.msgpack: SHA-256 [0-9a-f]{64}, the manifest says [0-9a-f]{64}/);
  });
});

test('a truncated file, a missing file and a directory without a manifest are refused by name', async () => {
  await withRoot(async (root) => {
    const a = await writeCheckpoint(root, content('a'));
    await writeFile(join(a.path, 's1.msgpack'), 'short');
    await rm(join(a.path, 's2.msgpack'));
    await assert.rejects(verifyCheckpoint(a.path), (e: unknown) => e instanceof CheckpointError
      && /^s1\.msgpack: 5 bytes, the manifest says \d+$/.test(e.problems[0]!) && e.problems.includes('s2.msgpack: missing'));
    // A crash before the rename leaves no checkpoint; one that lost its manifest is not one either.
    await mkdir(join(root, 'ckpt-000009-crashed'));
    await writeFile(join(root, 'ckpt-000009-crashed', 's1.msgpack'), 'x');
    await assert.rejects(verifyCheckpoint(join(root, 'ckpt-000009-crashed')), /no manifest\.json \(an incomplete checkpoint\)/);
    const listed = await listCheckpoints(root);
    assert.deepEqual(listed.map((l) => [l.sequence, l.manifest === null]), [[1, false], [9, true]]);
    assert.equal(await newestValidCheckpoint(root), null, 'nothing usable');
    await writeFile(join(a.path, 'manifest.json'), '{"format": 2, "name": "x"}');
    await assert.rejects(verifyCheckpoint(a.path), (e: unknown) => e instanceof CheckpointError && e.problems.some((p) => p.startsWith('manifest.json: sequence:')));
  });
});

test('prune keeps the newest N and removes temporary directories of writes that died', async () => {
  await withRoot(async (root) => {
    for (const t of ['1', '2', '3', '4']) await writeCheckpoint(root, content(t, 1));
    await mkdir(join(root, '.tmp-ckpt-000005-x-999999999'));
    const removed = await pruneCheckpoints(root, 2);
    assert.equal(removed.length, 3);
    assert.deepEqual((await listCheckpoints(root)).map((l) => l.sequence), [3, 4]);
    assert.deepEqual((await readdir(root)).filter((e) => e.startsWith('.tmp')), []);
    assert.equal((await writeCheckpoint(root, content('5', 1))).manifest.sequence, 5, 'sequence numbers keep growing after a prune');
    await assert.rejects(pruneCheckpoints(root, 0), /checkpoint\.keep must be an integer ≥ 1, got 0/);
  });
});

test('bad content is refused before anything is written', async () => {
  await withRoot(async (root) => {
    const c = content('dup');
    c.files[1]!.name = c.files[0]!.name;
    await assert.rejects(writeCheckpoint(root, c), /file names repeat/);
    const bad = content('bad');
    bad.files[0]!.name = '../escape';
    await assert.rejects(writeCheckpoint(root, bad));
    assert.deepEqual((await readdir(root)).filter((e) => !e.startsWith('.tmp')), []);
  });
});

test('a checkpoint at a chosen path (the API) is written the same way and never over an existing one', async () => {
  await withRoot(async (root) => {
    const at = join(root, 'epoch_2');
    const { path, manifest } = await writeCheckpointAt(at, { ...content('api'), manifest: { ...content('api').manifest, trigger: 'api' } });
    assert.equal(path, at);
    assert.deepEqual([manifest.name, manifest.sequence, manifest.trigger], ['epoch_2', 0, 'api']);
    assert.deepEqual(await verifyCheckpoint(at), manifest);
    await assert.rejects(writeCheckpointAt(at, content('again')), /epoch_2 exists already; choose another path or remove it first/);
    assert.deepEqual(await readdir(root), ['epoch_2']);
  });
});

test('a shard state over the file part size: a head file and part files, each in the manifest with its checksum; read back exactly, a damaged or missing part named', async () => {
  await withRoot(async (root) => {
    const rows = 5_000;
    const snap: ShardSnapshot = {
      format: 1, shard: 's1', plan_version: 2, version: 77, round: 0, dense_optimizer: 'adam', sparse_optimizer: 'adagrad',
      dense: [{ id: 0, param: 'w', offset: 0, length: 3_000, values: Float32Array.from({ length: 3_000 }, (_, i) => i / 3), state: [new Float32Array(3_000).fill(0.5), new Float32Array(3_000).fill(2)], step: 77 }],
      sparse: [{ table: 'emb', dim: 4, stateSlots: 1, ids: Uint32Array.from({ length: rows }, (_, i) => i * 3), values: Float32Array.from({ length: rows * 4 }, (_, i) => i % 97), state: new Float32Array(rows * 4).fill(0.1), steps: new Uint32Array(rows).fill(3) }],
      dedup: [{ from: 'w1', evicted_up_to: -1, seqs: [1, 2], replies: [{ version: 1, applied: true, staleness: 0, lr_scale: 1 }, { version: 2, applied: true, staleness: 0, lr_scale: 1 }] }],
      applied: [['b1', 1]], refused: [],
    };
    const files = [...shardFiles('s1', snap, 16 * 1024)];
    // ~36 KB of dense arrays and ~180 KB of rows in parts of 16 KiB: ≥ 13 parts, each under the part size.
    assert.ok(files.length >= 14, `${files.length} files`);
    assert.equal(files[0]!.name, 's1.msgpack');
    assert.deepEqual([files[0]!.shard, files[0]!.version], ['s1', 77]);
    assert.ok(files.slice(1).every((f, i) => f.name === `s1.part-${String(i + 1).padStart(6, '0')}.msgpack` && f.shard === null && f.bytes.byteLength < 17 * 1024));
    // A small state stays one file, as before.
    assert.equal([...shardFiles('s1', { ...snap, dense: [], sparse: [] }, 16 * 1024)].length, 1);
    const c: CheckpointContent = { ...content('big', 0), files };
    const { path, manifest } = await writeCheckpoint(root, c);
    assert.equal(manifest.files.length, files.length);
    assert.deepEqual((await readCheckpointState(path)).snapshots.get('s1'), snap);

    // One byte of a part flipped: the checkpoint fails its checks, naming that part.
    const part = join(path, files[5]!.name);
    const bytes = await readFile(part);
    bytes[40] = bytes[40]! ^ 0x01;
    await writeFile(part, bytes);
    await assert.rejects(readCheckpointState(path), (e: unknown) => e instanceof CheckpointError && e.problems.some((p) => p.startsWith(`${files[5]!.name}: SHA-256`)));
    // A head naming a part the manifest does not list.
    const other = await writeCheckpoint(root, { ...c, files: files.filter((_, i) => i !== 3) });
    await assert.rejects(readCheckpointState(other.path), new RegExp(`s1\\.msgpack names part ${files[3]!.name.replace(/\./g, '\\.')}, which the manifest does not list`));
  });
});
