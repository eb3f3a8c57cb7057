/**
 * Process helpers for the parameter-server tests: the `hetps` CLI (and the
 * API example) as child processes, each killed if the test process exits
 * first, plus a small job config written to a temp dir.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { after, before } from 'node:test';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { connect } from '@nats-io/transport-node';
import { decode } from '@msgpack/msgpack';
import { connectTransport } from '../../runtime/mod.ts';
import { subscribeTelemetry } from '../../actors/monitor/telemetry.ts';
import { startTestCluster, type TestCluster } from './cluster.ts';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const BIN = join(ROOT, 'bin', 'hetps.mjs');

export interface Exited { code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }

export interface Child {
  readonly child: ChildProcess;
  readonly pid: number;
  /** Output so far. */
  stdout(): string;
  stderr(): string;
  readonly exited: Promise<Exited>;
  kill(signal?: NodeJS.Signals): void;
}

const live = new Set<ChildProcess>();
let hooked = false;
function killOnExit(c: ChildProcess): void {
  live.add(c);
  c.once('exit', () => live.delete(c));
  if (hooked) return;
  hooked = true;
  process.on('exit', () => { for (const p of live) { try { p.kill('SIGKILL'); } catch { /* gone */ } } });
}

/** `node <args>` in the repository root; stdout and stderr are collected. */
export function node(args: string[], opts: { env?: NodeJS.ProcessEnv; timeoutMs?: number } = {}): Child {
  const child = spawn(process.execPath, args, { cwd: ROOT, env: { ...process.env, ...opts.env }, stdio: ['ignore', 'pipe', 'pipe'] });
  killOnExit(child);
  let out = ''; let err = '';
  child.stdout!.on('data', (d: Buffer) => { out += d.toString(); });
  child.stderr!.on('data', (d: Buffer) => { err += d.toString(); });
  const timer = opts.timeoutMs ? setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs) : null;
  const exited = new Promise<Exited>((resolve) => {
    child.once('exit', (code, signal) => {
      if (timer) clearTimeout(timer);
      // Let the pipes drain before reporting.
      setImmediate(() => resolve({ code, signal, stdout: out, stderr: err }));
    });
  });
  return {
    child, pid: child.pid!, exited,
    stdout: () => out, stderr: () => err,
    kill: (signal: NodeJS.Signals = 'SIGTERM') => { try { child.kill(signal); } catch { /* gone */ } },
  };
}

/** `hetps <args>` as a user runs it. */
export function hetps(args: string[], opts: { env?: NodeJS.ProcessEnv; timeoutMs?: number } = {}): Child {
  return node([BIN, ...args], opts);
}

/**
 * The quick start's node processes (`hetps launch`: server-1, server-2, and
 * the workers of groups fast (3) and slow (2)), started by the test so they
 * outlive any driver.
 */
export function launchQuickstartNodes(cfg: string, timeoutMs = 400_000): Child[] {
  return QUICKSTART_NODES.map((n) => hetps(['launch', ...n.args, '--config', cfg], { timeoutMs }));
}

/** The quick start's nodes in the order launchQuickstartNodes starts them, with their `hetps launch` arguments. */
export const QUICKSTART_NODES: readonly { name: string; args: readonly string[] }[] = [
  ...['server-1', 'server-2'].map((s) => ({ name: s, args: ['--role', 'server', '--server-id', s] })),
  ...([['fast', 3], ['slow', 2]] as const).flatMap(([g, n]) => Array.from({ length: n }, (_, r) => ({ name: `${g}-${r + 1}`, args: ['--role', 'worker', '--group', g, '--node-rank', String(r)] }))),
];

export interface JobConfigOptions {
  job: string;
  mode: 'bsp' | 'asp' | 'hps';
  servers: string[] | null;
  runDir: string;
  /** Spam mails per epoch. */
  samples: number;
  epochs: number;
  /** ack_wait of the batch queue, seconds. */
  workerRecoveryTimeoutS: number;
  /** communication.compression; absent: the default. */
  compression?: 'none' | 'fp16' | 'adaptive';
  /** cluster.shards_per_server; absent: the default (1). */
  shardsPerServer?: number;
  /** cluster.start_barrier_seconds; absent: the default (30). */
  startBarrierSeconds?: number;
}

/**
 * Spam Assassin with a small Wide & Deep model on 2 servers and 4 workers in
 * two groups; small enough that a whole run takes seconds once the nodes are up.
 */
