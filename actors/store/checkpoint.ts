/**
 * Checkpoint directories: one directory per checkpoint under a root, written
 * so that a crash at any moment leaves either the whole checkpoint or none
 * of it, and checked file by file before anything reads it back.
 *
 * Writing (`writeCheckpoint`):
 * 1. every file goes into a hidden temporary directory `.tmp-<name>-<pid>`
 *    under the root, each one fsynced;
 * 2. `manifest.json` last, naming every file with its size and SHA-256;
 * 3. the temporary directory is fsynced and renamed to `<name>` (atomic on
 *    one file system), then the root is fsynced.
 *
 * A directory without a manifest, or whose files do not match it, is not a
 * checkpoint: `verifyCheckpoint` says which file and what differs, and
 * `newestValidCheckpoint` skips it for the one before, saying why.
 * Temporary directories left by a crash are ignored and removed by
 * `pruneCheckpoints`.
 */
import { createHash } from 'node:crypto';
import { mkdir, open, readdir, readFile, rename, rm, stat } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { z } from 'zod';
import { HetpsError, decode, encode } from '../../runtime/mod.ts';
import type { ShardSnapshot } from '../shard/shard.messages.ts';
import { SnapshotAssembler, splitSnapshot, type SnapshotHead, type SnapshotSegment } from '../shard/snapshot-segments.ts';
import { overlay } from './checkpoint-delta.ts';

/** The job's checkpoint root: checkpoint.dir, or <job.run_dir>/checkpoints/<job.name>; absolute. */
export function checkpointRoot(config: { job: { name: string; run_dir: string }; checkpoint: { dir: string | null } }): string {
  return resolve(config.checkpoint.dir ?? join(config.job.run_dir, 'checkpoints', config.job.name));
}

/** The manifest format written here (the API's first checkpoints, without checksums, were format 1). */
export const CHECKPOINT_FORMAT = 2;
const MANIFEST = 'manifest.json';
const NAME = /^ckpt-(\d{6,})-/;
const plainName = (n: string) => n.length > 0 && !n.includes('/') && !n.includes('\\') && n !== MANIFEST && !n.startsWith('.');

const fileEntry = z.object({
  /** File name inside the checkpoint directory. */
  name: z.string().min(1).refine((n) => plainName(n), 'a plain file name'),
  bytes: z.number().int().nonnegative(),
  sha256: z.string().regex(/^[0-9a-f]{64}$/),
  /** The shard whose state the file holds (null: some other part of the checkpoint). */
  shard: z.string().min(1).nullable().default(null),
  /** The shard's version and round in the file. */
  version: z.number().int().nonnegative().nullable().default(null),
  round: z.number().int().nonnegative().nullable().default(null),
});

/**
 * The model the shards' state belongs to: what `hetps export` needs to turn
 * the checkpoint into an inference graph without the job's config.
 */
export const checkpointModelSchema = z.discriminatedUnion('type', [
  z.object({
    type: z.literal('ctr'),
    slots: z.number().int().positive(),
    embedding_dim: z.number().int().positive(),
    dense_features: z.number().int().nonnegative(),
    hidden: z.array(z.number().int().positive()),
    pooling: z.enum(['sum', 'mean']),
    wide: z.boolean(),
    /** `bucketCtrIds` buckets (one number, or one per slot); null: the data's ids key the rows as they are. */
    hash_buckets: z.union([z.number().int().positive(), z.array(z.number().int().positive()).min(1)]).nullable(),
  }),
  z.object({ type: z.literal('mlp'), layers: z.array(z.number().int().positive()).min(2) }),
]);
export type CheckpointModel = z.output<typeof checkpointModelSchema>;

