/**
 * Shard replication under access control (nats.secure), on a real
 * nats-server enforcing the authorization block hetps writes: each server
 * node logs in as its own shard user, the failover as the scheduler, pushes
 * come from the worker user.
 *
 * - a backup restarted mid-job is seeded by its primary (`shard.*.seed`) and,
 *   caught up, is made a backup again by the failover (`replica_ready`), then
 *   holds the primary's exact state;
 * - a backup whose shard's state is over communication.max_message_bytes is
 *   seeded in segments (`seed_begin`, `seed_part`) and holds the exact state;
 * - a backup whose seed's logs (the applied-batch log) are over the limit too
 *   gets them in chunks that each fit (`seed_logs`), and is a backup again.
 *
 * - a worker lowers a bsp round's expected count (`shard.*.round_expected`,
 *   sent when a round mate is declared dead).
 *
 * None of these is a permissions violation in the server's log.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ActorSystem, SeededRandom, connectTransport, silentLogger, systemClock, type Transport } from '../../runtime/mod.ts';
import { buildShardPlan, roleAuth, shardOfSparseId, withPlacement, demoteToSeeding, type ShardPlan } from '../../topology/mod.ts';
import { readRoleFile } from '../../topology/nats-roles.ts';
import { startLocalCluster, type LocalCluster } from '../../deploy/local-cluster.ts';
import { writeAuthFiles, type AuthFiles } from '../../deploy/auth.ts';
import { ShardState, type PushRequest } from '../../actors/mod.ts';
import { ShardHost } from '../../actors/shard/shard-host.ts';
import { checkIntegrity } from '../../actors/scheduler/integrity.ts';
import { replicaId } from '../../actors/shard/replica.ts';
import type { IntegrityReply } from '../../actors/shard/shard.messages.ts';
import { memoryPlanStore, type PlanStore } from '../../actors/store/plan-store.ts';
import { ShardFailover, createFailoverActor } from '../../actors/scheduler/failover.ts';
import type { HealthView } from '../../actors/health/health.types.ts';
import { until } from '../support/until.ts';

/** Named after its server node, as hetps names shards: a server node's own user serves the replicas of those. */
const SHARD = 'n1';
const noVerdicts: HealthView = { stateOf: () => null, onChange: () => () => undefined };

interface Secure { dir: string; auth: AuthFiles; cluster: LocalCluster }

async function secureCluster(job: string): Promise<Secure> {
  const dir = await mkdtemp(join(tmpdir(), 'hetps-secure-rep-'));
  const auth = await writeAuthFiles(dir, job, { serverNodes: ['n1', 'n2'] });
  const cluster = await startLocalCluster({ nodes: 1, dir: join(dir, 'nats'), clientPort: null, clusterPort: null, httpPort: null, jetstream: false, authorization: auth.authorization });
  return { dir, auth, cluster };
}

/** Two server nodes (n1 primary of shard n1, n2 its backup), each logged in as its own shard user; a worker; the failover as the scheduler. */
class SecureLab {
  readonly transports: Transport[] = [];
  readonly hosts = new Map<string, { host: ShardHost; system: ActorSystem }>();
  readonly store: PlanStore;
  worker!: ActorSystem;
  failover!: ShardFailover;
  sched!: ActorSystem;

  constructor(readonly s: Secure, readonly job: string, readonly plan: ShardPlan, readonly denseSize: number, readonly limits: Record<string, number> = {}) {
    this.store = memoryPlanStore(plan);
  }

  private async system(node: string, file: string, maxMessageBytes?: number): Promise<ActorSystem> {
    const transport = await connectTransport({
      servers: this.s.cluster.urls, name: node, auth: roleAuth(readRoleFile(file)), ...(maxMessageBytes !== undefined ? { maxMessageBytes } : {}),
    });
    this.transports.push(transport);
    return new ActorSystem({ transport, job: this.job, node, clock: systemClock, random: new SeededRandom(1), defaultRequestTimeoutMs: 5_000 });
  }

