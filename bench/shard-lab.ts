/**
 * The state benchmarks' lab (bench:state-transfer, bench:checkpoint-writer):
 * one shard on node 1 of a local 3-node NATS cluster — 4 MiB of dense
 * parameters with Adam's two slots and an Adagrad table of dim 16 — and the
 * driver's clients on node 2, so every message crosses a route (chunked at
 * NATS' default 1 MiB max_payload). `grow(rows)` creates table rows by pulls.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { startLocalCluster } from '../deploy/local-cluster.ts';
import { ActorSystem, SeededRandom, connectTransport, silentLogger, systemClock, type ActorRef, type Transport } from '../runtime/mod.ts';
import { buildShardPlan } from '../topology/mod.ts';
import { createShardActor } from '../actors/mod.ts';
import { ShardClient } from '../actors/worker/shard-client.ts';
import { earlierResults, gitCommit, machineRecord } from './chaos.ts';

export const DENSE_FLOATS = 1024 * 1024;
export const DIM = 16;
/** The two state sizes both benchmarks measure: ~18 MB and ~81 MB. */
export const SIZES = [{ name: 'small', rows: 40_000 }, { name: 'large', rows: 500_000 }];
export const STATE = `dense ${DENSE_FLOATS} floats with Adam's 2 slots; an Adagrad table of dim ${DIM}, rows as given`;

export interface ShardLab {
  /** A temporary directory, removed by `close`. */
  dir: string;
  /** Per client asked for, by name: a ShardClient over its own connection on node 2. */
  clients: Map<string, ShardClient>;
  /** The shard, from the first client's connection (raw requests). */
  ref: ActorRef;
  /** The table's rows made up to `rows`. */
  grow(rows: number): Promise<void>;
  close(): Promise<void>;
}

export async function shardLab(prefix: string, clients: { name: string; maxMessageBytes?: number }[]): Promise<ShardLab> {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  const cluster = await startLocalCluster({ nodes: 3, dir, clientPort: null, clusterPort: null, httpPort: null, jetstream: false });
  const transports: Transport[] = [];
  const systems: ActorSystem[] = [];
  const close = async () => {
    for (const s of systems) await s.stop().catch(() => undefined);
    for (const t of transports) await t.close().catch(() => undefined);
    await cluster.stop();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    const [node1, node2] = cluster.urls as [string, string];
    const system = async (url: string, node: string, seed: number, maxMessageBytes?: number) => {
      const transport = await connectTransport({ servers: [url], name: `bench-${node}`, ...(maxMessageBytes === undefined ? {} : { maxMessageBytes }) });
      transports.push(transport);
      const s = new ActorSystem({ transport, job: 'bench', node, clock: systemClock, random: new SeededRandom(seed), defaultRequestTimeoutMs: 120_000 });
      systems.unshift(s);
      return s;
    };
    const server = await system(node1, 'shard', 1);
    const plan = buildShardPlan({
      version: 1, shards: ['s0'], partitions: 64, maxBlockBytes: 256 * 1024,
      denseParams: [{ name: 'w', size: DENSE_FLOATS }], sparseTables: [{ name: 'emb', dim: DIM }],
    });
    await server.spawn(createShardActor({
      shard: 's0', plan, initialDense: new Map([['w', new Float32Array(DENSE_FLOATS).fill(0.01)]]),
      denseOptimizer: { type: 'adam', learningRate: 1e-3 }, sparseOptimizer: { type: 'adagrad', learningRate: 0.05 },
      sparseInitScale: 0.05, seed: 7, clock: systemClock,
    }));
    const byName = new Map<string, ShardClient>();
    let ref: ActorRef | null = null;
    for (const [i, c] of clients.entries()) {
      const s = await system(node2, c.name, 2 + i, c.maxMessageBytes);
      ref ??= s.ref('shard', 's0@s0');
      byName.set(c.name, new ShardClient(s, { requestTimeoutMs: 120_000, log: silentLogger(), shouldStop: () => false, plans: plan }));
    }
    let rowsNow = 0;
    return {
      dir, clients: byName, ref: ref!, close,
      async grow(rows: number) {
        for (let from = rowsNow; from < rows; from += 8192) {
          const ids = Int32Array.from({ length: Math.min(8192, rows - from) }, (_, i) => from + i);
          await ref!.request('pull', { plan_version: 1, dense: new Int32Array(0), sparse: [{ table: 'emb', ids }], min_round: null });
        }
        rowsNow = Math.max(rowsNow, rows);
      },
    };
  } catch (e) {
    await close();
    throw e;
  }
}

/**
 * A benchmark's result file, bench/results/<name>.json: the commit, date and
 * machine first, earlier invocations kept under `superseded`; printed too.
 * `quick` runs print it only.
 */
export function writeBenchResult(name: string, body: Record<string, unknown>, quick: boolean): void {
  const { commit, dirty } = gitCommit(fileURLToPath(new URL('../', import.meta.url)));
  const out: Record<string, unknown> = { benchmark: name, commit, dirty, date: new Date().toISOString(), machine: machineRecord(), ...body };
  const file = new URL(`./results/${name}.json`, import.meta.url);
  if (!quick) {
    mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
    out.superseded = earlierResults(file);
    writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
  }
  console.log(JSON.stringify(out, null, 2));
}