export async function writeJobConfig(dir: string, o: JobConfigOptions): Promise<string> {
  const text = `job: { name: ${o.job}, run_dir: ${JSON.stringify(o.runDir)} }
${o.servers ? `nats: { servers: [${o.servers.map((s) => JSON.stringify(s)).join(', ')}] }\n` : ''}cluster:
  worker_groups:
    - name: g1
      nodes: [w1, w2]
    - name: g2
      nodes: [w3, w4]
  server_nodes: [s1, s2]
${o.shardsPerServer !== undefined ? `  shards_per_server: ${o.shardsPerServer}\n` : ''}${o.startBarrierSeconds !== undefined ? `  start_barrier_seconds: ${o.startBarrierSeconds}\n` : ''}model:
  type: ctr
  ctr: { embedding_dim: 8, hidden: [32, 16], pooling: mean, wide: true, hash_buckets: 65536 }
data: { source: spam, batch_size: 32, epochs: ${o.epochs}, samples: ${o.samples}, test_fraction: 0.2, vocab_size: 65536, max_tokens: 256 }
optimizer:
  type: adam
  learning_rate: 0.003
  sparse: { type: adagrad, learning_rate: 0.05 }
training: { mode: ${o.mode}, random_seed: 42 }
fault_tolerance: { worker_recovery_timeout: ${o.workerRecoveryTimeoutS} }
${o.compression !== undefined ? `communication: { compression: ${o.compression} }\n` : ''}logging: { level: info }
`;
  const file = join(dir, `${o.job}.yaml`);
  await writeFile(file, text);
  return file;
}

/** The last line of stdout as JSON (commands run with --json print one object there). */
/** The small embedded hps jobs' cluster: a sync group `fast` [w1, w2] (every 2 steps) and an async group `loose` [w3, w4] on 2 servers. */
export const FAST_AND_LOOSE_CLUSTER = `cluster:
  worker_groups:
    - { name: fast, nodes: [w1, w2], sync_mode: sync, sync_steps: 2 }
    - { name: loose, nodes: [w3, w4], sync_mode: async }
  server_nodes: [s1, s2]
`;

/**
 * The model, data, optimizer and training sections of the small embedded hps
 * jobs (Wide & Deep on 640 Spam Assassin mails by default): one tail for the
 * `hetps up --embedded` tests, which differ in their cluster and nodes.
 */
export function smallHpsJobTail(o: { hidden?: string; samples?: number; maxTokens?: number; seed?: number; referenceStepMs?: number; maxStaleness?: string } = {}): string {
  return `model:
  type: ctr
  ctr: { embedding_dim: 8, hidden: ${o.hidden ?? '[32, 16]'}, pooling: mean, wide: true, hash_buckets: 65536 }
data: { source: spam, batch_size: 32, epochs: 1, samples: ${o.samples ?? 640}, test_fraction: 0.2, vocab_size: 65536, max_tokens: ${o.maxTokens ?? 256} }
optimizer:
  type: adam
  learning_rate: 0.003
  sparse: { type: adagrad, learning_rate: 0.05 }
training: { mode: hps, random_seed: ${o.seed ?? 42}, max_staleness: ${o.maxStaleness ?? '8'}, emulation_reference_step_ms: ${o.referenceStepMs ?? 30} }
fault_tolerance: { worker_recovery_timeout: 10 }
logging: { level: info }
`;
}

/** Confirmed batch acknowledgements as the workers' telemetry reports them: a view independent of the driver's. */
export interface AckWatch {
  /** Confirmed acknowledgements per batch id. */
  acks: Map<string, number>;
  /** Confirmed acknowledgements per node. */
  byNode: Map<string, number>;
  /** hps: the windows each node's batches were trained in. */
  windowsOf: Map<string, Set<number>>;
  /** The groups versions each node reported `ready` (paused) for. */
  regroupReady: Map<string, Set<number>>;
  close(): Promise<void>;
}

export async function watchAcks(urls: string[], job: string): Promise<AckWatch> {
  const watcher = await connectTransport({ servers: urls, name: `ack-watcher-${job}` });
  const acks = new Map<string, number>();
  const byNode = new Map<string, number>();
  const windowsOf = new Map<string, Set<number>>();
  const regroupReady = new Map<string, Set<number>>();
  const stop = subscribeTelemetry(watcher, job, {
    regroup: (r) => {
      if (r.state !== 'ready') return;
      let v = regroupReady.get(r.node);
      if (!v) { v = new Set(); regroupReady.set(r.node, v); }
      v.add(r.groups_version);
    },
    batch: (b) => {
      if (b.window !== null) { let w = windowsOf.get(b.node); if (!w) { w = new Set(); windowsOf.set(b.node, w); } w.add(b.window); }
      if (!b.ack_confirmed) return;
      acks.set(b.batch_id, (acks.get(b.batch_id) ?? 0) + 1);
      byNode.set(b.node, (byNode.get(b.node) ?? 0) + 1);
    },
  });
  await watcher.flush();
  return { acks, byNode, windowsOf, regroupReady, close: async () => { stop(); await watcher.close(); } };
}