export const checkpointManifestSchema = z.object({
  format: z.literal(CHECKPOINT_FORMAT),
  /** The directory name: `ckpt-<sequence>-<time>` under a checkpoint root, or the name a caller chose (the API's `saveCheckpoint({ path })`). */
  name: z.string().min(1),
  /** Its number under the root (0: written at a path the caller chose). */
  sequence: z.number().int().nonnegative(),
  job: z.string().min(1),
  run_id: z.string().min(1).nullable(),
  created_at: z.string().min(1),
  /** What took it: a control command, the periodic timer, the end of the job, the API. */
  trigger: z.enum(['command', 'periodic', 'end', 'api']),
  /** `full`: every row; `delta`: dense blocks and the sparse rows updated since the last checkpoint of `chain` (actors/store/checkpoint-delta.ts). */
  kind: z.enum(['full', 'delta']).default('full'),
  /** A delta: the checkpoints it builds on, oldest (the full one) first, by name, in the same root; [] for a full one. */
  chain: z.array(z.string().min(1)).default([]),
  /** The shard plan at the cut: its version (epoch), shards and placement. */
  plan: z.object({ version: z.number().int().nonnegative(), shards: z.array(z.string().min(1)), placement: z.unknown().nullable().default(null) }),
  /** hps: the groups at the cut (null: another mode). */
  groups: z.array(z.unknown()).nullable().default(null),
  optimizer: z.object({ dense: z.string().min(1), sparse: z.string().min(1) }).nullable().default(null),
  /** The model (null: a checkpoint written before hetps recorded it; `hetps export --config` supplies it). */
  model: checkpointModelSchema.nullable().default(null),
  /** Where the data stood: batches acknowledged before the cut (by id) and the job's total. */
  data: z.object({ total_batches: z.number().int().nonnegative().nullable(), acked: z.array(z.string().min(1)) }).nullable().default(null),
  files: z.array(fileEntry),
  /** Σ bytes of the files. */
  bytes: z.number().int().nonnegative(),
});
export type CheckpointManifest = z.output<typeof checkpointManifestSchema>;
export type CheckpointFile = z.output<typeof fileEntry>;

/** A checkpoint that cannot be used: `problems` names each file and what is wrong with it. */
export class CheckpointError extends HetpsError {
  constructor(message: string, readonly path: string, readonly problems: string[]) {
    super(message, { data: { path, problems } });
  }
}

/** Node's hash and file calls take at most 2 GiB at once; a shard's file may be larger (up to a Buffer's 4 GiB). */
const IO_CHUNK = 1 << 30;

export function sha256(bytes: Uint8Array): string {
  const h = createHash('sha256');
  for (let at = 0; at < bytes.byteLength; at += IO_CHUNK) h.update(bytes.subarray(at, Math.min(bytes.byteLength, at + IO_CHUNK)));
  return h.digest('hex');
}

/** A whole file, in chunks: `readFile` refuses files over 2 GiB. */
export async function readWholeFile(path: string): Promise<Buffer> {
  const fh = await open(path, 'r');
  try {
    const size = (await fh.stat()).size;
    const out = Buffer.allocUnsafe(size);
    let at = 0;
    while (at < size) {
      const { bytesRead } = await fh.read(out, at, Math.min(IO_CHUNK, size - at), at);
      if (bytesRead === 0) throw new Error(`${path}: ended at byte ${at} of ${size} (changed while read)`);
      at += bytesRead;
    }
    return out;
  } finally {
    await fh.close();
  }
}

async function writeSynced(path: string, bytes: Uint8Array): Promise<void> {
  const fh = await open(path, 'wx');
  try {
    await fh.writeFile(bytes);
    await fh.sync();
  } finally {
    await fh.close();
  }
}

async function syncDir(path: string): Promise<void> {
  const fh = await open(path, 'r');
  try { await fh.sync(); } finally { await fh.close(); }
}

/** The next sequence number under `root` (1 when it holds none). */
export async function nextSequence(root: string): Promise<number> {
  let max = 0;
  for (const e of await readdir(root).catch(() => [] as string[])) {
    const m = NAME.exec(e);
    if (m !== null) max = Math.max(max, Number(m[1]));
  }
  return max + 1;
}

/** A shard file's arrays beyond this go into part files (each one Buffer in memory while written or read). */
export const SHARD_FILE_PART_BYTES = 256 * 1024 * 1024;

/** The head file of a shard whose state is split into part files: the layout, the part files in order, and the replica's logs. */
interface SegmentedShardFile {
  segmented: { head: SnapshotHead; parts: string[] };
  dedup?: ShardSnapshot['dedup'];
  applied?: ShardSnapshot['applied'];
  refused?: ShardSnapshot['refused'];
}

