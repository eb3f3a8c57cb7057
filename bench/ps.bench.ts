/**
 * The shard's hot paths against raw nats.js moving the same bytes, side by
 * side on one local 3-node cluster in one run. The shard actor has its own
 * ActorSystem and connection on node 1; the client is on node 2, so every
 * request and reply crosses a route. The raw responder (node 1) answers with
 * a preallocated buffer of the reply's size and does no parameter work; the
 * shard does everything it does in a job (validation, SGD, row lookups).
 *
 *   dense_pull   4 blocks × 256 KiB (1 MiB of parameters) per request
 *   dense_push   the same 1 MiB as gradients, applied with SGD
 *   sparse_pull  4096 ids × dim 16 per request (16 KiB ids → 256 KiB rows)
 *   sparse_push  4096 ids + their 256 KiB of gradient rows, applied with SGD
 *
 * Sparse ids are distinct per request, uniform over ID_UNIVERSE ids (200 000,
 * or env PS_ID_UNIVERSE): ~150 000 rows (16 MiB of table) are live, so row
 * lookups are random memory accesses, the hard case for a shard.
 *
 * Both sides keep CONCURRENCY requests in flight. Raw and hetps alternate in
 * short back-to-back rounds; a side's rate is its requests over its total
 * time, and `ratio` is the median over rounds of raw time / hetps time, so a
 * burst of load from other processes on a small shared machine spoils a
 * round, not the result (`ratio_of_totals` is the plain quotient of rates).
 * MB = 10^6 bytes of tensor payload (ids + values) per second.
 *
 * Writes bench/results/ps.json. `--quick` runs fewer requests; `--ops a,b`
 * runs a subset (for profiling one path with --cpu-prof).
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { startLocalCluster } from '../deploy/local-cluster.ts';
import { ActorSystem, SeededRandom, connectTransport, encode, systemClock, type ActorRef, type Transport } from '../runtime/mod.ts';
import { buildShardPlan } from '../topology/mod.ts';
import { createShardActor, type ShardStats } from '../actors/mod.ts';
import { alternateRounds, earlierResults, gitCommit, machineRecord } from './chaos.ts';

const quick = process.argv.includes('--quick');
const opsArg = process.argv.indexOf('--ops');
const ALL_OPS = ['dense_pull', 'dense_push', 'sparse_pull', 'sparse_push'] as const;
type Op = typeof ALL_OPS[number];
const OPS: Op[] = opsArg > 0 ? (process.argv[opsArg + 1] ?? '').split(',') as Op[] : [...ALL_OPS];
/** `--only hetps|raw`: time one side (profiling). */
/**
 * `--null-shard`: a stand-in actor with the shard's message schemas (same
 * decode and validation) that answers with preallocated arrays and applies
 * nothing: what the runtime and transport cost without the parameter work.
 */
const NULL_SHARD = process.argv.includes('--null-shard');
const onlyArg = process.argv.indexOf('--only');
const ONLY = onlyArg > 0 ? process.argv[onlyArg + 1] ?? null : null;

const CONCURRENCY = 8;
const BLOCKS = 4;
const BLOCK_FLOATS = 64 * 1024; // 256 KiB
const IDS = 4096;
const DIM = 16;
const ID_UNIVERSE = Number(process.env.PS_ID_UNIVERSE ?? 200_000);
const ID_SETS = 64;
/** Raw and hetps run in alternating short rounds, so both see the same interference on a shared machine. */
const ROUNDS = quick ? 4 : 10;
const PER_ROUND: Record<Op, number> = quick
  ? { dense_pull: 40, dense_push: 40, sparse_pull: 150, sparse_push: 150 }
  : { dense_pull: 60, dense_push: 60, sparse_pull: 250, sparse_push: 250 };

const DENSE_BYTES = BLOCKS * BLOCK_FLOATS * 4;
const SPARSE_ID_BYTES = IDS * 4;
const SPARSE_ROW_BYTES = IDS * DIM * 4;
/** Tensor bytes each request moves (both sides move the same). */
const PAYLOAD: Record<Op, number> = {
  dense_pull: DENSE_BYTES, dense_push: DENSE_BYTES,
  sparse_pull: SPARSE_ID_BYTES + SPARSE_ROW_BYTES, sparse_push: SPARSE_ID_BYTES + SPARSE_ROW_BYTES,
};

/** Runs `count` calls of `once` with `CONCURRENCY` in flight; returns the seconds taken. */
async function measure(count: number, once: (i: number) => Promise<unknown>): Promise<number> {
  let next = 0;
  const t0 = performance.now();
  const lanes: Promise<void>[] = [];
  for (let l = 0; l < CONCURRENCY; l++) {
    lanes.push((async () => {
      while (next < count) await once(next++);
    })());
  }
  await Promise.all(lanes);
  return (performance.now() - t0) / 1000;
}

interface Sides {
  raw: (i: number) => Promise<unknown>;
  hetps: (i: number) => Promise<unknown>;
}

