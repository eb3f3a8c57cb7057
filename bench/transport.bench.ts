/**
 * Transport cost of hetps actors against raw nats.js, side by side on the same
 * local 3-node cluster in one run. Sender and receiver use separate
 * connections on different nodes, so every message crosses a route.
 * Handlers are empty (count only), as in ps-lite's transport benchmark.
 *
 * The cluster runs with max_payload = 2 MiB: 8 MiB messages are chunked by
 * hetps; raw nats.js sends the same 8 MiB as four 2 MiB publishes (counted as
 * one logical message), since it cannot send it whole.
 *
 * Raw and hetps alternate in back-to-back rounds (which side goes first
 * alternates too), as bench:ps does: a side's rate is its messages over its
 * total time, and `ratio` is the median over rounds of raw time / hetps
 * time, so a burst of load from elsewhere on a small shared machine spoils a
 * round, not the result (`ratio_of_totals`: the plain quotient of rates).
 * The raw nats.js connections run with `noAsyncTraces: true`, which nats.js
 * documents as greatly speeding up request/reply (hetps' own connections
 * set it too).
 *
 * Writes bench/results/transport.json (earlier invocations kept under
 * `superseded`). `--quick`: fewer messages; `--rounds N` (default 5).
 */
import { mkdirSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { z } from 'zod';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { startLocalCluster } from '../deploy/local-cluster.ts';
import { ActorSystem, SeededRandom, connectTransport, systemClock, zbytes, type Transport } from '../runtime/mod.ts';
import { alternateRounds, earlierResults, gitCommit, machineRecord } from './chaos.ts';
import { median } from './stats.ts';

const roundsArg = process.argv.indexOf('--rounds');
const ROUNDS = roundsArg > 0 ? Number(process.argv[roundsArg + 1]) : 5;

const MAX_PAYLOAD = 2 * 1024 * 1024;
const ALL_SIZES = [64, 4 * 1024, 256 * 1024, 1024 * 1024, 8 * 1024 * 1024];
// `--sizes 64,4096` runs a subset (for profiling one path).
const sizesArg = process.argv.indexOf('--sizes');
const SIZES = sizesArg > 0 ? (process.argv[sizesArg + 1] ?? '').split(',').map(Number) : ALL_SIZES;
const quick = process.argv.includes('--quick');

function budgetBytes(size: number): number { return quick ? 64 * 1024 * 1024 : 512 * 1024 * 1024; }
function oneWayCount(size: number): number { return Math.max(quick ? 20 : 40, Math.min(quick ? 50_000 : 300_000, Math.floor(budgetBytes(size) / size))); }
function rrCount(size: number): number { return Math.max(quick ? 10 : 30, Math.min(quick ? 5_000 : 30_000, Math.floor(budgetBytes(size) / 4 / size))); }
const RR_CONCURRENCY = 16;
/** Requests in flight: 16, but never more than ~32 MiB toward one receiver (the server's slow-consumer limit is 64 MiB). */
function rrConcurrency(size: number): number { return Math.max(1, Math.min(RR_CONCURRENCY, Math.floor((32 * 1024 * 1024) / size))); }

async function waitUntil(pred: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!pred()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 1));
  }
}

/**
 * Publishes `count` payloads, flushing every ~4 MiB, and never more than
 * ~32 MiB ahead of the receiver: without that window a fast publisher makes
 * the server cut the receiver off as a slow consumer (core NATS has no flow
 * control), and the run measures drops instead of throughput. Same for both sides.
 */
async function pump(count: number, size: number, send: () => void, flush: () => Promise<void>, received: () => number): Promise<void> {
  const flushEvery = Math.max(1, Math.floor((4 * 1024 * 1024) / size));
  const window = Math.max(2 * flushEvery, Math.floor((32 * 1024 * 1024) / size));
  for (let i = 0; i < count; i++) {
    send();
    if ((i + 1) % flushEvery === 0) {
      await flush();
      while (i + 1 - received() > window) await new Promise((r) => setImmediate(r));
    }
  }
  await flush();
}