  async init(): Promise<void> {
    this.worker = await this.system('w1', this.s.auth.roles.worker);
    this.sched = await this.system('scheduler', this.s.auth.roles.scheduler);
    this.failover = new ShardFailover({
      planStore: this.store, health: noVerdicts, servers: ['n1', 'n2'], backupFactor: 1, transport: this.sched.transport, job: this.job, clock: systemClock, log: silentLogger(),
    });
    await this.sched.spawn(createFailoverActor(this.failover));
    await this.sched.transport.flush();
  }

  async start(node: string): Promise<void> {
    const system = await this.system(node, this.s.auth.servers[node]!, this.limits[node]);
    const host = new ShardHost({
      node, system, planStore: this.store, log: silentLogger(), replication: 'sync', lagLimit: 8, requestTimeoutMs: 1_000,
      newState: (shard, p) => new ShardState({
        shard, plan: p, initialDense: new Map([['w', new Float32Array(this.denseSize).fill(1)]]),
        denseOptimizer: { type: 'sgd', learningRate: 0.1 }, sparseOptimizer: { type: 'sgd', learningRate: 0.1 },
        sparseInitScale: 0.1, seed: 5, clock: systemClock, staleness: null,
      }),
    });
    await host.start((await this.store.get())!);
    await system.transport.flush();
    this.hosts.set(node, { host, system });
  }

  async kill(node: string): Promise<void> {
    const h = this.hosts.get(node)!;
    this.hosts.delete(node);
    await h.host.stop();
    await h.system.stop();
  }

  async push(k: number, batches = [`b${k}`]): Promise<void> {
    const p = (await this.store.get())!;
    const ids = Int32Array.from([1, 2, 3].filter((id) => shardOfSparseId(p, id) === SHARD));
    const m: PushRequest = {
      plan_version: p.version, round: null, expected: null, weight: 1, base_version: 0, later_steps: [], lr_mult: 1,
      // Embedding rows only where the dense tower is big: the pushes (and their replication) stay small, only a seed is large.
      dense: this.denseSize > 1_000 ? [] : p.dense.filter((b) => b.shard === SHARD).map((b) => ({ block: b.id, grad: new Float32Array(b.length).fill(k) })),
      sparse: ids.length ? [{ table: 'emb', ids, grads: new Float32Array(ids.length * 2).fill(k) }] : [],
      batches,
    };
    await this.worker.ref('shard', replicaId(SHARD, p.placement.replicas[SHARD]!.primary)).request('push', m as unknown as Record<string, unknown>);
  }

  /** The end-of-run check, as the driver asks it (a worker may not). */
  integrity(node: string): Promise<IntegrityReply> {
    return this.sched.ref('shard', replicaId(SHARD, node)).request<IntegrityReply & Record<string, unknown>>('integrity', {});
  }

  async close(): Promise<void> {
    this.failover?.dispose();
    for (const node of [...this.hosts.keys()]) await this.kill(node).catch(() => undefined);
    await this.sched?.stop().catch(() => undefined);
    await this.worker?.stop().catch(() => undefined);
    for (const t of this.transports) await t.close().catch(() => undefined);
  }
}

function shardPlan(denseSize: number): ShardPlan {
  return buildShardPlan({
    version: 1, shards: [SHARD], servers: ['n1', 'n2'], backupFactor: 1, partitions: 4, maxBlockBytes: 4 * 1024 * 1024,
    denseParams: [{ name: 'w', size: denseSize }], sparseTables: [{ name: 'emb', dim: 2 }],
  });
}

/** The server's log lines reporting a permissions violation by anyone. */
async function violations(s: Secure): Promise<string[]> {
  const out: string[] = [];
  for (const n of s.cluster.nodes) {
    const log = await readFile(n.log, 'utf8').catch(() => '');
    out.push(...log.split('\n').filter((l) => /Permissions Violation/.test(l)));
  }
  return out;
}