/**
 * One shard's state as checkpoint files: `<shard>.msgpack` holding the
 * whole snapshot while its arrays fit `partBytes`; otherwise a head file of
 * that name (the layout, the logs, the part files' names) and
 * `<shard>.part-<n>.msgpack` files, each a segment of at most `partBytes`
 * (snapshot-segments.ts), so no file — and no Buffer — has to hold the
 * whole state (a Buffer holds at most 4 GiB).
 */
export function* shardFiles(shard: string, snap: ShardSnapshot, partBytes = SHARD_FILE_PART_BYTES): Generator<CheckpointFileContent> {
  const meta = { shard, version: snap.version, round: snap.round };
  const { head, segments } = splitSnapshot(snap, partBytes);
  if (segments.length <= 1) {
    yield { name: `${shard}.msgpack`, bytes: encode(snap), ...meta };
    return;
  }
  const parts = segments.map((_, i) => `${shard}.part-${String(i + 1).padStart(6, '0')}.msgpack`);
  const headFile: SegmentedShardFile = {
    segmented: { head, parts },
    ...(snap.dedup === undefined ? {} : { dedup: snap.dedup, applied: snap.applied ?? [], refused: snap.refused ?? [] }),
  };
  yield { name: `${shard}.msgpack`, bytes: encode(headFile), ...meta };
  // Parts are no shard's file of their own: the head names them. Each is encoded when it is written.
  for (let i = 0; i < segments.length; i++) yield { name: parts[i]!, bytes: encode(segments[i]!), shard: null };
}

/** A shard file's snapshot: the file itself, or (a head file) rebuilt from the part files it names, each checked against the manifest. */
async function readShardFile(path: string, manifest: CheckpointManifest, f: CheckpointFile): Promise<ShardSnapshot> {
  const raw = decode(await readCheckpointFile(path, f)) as ShardSnapshot | SegmentedShardFile;
  if (!('segmented' in raw)) return raw;
  const asm = new SnapshotAssembler(raw.segmented.head, `checkpoint ${path}: ${f.name}`);
  for (const name of raw.segmented.parts) {
    const part = manifest.files.find((x) => x.name === name);
    if (part === undefined) throw new CheckpointError(`checkpoint ${path}: ${f.name} names part ${name}, which the manifest does not list`, path, [`${name}: missing`]);
    try {
      asm.add(decode(await readCheckpointFile(path, part)) as SnapshotSegment);
    } catch (e) {
      if (e instanceof CheckpointError) throw e;
      throw new CheckpointError(`checkpoint ${path}: ${name} does not continue ${f.name}: ${(e as Error).message}`, path, [`${name}: ${(e as Error).message}`]);
    }
  }
  let snap: ShardSnapshot;
  try { snap = asm.finish(); } catch (e) {
    throw new CheckpointError(`checkpoint ${path}: ${f.name}: ${(e as Error).message}`, path, [`${f.name}: ${(e as Error).message}`]);
  }
  return raw.dedup === undefined ? snap : { ...snap, dedup: raw.dedup, applied: raw.applied ?? [], refused: raw.refused ?? [] };
}

export interface CheckpointFileContent { name: string; bytes: Uint8Array; shard?: string | null; version?: number | null; round?: number | null }
export type ManifestFields = Omit<CheckpointManifest, 'format' | 'name' | 'sequence' | 'files' | 'bytes' | 'created_at' | 'kind' | 'chain' | 'model'>
  & { created_at?: string; kind?: CheckpointManifest['kind']; chain?: string[]; model?: CheckpointModel | null };

/** A file some other process (a shard, `checkpoint.written_by: shards`) wrote into the checkpoint's directory, as it says. */
export interface WrittenFile { written: CheckpointFile }

/**
 * Writes one file of a checkpoint into `dir` (its temporary directory):
 * created new, synced, and described for the manifest (size, SHA-256).
 */
export async function writeCheckpointFile(dir: string, f: CheckpointFileContent): Promise<CheckpointFile> {
  checkName(f.name);
  await writeSynced(join(dir, f.name), f.bytes);
  return { name: f.name, bytes: f.bytes.byteLength, sha256: sha256(f.bytes), shard: f.shard ?? null, version: f.version ?? null, round: f.round ?? null };
}