async function rawOneWay(pub: NatsConnection, sub: NatsConnection, size: number, count: number): Promise<number> {
  const parts = Math.ceil(size / MAX_PAYLOAD);
  const payload = new Uint8Array(Math.ceil(size / parts));
  let got = 0;
  const s = sub.subscribe(`raw.oneway.${size}`, { callback: () => { got++; } });
  await sub.flush();
  await new Promise((r) => setTimeout(r, 200)); // interest reaches the other nodes
  const t0 = performance.now();
  await pump(count, size, () => { for (let p = 0; p < parts; p++) pub.publish(`raw.oneway.${size}`, payload); }, () => pub.flush(), () => Math.floor(got / parts));
  await waitUntil(() => got >= count * parts, 120_000, 'raw one-way');
  const dt = (performance.now() - t0) / 1000;
  s.unsubscribe();
  return dt;
}

async function rawRequestReply(req: NatsConnection, rep: NatsConnection, size: number, count: number): Promise<number> {
  const parts = Math.ceil(size / MAX_PAYLOAD);
  const payload = new Uint8Array(Math.ceil(size / parts));
  const ack = new Uint8Array(16);
  // A multi-part raw request: parts-1 publishes, then a request on the last part.
  const s = rep.subscribe(`raw.rr.${size}`, { callback: (_e, m) => { if (m.reply) m.respond(ack); } });
  await rep.flush();
  await new Promise((r) => setTimeout(r, 200));
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: rrConcurrency(size) }, async () => {
    while (next < count) {
      next++;
      for (let p = 0; p < parts - 1; p++) req.publish(`raw.rr.${size}`, payload);
      await req.request(`raw.rr.${size}`, payload, { timeout: 60_000 });
    }
  }));
  const dt = (performance.now() - t0) / 1000;
  s.unsubscribe();
  return dt;
}

