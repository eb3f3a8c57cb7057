/**
 * Who writes a checkpoint's shard files (`checkpoint.written_by`): the driver,
 * which fetches the frozen copy over NATS in segments (`take_frozen`,
 * `take_frozen_part`) and writes it, against the shard itself
 * (`write_frozen`: it writes its own files into the checkpoint's directory).
 * One local 3-node cluster: the shard on node 1, the driver's client on node
 * 2 (every message crosses a route); both write to the same local disk, as a
 * shared file system would be reached from one machine.
 *
 * The state: 4 MiB of dense parameters with Adam's two slots and an Adagrad
 * table of dim 16 (~18 MB and ~81 MB). The two paths alternate in
 * back-to-back rounds, each from a fresh freeze to every file synced;
 * `ratio` is the median over rounds of driver time / shard time (above 1:
 * the shard is faster).
 *
 * Goal, set before the first run: the shard writing its own files at least
 * 2 × as fast as the driver's fetch and write, for both sizes (one shard;
 * several shards write at once, which the driver's one-at-a-time fetch does not).
 *
 * Writes bench/results/checkpoint-writer.json; `--quick` runs fewer rounds
 * and does not write it.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { shardFiles, writeCheckpointFile } from '../actors/store/checkpoint.ts';
import { alternateRounds } from './chaos.ts';
import { median } from './stats.ts';
import { SIZES, STATE, shardLab, writeBenchResult } from './shard-lab.ts';

const quick = process.argv.includes('--quick');
const ROUNDS = quick ? 2 : 6;
const GOAL = 2;

async function main(): Promise<void> {
  const lab = await shardLab('hetps-bench-ckwriter-', [{ name: 'driver' }]);
  const results: Record<string, unknown> = {};
  try {
    const shards = lab.clients.get('driver')!;
    let token = 0;
    for (const size of SIZES) {
      await lab.grow(size.rows);
      let bytes = 0;
      // Each round into a fresh directory, removed after it (not timed).
      const round = (write: (t: string, out: string) => Promise<number>) => async () => {
        const out = await mkdtemp(join(lab.dir, 'ck-'));
        const t = `t${token++}`;
        const t0 = performance.now();
        await shards.freeze('s0', t);
        bytes = await write(t, out);
        const s = (performance.now() - t0) / 1000;
        await rm(out, { recursive: true, force: true });
        return s;
      };
      const byDriver = round(async (t, out) => {
        const snap = await shards.takeFrozen('s0', t);
        let n = 0;
        for (const f of shardFiles('s0', snap)) n += (await writeCheckpointFile(out, f)).bytes;
        return n;
      });
      const byShard = round(async (t, out) => (await shards.writeFrozen('s0', t, out)).files.reduce((n, f) => n + f.bytes, 0));
      await byDriver(); await byShard(); // warm-up
      const { rawSeconds, oursSeconds, paired } = await alternateRounds(ROUNDS, byDriver, byShard);
      const ratio = +median(paired)!.toFixed(3);
      results[size.name] = {
        rows: size.rows, file_bytes: bytes,
        driver_mb_per_s: +((bytes * ROUNDS) / rawSeconds / 1e6).toFixed(1), shard_mb_per_s: +((bytes * ROUNDS) / oursSeconds / 1e6).toFixed(1),
        ratio, rounds: paired.map((x) => +x.toFixed(3)), met: ratio >= GOAL,
      };
      process.stderr.write(`${size.name}: ${JSON.stringify(results[size.name])}\n`);
    }
  } finally {
    await lab.close();
  }
  writeBenchResult('checkpoint-writer', {
    goals: { ratio: GOAL, note: 'the shard writing its own checkpoint files (write_frozen) ≥ 2 × as fast as the driver fetching them over NATS in segments and writing them, both sizes; ratio = median over rounds of driver time / shard time' },
    ...results,
    setup: {
      cluster: { nodes: 3, max_payload: 'nats default (1 MiB)', note: 'shard on node 1, the driver\'s client on node 2, one process; both write to the same local disk' },
      rounds: ROUNDS, state: STATE,
      driver: 'freeze, take_frozen / take_frozen_part in segments of ≤ 64 MiB, the copy rebuilt, its files encoded and written (synced)',
      shard: 'freeze, write_frozen: the shard encodes and writes its files (synced) itself; the reply lists them',
    },
  }, quick);
}

await main();