export interface CheckpointContent {
  /**
   * The files; or, streamed, an iterable producing them one at a time:
   * each is written as it comes and then let go, so a checkpoint never has
   * to be in memory whole; or a function given the temporary directory and the checkpoint's name,
   * whose iterable may also name files others wrote there (`WrittenFile`:
   * each must be there, of the size it says).
   */
  files: CheckpointFileContent[] | Iterable<CheckpointFileContent> | AsyncIterable<CheckpointFileContent>
    | ((dir: string, name: string) => AsyncIterable<CheckpointFileContent | WrittenFile>);
  /** The manifest's fields; or a function asked once every file is written (fields known only then). */
  manifest: ManifestFields | (() => ManifestFields);
}

/**
 * Writes one checkpoint under `root` atomically (see the module comment);
 * returns its path and manifest. Throws if a file name repeats.
 */
export async function writeCheckpoint(root: string, content: CheckpointContent): Promise<{ path: string; manifest: CheckpointManifest }> {
  checkNames(content);
  await mkdir(root, { recursive: true });
  const sequence = await nextSequence(root);
  const createdAt = createdAtOf(content);
  const name = `ckpt-${String(sequence).padStart(6, '0')}-${createdAt.replace(/[:.]/g, '-')}`;
  return writeInto(root, name, sequence, createdAt, content);
}

/**
 * Writes one checkpoint at exactly `path` (the API's `saveCheckpoint({ path
 * })`), as atomically as `writeCheckpoint`; refuses a path that exists.
 */
export async function writeCheckpointAt(path: string, content: CheckpointContent): Promise<{ path: string; manifest: CheckpointManifest }> {
  checkNames(content);
  await refuseExisting(path);
  const parent = dirname(path);
  await mkdir(parent, { recursive: true });
  return writeInto(parent, basename(path), 0, createdAtOf(content), content);
}

function createdAtOf(content: CheckpointContent): string {
  return (typeof content.manifest === 'function' ? undefined : content.manifest.created_at) ?? new Date().toISOString();
}

/** A checkpoint written at exactly `path` never replaces anything. */
export async function refuseExisting(path: string): Promise<void> {
  if (await stat(path).catch(() => null)) throw new HetpsError(`checkpoint: ${path} exists already; choose another path or remove it first`);
}

/** Files given as a list are checked before anything is written; streamed ones as each comes (checkName). */
function checkNames(content: CheckpointContent): void {
  if (!Array.isArray(content.files)) return;
  const names = content.files.map((f) => f.name);
  if (new Set(names).size !== names.length) throw new HetpsError(`checkpoint: file names repeat (${names.join(', ')})`);
  for (const n of names) checkName(n);
}

function checkName(n: string): void {
  if (!plainName(n)) throw new HetpsError(`checkpoint: ${JSON.stringify(n)} is not a plain file name (no path, not ${MANIFEST}, not hidden)`);
}

async function writeInto(parent: string, name: string, sequence: number, createdAt: string, content: CheckpointContent): Promise<{ path: string; manifest: CheckpointManifest }> {
  const tmp = join(parent, `.tmp-${name}-${process.pid}`);
  await rm(tmp, { recursive: true, force: true });
  await mkdir(tmp);
  try {
    const files: CheckpointFile[] = [];
    const source = typeof content.files === 'function' ? content.files(tmp, name) : content.files;
    for await (const f of source) {
      const name = 'written' in f ? f.written.name : f.name;
      checkName(name);
      if (files.some((x) => x.name === name)) throw new HetpsError(`checkpoint: file name ${name} repeats`);
      if ('written' in f) {
        const st = await stat(join(tmp, name)).catch(() => null);
        if (st === null || st.size !== f.written.bytes) {
          throw new HetpsError(`checkpoint: ${name} was to be written into ${tmp} (${f.written.bytes} bytes) but ${st === null ? 'is not there' : `has ${st.size} bytes`}; the writer and this process must see the same directory`);
        }
        files.push(f.written);
      } else {
        files.push(await writeCheckpointFile(tmp, f));
      }
    }
    const fields = typeof content.manifest === 'function' ? content.manifest() : content.manifest;
    const manifest = checkpointManifestSchema.parse({
      ...fields, format: CHECKPOINT_FORMAT, name, sequence, created_at: createdAt, files, bytes: files.reduce((n, f) => n + f.bytes, 0),
    });
    await writeSynced(join(tmp, MANIFEST), new TextEncoder().encode(`${JSON.stringify(manifest, null, 2)}\n`));
    await syncDir(tmp);
    const path = join(parent, name);
    await rename(tmp, path);
    await syncDir(parent);
    return { path, manifest };
  } catch (e) {
    await rm(tmp, { recursive: true, force: true }).catch(() => undefined);
    throw e;
  }
}