async function hetpsRun(servers: string[]): Promise<{ a: ActorSystem; b: ActorSystem; ta: Transport; tb: Transport; counter: { n: number } }> {
  // Receiver on node 1, sender on node 2.
  const ta = await connectTransport({ servers: [servers[0]!], name: 'bench-recv' });
  const tb = await connectTransport({ servers: [servers[1]!], name: 'bench-send' });
  const a = new ActorSystem({ transport: ta, job: 'bench', node: 'recv', clock: systemClock, random: new SeededRandom(1), defaultRequestTimeoutMs: 60_000 });
  const b = new ActorSystem({ transport: tb, job: 'bench', node: 'send', clock: systemClock, random: new SeededRandom(2), defaultRequestTimeoutMs: 60_000 });
  const counter = { n: 0 };
  await a.spawn({
    kind: 'actor', id: 'sink',
    messages: { blob: z.object({ data: zbytes() }) },
    handlers: { blob: () => { counter.n++; return null; } },
  });
  await new Promise((r) => setTimeout(r, 200));
  return { a, b, ta, tb, counter };
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'hetps-bench-'));
  const cluster = await startLocalCluster({ nodes: 3, dir, clientPort: null, clusterPort: null, httpPort: null, maxPayload: MAX_PAYLOAD, jetstream: false });
  const results: object[] = [];
  try {
    const servers = cluster.urls;
    const rawSub = await connect({ servers: [servers[0]!], noAsyncTraces: true });
    const rawPub = await connect({ servers: [servers[1]!], noAsyncTraces: true });
    const h = await hetpsRun(servers);
    const sink = h.b.ref('actor', 'sink');
    const oursOneWay = async (size: number, n: number, data: Uint8Array): Promise<number> => {
      h.counter.n = 0;
      const t0 = performance.now();
      await pump(n, size, () => sink.tell('blob', { data }), () => h.tb.flush(), () => h.counter.n);
      await waitUntil(() => h.counter.n >= n, 120_000, 'hetps one-way');
      return (performance.now() - t0) / 1000;
    };
    const oursRequestReply = async (size: number, n: number, data: Uint8Array): Promise<number> => {
      let next = 0;
      const t0 = performance.now();
      await Promise.all(Array.from({ length: rrConcurrency(size) }, async () => {
        while (next < n) { next++; await sink.request('blob', { data }); }
      }));
      return (performance.now() - t0) / 1000;
    };
    /** Totals and the median of raw time / hetps time over ROUNDS alternating rounds. */
    const rounds = async (n: number, raw: () => Promise<number>, ours: () => Promise<number>) => {
      const { rawSeconds, oursSeconds, paired } = await alternateRounds(ROUNDS, raw, ours);
      const rawRate = (n * ROUNDS) / rawSeconds; const oursRate = (n * ROUNDS) / oursSeconds;
      return { raw: rawRate, ours: oursRate, ratio: median(paired)!, ratio_of_totals: oursRate / rawRate, rounds: paired.map((x) => +x.toFixed(3)) };
    };
    for (const size of SIZES) {
      const n1 = Math.max(20, Math.floor(oneWayCount(size) / ROUNDS));
      const n2 = Math.max(10, Math.floor(rrCount(size) / ROUNDS));
      const data = new Uint8Array(size);
      // Warm up both paths (JIT, buffers) before timing.
      await rawOneWay(rawPub, rawSub, size, Math.min(n1, 200));
      await oursOneWay(size, Math.min(n1, 200), data);
      await rawRequestReply(rawPub, rawSub, size, Math.min(n2, 100));
      await oursRequestReply(size, Math.min(n2, 100), data);

      const one = await rounds(n1, () => rawOneWay(rawPub, rawSub, size, n1), () => oursOneWay(size, n1, data));
      const rr = await rounds(n2, () => rawRequestReply(rawPub, rawSub, size, n2), () => oursRequestReply(size, n2, data));
      const row = {
        payload_bytes: size,
        messages_per_round: { oneway: n1, request_reply: n2 },
        request_reply_concurrency: rrConcurrency(size),
        oneway: { raw_msgs_per_s: Math.round(one.raw), hetps_msgs_per_s: Math.round(one.ours), ratio: +one.ratio.toFixed(3), ratio_of_totals: +one.ratio_of_totals.toFixed(3), rounds: one.rounds },
        request_reply: { raw_per_s: Math.round(rr.raw), hetps_per_s: Math.round(rr.ours), ratio: +rr.ratio.toFixed(3), ratio_of_totals: +rr.ratio_of_totals.toFixed(3), rounds: rr.rounds },
      };
      results.push(row);
      process.stderr.write(`${JSON.stringify(row)}\n`);
    }
    await h.a.stop(); await h.b.stop();
    await h.ta.close(); await h.tb.close();
    await rawSub.close(); await rawPub.close();
  } finally {
    await cluster.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  const root = fileURLToPath(new URL('../', import.meta.url));
  const { commit, dirty } = gitCommit(root);
  const out: Record<string, unknown> = {
    benchmark: 'transport',
    commit, dirty, date: new Date().toISOString(),
    machine: machineRecord(),
    cluster: { nodes: 3, max_payload: MAX_PAYLOAD, note: 'sender and receiver on different nodes; empty handlers' },
    raw_side: 'nats.js with noAsyncTraces: true; multi-part 8 MiB as four 2 MiB publishes',
    rounds: ROUNDS,
    ratio: 'median over rounds of raw time / hetps time (back-to-back, first side alternating); ratio_of_totals = hetps rate / raw rate over all rounds',
    goals: { oneway_64B: 0.5, oneway_4KiB_and_up: 0.8, request_reply: 0.7 },
    request_reply_concurrency: RR_CONCURRENCY,
    results,
    superseded: earlierResults(new URL('./results/transport.json', import.meta.url)),
  };
  const file = new URL('./results/transport.json', import.meta.url);
  mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
  if (SIZES.length === ALL_SIZES.length && !quick) writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
  console.log(JSON.stringify(out, null, 2));
}

await main();
