/** `hetps checkpoint ls|verify DIR`: what checkpoints a directory holds, and whether each file still matches its manifest. */
import type { Command } from 'commander';
import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { ConfigError } from '../runtime/errors.ts';
import { CheckpointError, listCheckpoints, readManifest, verifyCheckpoint, type CheckpointManifest } from '../actors/store/checkpoint.ts';

const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(2)} MiB`;

type Row = { name: string; path: string; manifest: CheckpointManifest | null; error: string | null };

/** DIR itself when it holds a manifest (one checkpoint), else the checkpoints under it (a checkpoint root), each with its manifest or why it cannot be read. */
async function checkpointsIn(dir: string): Promise<Row[]> {
  const s = await stat(dir).catch(() => null);
  if (s === null || !s.isDirectory()) throw new ConfigError(`${dir} is not a directory; give a checkpoint directory or the checkpoint root (checkpoint.dir)`);
  if (!(await stat(join(dir, 'manifest.json')).catch(() => null))) return listCheckpoints(dir);
  try {
    return [{ name: dir, path: dir, manifest: await readManifest(dir), error: null }];
  } catch (e) {
    return [{ name: dir, path: dir, manifest: null, error: (e as Error).message }];
  }
}

function line(name: string, m: CheckpointManifest, state: string): string {
  const shards = m.files.filter((f) => f.shard !== null).length;
  const data = m.data === null ? '' : `, ${m.data.acked.length}${m.data.total_batches === null ? '' : `/${m.data.total_batches}`} batches done`;
  return `${name}  ${m.created_at}  ${m.trigger}  job ${m.job}  plan v${m.plan.version}  ${shards} shard file${shards === 1 ? '' : 's'}, ${mib(m.bytes)}${data}  ${state}`;
}

export function register(program: Command): void {
  const cmd = program.command('checkpoint').description('list and verify checkpoints (one directory per checkpoint, a manifest of sizes and SHA-256)');
  cmd
    .command('ls')
    .description('list the checkpoints in DIR (a checkpoint root, or one checkpoint), oldest first, with whether each one is complete')
    .argument('<dir>', 'checkpoint root (checkpoint.dir) or one checkpoint directory')
    .option('--json', 'print [{ name, path, manifest, error }] on stdout', false)
    .action(async (dir: string, o: { json: boolean }) => {
      const rows = (await checkpointsIn(dir)).map(({ name, path, manifest, error }) => ({ name, path, manifest, error }));
      if (o.json) { process.stdout.write(`${JSON.stringify(rows, null, 2)}\n`); return; }
      if (rows.length === 0) { process.stdout.write(`no checkpoints in ${dir}\n`); return; }
      for (const r of rows) process.stdout.write(`${r.manifest ? line(r.name, r.manifest, 'manifest ok (run verify to check the files)') : `${r.name}  not usable: ${r.error}`}\n`);
    });
  cmd
    .command('verify')
    .description('check every file of each checkpoint in DIR against its manifest (size and SHA-256); exits 2 when one fails, naming the file')
    .argument('<dir>', 'checkpoint root (checkpoint.dir) or one checkpoint directory')
    .option('--json', 'print [{ name, path, ok, problems }] on stdout', false)
    .action(async (dir: string, o: { json: boolean }) => {
      const found = await checkpointsIn(dir);
      if (found.length === 0) throw new ConfigError(`no checkpoints in ${dir}`);
      const rows: { name: string; path: string; ok: boolean; problems: string[] }[] = [];
      for (const { name, path } of found) {
        const c = { name, path };
        try {
          const m = await verifyCheckpoint(c.path);
          rows.push({ ...c, ok: true, problems: [] });
          if (!o.json) process.stdout.write(`${line(c.name, m, `ok: ${m.files.length} files match their SHA-256`)}\n`);
        } catch (e) {
          const problems = e instanceof CheckpointError ? e.problems : [(e as Error).message];
          rows.push({ ...c, ok: false, problems });
          if (!o.json) process.stdout.write(`${c.name}  FAILED: ${problems.join('; ')}\n`);
        }
      }
      if (o.json) process.stdout.write(`${JSON.stringify(rows, null, 2)}\n`);
      const bad = rows.filter((r) => !r.ok);
      if (bad.length > 0) {
        throw new CheckpointError(`${bad.length} of ${rows.length} checkpoint${rows.length === 1 ? '' : 's'} failed verification (${bad.map((b) => b.name).join(', ')}); `
          + 'a resume skips them and uses the newest one that verifies', bad[0]!.path, bad.flatMap((b) => b.problems));
      }
    });
}
