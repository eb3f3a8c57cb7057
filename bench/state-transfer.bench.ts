/**
 * A shard's whole state across NATS: the checkpoint fetch (`take_frozen`)
 * and the resume's restore, as one message against in segments
 * (`take_frozen_part`, `restore_begin` / `restore_part`;
 * actors/shard/snapshot-segments.ts), side by side on one local 3-node
 * cluster: the shard on node 1, the driver's client on node 2, so every
 * message crosses a route (chunked at NATS' 1 MiB max_payload).
 *
 *   whole       one message each way (what hetps did before segments; it
 *               needs communication.max_message_bytes ≥ the state)
 *   segmented   the same state in segments of at most 64 MiB (the default
 *               limit, 1 GiB, is not what bounds them)
 *   segmented_4mib  segments of ~4 MiB (a 4 MiB communication.max_message_bytes)
 *
 * The state: 4 MiB of dense parameters with Adam's two slots, and an
 * Adagrad table of dim 16 (SIZES rows: ~18 MB and ~81 MB of state). Whole and
 * segmented alternate in back-to-back rounds; `ratio` is the median over
 * rounds of whole time / segmented time (above 1: segments are faster).
 *
 * Goal, set before the first run: each segmented path ≥ 0.8 × the whole
 * message's speed (a price for states over the limit, not a slowdown of
 * every checkpoint).
 *
 * Writes bench/results/state-transfer.json; `--quick` runs fewer rounds and
 * does not write it.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { startLocalCluster } from '../deploy/local-cluster.ts';
import { ActorSystem, SeededRandom, connectTransport, silentLogger, systemClock, type Transport } from '../runtime/mod.ts';
import { buildShardPlan } from '../topology/mod.ts';
import { createShardActor, type ShardSnapshot } from '../actors/mod.ts';
import { ShardClient } from '../actors/worker/shard-client.ts';
import { alternateRounds, earlierResults, gitCommit, machineRecord } from './chaos.ts';

const quick = process.argv.includes('--quick');
const ROUNDS = quick ? 2 : 6;
const DENSE_FLOATS = 1024 * 1024;
const DIM = 16;
const SIZES = [{ name: 'small', rows: 40_000 }, { name: 'large', rows: 500_000 }];
const GOAL = 0.8;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[s.length >> 1]! : 0;
}

function stateBytes(s: ShardSnapshot): number {
  let n = 0;
  for (const d of s.dense) n += d.values.byteLength + d.state.reduce((a, x) => a + x.byteLength, 0);
  for (const t of s.sparse) n += t.ids.byteLength + t.values.byteLength + t.state.byteLength + t.steps.byteLength;
  return n;
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'hetps-bench-state-'));
  const cluster = await startLocalCluster({ nodes: 3, dir, clientPort: null, clusterPort: null, httpPort: null, jetstream: false });
  const transports: Transport[] = [];
  const systems: ActorSystem[] = [];
  const results: Record<string, unknown> = {};
  try {
    const [node1, node2] = cluster.urls as [string, string];
    const serverT = await connectTransport({ servers: [node1], name: 'bench-shard' });
    const clientT = await connectTransport({ servers: [node2], name: 'bench-driver' });
    const smallT = await connectTransport({ servers: [node2], name: 'bench-driver-4mib', maxMessageBytes: 4 * 1024 * 1024 });
    transports.push(serverT, clientT, smallT);
    const server = new ActorSystem({ transport: serverT, job: 'bench', node: 'shard', clock: systemClock, random: new SeededRandom(1), defaultRequestTimeoutMs: 120_000 });
    const client = new ActorSystem({ transport: clientT, job: 'bench', node: 'driver', clock: systemClock, random: new SeededRandom(2), defaultRequestTimeoutMs: 120_000 });
    const small = new ActorSystem({ transport: smallT, job: 'bench', node: 'driver4', clock: systemClock, random: new SeededRandom(3), defaultRequestTimeoutMs: 120_000 });
    systems.push(client, small, server);
    const plan = buildShardPlan({
      version: 1, shards: ['s0'], partitions: 64, maxBlockBytes: 256 * 1024,
      denseParams: [{ name: 'w', size: DENSE_FLOATS }], sparseTables: [{ name: 'emb', dim: DIM }],
    });
    const def = createShardActor({
      shard: 's0', plan, initialDense: new Map([['w', new Float32Array(DENSE_FLOATS).fill(0.01)]]),
      denseOptimizer: { type: 'adam', learningRate: 1e-3 }, sparseOptimizer: { type: 'adagrad', learningRate: 0.05 },
      sparseInitScale: 0.05, seed: 7, clock: systemClock,
    });
    await server.spawn(def);
    const opts = { requestTimeoutMs: 120_000, log: silentLogger(), shouldStop: () => false, plans: plan };
    const segmented = new ShardClient(client, opts);
    const segmented4 = new ShardClient(small, opts);
    const ref = client.ref('shard', 's0@s0');
    let rowsNow = 0;
    let token = 0;
    for (const size of SIZES) {
      // Rows created by pulls, up to this size.
      for (let from = rowsNow; from < size.rows; from += 8192) {
        const ids = Int32Array.from({ length: Math.min(8192, size.rows - from) }, (_, i) => from + i);
        await ref.request('pull', { plan_version: 1, dense: new Int32Array(0), sparse: [{ table: 'emb', ids }], min_round: null });
      }
      rowsNow = size.rows;
      const time = async (fn: () => Promise<unknown>) => { const t0 = performance.now(); await fn(); return (performance.now() - t0) / 1000; };
      const fetchWhole = () => time(async () => { const t = `t${token++}`; await ref.request('freeze', { token: t }); await ref.request('take_frozen', { token: t }); });
      const fetchWith = (c: ShardClient) => () => time(async () => { const t = `t${token++}`; await c.freeze('s0', t); await c.takeFrozen('s0', t); });
      const snap = await segmented.snapshot('s0');
      const bytes = stateBytes(snap);
      const restoreWhole = () => time(() => ref.request('restore', { state: snap as unknown as Record<string, unknown> }));
      const restoreWith = (c: ShardClient) => () => time(() => c.restore('s0', snap));
      const row: Record<string, unknown> = { rows: size.rows, state_bytes: bytes };
      for (const [name, whole, seg] of [
        ['fetch_segmented', fetchWhole, fetchWith(segmented)], ['fetch_segmented_4mib', fetchWhole, fetchWith(segmented4)],
        ['restore_segmented', restoreWhole, restoreWith(segmented)], ['restore_segmented_4mib', restoreWhole, restoreWith(segmented4)],
      ] as const) {
        await whole(); await seg(); // warm-up
        const { rawSeconds, oursSeconds, paired } = await alternateRounds(ROUNDS, whole, seg);
        const ratio = +median(paired).toFixed(3);
        row[name] = {
          whole_mb_per_s: +((bytes * ROUNDS) / rawSeconds / 1e6).toFixed(1), segmented_mb_per_s: +((bytes * ROUNDS) / oursSeconds / 1e6).toFixed(1),
          ratio, met: ratio >= GOAL,
        };
        process.stderr.write(`${size.name} ${name}: ${JSON.stringify(row[name])}\n`);
      }
      results[size.name] = row;
    }
  } finally {
    for (const s of systems) await s.stop().catch(() => undefined);
    for (const t of transports) await t.close().catch(() => undefined);
    await cluster.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  const { commit, dirty } = gitCommit(fileURLToPath(new URL('../', import.meta.url)));
  const out: Record<string, unknown> = {
    benchmark: 'state-transfer',
    commit, dirty, date: new Date().toISOString(),
    machine: machineRecord(),
    goals: { ratio: GOAL, note: 'each segmented path (fetch and restore, segments of ≤ 64 MiB and of ~4 MiB) ≥ 0.8 × one whole message, the same state; ratio = median over rounds of whole time / segmented time' },
    ...results,
    setup: {
      cluster: { nodes: 3, max_payload: 'nats default (1 MiB)', note: 'shard on node 1, the client on node 2' },
      rounds: ROUNDS, state: `dense ${DENSE_FLOATS} floats with Adam's 2 slots; an Adagrad table of dim ${DIM}, rows as given`,
      fetch: 'freeze + take_frozen (whole) or freeze + take_frozen / take_frozen_part (segmented), the copy rebuilt in the client',
      restore: 'restore { state } (whole) or restore_begin / restore_part / restore { transfer } (segmented)',
    },
  };
  const file = new URL('./results/state-transfer.json', import.meta.url);
  if (!quick) {
    mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
    out.superseded = earlierResults(file);
    writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
  }
  console.log(JSON.stringify(out, null, 2));
}

await main();