/** Reads and checks `path`'s manifest; throws CheckpointError naming what is wrong. */
export async function readManifest(path: string): Promise<CheckpointManifest> {
  let text: string;
  try {
    text = await readFile(join(path, MANIFEST), 'utf8');
  } catch (e) {
    throw new CheckpointError(`checkpoint ${path}: no ${MANIFEST} (an incomplete checkpoint): ${(e as Error).message}`, path, [`${MANIFEST}: missing`]);
  }
  let raw: unknown;
  try { raw = JSON.parse(text); } catch (e) {
    throw new CheckpointError(`checkpoint ${path}: ${MANIFEST} is not JSON: ${(e as Error).message}`, path, [`${MANIFEST}: not JSON`]);
  }
  const r = checkpointManifestSchema.safeParse(raw);
  if (!r.success) {
    const problems = r.error.issues.map((i) => `${MANIFEST}: ${i.path.join('.') || '(root)'}: ${i.message}`);
    throw new CheckpointError(`checkpoint ${path}: ${MANIFEST} is not a format-${CHECKPOINT_FORMAT} manifest: ${problems.join('; ')}`, path, problems);
  }
  return r.data;
}

/**
 * Checks every file of the checkpoint at `path` against its manifest (size,
 * SHA-256). Resolves with the manifest; throws CheckpointError listing each
 * file that is missing or differs, with the expected and the actual checksum.
 */
export async function verifyCheckpoint(path: string): Promise<CheckpointManifest> {
  const manifest = await readManifest(path);
  const problems: string[] = [];
  for (const f of manifest.files) {
    let bytes: Uint8Array;
    try { bytes = await readWholeFile(join(path, f.name)); } catch {
      problems.push(`${f.name}: missing`);
      continue;
    }
    if (bytes.byteLength !== f.bytes) problems.push(`${f.name}: ${bytes.byteLength} bytes, the manifest says ${f.bytes}`);
    const sum = sha256(bytes);
    if (sum !== f.sha256) problems.push(`${f.name}: SHA-256 ${sum}, the manifest says ${f.sha256}`);
  }
  if (problems.length > 0) throw new CheckpointError(`checkpoint ${path} fails its checks: ${problems.join('; ')}`, path, problems);
  return manifest;
}

/** Reads one file of a verified checkpoint, checking it again (it may have changed since). */
export async function readCheckpointFile(path: string, f: CheckpointFile): Promise<Uint8Array> {
  const bytes = await readWholeFile(join(path, f.name));
  const sum = sha256(bytes);
  if (sum !== f.sha256) throw new CheckpointError(`checkpoint ${path}: ${f.name} has SHA-256 ${sum}, the manifest says ${f.sha256}`, path, [`${f.name}: checksum`]);
  return bytes;
}

export interface CheckpointListing {
  name: string;
  path: string;
  sequence: number;
  /** null when the manifest cannot be read (see `error`). */
  manifest: CheckpointManifest | null;
  /** Why it is not usable; null for one whose manifest reads (files are checked by `verifyCheckpoint`). */
  error: string | null;
}

/** The checkpoints under `root`, oldest first (temporary directories of unfinished writes are left out). */
export async function listCheckpoints(root: string): Promise<CheckpointListing[]> {
  const out: CheckpointListing[] = [];
  for (const e of await readdir(root).catch(() => [] as string[])) {
    const m = NAME.exec(e);
    if (m === null) continue;
    const path = join(root, e);
    if (!(await stat(path).catch(() => null))?.isDirectory()) continue;
    try {
      out.push({ name: e, path, sequence: Number(m[1]), manifest: await readManifest(path), error: null });
    } catch (err) {
      out.push({ name: e, path, sequence: Number(m[1]), manifest: null, error: (err as Error).message });
    }
  }
  return out.sort((a, b) => a.sequence - b.sequence);
}

