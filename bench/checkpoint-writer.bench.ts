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
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { startLocalCluster } from '../deploy/local-cluster.ts';
import { ActorSystem, SeededRandom, connectTransport, silentLogger, systemClock, type Transport } from '../runtime/mod.ts';
import { buildShardPlan } from '../topology/mod.ts';
import { createShardActor } from '../actors/mod.ts';
import { ShardClient } from '../actors/worker/shard-client.ts';
import { shardFiles, writeCheckpointFile } from '../actors/store/checkpoint.ts';
import { alternateRounds, earlierResults, gitCommit, machineRecord } from './chaos.ts';
import { median } from './stats.ts';

const quick = process.argv.includes('--quick');
const ROUNDS = quick ? 2 : 6;
const DENSE_FLOATS = 1024 * 1024;
const DIM = 16;
const SIZES = [{ name: 'small', rows: 40_000 }, { name: 'large', rows: 500_000 }];
const GOAL = 2;

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'hetps-bench-ckwriter-'));
  const cluster = await startLocalCluster({ nodes: 3, dir, clientPort: null, clusterPort: null, httpPort: null, jetstream: false });
  const transports: Transport[] = [];
  const systems: ActorSystem[] = [];
  const results: Record<string, unknown> = {};
  try {
    const [node1, node2] = cluster.urls as [string, string];
    const serverT = await connectTransport({ servers: [node1], name: 'bench-shard' });
    const clientT = await connectTransport({ servers: [node2], name: 'bench-driver' });
    transports.push(serverT, clientT);
    const server = new ActorSystem({ transport: serverT, job: 'bench', node: 'shard', clock: systemClock, random: new SeededRandom(1), defaultRequestTimeoutMs: 120_000 });
    const client = new ActorSystem({ transport: clientT, job: 'bench', node: 'driver', clock: systemClock, random: new SeededRandom(2), defaultRequestTimeoutMs: 120_000 });
    systems.push(client, server);
    const plan = buildShardPlan({
      version: 1, shards: ['s0'], partitions: 64, maxBlockBytes: 256 * 1024,
      denseParams: [{ name: 'w', size: DENSE_FLOATS }], sparseTables: [{ name: 'emb', dim: DIM }],
    });
    await server.spawn(createShardActor({
      shard: 's0', plan, initialDense: new Map([['w', new Float32Array(DENSE_FLOATS).fill(0.01)]]),
      denseOptimizer: { type: 'adam', learningRate: 1e-3 }, sparseOptimizer: { type: 'adagrad', learningRate: 0.05 },
      sparseInitScale: 0.05, seed: 7, clock: systemClock,
    }));
    const shards = new ShardClient(client, { requestTimeoutMs: 120_000, log: silentLogger(), shouldStop: () => false, plans: plan });
    const ref = client.ref('shard', 's0@s0');
    let rowsNow = 0;
    let token = 0;
    for (const size of SIZES) {
      for (let from = rowsNow; from < size.rows; from += 8192) {
        const ids = Int32Array.from({ length: Math.min(8192, size.rows - from) }, (_, i) => from + i);
        await ref.request('pull', { plan_version: 1, dense: new Int32Array(0), sparse: [{ table: 'emb', ids }], min_round: null });
      }
      rowsNow = size.rows;
      let bytes = 0;
      // Each round into a fresh directory, removed after it (not timed).
      const round = (write: (t: string, out: string) => Promise<number>) => async () => {
        const out = await mkdtemp(join(dir, 'ck-'));
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
    for (const s of systems) await s.stop().catch(() => undefined);
    for (const t of transports) await t.close().catch(() => undefined);
    await cluster.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  const { commit, dirty } = gitCommit(fileURLToPath(new URL('../', import.meta.url)));
  const out: Record<string, unknown> = {
    benchmark: 'checkpoint-writer',
    commit, dirty, date: new Date().toISOString(),
    machine: machineRecord(),
    goals: { ratio: GOAL, note: 'the shard writing its own checkpoint files (write_frozen) ≥ 2 × as fast as the driver fetching them over NATS in segments and writing them, both sizes; ratio = median over rounds of driver time / shard time' },
    ...results,
    setup: {
      cluster: { nodes: 3, max_payload: 'nats default (1 MiB)', note: 'shard on node 1, the driver\'s client on node 2, one process; both write to the same local disk' },
      rounds: ROUNDS, state: `dense ${DENSE_FLOATS} floats with Adam's 2 slots; an Adagrad table of dim ${DIM}, rows as given`,
      driver: 'freeze, take_frozen / take_frozen_part in segments of ≤ 64 MiB, the copy rebuilt, its files encoded and written (synced)',
      shard: 'freeze, write_frozen: the shard encodes and writes its files (synced) itself; the reply lists them',
    },
  };
  const file = new URL('./results/checkpoint-writer.json', import.meta.url);
  if (!quick) {
    mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
    out.superseded = earlierResults(file);
    writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
  }
  console.log(JSON.stringify(out, null, 2));
}

await main();