/** Health verdicts as the health actor publishes them (`hps.<job>.tel.health.*`), each with when it arrived. */
export interface VerdictWatch {
  verdicts: { node: string; state: string; reason: string; at: number }[];
  /** The first verdict of `node` in `state` that arrived at or after `since` (ms since the epoch). */
  first(node: string, state: string, since?: number): { node: string; state: string; reason: string; at: number } | undefined;
  close(): Promise<void>;
}

export async function watchVerdicts(urls: string[], job: string): Promise<VerdictWatch> {
  const nc = await connect({ servers: urls, name: `verdict-watcher-${job}` });
  const verdicts: VerdictWatch['verdicts'] = [];
  nc.subscribe(`hps.${job}.tel.health.*`, { callback: (_e, m) => { verdicts.push({ ...(decode(m.data) as { node: string; state: string; reason: string }), at: Date.now() }); } });
  await nc.flush();
  return {
    verdicts,
    first: (node, state, since = 0) => verdicts.find((v) => v.node === node && v.state === state && v.at >= since),
    close: () => nc.close(),
  };
}

export function lastJson(stdout: string): Record<string, unknown> {
  const lines = stdout.trim().split('\n').filter(Boolean);
  return JSON.parse(lines[lines.length - 1] ?? 'null') as Record<string, unknown>;
}

/** A temp dir for one test file: made before its tests, removed after them. Call the result for the path. */
export function tempDirForFile(prefix: string): () => string {
  let dir = '';
  before(async () => { dir = await mkdtemp(join(tmpdir(), prefix)); });
  after(async () => { await rm(dir, { recursive: true, force: true }); });
  return () => dir;
}

/** A 3-node test cluster and a temp dir for one test file: started before its tests, removed after them. */
export function clusterAndDirForFile(prefix: string): { nats: () => TestCluster; dir: () => string } {
  let nats: TestCluster | null = null;
  let dir = '';
  before(async () => {
    nats = await startTestCluster({ nodes: 3 });
    dir = await mkdtemp(join(tmpdir(), prefix));
  });
  after(async () => {
    await nats?.[Symbol.asyncDispose]();
    if (dir) await rm(dir, { recursive: true, force: true });
  });
  return { nats: () => nats!, dir: () => dir };
}

/** A child's exit and the tail of its stderr, for assertion messages. */
export const explainExit = (r: Exited): string => `exit ${r.code ?? r.signal}; stderr (tail):\n${r.stderr.split('\n').slice(-40).join('\n')}`;

/** What a run's summary says about its batches and the shards' integrity check. */
export interface LossSummary {
  batches: number; batches_acked: number; duplicate_acks: number;
  integrity: { acked: number; applied: number; lost: number; duplicated: number; replicas_equal: boolean | null; dropped_stale?: number } | null;
}

/**
 * A run that must have lost nothing: every batch acknowledged exactly once
 * (the summary and a watcher of `tel.batch` agree), and the integrity check
 * found every acknowledged batch applied once on the shards.
 */
export function assertNothingLost(s: LossSummary, acks: ReadonlyMap<string, number>): void {
  assert.equal(s.batches_acked, s.batches, 'every batch acknowledged');
  assert.equal(s.duplicate_acks, 0);
  for (const [b, n] of acks) assert.equal(n, 1, `batch ${b} acknowledged ${n} times`);
  // tel.batch is core NATS, at most once: on a loaded machine a watcher may miss a report. What was acknowledged
  // and applied is the shards' applied logs, checked below.
  assert.ok(acks.size <= s.batches && acks.size >= s.batches * 0.9, `the watcher heard ${acks.size} of ${s.batches} acknowledgements`);
  const i = s.integrity;
  assert.ok(i, 'the summary has the integrity check');
  assert.equal(i.acked, s.batches);
  assert.equal(i.lost, 0, `lost: ${JSON.stringify(i)}`);
  assert.equal(i.duplicated, 0, `duplicated: ${JSON.stringify(i)}`);
  // hps refuses a push staler than max_staleness: its batches are acknowledged and dropped, not applied (on a
  // loaded machine a CI run dropped 8 of 292 this way).
  assert.equal(i.applied + (i.dropped_stale ?? 0), s.batches, `applied ${i.applied}, dropped as too stale ${i.dropped_stale ?? 0}`);
}