function sides(op: Op, shard: ActorRef, rawReq: NatsConnection, idSets: Int32Array[], sparseGrads: Float32Array, denseGrads: Float32Array[]): Sides {
  const dense = Int32Array.from({ length: BLOCKS }, (_, k) => k);
  const denseEntries = denseGrads.map((grad, block) => ({ block, grad }));
  // Raw requests carry what the hetps requests carry, as bytes of the same size.
  const pullDenseBody = encode({ plan_version: 1, dense, sparse: [], min_round: null });
  const pushDenseBody = new Uint8Array(DENSE_BYTES);
  const pullSparseBody = new Uint8Array(SPARSE_ID_BYTES);
  const pushSparseBody = new Uint8Array(SPARSE_ID_BYTES + SPARSE_ROW_BYTES);
  const timeout = { timeout: 60_000 };
  switch (op) {
    case 'dense_pull':
      return {
        raw: () => rawReq.request('raw.ps.dense_pull', pullDenseBody, timeout),
        hetps: () => shard.request('pull', { plan_version: 1, dense, sparse: [], min_round: null }),
      };
    case 'dense_push':
      return {
        raw: () => rawReq.request('raw.ps.dense_push', pushDenseBody, timeout),
        hetps: () => shard.request('push', { plan_version: 1, round: null, expected: null, weight: 1, base_version: 0, dense: denseEntries, sparse: [] }),
      };
    case 'sparse_pull':
      return {
        raw: () => rawReq.request('raw.ps.sparse_pull', pullSparseBody, timeout),
        hetps: (i) => shard.request('pull', { plan_version: 1, dense: new Int32Array(0), sparse: [{ table: 'emb', ids: idSets[i % ID_SETS]! }], min_round: null }),
      };
    case 'sparse_push':
      return {
        raw: () => rawReq.request('raw.ps.sparse_push', pushSparseBody, timeout),
        hetps: (i) => shard.request('push', {
          plan_version: 1, round: null, expected: null, weight: 1, base_version: 0, dense: [],
          sparse: [{ table: 'emb', ids: idSets[i % ID_SETS]!, grads: sparseGrads }],
        }),
      };
  }
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'hetps-bench-ps-'));
  const cluster = await startLocalCluster({ nodes: 3, dir, clientPort: null, clusterPort: null, httpPort: null, jetstream: false });
  const results: Record<string, Record<string, number>> = {};
  let shardStats: ShardStats | null = null;
  const transports: Transport[] = [];
  const raws: NatsConnection[] = [];
  try {
    const [node1, node2] = cluster.urls as [string, string];
    // --- the shard, alone in its system and connection on node 1
    const serverT = await connectTransport({ servers: [node1], name: 'bench-shard' });
    const clientT = await connectTransport({ servers: [node2], name: 'bench-worker' });
    transports.push(serverT, clientT);
    const server = new ActorSystem({ transport: serverT, job: 'bench', node: 'shard', clock: systemClock, random: new SeededRandom(1), defaultRequestTimeoutMs: 60_000 });
    const client = new ActorSystem({ transport: clientT, job: 'bench', node: 'worker', clock: systemClock, random: new SeededRandom(2), defaultRequestTimeoutMs: 60_000 });
    const plan = buildShardPlan({
      version: 1, shards: ['s0'], partitions: 64, maxBlockBytes: BLOCK_FLOATS * 4,
      denseParams: [{ name: 'w', size: BLOCKS * BLOCK_FLOATS }], sparseTables: [{ name: 'emb', dim: DIM }],
    });
    const rng = new SeededRandom(5);
    const w = new Float32Array(BLOCKS * BLOCK_FLOATS);
    for (let i = 0; i < w.length; i++) w[i] = rng.normal() * 0.01;
    const def = createShardActor({
      shard: 's0', plan, initialDense: new Map([['w', w]]),
      denseOptimizer: { type: 'sgd', learningRate: 1e-4 }, sparseOptimizer: { type: 'sgd', learningRate: 1e-4 },
      sparseInitScale: 0.05, seed: 7, clock: systemClock,
    });
    if (NULL_SHARD) {
      const blocks = Array.from({ length: BLOCKS }, () => new Float32Array(BLOCK_FLOATS));
      const rows = new Float32Array(IDS * DIM);
      const pushed = { version: 1, applied: true, staleness: 0 };
      const real = def.handlers;
      def.handlers = {
        ...real,
        pull: (m) => ({ version: 0, round: 0, dense: m.dense.length ? blocks : [], sparse: m.sparse.length ? [rows.subarray(0, m.sparse[0]!.ids.length * DIM)] : [] }),
        push: () => pushed,
      };
    }
    await server.spawn(def);
    const shard = client.ref('shard', 's0@s0');

    // --- raw nats.js: a responder on node 1 answering with preallocated buffers of the same sizes
    // noAsyncTraces: nats.js documents it as greatly speeding up request/reply; the baseline gets its best configuration.
    const rawRep = await connect({ servers: [node1], name: 'bench-raw-rep', noAsyncTraces: true });
    const rawReq = await connect({ servers: [node2], name: 'bench-raw-req', noAsyncTraces: true });
    raws.push(rawRep, rawReq);
    const pushAck = encode({ v: 1, type: 'reply', from: 'hps.bench.shard.s0', seq: 1, result: { version: 1, applied: true, staleness: 0 } }).slice();
    const replies: Record<Op, Uint8Array> = {
      dense_pull: new Uint8Array(DENSE_BYTES), dense_push: pushAck, sparse_pull: new Uint8Array(SPARSE_ROW_BYTES), sparse_push: pushAck,
    };
    for (const op of ALL_OPS) {
      const reply = replies[op];
      rawRep.subscribe(`raw.ps.${op}`, { callback: (_e, m) => { m.respond(reply); } });
    }
    await rawRep.flush();
    await new Promise((r) => setTimeout(r, 300)); // interest reaches the other nodes

    // Distinct ids per request, as a worker sends them (it pulls a batch's unique ids).
    const idSets = Array.from({ length: ID_SETS }, () => {
      const seen = new Set<number>();
      while (seen.size < IDS) seen.add(Math.floor(rng.next() * ID_UNIVERSE));
      return Int32Array.from(seen);
    });
    const sparseGrads = Float32Array.from({ length: IDS * DIM }, () => rng.normal() * 1e-3);
    const denseGrads = Array.from({ length: BLOCKS }, () => Float32Array.from({ length: BLOCK_FLOATS }, () => rng.normal() * 1e-3));
    // Rows exist before timing (steady state, not table growth).
    for (const ids of idSets) await shard.request('pull', { plan_version: 1, dense: new Int32Array(0), sparse: [{ table: 'emb', ids }], min_round: null });

    for (const op of OPS) {
      const s = sides(op, shard, rawReq, idSets, sparseGrads, denseGrads);
      const n = PER_ROUND[op];
      if (ONLY !== 'hetps') await measure(n, s.raw);
      if (ONLY !== 'raw') await measure(n, s.hetps);
      const { rawSeconds, oursSeconds, paired } = await alternateRounds(ROUNDS,
        ONLY === 'hetps' ? null : () => measure(n, s.raw), ONLY === 'raw' ? null : () => measure(n, s.hetps));
      const raw = rawSeconds ? (n * ROUNDS) / rawSeconds : 0;
      const ours = oursSeconds ? (n * ROUNDS) / oursSeconds : 0;
      // The ratio is the median over rounds of (raw time / hetps time) of back-to-back runs:
      // a burst of load from elsewhere spoils a round or two, not the result.
      paired.sort((a, b) => a - b);
      const ratio = paired.length ? paired[paired.length >> 1]! : 0;
      const mb = PAYLOAD[op] / 1e6;
      const row: Record<string, number> = {};
      if (op.startsWith('sparse')) row.rows_per_s = Math.round(ours * IDS);
      row.hetps_mb_per_s = +(ours * mb).toFixed(1);
      row.raw_mb_per_s = +(raw * mb).toFixed(1);
      row.ratio = +ratio.toFixed(3);
      row.ratio_of_totals = raw ? +(ours / raw).toFixed(3) : 0;
      row.hetps_requests_per_s = Math.round(ours);
      row.raw_requests_per_s = Math.round(raw);
      results[op] = row;
      process.stderr.write(`${op}: ${JSON.stringify(row)}\n`);
    }
    shardStats = await shard.request<ShardStats & Record<string, unknown>>('stats', {});
    await client.stop();
    await server.stop();
  } finally {
    for (const t of transports) await t.close().catch(() => undefined);
    for (const r of raws) await r.close().catch(() => undefined);
    await cluster.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  const { commit, dirty } = gitCommit(fileURLToPath(new URL('../', import.meta.url)));
  const out: Record<string, unknown> = {
    benchmark: 'ps',
    commit, dirty, date: new Date().toISOString(),
    machine: machineRecord(),
    goals: { ratio: 0.7, note: 'sparse_push and sparse_pull ≥ 0.7 × raw nats.js (noAsyncTraces: true) moving the same bytes' },
    ...results,
    setup: {
      cluster: { nodes: 3, max_payload: 'nats default (1 MiB)', note: 'shard on node 1, client on node 2; raw responder on node 1 replies with preallocated buffers; raw nats.js with noAsyncTraces: true' },
      concurrency: CONCURRENCY, rounds: ROUNDS, requests_per_round: PER_ROUND,
      dense: { blocks: BLOCKS, block_bytes: BLOCK_FLOATS * 4 }, sparse: { ids: IDS, dim: DIM, id_universe: ID_UNIVERSE },
      mb: '10^6 bytes of tensor payload (ids + values) per second, over all rounds of each side; ratio = median over rounds of raw time / hetps time',
      shard_apply_ms: shardStats ? Math.round(shardStats.apply_ms) : null,
      null_shard: NULL_SHARD,
      node: process.version,
      date: new Date().toISOString(),
    },
  };
  mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
  const file = new URL('./results/ps.json', import.meta.url);
  if (OPS.length === ALL_OPS.length && ONLY === null && !NULL_SHARD && !quick) {
    out.superseded = earlierResults(file);
    writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
  }
  console.log(JSON.stringify(out, null, 2));
}

await main();
