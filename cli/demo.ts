/**
 * `hetps demo`: the foundation end to end — a local 3-node NATS cluster (or
 * the embedded bus when nats-server is missing) and two actors exchanging
 * sequenced requests, including tensors above max_payload. This is a stand-in
 * main job until the parameter server (`hetps up`) lands; it says so.
 */
import type { Command } from 'commander';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { z } from 'zod';
import { findNatsServer, startLocalCluster, type LocalCluster } from '../deploy/local-cluster.ts';
import {
  ActorSystem, InProcessBroker, MissingDependencyError, SeededRandom, connectTransport, createLogger, systemClock, zf32,
} from '../runtime/mod.ts';

export interface DemoSummary {
  job: 'demo';
  label: string;
  transport: 'nats' | 'embedded';
  requests: number;
  tensor_bytes: number;
  chunked_messages: number;
  wall_s: number;
  requests_per_s: number;
  exactly_once: boolean;
}

export async function runDemo(opts: { requests: number; json: boolean; embedded: boolean }): Promise<DemoSummary> {
  const log = createLogger({ name: 'hetps-demo', stderr: opts.json });
  let cluster: LocalCluster | null = null;
  let dir: string | null = null;
  let servers: string[] | null = null;
  let broker: InProcessBroker | null = null;
  if (!opts.embedded) {
    try {
      findNatsServer();
      dir = await mkdtemp(join(tmpdir(), 'hetps-demo-'));
      log.info('starting a local 3-node NATS cluster (random ports)');
      cluster = await startLocalCluster({ nodes: 3, dir, clientPort: null, clusterPort: null, httpPort: null, maxPayload: 1024 * 1024, jetstream: false });
      servers = cluster.urls;
      log.info({ servers }, 'cluster up: every node has its routes');
    } catch (e) {
      if (!(e instanceof MissingDependencyError)) throw e;
      log.warn(`${e.message} — running on the embedded in-process bus instead`);
    }
  }
  if (!servers) broker = new InProcessBroker(1024 * 1024);
  try {
    const ta = await connectTransport({ servers: servers ? [servers[0]!] : null, broker, name: 'demo-server', logger: log });
    const tb = await connectTransport({ servers: servers ? [servers[servers.length - 1]!] : null, broker, name: 'demo-client', logger: log });
    const a = new ActorSystem({ transport: ta, job: 'demo', node: 'server', clock: systemClock, random: new SeededRandom(1), logger: log });
    const b = new ActorSystem({ transport: tb, job: 'demo', node: 'client', clock: systemClock, random: new SeededRandom(2), logger: log });
    const applied = new Set<number>();
    let duplicates = 0;
    await a.spawn({
      kind: 'actor', id: 'accumulator', idempotent: true,
      messages: { add: z.object({ n: z.number().int() }), sum: z.object({ x: zf32() }) },
      handlers: {
        add: (m) => { if (applied.has(m.n)) duplicates++; applied.add(m.n); return { count: applied.size }; },
        sum: (m) => { let s = 0; for (let i = 0; i < m.x.length; i++) s += m.x[i]!; return { sum: s, length: m.x.length }; },
      },
    });
    const ref = b.ref('actor', 'accumulator');
    const t0 = performance.now();
    let next = 0;
    await Promise.all(Array.from({ length: 16 }, async () => {
      while (next < opts.requests) {
        const n = next++;
        await ref.request('add', { n }, { retries: 5 });
        if ((n + 1) % Math.max(1, Math.floor(opts.requests / 4)) === 0) log.info(`${n + 1}/${opts.requests} requests answered`);
      }
    }));
    // A 4 MiB tensor: above max_payload, so it travels in chunks.
    const x = new Float32Array(1024 * 1024).fill(0.5);
    const r = await ref.request<{ sum: number; length: number }>('sum', { x }, { timeoutMs: 30_000 });
    const wall = (performance.now() - t0) / 1000;
    if (r.length !== x.length || r.sum !== x.length * 0.5) throw new Error(`tensor arrived wrong: ${JSON.stringify(r)}`);
    const summary: DemoSummary = {
      job: 'demo',
      label: 'foundation demo: two actors exchanging messages (the parameter server job comes with `hetps up`)',
      transport: ta.kind,
      requests: opts.requests,
      tensor_bytes: x.byteLength,
      chunked_messages: tb.stats.chunkedSent,
      wall_s: +wall.toFixed(3),
      requests_per_s: Math.round(opts.requests / wall),
      exactly_once: applied.size === opts.requests && duplicates === 0,
    };
    await a.stop(); await b.stop();
    await ta.close(); await tb.close();
    return summary;
  } finally {
    await cluster?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
  }
}

export function register(program: Command): void {
  program
    .command('demo')
    .description('foundation demo: a local NATS cluster (or the embedded bus) and two actors exchanging messages')
    .option('--requests <n>', 'sequenced requests to send', '5000')
    .option('--embedded', 'use the in-process bus even when nats-server is installed', false)
    .option('--json', 'print one JSON summary on stdout', false)
    .action(async (o: { requests: string; embedded: boolean; json: boolean }) => {
      const requests = Number(o.requests);
      if (!Number.isInteger(requests) || requests <= 0) throw new Error(`--requests must be a positive integer, got ${o.requests}`);
      const s = await runDemo({ requests, json: o.json, embedded: o.embedded });
      if (o.json) process.stdout.write(`${JSON.stringify(s)}\n`);
      else process.stdout.write(`${s.label}\n  transport=${s.transport} requests=${s.requests} (${s.requests_per_s}/s) 4 MiB tensor in ${s.chunked_messages} chunked message(s), exactly once: ${s.exactly_once}\n`);
    });
}