/**
 * The newest checkpoint under `root` that passes `verifyCheckpoint`, and the
 * newer ones refused on the way (each with its reason). null when none is usable.
 */
export async function newestValidCheckpoint(root: string): Promise<{ path: string; manifest: CheckpointManifest; refused: { path: string; reason: string }[] } | null> {
  const r = await newestUsable(root, verifyCheckpoint);
  return r.found === null ? null : { path: r.found.path, manifest: r.found.value, refused: r.refused };
}

/** The newest checkpoint under `root` that `use` accepts (its value), and the newer ones it refused, each with its reason. */
async function newestUsable<T>(root: string, use: (path: string) => Promise<T>): Promise<{ found: { path: string; value: T } | null; refused: { path: string; reason: string }[]; listed: number }> {
  const refused: { path: string; reason: string }[] = [];
  const all = await listCheckpoints(root);
  for (const c of [...all].reverse()) {
    try {
      return { found: { path: c.path, value: await use(c.path) }, refused, listed: all.length };
    } catch (e) {
      refused.push({ path: c.path, reason: (e as Error).message });
    }
  }
  return { found: null, refused, listed: all.length };
}

/** Keeps the newest `keep` checkpoints under `root` (and the checkpoints their deltas build on), removes older ones and temporary directories of writes that did not finish; returns what it removed. */
export async function pruneCheckpoints(root: string, keep: number): Promise<string[]> {
  if (!(Number.isInteger(keep) && keep >= 1)) throw new HetpsError(`checkpoint.keep must be an integer ≥ 1, got ${keep}`);
  const removed: string[] = [];
  const all = await listCheckpoints(root);
  const kept = all.slice(Math.max(0, all.length - keep));
  // A kept delta needs its whole chain.
  const needed = new Set([...kept.map((c) => c.name), ...kept.flatMap((c) => c.manifest?.chain ?? [])]);
  for (const c of all) {
    if (needed.has(c.name)) continue;
    await rm(c.path, { recursive: true, force: true });
    removed.push(c.path);
  }
  for (const e of await readdir(root).catch(() => [] as string[])) {
    if (!e.startsWith('.tmp-ckpt-')) continue;
    // Another process's write in progress ends with its pid; only ours, or a dead one's, are removed.
    const pid = Number(/-(\d+)$/.exec(e)?.[1] ?? NaN);
    if (pid !== process.pid && Number.isFinite(pid) && processAlive(pid)) continue;
    await rm(join(root, e), { recursive: true, force: true });
    removed.push(join(root, e));
  }
  return removed;
}

function processAlive(pid: number): boolean {
  try { process.kill(pid, 0); return true; } catch (e) { return (e as NodeJS.ErrnoException).code === 'EPERM'; }
}

/**
 * A checkpoint chosen for a resume: it and every checkpoint of its chain
 * verified (every file's SHA-256), its shards' state read when asked for, one
 * shard at a time, so the driver holds one shard's state (and its delta
 * chain) at once, not the whole checkpoint.
 */
export interface ResumePoint {
  path: string;
  manifest: CheckpointManifest;
  /** The shards that hold state in the checkpoint (its chain included), sorted. */
  shards: string[];
  /** One shard's state as of the checkpoint (a delta's chain applied in order); CheckpointError naming the file that does not read. */
  readShard(shard: string): Promise<ShardSnapshot>;
  /** Every shard's state at once (a re-shard needs them together). */
  readAll(): Promise<Map<string, ShardSnapshot>>;
  /** Batch ids done (acknowledged) at the cut. */
  done: Set<string>;
  /** Newer checkpoints refused on the way, each with its reason (`latest` only). */
  refused: { path: string; reason: string }[];
}

/**
 * The shards' state as of one checkpoint: it and every checkpoint of its
 * chain verified (CheckpointError naming the file otherwise), their shard
 * files decoded and applied in order.
 */