test('nats.secure: a restarted backup is seeded by its primary (in segments when its state is over the message limit, its logs in chunks when they are) and made a backup again by the failover', { timeout: 120_000 }, async () => {
  const job = `securerep${process.pid}`;
  const s = await secureCluster(job);
  try {
    // ---- a seed that fits: the backup restarted mid-job gets the primary's state, and is a backup again.
    const small = new SecureLab(s, job, shardPlan(64), 64);
    try {
      await small.init();
      await small.start('n1'); await small.start('n2');
      for (let k = 1; k <= 3; k++) await small.push(k);
      // A bsp worker whose round mate was declared dead lowers the round's count (answered, not refused by the server).
      const lowered = await small.worker.ref('shard', replicaId(SHARD, 'n1')).request<{ round: number; expected: number | null }>('round_expected', { plan_version: 1, round: 0, expected: 1 });
      assert.equal(lowered.round, 0);
      await small.kill('n2');
      // The plan the failover would write for a restarted backup (seeding), then the restarted process itself.
      const p = (await small.store.get())!;
      await small.store.put(withPlacement(p, demoteToSeeding(p.placement, SHARD, 'n2')!));
      await small.start('n2');
      // The next update finds it at update 0: its primary seeds it, then reports it caught up.
      await small.push(4);
      await until(async () => (await small.store.get())!.placement.replicas[SHARD]!.backups.includes('n2'), 'n2 seeded, caught up and made a backup again (replica_ready)', 20_000);
      await small.push(5);
      const [a, b] = await Promise.all([small.integrity('n1'), small.integrity('n2')]);
      assert.equal(b.hash, a.hash, 'the reseeded backup holds the primary\'s exact state');
      assert.deepEqual(Object.keys(b.applied).sort(), ['b1', 'b2', 'b3', 'b4', 'b5']);
      assert.equal(small.failover.replicas.at(-1)?.kind, 'backup');
    } finally {
      await small.close();
    }

    // ---- a state over the message limit (~1.2 MB, every node's limit 1.1 MiB; chunked over the 1 MiB max_payload besides):
    // the restarted backup is seeded in segments that each fit (`seed_begin`, `seed_part`, `seed`) and is waited for again.
    const big = new SecureLab(s, job, shardPlan(300_000), 300_000, { n1: 1_150_000, n2: 1_150_000 });
    try {
      await big.init();
      await big.start('n1'); await big.start('n2');
      await big.push(1);
      await big.kill('n2');
      await big.start('n2');
      await big.push(2);
      const [a, b] = await Promise.all([big.integrity('n1'), big.integrity('n2')]);
      assert.equal(b.hash, a.hash, 'the backup seeded in segments holds the primary\'s exact state');
      assert.deepEqual(big.failover.report().unprotected, [], 'still a backup');

      // ---- a seed whose logs are over the limit too: every batch id the primary applied (45 000 of them, ~1.5 MB)
      // goes in `seed_logs` chunks that each fit, the last chunk in the seed's last message (before: one message,
      // refused; the replica was reported unseedable and made seeding again, the shard left unprotected).
      const many = (k: number) => Array.from({ length: 15_000 }, (_, j) => `batch-${k}-${j}-${'x'.repeat(16)}`);
      for (let k = 3; k <= 5; k++) await big.push(k, many(k));
      await big.kill('n2');
      await big.start('n2');
      await big.push(6);
      await big.push(7);
      // Each replica's integrity reply (its whole log) is over the limit too: the end-of-run check reads it in parts
      // (`integrity_part`, the scheduler's user), as the driver does.
      const want = ['b1', 'b2', ...many(3), ...many(4), ...many(5), 'b6', 'b7'];
      const report = await checkIntegrity({ system: big.sched, plan: (await big.store.get())!, acked: new Set(want), clock: systemClock, log: null, settleMs: 0 });
      assert.deepEqual([report.applied, report.lost, report.duplicated, report.replicas_equal], [want.length, 0, 0, true], JSON.stringify({ ...report, per_shard: undefined }));
      assert.deepEqual([report.per_shard[SHARD]!.replicas, report.per_shard[SHARD]!.unanswered], [2, []], 'both replicas read');
      assert.ok((await big.store.get())!.placement.replicas[SHARD]!.backups.includes('n2'), 'n2 is still a backup');
      assert.deepEqual(big.failover.report().unprotected, [], 'the shard stays protected');
    } finally {
      await big.close();
    }
    assert.deepEqual(await violations(s), [], 'no permissions violation');
  } finally {
    await s.cluster.stop();
    await rm(s.dir, { recursive: true, force: true });
  }
});