export async function readCheckpointState(path: string): Promise<{ manifest: CheckpointManifest; snapshots: Map<string, ShardSnapshot> }> {
  const manifest = await verifyCheckpoint(path);
  return { manifest, snapshots: await (await checkpointChain(path, manifest)).readAll() };
}

/** A checkpoint for a resume: its chain verified, and a check that it is of this job and records where the data stood. */
async function readForResume(path: string, job: string): Promise<Omit<ResumePoint, 'refused'>> {
  const manifest = await verifyCheckpoint(path);
  if (manifest.job !== job) throw new CheckpointError(`checkpoint ${path} is of job ${manifest.job}, not ${job}; give a checkpoint of this job (or --job ${manifest.job})`, path, []);
  if (manifest.data === null) throw new CheckpointError(`checkpoint ${path} records no data position (a checkpoint saved by the API); a resume needs one taken by the driver (ctl.checkpoint, checkpoint.every_s, the end of a job)`, path, []);
  return { path, manifest, ...(await checkpointChain(path, manifest)), done: new Set(manifest.data.acked) };
}

/**
 * A checkpoint's chain (the checkpoints a delta builds on, then itself), each
 * link verified; a shard's state is read from its files in each link only
 * when asked for.
 */
async function checkpointChain(
  path: string, manifest: CheckpointManifest, check: (p: string) => Promise<CheckpointManifest> = verifyCheckpoint,
): Promise<Pick<ResumePoint, 'shards' | 'readShard' | 'readAll'>> {
  const links: { path: string; manifest: CheckpointManifest }[] = [];
  for (const name of manifest.chain) {
    const p = join(dirname(path), name);
    try {
      links.push({ path: p, manifest: await check(p) });
    } catch (e) {
      throw new CheckpointError(`checkpoint ${path} is a delta on ${name}, which cannot be used: ${(e as Error).message}`, path, e instanceof CheckpointError ? e.problems : []);
    }
  }
  links.push({ path, manifest });
  const shards = [...new Set(links.flatMap((l) => l.manifest.files.flatMap((f) => (f.shard === null ? [] : [f.shard]))))].sort();
  const readShard = async (shard: string): Promise<ShardSnapshot> => {
    const chain: ShardSnapshot[] = [];
    for (const l of links) {
      for (const f of l.manifest.files) if (f.shard === shard) chain.push(await readShardFile(l.path, l.manifest, f));
    }
    if (chain.length === 0) throw new CheckpointError(`checkpoint ${path} holds no state of shard ${shard} (it holds ${shards.join(', ') || 'none'})`, path, []);
    return overlay(chain);
  };
  const readAll = async (): Promise<Map<string, ShardSnapshot>> => {
    const all = new Map<string, ShardSnapshot>();
    for (const s of shards) all.set(s, await readShard(s));
    return all;
  };
  return { shards, readShard, readAll };
}

/**
 * One shard's state as of the checkpoint at `path` (its chain applied),
 * read by whoever holds that shard (`restore_files`): only the manifests and
 * that shard's own files are read, each file checked against its SHA-256
 * (CheckpointError naming it otherwise).
 */
export async function readShardFromCheckpoint(path: string, shard: string): Promise<ShardSnapshot> {
  return (await checkpointChain(path, await readManifest(path), readManifest)).readShard(shard);
}

/**
 * `hetps up --resume latest|DIR`: `latest` is the newest checkpoint under
 * `root` that verifies with its whole chain (newer ones that do not are
 * refused, by name and reason); a DIR must verify itself. Throws
 * CheckpointError saying what to do when none can be used, or when it
 * belongs to another job.
 */
export async function loadResumePoint(which: string, root: string, job: string): Promise<ResumePoint> {
  if (which !== 'latest') return { ...(await readForResume(resolve(which), job)), refused: [] };
  const { found, refused, listed } = await newestUsable(root, (path) => readForResume(path, job));
  if (found !== null) return { ...found.value, refused };
  throw new CheckpointError(listed === 0
    ? `--resume latest: no checkpoints in ${root} (checkpoint.dir); take one with ctl.checkpoint or checkpoint.every_s, or start without --resume`
    : `--resume latest: none of the ${listed} checkpoints in ${root} can be used (${refused.map((r) => r.reason).join('; ')}); start without --resume`, root, []);
}
