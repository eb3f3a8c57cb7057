/**
 * Shard replication on the in-process bus: placement and the promotion rule
 * (plain functions), sync replication, dedup across a promotion, fencing of
 * a deposed primary, seeding a new replica while updates keep coming, the
 * applied-batch log, and the scheduler's failover on a dead verdict (on a
 * simulated clock).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  ActorSystem, InProcessBroker, SeededRandom, SimulatedClock, Transport, silentLogger, systemClock, type Clock,
} from '../../runtime/mod.ts';
import type { Bus } from '../../runtime/bus.ts';
import {
  buildShardPlan, demoteToSeeding, failover, placeReplicas, promoteSeeded, rereplicate, shardOfSparseId, unprotectedShards, withPlacement,
  type ShardPlan, type StalenessPolicy,
} from '../../topology/mod.ts';
import { ShardState, type PushReply, type PushRequest, type ShardStats } from '../../actors/mod.ts';
import { ShardHost } from '../../actors/shard/shard-host.ts';
import { replicaId } from '../../actors/shard/replica.ts';
import type { IntegrityReply, ShardSnapshot } from '../../actors/shard/shard.messages.ts';
import { memoryPlanStore, type PlanStore } from '../../actors/store/plan-store.ts';
import { ShardFailover, createFailoverActor } from '../../actors/scheduler/failover.ts';
import { checkIntegrity } from '../../actors/scheduler/integrity.ts';
import type { HealthState, HealthView } from '../../actors/health/health.types.ts';
import { until } from '../support/until.ts';
import { pino, type Logger } from 'pino';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ShardClient } from '../../actors/worker/shard-client.ts';
import { readCheckpointState, sha256, shardFiles, writeCheckpoint } from '../../actors/store/checkpoint.ts';

// ---------------------------------------------------------------- the rules

describe('placement and the promotion rule', () => {
  test('a fresh job: primary on its own server, backups on the next ones of the ring, never two replicas of a shard on one node', () => {
    const p = placeReplicas(['a', 'b', 'c'], ['a', 'b', 'c'], 2);
    assert.deepEqual(p.replicas, {
      a: { primary: 'a', backups: ['b', 'c'], seeding: [] },
      b: { primary: 'b', backups: ['c', 'a'], seeding: [] },
      c: { primary: 'c', backups: ['a', 'b'], seeding: [] },
    });
    assert.throws(() => placeReplicas(['a', 'b'], ['a', 'b'], 2), /backup_factor 2 needs at least 3 server nodes/);
  });

  test('a dead primary is replaced by the live backup that applied the most (ties: the plan\'s order); the other backups stay; dead ones are dropped', () => {
    const p = placeReplicas(['a', 'b', 'c'], ['a', 'b', 'c'], 2);
    const r = failover(p, new Set(['a']))!;
    assert.deepEqual(r.placement.replicas.a, { primary: 'b', backups: ['c'], seeding: [] });
    const byApplied = failover(p, new Set(['a']), (shard, node) => (shard === 'a' ? ({ b: 40, c: 42 } as Record<string, number>)[node] ?? null : null))!;
    assert.deepEqual(byApplied.placement.replicas.a, { primary: 'c', backups: ['b'], seeding: [] }, 'c applied more of a\'s stream');
    assert.deepEqual(byApplied.changes[0]!.promoted, { from: 'a', to: 'c' });
    assert.deepEqual(r.placement.replicas.b, { primary: 'b', backups: ['c'], seeding: [] });
    assert.deepEqual(r.placement.replicas.c, { primary: 'c', backups: ['b'], seeding: [] });
    assert.deepEqual(r.changes.map((c) => [c.shard, c.promoted, c.dropped]), [['a', { from: 'a', to: 'b' }, []], ['b', null, ['a']], ['c', null, ['a']]]);
    assert.deepEqual(r.lost, []);
    assert.equal(failover(p, new Set()), null, 'nothing dead: no new plan');
  });

  test('only a backup whose replica answered is promoted: a server still starting holds nothing, so the shard waits instead', () => {
    const p = placeReplicas(['a', 'b', 'c'], ['a', 'b', 'c'], 2);
    // a dies while b and c have not started their replicas of a (a slow start on a loaded machine).
    const none = failover(p, new Set(['a']), () => null, () => false)!;
    assert.deepEqual(none.waiting, ['a']);
    assert.deepEqual(none.placement.replicas.a, p.replicas.a, 'nothing promoted');
    assert.deepEqual(none.changes.map((c) => c.shard), ['b', 'c'], 'the other shards drop the dead backup as usual');
    // c answers (even with less applied than b would have): it is the one promoted.
    const one = failover(p, new Set(['a']), (_s, n) => (n === 'c' ? 0 : null), (_s, n) => n === 'c')!;
    assert.deepEqual([one.waiting, one.placement.replicas.a!.primary], [[], 'c']);
  });

  test('a seeding replica is never promoted, and a shard whose every backup is dead is reported lost', () => {
    const p = placeReplicas(['a', 'b'], ['a', 'b', 'c'], 1);
    p.replicas.a!.seeding = ['c'];
    // a: backup b is dead too, and c is only seeding: lost. b: its backup c is promoted.
    const r = failover(p, new Set(['a', 'b']))!;
    assert.deepEqual(r.lost, ['a']);
    assert.equal(r.placement.replicas.b!.primary, 'c');
  });

  test('re-replication: a new replica on the least-loaded live server that holds none of the shard; promoted once caught up', () => {
    const p = failover(placeReplicas(['a', 'b', 'c'], ['a', 'b', 'c'], 1), new Set(['a']))!.placement;
    // a's shard is on b only now, c's backup (a) was dropped.
    const r = rereplicate(p, new Set(['b', 'c']), 1)!;
    assert.deepEqual(r.added, [{ shard: 'a', node: 'c' }, { shard: 'c', node: 'b' }]);
    assert.equal(rereplicate(r.placement, new Set(['b', 'c']), 1), null, 'seeding replicas count: nothing more to add');
    const ready = promoteSeeded(r.placement, 'a', 'c')!;
    assert.deepEqual(ready.replicas.a, { primary: 'b', backups: ['c'], seeding: [] });
    assert.equal(promoteSeeded(ready, 'a', 'c'), null);
    const onlyB = rereplicate(p, new Set(['b']), 1)!;
    assert.deepEqual(onlyB.added, [{ shard: 'c', node: 'b' }], 'shard a is on b already: no live server left for it');
  });

  test('a backup its primary cannot seed goes back to seeding: the shard counts as unprotected, and a failover never promotes it', () => {
    const p = placeReplicas(['a', 'b', 'c'], ['a', 'b', 'c'], 1);
    assert.deepEqual(unprotectedShards(p), []);
    const d = demoteToSeeding(p, 'a', 'b')!;
    assert.deepEqual(d.replicas.a, { primary: 'a', backups: [], seeding: ['b'] });
    assert.deepEqual(p.replicas.a, { primary: 'a', backups: ['b'], seeding: [] }, 'the plan given is not changed');
    assert.deepEqual(unprotectedShards(d), ['a']);
    assert.equal(demoteToSeeding(d, 'a', 'b'), null, 'already seeding: nothing to change');
    assert.equal(demoteToSeeding(p, 'a', 'c'), null, 'not a replica of a');
    assert.deepEqual(failover(d, new Set(['a']))!.lost, ['a'], 'its primary dead, the shard is lost rather than served from an empty replica');
    assert.deepEqual(promoteSeeded(d, 'a', 'b')!.replicas.a, p.replicas.a, 'seeded later, it is a backup again');
  });
});

// ---------------------------------------------------------------- replicas over the bus

const SEED = 5;

function plan(): ShardPlan {
  return buildShardPlan({
    version: 1, shards: ['s0'], servers: ['n1', 'n2', 'n3'], backupFactor: 1, partitions: 4, maxBlockBytes: 16,
    denseParams: [{ name: 'w', size: 4 }], sparseTables: [{ name: 'emb', dim: 2 }],
  });
}

/** plan() with its dense parameter cut into `blocks` blocks of 4 floats (pushes carry block 0 only). */
function manyBlocksPlan(blocks: number): ShardPlan {
  return buildShardPlan({
    version: 1, shards: ['s0'], servers: ['n1', 'n2', 'n3'], backupFactor: 1, partitions: 4, maxBlockBytes: 16,
    denseParams: [{ name: 'w', size: 4 * blocks }], sparseTables: [{ name: 'emb', dim: 2 }],
  });
}

interface Node { system: ActorSystem; host: ShardHost; store: PlanStore }

/** Lab options: the bus's max_payload, a node's message limit (communication.max_message_bytes) and its log. */
interface LabOptions { maxPayload?: number; maxMessageBytes?: Record<string, number>; log?: Record<string, Logger> }

class Lab {
  readonly broker: InProcessBroker;
  readonly nodes = new Map<string, Node>();
  readonly client: ActorSystem;
  readonly store: PlanStore;
  constructor(readonly plan: ShardPlan, readonly clock: Clock = systemClock, readonly staleness: StalenessPolicy | null = null, readonly opts: LabOptions = {}) {
    this.broker = new InProcessBroker(opts.maxPayload);
    this.store = memoryPlanStore(plan);
    this.client = this.system('client');
  }

  /** `deliveryDelayMs`: every message reaches this node that much later (a replica slower than its stream's primary). */
  system(node: string, deliveryDelayMs = 0): ActorSystem {
    const bus = deliveryDelayMs > 0 ? delayedDeliveries(this.broker.client(), deliveryDelayMs) : this.broker.client();
    const limit = this.opts.maxMessageBytes?.[node];
    const transport = new Transport(bus, { clientId: node, clock: this.clock, ...(limit !== undefined ? { maxMessageBytes: limit } : {}) });
    return new ActorSystem({ transport, job: 'rep', node, clock: this.clock, random: new SeededRandom(1), defaultRequestTimeoutMs: 2_000 });
  }

  /** Starts a server node following `store` (default: the lab's; a node cut off from the plan gets one of its own). */
  async start(node: string, store: PlanStore = this.store, deliveryDelayMs = 0): Promise<Node> {
    const system = this.system(node, deliveryDelayMs);
    const host = new ShardHost({
      node, system, planStore: store, log: this.opts.log?.[node] ?? silentLogger(), replication: 'sync', lagLimit: 8, requestTimeoutMs: 300,
      newState: (shard, p) => new ShardState({
        shard, plan: p, initialDense: new Map([['w', Float32Array.from({ length: p.denseParams[0]!.size }, (_, i) => (i % 4) + 1)]]),
        denseOptimizer: { type: 'sgd', learningRate: 0.1 }, sparseOptimizer: { type: 'sgd', learningRate: 0.1 },
        sparseInitScale: 0.1, seed: SEED, clock: this.clock, staleness: this.staleness,
      }),
    });
    const current = await store.get();
    await host.start(current!);
    const n = { system, host, store };
    this.nodes.set(node, n);
    return n;
  }

  /** The node's process is gone: its replicas answer nothing more. */
  async kill(node: string): Promise<void> {
    const n = this.nodes.get(node)!;
    await n.host.stop();
    await n.system.stop();
  }

  async next(make: (p: ShardPlan) => ShardPlan): Promise<ShardPlan> {
    const p = make((await this.store.get())!);
    await this.store.put(p);
    return p;
  }

  ask<R>(node: string, type: string, fields: Record<string, unknown> = {}, seq?: number): Promise<R> {
    return this.client.ref('shard', replicaId('s0', node)).request<R & Record<string, unknown>>(type, fields, seq === undefined ? {} : { seq });
  }

  async close(): Promise<void> {
    for (const [, n] of this.nodes) { await n.host.stop().catch(() => undefined); await n.system.stop().catch(() => undefined); }
    await this.client.stop();
  }
}

/**
 * n1 primary of s0 and n2 its backup, the scheduler's failover on fake
 * health verdicts, and n3 (its messages `n3DelayMs` late) — the server a
 * new replica goes to once the test kills n1.
 */
async function seedingLab(n3DelayMs: number, fn: (l: { lab: Lab; health: ReturnType<typeof fakeHealth>; f: ShardFailover }) => Promise<void>): Promise<void> {
  const lab = new Lab(plan());
  const health = fakeHealth();
  const sched = lab.system('scheduler');
  const f = new ShardFailover({ planStore: lab.store, health, servers: ['n1', 'n2', 'n3'], backupFactor: 1, transport: sched.transport, job: 'rep', clock: systemClock, log: silentLogger() });
  await sched.spawn(createFailoverActor(f));
  try {
    await lab.start('n1'); await lab.start('n2'); await lab.start('n3', lab.store, n3DelayMs);
    await fn({ lab, health, f });
  } finally {
    f.dispose();
    await sched.stop();
    await lab.close();
  }
}

/** The same bus, its deliveries to this node's subscribers held back by `ms` (a timer, not a microtask). */
function delayedDeliveries(bus: Bus, ms: number): Bus {
  return Object.assign(Object.create(bus) as Bus, {
    subscribe: (subject: string, handler: Parameters<Bus['subscribe']>[1], opts?: { queue?: string | null }) =>
      bus.subscribe(subject, (msg) => { setTimeout(() => handler(msg), ms); }, opts),
  });
}

/** A push of 150 rows (ids k·150 + 1 …, new for each k) with gradient `grad`, naming batch `batch`: ~2 KB, a state that outgrows a small message limit. */
function rowsPush(p: ShardPlan, k: number, grad: number, batch: string): PushRequest {
  const ids = Int32Array.from({ length: 150 }, (_, i) => 1 + k * 150 + i);
  return { ...push(p, { grad, batches: [batch] }), sparse: [{ table: 'emb', ids, grads: new Float32Array(ids.length * 2).fill(grad) }] };
}

function push(p: ShardPlan, o: { grad?: number; batches?: string[]; round?: number | null; expected?: number | null } = {}): PushRequest {
  const ids = Int32Array.from([1, 2, 3].filter((id) => shardOfSparseId(p, id) === 's0'));
  return {
    plan_version: p.version, round: o.round ?? null, expected: o.expected ?? null, weight: 1, base_version: 0, later_steps: [], lr_mult: 1,
    dense: [{ block: 0, grad: Float32Array.from([o.grad ?? 1, 1, 1, 1]) }],
    sparse: ids.length ? [{ table: 'emb', ids, grads: new Float32Array(ids.length * 2).fill(o.grad ?? 1) }] : [],
    batches: o.batches ?? [],
  };
}

describe('replicated shards', () => {
  test('sync replication: when the primary answers, the backup has applied the update; their states hash the same', async () => {
    const lab = new Lab(plan());
    try {
      await lab.start('n1'); await lab.start('n2');
      for (let k = 0; k < 5; k++) {
        const r = await lab.ask<PushReply>('n1', 'push', push(lab.plan, { grad: k + 1, batches: [`b${k}`] }) as unknown as Record<string, unknown>);
        const backup = await lab.ask<ShardStats>('n2', 'stats');
        assert.equal(backup.version, r.version, `after push ${k} the backup is at the primary's version`);
      }
      const [a, b] = await Promise.all(['n1', 'n2'].map((n) => lab.ask<IntegrityReply>(n, 'integrity')));
      assert.equal(a!.hash, b!.hash);
      assert.deepEqual(b!.applied, { b0: 1, b1: 1, b2: 1, b3: 1, b4: 1 });
      assert.equal(a!.role, 'primary');
      assert.equal(b!.role, 'backup');
      await assert.rejects(lab.ask('n2', 'pull', { plan_version: 1, dense: Int32Array.from([0]), sparse: [], min_round: null }), (e: Error) => e.name === 'StalePlanError' && /backup/.test(e.message));
    } finally {
      await lab.close();
    }
  });

  test('stale pushes with separate dense and row tolerances: the backup applies each at the primary\'s two rates and ends bit-identical', async () => {
    const lab = new Lab(plan(), systemClock, { maxStaleness: 32, scaling: 'inverse', tolerance: 0, sparseTolerance: 'auto' });
    try {
      await lab.start('n1'); await lab.start('n2');
      const replies: PushReply[] = [];
      // Every push is computed from version 0: staleness 0, 1, 2, …
      for (let k = 0; k < 6; k++) replies.push(await lab.ask<PushReply>('n1', 'push', push(lab.plan, { grad: k + 1, batches: [`b${k}`] }) as unknown as Record<string, unknown>));
      const last = replies.at(-1)!;
      assert.equal(last.staleness, 5);
      assert.equal(last.lr_scale, 1 / 6, 'dense: strict 1/(1 + s)');
      assert.equal(last.sparse_lr_scale, 3 / 6, 'rows: tolerant of the median staleness of the earlier pushes (2, of 0 … 4)');
      const [a, b] = await Promise.all(['n1', 'n2'].map((n) => lab.ask<IntegrityReply>(n, 'integrity')));
      assert.equal(a!.hash, b!.hash);
    } finally {
      await lab.close();
    }
  });

  test('max_staleness { dense, sparse }: pushes whose dense part the primary dropped reach the backup with lr_scale 0, which drops it too, and both end bit-identical', async () => {
    const lab = new Lab(plan(), systemClock, { maxStaleness: 1, sparseMaxStaleness: 32, scaling: 'inverse', tolerance: 0 });
    try {
      await lab.start('n1'); await lab.start('n2');
      const replies: PushReply[] = [];
      for (let k = 0; k < 6; k++) replies.push(await lab.ask<PushReply>('n1', 'push', push(lab.plan, { grad: k + 1, batches: [`b${k}`] }) as unknown as Record<string, unknown>));
      assert.deepEqual(replies.map((r) => r.lr_scale), [1, 1 / 2, 0, 0, 0, 0], 'dense dropped from staleness 2 on');
      assert.deepEqual(replies.map((r) => r.sparse_lr_scale ?? r.lr_scale), [1, 1 / 2, 1 / 3, 1 / 4, 1 / 5, 1 / 6], 'rows applied throughout');
      const [a, b] = await Promise.all(['n1', 'n2'].map((n) => lab.ask<IntegrityReply>(n, 'integrity')));
      assert.equal(a!.hash, b!.hash);
      const [sa, sb] = await Promise.all(['n1', 'n2'].map((n) => lab.ask<ShardStats>(n, 'stats')));
      assert.deepEqual([sa!.stale_dense_dropped, sb!.stale_dense_dropped], [4, 4]);
    } finally {
      await lab.close();
    }
  });

  test('a push retried at the promoted backup (same from, seq) gets the first reply and is not applied again', async () => {
    const lab = new Lab(plan());
    try {
      await lab.start('n1'); await lab.start('n2');
      const first = await lab.ask<PushReply>('n1', 'push', push(lab.plan, { batches: ['x'] }) as unknown as Record<string, unknown>, 77);
      await lab.kill('n1');
      const v2 = await lab.next((p) => withPlacement(p, failover(p.placement, new Set(['n1']))!.placement));
      await until(async () => (await lab.ask<ShardStats & { role: string }>('n2', 'stats')).role === 'primary', 'n2 promoted', 5_000);
      const retried = await lab.ask<PushReply>('n2', 'push', push(v2, { batches: ['x'] }) as unknown as Record<string, unknown>, 77);
      assert.deepEqual(retried, first, 'answered from the dedup table that travelled with the updates');
      const st = await lab.ask<ShardStats & { epoch: number }>('n2', 'stats');
      assert.equal(st.version, 1, 'applied once');
      assert.equal(st.epoch, 2);
      // A new push under the new epoch is applied; one under the old epoch is refused.
      await lab.ask('n2', 'push', push(v2, { batches: ['y'] }) as unknown as Record<string, unknown>);
      await assert.rejects(lab.ask('n2', 'push', push(lab.plan, { batches: ['z'] }) as unknown as Record<string, unknown>), (e: Error) => e.name === 'StalePlanError');
      assert.equal((await lab.ask<ShardStats>('n2', 'stats')).version, 2);
    } finally {
      await lab.close();
    }
  });

  test('a checkpoint\'s cut holds the dedup table: after a restore a push from before the cut is answered, one from after it is applied again', async () => {
    const lab = new Lab(plan());
    try {
      await lab.start('n1'); await lab.start('n2');
      const first = await lab.ask<PushReply>('n1', 'push', push(lab.plan, { batches: ['x'] }) as unknown as Record<string, unknown>, 77);
      await lab.ask('n1', 'freeze', { token: 'cut1' });
      const snap = await lab.ask<ShardSnapshot>('n1', 'take_frozen', { token: 'cut1' });
      assert.equal(snap.version, 1);
      assert.deepEqual(snap.dedup!.map((w) => w.seqs), [[77]], 'the table as of the cut');
      await lab.ask('n1', 'push', push(lab.plan, { batches: ['y'] }) as unknown as Record<string, unknown>, 78);
      assert.equal((await lab.ask<ShardStats>('n1', 'stats')).version, 2);
      // Back to the cut (what a resume does): the push after it is gone with its update.
      await lab.ask('n1', 'restore', { state: snap as unknown as Record<string, unknown> });
      assert.equal((await lab.ask<ShardStats>('n1', 'stats')).version, 1);
      assert.deepEqual(await lab.ask<PushReply>('n1', 'push', push(lab.plan, { batches: ['x'] }) as unknown as Record<string, unknown>, 77), first, 'x was in the checkpoint: answered, not applied twice');
      assert.equal((await lab.ask<ShardStats>('n1', 'stats')).version, 1);
      await lab.ask('n1', 'push', push(lab.plan, { batches: ['y'] }) as unknown as Record<string, unknown>, 78);
      assert.equal((await lab.ask<ShardStats>('n1', 'stats')).version, 2, 'y was not: applied again');
      // The backup was seeded again from the restored primary, dedup table included.
      await until(async () => (await lab.ask<ShardStats>('n2', 'stats')).version === 2, 'the backup to follow', 5_000);
      const [a, b] = await Promise.all(['n1', 'n2'].map((n) => lab.ask<IntegrityReply>(n, 'integrity')));
      assert.equal(a!.hash, b!.hash);
    } finally {
      await lab.close();
    }
  });

  test('a checkpoint of a state many times the message limit: fetched in segments, written in part files and read back exactly; restored in segments, and the backup seeded again from it', async () => {
    const limits = { n1: 4096, n2: 4096, client: 4096 };
    const lab = new Lab(plan(), systemClock, null, { maxPayload: 2048, maxMessageBytes: limits });
    const dir = await mkdtemp(join(tmpdir(), 'hetps-ckpt-seg-'));
    const rows = (k: number, grad: number, batch: string) => rowsPush(lab.plan, k, grad, batch) as unknown as Record<string, unknown>;
    try {
      await lab.start('n1'); await lab.start('n2');
      for (let k = 0; k < 12; k++) await lab.ask('n1', 'push', rows(k, k + 1, `b${k}`), 500 + k);
      const client = new ShardClient(lab.client, { requestTimeoutMs: 5_000, log: silentLogger(), shouldStop: () => false, plans: lab.plan });
      await client.freeze('s0', 'cut1');
      const atCut = (await lab.ask<IntegrityReply>('n1', 'integrity')).hash;
      // The whole copy (~30 KB of rows) is far over the 4 KiB limit: asked whole, it is refused by name.
      await lab.ask('n1', 'freeze', { token: 'whole' });
      await assert.rejects(lab.ask('n1', 'take_frozen', { token: 'whole' }), /exceeds the 4096-byte limit \(communication\.max_message_bytes\)/);
      await client.freeze('s0', 'cut1');
      const taken = await client.takeFrozen('s0', 'cut1');
      assert.deepEqual(taken.sparse.map((t) => t.ids.length), [12 * 150]);
      assert.deepEqual(taken.dedup!.map((w) => w.seqs.length), [12], 'the dedup table as of the cut comes with it');
      // Written as a head file and parts of at most 8 KiB of arrays; read back exactly.
      const files = [...shardFiles('s0', taken, 8192)];
      assert.ok(files.length >= 4, `${files.length} files`);
      assert.deepEqual(files.map((f) => f.shard), ['s0', ...files.slice(1).map(() => null)]);
      const { path } = await writeCheckpoint(dir, { files, manifest: { job: 'rep', run_id: null, trigger: 'command', plan: { version: 1, shards: ['s0'], placement: null }, groups: null, optimizer: null, data: null } });
      const read = (await readCheckpointState(path)).snapshots.get('s0')!;
      assert.deepEqual(read, taken);
      // checkpoint.written_by shards: the same cut written by the primary itself — the same files, nothing over the 4 KiB
      // limit but their names and checksums; into a directory it cannot see, refused by name.
      await client.freeze('s0', 'cut1');
      await assert.rejects(client.writeFrozen('s0', 'cut1', join(dir, 'nowhere')), /cannot write its checkpoint files into .*nowhere: no such directory here; checkpoint\.written_by: shards needs checkpoint\.dir on storage every server node reaches at the same path/);
      await client.freeze('s0', 'cut1');
      const own = await mkdtemp(join(dir, 'own-'));
      const written = await client.writeFrozen('s0', 'cut1', own, { partBytes: 8192, name: 'c1', base: null });
      assert.deepEqual(written.files.map((f) => [f.name, f.bytes, f.sha256]), files.map((f) => [f.name, f.bytes.byteLength, sha256(f.bytes)]), 'the files the driver would have written');
      assert.deepEqual([written.kind, written.rows, written.rows_held, written.dense_optimizer, written.sparse_optimizer], ['full', 12 * 150, 12 * 150, 'sgd', 'sgd']);
      await assert.rejects(client.writeFrozen('s0', 'cut1', own), /no copy frozen under cut1/, 'handed over once');
      // The next checkpoints of its chain: a delta on c1 holds only the 150 rows pushed since; on one it did not write, full.
      await lab.ask('n1', 'push', rows(4, 2, 'd1'), 640);
      await client.freeze('s0', 'cut2');
      const delta = await client.writeFrozen('s0', 'cut2', await mkdtemp(join(dir, 'own-')), { name: 'c2', base: 'c1' });
      assert.deepEqual([delta.kind, delta.rows, delta.rows_held], ['delta', 150, 12 * 150]);
      await client.freeze('s0', 'cut3');
      const other = await client.writeFrozen('s0', 'cut3', await mkdtemp(join(dir, 'own-')), { name: 'c3', base: 'elsewhere' });
      assert.deepEqual([other.kind, other.rows], ['full', 12 * 150], 'a base it did not write: full');
      // A resume read by the primary itself (restore_files): the state of the cut again, from the checkpoint's files.
      for (let k = 0; k < 2; k++) await lab.ask('n1', 'push', rows(k, 5, `mid${k}`), 650 + k);
      assert.notEqual((await lab.ask<IntegrityReply>('n1', 'integrity')).hash, atCut);
      assert.equal((await client.restoreFiles('s0', path)).version, 12);
      assert.equal((await lab.ask<IntegrityReply>('n1', 'integrity')).hash, atCut, 'restored from the files by the shard');
      await assert.rejects(client.restoreFiles('s0', join(dir, 'none')), /no manifest\.json \(an incomplete checkpoint\)/);
      // Training goes on; then back to the cut, in segments.
      for (let k = 0; k < 3; k++) await lab.ask('n1', 'push', rows(k, 9, `later${k}`), 600 + k);
      assert.notEqual((await lab.ask<IntegrityReply>('n1', 'integrity')).hash, atCut);
      const r = await client.restore('s0', read);
      assert.equal(r.version, 12);
      assert.equal((await lab.ask<IntegrityReply>('n1', 'integrity')).hash, atCut, 'the primary holds the state of the cut again');
      // A push from before the cut is answered from the restored dedup table, not applied twice.
      const again = await lab.ask<PushReply>('n1', 'push', rows(0, 1, 'b0'), 500);
      assert.equal(again.version, 1);
      // The backup is seeded again (in segments: its state is over the limit too) and follows from there.
      await lab.ask('n1', 'push', rows(1, 3, 'after'), 700);
      await until(async () => (await lab.ask<ShardStats>('n2', 'stats')).version === 13, 'the backup to follow the restored primary', 5_000);
      const [a, b] = await Promise.all(['n1', 'n2'].map((n) => lab.ask<IntegrityReply>(n, 'integrity')));
      assert.equal(b!.hash, a!.hash);
      // A state the shard does not take is refused by name, before anything is sent.
      await assert.rejects(client.restore('s0', { ...read, sparse: [{ ...read.sparse[0]!, values: 'no' }] }), /restore of shard s0: not a shard snapshot: sparse\.0\.values/);
    } finally {
      await lab.close();
      await rm(dir, { recursive: true, force: true });
    }
  });

  test('a node that started under an earlier run\'s plan switches to a new layout while nothing is trained, and keeps its layout once it is', async () => {
    // The earlier run: one shard s0 with blocks of 4 bytes; the new run cuts the blocks otherwise (another layout).
    const recut = (version: number): ShardPlan => buildShardPlan({
      version, shards: ['s0'], servers: ['n1', 'n2', 'n3'], backupFactor: 1, partitions: 4, maxBlockBytes: 8,
      denseParams: [{ name: 'w', size: 4 }], sparseTables: [{ name: 'emb', dim: 2 }],
    });
    const lab = new Lab(plan());
    try {
      await lab.start('n1'); await lab.start('n2');
      await lab.next(() => recut(2));
      await until(async () => (await lab.ask<ShardStats>('n1', 'stats').catch(() => ({ plan_version: -1 }))).plan_version === 2, 'n1 serving plan v2', 5_000);
      const st = await lab.ask<ShardStats>('n1', 'stats');
      assert.equal(st.dense_blocks, recut(2).dense.length, 'the new layout\'s blocks');
      assert.notEqual(recut(2).dense.length, plan().dense.length);
      // Trained under v2, a plan cut otherwise again is not followed (moving blocks is not supported).
      await lab.ask('n1', 'push', { ...push(recut(2)), dense: [{ block: 0, grad: Float32Array.from([1, 1]) }] } as unknown as Record<string, unknown>);
      await lab.next(() => ({ ...plan(), version: 3 }));
      await new Promise((r) => setTimeout(r, 300));
      assert.equal((await lab.ask<ShardStats>('n1', 'stats')).dense_blocks, recut(2).dense.length, 'kept the layout it trained under');
    } finally {
      await lab.close();
    }
  });

  test('a deposed primary that did not see the new plan is fenced by its old backup: it applies nothing more and refuses everything', async () => {
    const lab = new Lab(plan());
    try {
      // n1 follows a plan store of its own that never changes: it is cut off from the scheduler (or paused).
      const isolated = memoryPlanStore(lab.plan);
      await lab.start('n1', isolated); await lab.start('n2');
      await lab.ask('n1', 'push', push(lab.plan, { batches: ['a'] }) as unknown as Record<string, unknown>);
      await lab.next((p) => withPlacement(p, failover(p.placement, new Set(['n1']))!.placement));
      await until(async () => (await lab.ask<ShardStats & { role: string }>('n2', 'stats')).role === 'primary', 'n2 promoted', 5_000);
      const before = await lab.ask<IntegrityReply>('n2', 'integrity');
      // A client still on plan v1 reaches the old primary: the update is not acknowledged anywhere.
      await assert.rejects(lab.ask('n1', 'push', push(lab.plan, { batches: ['late'] }) as unknown as Record<string, unknown>), (e: Error) => e.name === 'StalePlanError');
      const after = await lab.ask<IntegrityReply>('n2', 'integrity');
      assert.equal(after.hash, before.hash, 'the new primary applied nothing from the deposed one');
      assert.equal(after.applied.late, undefined);
      const fenced = await lab.ask<ShardStats & { role: string }>('n1', 'stats');
      assert.equal(fenced.role, 'fenced');
      await assert.rejects(lab.ask('n1', 'pull', { plan_version: 1, dense: Int32Array.from([0]), sparse: [], min_round: null }), /fenced/);
    } finally {
      await lab.close();
    }
  });

  test('a restarted primary process (same node and plan, a fresh state) is refused by its backup and fenced: it acknowledges nothing', async () => {
    const lab = new Lab(plan());
    try {
      await lab.start('n1'); await lab.start('n2');
      for (let k = 0; k < 3; k++) await lab.ask('n1', 'push', push(lab.plan, { grad: k + 1, batches: [`b${k}`] }) as unknown as Record<string, unknown>);
      const before = await lab.ask<IntegrityReply>('n2', 'integrity');
      await lab.kill('n1');
      await new Promise((r) => setTimeout(r, 5)); // another incarnation id
      await lab.start('n1');
      await assert.rejects(lab.ask('n1', 'push', push(lab.plan, { grad: 9, batches: ['after-restart'] }) as unknown as Record<string, unknown>),
        (e: Error) => e.name === 'StalePlanError' || e.name === 'FencedError');
      const after = await lab.ask<IntegrityReply>('n2', 'integrity');
      assert.equal(after.hash, before.hash, 'the backup applied nothing from the fresh process');
      assert.equal(after.applied['after-restart'], undefined);
      assert.equal((await lab.ask<ShardStats & { role: string }>('n1', 'stats')).role, 'fenced');
    } finally {
      await lab.close();
    }
  });

  test('a restarted backup (a fresh state) is seeded again by its primary, and the push that found it so is answered once the seed is confirmed, with no later push needed', async () => {
    const lab = new Lab(plan());
    try {
      await lab.start('n1'); await lab.start('n2');
      for (let k = 0; k < 3; k++) await lab.ask('n1', 'push', push(lab.plan, { grad: k + 1, batches: [`b${k}`] }) as unknown as Record<string, unknown>);
      await lab.kill('n2');
      await lab.start('n2');
      // The primary's stream reaches a replica at update 0, which it cannot continue: it seeds it. This push is
      // the only one in flight: it must not wait for a later update to be confirmed (there is none).
      await lab.ask('n1', 'push', push(lab.plan, { grad: 7, batches: ['only'] }) as unknown as Record<string, unknown>);
      const [p, b] = await Promise.all(['n1', 'n2'].map((n) => lab.ask<IntegrityReply>(n, 'integrity')));
      assert.equal(b!.hash, p!.hash, 'the reseeded backup holds the primary\'s state');
      assert.equal(b!.applied.only, 1);
    } finally {
      await lab.close();
    }
  });

  test('a restore while a seed is on its way: the replica is seeded again with the restored state, not left with the one the seed carried', async () => {
    const limits = { n1: 4096, n2: 4096, client: 4096 };
    const lab = new Lab(plan(), systemClock, null, { maxPayload: 2048, maxMessageBytes: limits });
    const rows = (k: number, grad: number, batch: string) => rowsPush(lab.plan, k, grad, batch) as unknown as Record<string, unknown>;
    try {
      await lab.start('n1'); await lab.start('n2');
      const client = new ShardClient(lab.client, { requestTimeoutMs: 5_000, log: silentLogger(), shouldStop: () => false, plans: lab.plan });
      for (let k = 0; k < 6; k++) await lab.ask('n1', 'push', rows(k, 1, `b${k}`), 800 + k);
      await client.freeze('s0', 'early');
      const early = await client.takeFrozen('s0', 'early');
      const earlyHash = (await lab.ask<IntegrityReply>('n1', 'integrity')).hash;
      for (let k = 6; k < 12; k++) await lab.ask('n1', 'push', rows(k, 2, `b${k}`), 800 + k);
      // n2 restarts, its messages 30 ms late: a seed of ~10 segments takes a third of a second.
      await lab.kill('n2');
      await lab.start('n2', lab.store, 30);
      const pushed = lab.client.ref('shard', replicaId('s0', 'n1')).request('push', rows(0, 3, 'during'), { timeoutMs: 10_000 });
      await new Promise((r) => setTimeout(r, 100));
      // Back to the early cut while that seed is on its way.
      await client.restore('s0', early);
      assert.equal((await lab.ask<IntegrityReply>('n1', 'integrity')).hash, earlyHash);
      await pushed.catch(() => undefined);
      await lab.ask('n1', 'push', rows(1, 4, 'after'), 900);
      await until(async () => (await lab.ask<ShardStats>('n2', 'stats')).version === (await lab.ask<ShardStats>('n1', 'stats')).version, 'the backup at the primary\'s version', 10_000);
      const [a, b] = await Promise.all(['n1', 'n2'].map((n) => lab.ask<IntegrityReply>(n, 'integrity')));
      assert.equal(b!.hash, a!.hash, 'the backup holds the restored state and what followed');
      assert.deepEqual(Object.keys(b!.applied).sort(), Object.keys(a!.applied).sort());
    } finally {
      await lab.close();
    }
  });

  test('a state many times the message limit is seeded in segments that each fit it, and the updates pushed meanwhile follow in messages that fit it; the backup ends bit-identical', async () => {
    const infos: string[] = [];
    const errors: string[] = [];
    const log = pino({ level: 'info' }, { write: (l: string) => { const o = JSON.parse(l) as { level: number; msg: string }; (o.level >= 50 ? errors : infos).push(o.msg); } });
    // Every node's limit is 4 KiB (max_payload 2 KiB: each message is also chunked); pushes of 150 rows fit, the state does not.
    const limits = { n1: 4096, n2: 4096, client: 4096 };
    const lab = new Lab(plan(), systemClock, null, { maxPayload: 2048, maxMessageBytes: limits, log: { n1: log } });
    const rows = (k: number, grad: number, batch = `b${k}`) => rowsPush(lab.plan, k, grad, batch);
    try {
      await lab.start('n1'); await lab.start('n2');
      for (let k = 0; k < 12; k++) await lab.ask('n1', 'push', rows(k, k + 1) as unknown as Record<string, unknown>);
      await lab.kill('n2');
      await lab.start('n2');
      // The first push finds the restarted backup at update 0: it waits for the seed. Two more go on meanwhile; the three
      // (~2 KB each) then wait to be streamed together, more than one message can hold.
      await Promise.all([12, 13, 14].map((k) => lab.ask('n1', 'push', rows(k % 12, 0.5, `b${k}`) as unknown as Record<string, unknown>, 1000 + k)));
      const seeded = infos.find((m) => /seeded its replica on n2/.test(m));
      const [, segments, bytes] = /\((\d+) segment\(s\), (\d+) bytes of state,/.exec(seeded ?? '') ?? [];
      assert.ok(Number(bytes) > 5 * 4096, `the state (${bytes} bytes) is many times the limit`);
      assert.ok(Number(segments) >= Math.ceil(Number(bytes) / 4096), `${segments} segment(s), each within the limit`);
      assert.deepEqual(errors, [], 'nothing refused as too large');
      await lab.ask('n1', 'push', rows(3, 2, 'last') as unknown as Record<string, unknown>);
      const [p, b] = await Promise.all(['n1', 'n2'].map((n) => lab.ask<IntegrityReply>(n, 'integrity')));
      assert.equal(b!.hash, p!.hash, 'the backup seeded in segments holds the primary\'s exact state');
      assert.equal(b!.version, p!.version);
      assert.equal(Object.keys(b!.applied).length, 16);
      const [sp, sb] = await Promise.all(['n1', 'n2'].map((n) => lab.ask<{ sparse_rows: Record<string, number> }>(n, 'stats')));
      assert.deepEqual(sp!.sparse_rows, { emb: 12 * 150 });
      assert.deepEqual(sb!.sparse_rows, { emb: 12 * 150 });
    } finally {
      await lab.close();
    }
  });

  test('a seed whose logs (every batch id applied, the dedup table) are many times the primary\'s message limit goes in chunks that each fit it; the backup ends with the primary\'s state and logs', async () => {
    const infos: string[] = [];
    const errors: string[] = [];
    const log = pino({ level: 'info' }, { write: (l: string) => { const o = JSON.parse(l) as { level: number; msg: string }; (o.level >= 50 ? errors : infos).push(o.msg); } });
    const lab = new Lab(plan(), systemClock, null, { maxPayload: 2048, maxMessageBytes: { n1: 1536 }, log: { n1: log } });
    try {
      await lab.start('n1'); await lab.start('n2');
      const long = (k: number) => Array.from({ length: 8 }, (_, j) => `batch-${k}-${j}-${'x'.repeat(24)}`);
      for (let k = 0; k < 12; k++) await lab.ask('n1', 'push', push(lab.plan, { grad: k + 1, batches: long(k) }) as unknown as Record<string, unknown>);
      await lab.kill('n2');
      await lab.start('n2');
      // This push finds the restarted backup at update 0: it is answered once the seed is confirmed.
      await lab.ask('n1', 'push', push(lab.plan, { grad: 7, batches: ['after'] }) as unknown as Record<string, unknown>, 900);
      assert.deepEqual(errors, [], 'nothing refused as too large');
      const seeded = infos.find((m) => /seeded its replica on n2/.test(m));
      const chunks = Number(/its logs in (\d+) message\(s\)/.exec(seeded ?? '')?.[1]);
      // 97 batch ids of ~40 bytes and 13 dedup pairs: ~5 KB of logs against a 1 152-byte budget.
      assert.ok(chunks >= 4, `the logs went in ${chunks} messages (${seeded})`);
      await lab.ask('n1', 'push', push(lab.plan, { grad: 2, batches: ['last'] }) as unknown as Record<string, unknown>, 901);
      const b = await lab.ask<IntegrityReply>('n2', 'integrity');
      const want = Object.fromEntries([...Array.from({ length: 12 }, (_, k) => long(k)).flat(), 'after', 'last'].map((id) => [id, 1]));
      assert.deepEqual(b.applied, want, 'the backup holds the whole applied-batch log, each batch once');
      // The primary's log does not fit one message of its own: whole, its integrity reply is refused by name; paged, it
      // comes in parts that each fit, and the end-of-run check reads it so.
      await assert.rejects(lab.ask('n1', 'integrity'), /exceeds the 1536-byte limit/);
      const paged = await lab.ask<IntegrityReply>('n1', 'integrity', { paged: true });
      assert.deepEqual(paged.applied, {});
      assert.ok((paged.applied_parts ?? 0) >= 3, `the log in ${paged.applied_parts} parts`);
      const parts: [string, number][] = [];
      for (let index = 0; index < paged.applied_parts!; index++) parts.push(...(await lab.ask<{ applied: [string, number][] }>('n1', 'integrity_part', { token: paged.applied_token, index })).applied);
      assert.deepEqual(Object.fromEntries(parts), want);
      await assert.rejects(lab.ask('n1', 'integrity_part', { token: paged.applied_token, index: 0 }), /holds no integrity log under .*; ask for the integrity check again/, 'dropped after its last part');
      const report = await checkIntegrity({ system: lab.client, plan: (await lab.store.get())!, acked: new Set(Object.keys(want)), clock: systemClock, log: null, settleMs: 0 });
      assert.deepEqual([report.acked, report.applied, report.lost, report.duplicated, report.replicas_equal], [98, 98, 0, 0, true], JSON.stringify(report));
    } finally {
      await lab.close();
    }
  });

  test('a seed whose layout is over the primary\'s message limit (communication.max_message_bytes) is logged as an error naming the setting and tried again seldom; pushes stop waiting for that replica, which the failover makes seeding again and never promotes', async () => {
    const errors: string[] = [];
    const warnings: string[] = [];
    const log = pino({ level: 'warn' }, { write: (l: string) => { const o = JSON.parse(l) as { level: number; msg: string }; (o.level >= 50 ? errors : warnings).push(o.msg); } });
    // Pushes (a few hundred bytes) fit, and so do the seed's arrays and logs, in segments and chunks; its layout (one
    // entry per dense block: 60 of them here) is one message, which does not.
    const lab = new Lab(manyBlocksPlan(60), systemClock, null, { maxPayload: 2048, maxMessageBytes: { n1: 1536 }, log: { n1: log } });
    const health = fakeHealth();
    const schedLog: string[] = [];
    const sched = lab.system('scheduler');
    const f = new ShardFailover({
      planStore: lab.store, health, servers: ['n1', 'n2'], backupFactor: 1, transport: sched.transport, job: 'rep', clock: systemClock,
      log: pino({ level: 'warn' }, { write: (l: string) => { schedLog.push((JSON.parse(l) as { msg: string }).msg); } }),
      appliedOf: async (shard, node) => (await lab.ask<{ applied_rseq: number | null }>(node, 'stats')).applied_rseq,
    });
    await sched.spawn(createFailoverActor(f));
    try {
      await lab.start('n1'); await lab.start('n2');
      const long = (k: number) => Array.from({ length: 8 }, (_, j) => `batch-${k}-${j}-${'x'.repeat(24)}`);
      for (let k = 0; k < 5; k++) await lab.ask('n1', 'push', push(lab.plan, { grad: k + 1, batches: long(k) }) as unknown as Record<string, unknown>);
      await lab.kill('n2');
      await lab.start('n2');
      // This push finds the restarted backup at update 0: the primary must seed it, and cannot. It is answered
      // all the same (before: it waited until the replica left the plan — for as long as the job ran).
      const t0 = Date.now();
      await lab.client.ref('shard', replicaId('s0', 'n1')).request('push', push(lab.plan, { grad: 7, batches: ['after'] }) as unknown as Record<string, unknown>, { timeoutMs: 5_000 });
      assert.ok(Date.now() - t0 < 3_000, `answered ${Date.now() - t0} ms after it was sent`);
      assert.match(errors[0]!, /shard s0: cannot seed its replica on n2: message of \d+ bytes to \S+\.seed_begin exceeds the 1536-byte limit \(communication\.max_message_bytes\); raise communication\.max_message_bytes/);
      assert.match(errors[1]!, /shard s0: its replica on n2 holds no copy and cannot be seeded; pushes no longer wait for it/);
      // The failover hears of it: from the next plan on n2 is seeding, and the shard is unprotected.
      await until(async () => (await lab.store.get())!.placement.replicas.s0!.seeding.includes('n2'), 'n2 seeding again in the plan', 5_000);
      assert.deepEqual((await lab.store.get())!.placement.replicas.s0, { primary: 'n1', backups: [], seeding: ['n2'] });
      assert.deepEqual(f.report().unprotected, ['s0']);
      assert.ok(f.isUnseedable('s0', 'n2'), 'the failover knows it stays seeding (load balancing does not wait for it)');
      assert.ok(schedLog.some((m) => /shard s0: its primary cannot seed the replica on n2, which holds no copy; seeding again, no longer a backup \(plan v2\): the shard has no backup now/.test(m)), schedLog.join('\n'));
      // Later pushes (under the plan that made it seeding) do not wait for it either.
      const v2 = (await lab.store.get())!;
      for (let k = 0; k < 3; k++) {
        const t = Date.now();
        await lab.ask('n1', 'push', push(v2, { grad: 2, batches: [`later${k}`] }) as unknown as Record<string, unknown>);
        assert.ok(Date.now() - t < 1_000, `push ${k} answered at once`);
      }
      await new Promise((r) => setTimeout(r, 1_000));
      assert.equal(errors.filter((e) => /cannot seed its replica/.test(e)).length, 1, `tried again seldom: ${errors.join(' | ')}`);
      assert.deepEqual(warnings.filter((w) => /re-sending/.test(w)), [], 'not reported as a replica that does not confirm');
      // The primary dies: the empty replica is not promoted; the shard is lost (named), not served from a fresh state.
      await lab.kill('n1');
      health.set('n1', 'dead');
      await until(() => f.report().lost.includes('s0'), 's0 reported lost', 5_000);
      assert.equal((await lab.store.get())!.placement.replicas.s0!.primary, 'n1', 'nothing promoted');
      assert.deepEqual(f.failovers, []);
    } finally {
      f.dispose();
      await sched.stop();
      await lab.close();
    }
  });

  test('a backup restarted under a later plan waits for its seed, and until then reports nothing applied, so a failover does not promote it', async () => {
    const lab = new Lab(plan());
    const health = fakeHealth();
    const sched = lab.system('scheduler');
    const f = new ShardFailover({
      planStore: lab.store, health, servers: ['n1', 'n2'], backupFactor: 1, transport: sched.transport, job: 'rep', clock: systemClock, log: silentLogger(),
      appliedOf: async (shard, node) => (await lab.ask<{ applied_rseq: number | null }>(node, 'stats')).applied_rseq,
    });
    await sched.spawn(createFailoverActor(f));
    try {
      await lab.start('n1'); await lab.start('n2');
      // A later plan (the same placement): a process starting under it joins mid-job.
      const v2 = await lab.next((p) => withPlacement(p, p.placement));
      await until(async () => (await lab.ask<{ epoch: number }>('n1', 'stats')).epoch === 2, 'n1 serving plan v2', 5_000);
      for (let k = 0; k < 3; k++) await lab.ask('n1', 'push', push(v2, { grad: k + 1, batches: [`b${k}`] }) as unknown as Record<string, unknown>);
      assert.equal((await lab.ask<{ applied_rseq: number | null }>('n2', 'stats')).applied_rseq, 3);
      await lab.kill('n2');
      await lab.kill('n1');
      await lab.start('n2');
      // Its primary gone before it could seed it: the restarted replica holds the job's initial state, not the shard's.
      assert.equal((await lab.ask<{ applied_rseq: number | null }>('n2', 'stats')).applied_rseq, null);
      health.set('n1', 'dead');
      await until(() => f.report().plan_version !== null && (f.report().lost.includes('s0') || f.failovers.length > 0 || f.overdue(0) !== null), 'the failover decided', 5_000);
      assert.deepEqual(f.failovers, [], 'not promoted');
      assert.equal((await lab.store.get())!.placement.replicas.s0!.primary, 'n1');
      assert.match(f.overdue(0) ?? '', /shard\(s\) s0 \(last held by n1, n2\): no live replica/);
    } finally {
      f.dispose();
      await sched.stop();
      await lab.close();
    }
  });

  test('backup_factor 2: after a failover the other backup stays a backup and follows the promoted one\'s stream without a seed; a second failover loses nothing', async () => {
    const p1 = buildShardPlan({
      version: 1, shards: ['s0'], servers: ['n1', 'n2', 'n3'], backupFactor: 2, partitions: 4, maxBlockBytes: 16,
      denseParams: [{ name: 'w', size: 4 }], sparseTables: [{ name: 'emb', dim: 2 }],
    });
    const lab = new Lab(p1);
    try {
      await lab.start('n1'); await lab.start('n2'); await lab.start('n3');
      for (let k = 0; k < 4; k++) await lab.ask('n1', 'push', push(lab.plan, { grad: k + 1, batches: [`a${k}`] }) as unknown as Record<string, unknown>);
      await lab.kill('n1');
      const v2 = await lab.next((p) => withPlacement(p, failover(p.placement, new Set(['n1']))!.placement));
      assert.deepEqual(v2.placement.replicas.s0, { primary: 'n2', backups: ['n3'], seeding: [] });
      await until(async () => (await lab.ask<ShardStats & { role: string }>('n2', 'stats')).role === 'primary', 'n2 promoted', 5_000);
      for (let k = 0; k < 4; k++) await lab.ask('n2', 'push', push(v2, { grad: k + 5, batches: [`b${k}`] }) as unknown as Record<string, unknown>);
      const [a, b] = await Promise.all(['n2', 'n3'].map((n) => lab.ask<IntegrityReply & { applied_rseq?: number }>(n, 'integrity')));
      assert.equal(a!.hash, b!.hash, 'the kept backup is bit-identical to the new primary');
      assert.equal(b!.role, 'backup');
      const n3 = await lab.ask<ShardStats & { applied_rseq: number }>('n3', 'stats');
      assert.equal(n3.applied_rseq, 8, 'it went on from update 4 of the first stream: 8 updates, no seed');
      // The new primary dies too: the kept backup has every acknowledged update.
      await lab.kill('n2');
      const v3 = await lab.next((p) => withPlacement(p, failover(p.placement, new Set(['n1', 'n2']))!.placement));
      assert.equal(v3.placement.replicas.s0!.primary, 'n3');
      await until(async () => (await lab.ask<ShardStats & { role: string }>('n3', 'stats')).role === 'primary', 'n3 promoted', 5_000);
      const c = await lab.ask<IntegrityReply>('n3', 'integrity');
      assert.deepEqual(Object.keys(c.applied).sort(), ['a0', 'a1', 'a2', 'a3', 'b0', 'b1', 'b2', 'b3']);
      assert.equal(c.hash, a!.hash);
    } finally {
      await lab.close();
    }
  });

  test('a new replica is seeded while pushes go on, then promoted to backup; it ends bit-identical to the primary', async () => {
    await seedingLab(0, async ({ lab, health, f }) => {
      let stop = false;
      let pushed = 0;
      const pusher = (async () => {
        for (let k = 0; !stop; k++) {
          // The in-process bus answers in microtasks: give the replicas' stream timers a turn, as network I/O would.
          await new Promise((r) => setTimeout(r, 1));
          const p = (await lab.store.get())!;
          const primary = p.placement.replicas.s0!.primary;
          try {
            await lab.ask(primary, 'push', push(p, { grad: (k % 7) + 1, batches: [`p${k}`] }) as unknown as Record<string, unknown>);
            pushed++;
          } catch { await new Promise((r) => setTimeout(r, 20)); }
        }
      })();
      await until(() => pushed >= 10, '10 pushes', 5_000);
      await lab.kill('n1');
      health.set('n1', 'dead');
      await until(async () => {
        const p = (await lab.store.get())!;
        return p.placement.replicas.s0!.backups.includes('n3');
      }, 'n3 seeded and promoted to backup', 10_000);
      const progressed = pushed;
      await until(() => pushed >= progressed + 10, '10 more pushes with n3 as backup', 5_000);
      stop = true;
      await pusher;
      const [a, b] = await Promise.all(['n2', 'n3'].map((n) => lab.ask<IntegrityReply>(n, 'integrity')));
      assert.equal(a!.role, 'primary');
      assert.equal(b!.role, 'backup');
      assert.equal(b!.hash, a!.hash);
      assert.deepEqual(b!.applied, a!.applied);
      assert.ok(Object.values(a!.applied).every((n) => n === 1), 'every batch applied once');
      assert.equal(f.failovers.length, 1);
      assert.deepEqual(f.replicas.map((r) => [r.node, r.kind]), [['n3', 'seeding'], ['n3', 'backup']]);
    });
  });

  test('a new replica slower than the push stream (never a moment with nothing unconfirmed) is still made a backup while pushes go on, and holds every acknowledged update', async () => {
    // n3 gets every message 4 ms late: each of its confirmations finds the next pushes already streamed to it.
    await seedingLab(4, async ({ lab, health, f }) => {
      let stop = false;
      let pushed = 0;
      let backupSince: number | null = null;
      const ackedWhileBackup: string[] = [];
      const pusher = async (who: number) => {
        for (let k = 0; !stop; k++) {
          await new Promise((r) => setTimeout(r, 1));
          const p = (await lab.store.get())!;
          const primary = p.placement.replicas.s0!.primary;
          const batch = `p${who}-${k}`;
          try {
            await lab.ask(primary, 'push', push(p, { grad: (k % 7) + 1, batches: [batch] }) as unknown as Record<string, unknown>);
            pushed++;
            if (backupSince !== null) ackedWhileBackup.push(batch);
          } catch { await new Promise((r) => setTimeout(r, 20)); }
        }
      };
      const pushers = [0, 1, 2, 3, 4, 5].map(pusher);
      await until(() => pushed >= 30, '30 pushes', 5_000);
      await lab.kill('n1');
      health.set('n1', 'dead');
      await until(async () => {
        const p = (await lab.store.get())!;
        if (p.placement.replicas.s0!.backups.includes('n3')) backupSince ??= pushed;
        return backupSince !== null;
      }, 'n3 seeded and made a backup while six clients keep pushing', 10_000);
      const progressed = pushed;
      await until(() => pushed >= progressed + 30, '30 more pushes with n3 as backup', 5_000);
      // Every push acknowledged so far is on n3 already: the primary's replies waited for it.
      const n3 = await lab.ask<IntegrityReply>('n3', 'integrity');
      assert.ok(ackedWhileBackup.length >= 30);
      assert.deepEqual(ackedWhileBackup.filter((b) => n3.applied[b] !== 1), [], 'every push acknowledged once n3 was a backup is applied on n3');
      stop = true;
      await Promise.all(pushers);
      const [a, b] = await Promise.all(['n2', 'n3'].map((n) => lab.ask<IntegrityReply>(n, 'integrity')));
      assert.equal(b!.role, 'backup');
      assert.equal(b!.hash, a!.hash);
      assert.deepEqual(b!.applied, a!.applied);
      assert.deepEqual(f.replicas.map((r) => [r.node, r.kind]), [['n3', 'seeding'], ['n3', 'backup']]);
    });
  });

  test('a batch already applied (trained again after its worker died unacknowledged) is answered without applying it again', async () => {
    const lab = new Lab(plan());
    try {
      await lab.start('n1'); await lab.start('n2');
      await lab.ask('n1', 'push', push(lab.plan, { batches: ['same'] }) as unknown as Record<string, unknown>);
      const again = await lab.ask<PushReply>('n1', 'push', push(lab.plan, { grad: 9, batches: ['same'] }) as unknown as Record<string, unknown>);
      assert.equal(again.applied, false);
      const [a, b] = await Promise.all(['n1', 'n2'].map((n) => lab.ask<IntegrityReply>(n, 'integrity')));
      assert.equal(a!.version, 1);
      assert.deepEqual(a!.applied, { same: 1 });
      assert.equal(a!.hash, b!.hash);
    } finally {
      await lab.close();
    }
  });

  test('a dead backup holds the primary\'s replies until the plan drops it; then they go out', async () => {
    const lab = new Lab(plan());
    try {
      await lab.start('n1'); await lab.start('n2');
      await lab.kill('n2');
      let answered = false;
      const pending = lab.ask<PushReply>('n1', 'push', push(lab.plan) as unknown as Record<string, unknown>).then((r) => { answered = true; return r; });
      await new Promise((r) => setTimeout(r, 500));
      assert.equal(answered, false, 'not acknowledged while a backup of the plan has not applied it');
      await lab.next((p) => withPlacement(p, failover(p.placement, new Set(['n2']))!.placement));
      const r = await pending;
      assert.equal(r.version, 1);
    } finally {
      await lab.close();
    }
  });
});

// ---------------------------------------------------------------- the scheduler's part

function fakeHealth(): HealthView & { set(node: string, s: HealthState): void } {
  const states = new Map<string, HealthState>();
  const ls = new Set<(n: string, s: HealthState) => void>();
  return {
    stateOf: (n) => states.get(n) ?? null,
    onChange: (l) => { ls.add(l); return () => { ls.delete(l); }; },
    set(n, s) { states.set(n, s); for (const l of ls) l(n, s); },
  };
}

/** Two servers a and b, each the primary of its shard and the backup of the other's, on a simulated clock and an in-process bus. */
function twoServers() {
  const clock = new SimulatedClock(1_000);
  const p1 = buildShardPlan({
    version: 1, shards: ['a', 'b'], servers: ['a', 'b'], backupFactor: 1, partitions: 4, maxBlockBytes: 16,
    denseParams: [{ name: 'w', size: 4 }], sparseTables: [],
  });
  const store = memoryPlanStore(p1);
  const health = fakeHealth();
  const broker = new InProcessBroker();
  const sys = new ActorSystem({ transport: new Transport(broker.client(), { clientId: 'x', clock }), job: 'fo', node: 'x', clock, random: new SeededRandom(1) });
  return { clock, p1, store, health, sys };
}

describe('failover on the health verdicts (simulated clock)', () => {
  test('a dead verdict writes the next plan epoch by compare-and-set; a concurrent writer makes it decide again on the newer plan', async () => {
    const clock = new SimulatedClock(1_000);
    const p1 = buildShardPlan({
      version: 1, shards: ['a', 'b', 'c'], servers: ['a', 'b', 'c'], backupFactor: 1, partitions: 6, maxBlockBytes: 16,
      denseParams: [{ name: 'w', size: 6 }], sparseTables: [],
    });
    const store = memoryPlanStore(p1);
    const health = fakeHealth();
    const broker = new InProcessBroker();
    const sys = new ActorSystem({ transport: new Transport(broker.client(), { clientId: 'x', clock }), job: 'fo', node: 'x', clock, random: new SeededRandom(1) });
    const f = new ShardFailover({ planStore: store, health, servers: ['a', 'b', 'c'], backupFactor: 1, transport: sys.transport, job: 'fo', clock, log: silentLogger() });
    try {
      // Another writer moves the plan on first (v2: c's backup moved nowhere, only the version).
      await store.put(withPlacement(p1, p1.placement));
      for (const n of ['a', 'b', 'c']) health.set(n, 'alive');
      health.set('a', 'dead');
      await f.settled();
      const p = (await store.get())!;
      assert.ok(p.version >= 3, `written on top of v2 (got v${p.version})`);
      assert.equal(p.placement.replicas.a!.primary, 'b', 'a\'s backup b promoted');
      assert.deepEqual(f.failovers.map((x) => [x.shard, x.from, x.to, x.epoch, x.decided_ms]), [['a', 'a', 'b', 3, 0]]);
      // Re-replication: a's shard and c's shard (whose backup was a) get a replica on a live server.
      assert.deepEqual(p.placement.replicas.a!.seeding, ['c']);
      assert.deepEqual(p.placement.replicas.c!.seeding, ['b']);
      assert.equal(p.version, 4, 'promotion (v3), then re-replication (v4)');
      // The node comes back: nothing to promote, nothing more to seed (both shards already have a replica seeding).
      health.set('a', 'alive');
      await f.settled();
      assert.equal((await store.get())!.version, 4);
    } finally {
      f.dispose();
      await sys.stop();
    }
  });

  test('server_recovery_timeout: a shard with no live replica is overdue after the limit, and served again when its primary is back', async () => {
    const { clock, p1, store, health, sys } = twoServers();
    const f = new ShardFailover({ planStore: store, health, servers: ['a', 'b'], backupFactor: 1, transport: sys.transport, job: 'fo', clock, log: silentLogger() });
    try {
      for (const n of ['a', 'b']) health.set(n, 'alive');
      health.set('a', 'dead');
      await f.settled();
      assert.equal(f.overdue(10_000), null, 'a shard failed over to its backup is not lost');
      health.set('b', 'dead');
      await f.settled();
      assert.deepEqual([...f.lost].sort(), ['a', 'b'], 'both servers dead: every shard lost');
      clock.increment(10_000);
      assert.equal(f.overdue(10_000), null, 'not more than the limit yet');
      clock.increment(1);
      assert.match(f.overdue(10_000) ?? '', /shard\(s\) a \(last held by b\), b \(last held by b\): no live replica for more than 10 s \(fault_tolerance.server_recovery_timeout\)/);
      health.set('b', 'alive');
      await f.settled();
      assert.deepEqual([...f.lost], [], 'b holds both shards (a promoted onto it): served again');
      assert.equal(f.overdue(10_000), null);
    } finally {
      f.dispose();
      await sys.stop();
    }
  });
  test('a dead primary whose backup does not answer yet (its server still starting) is not replaced by it; the failover decides again and promotes once it answers, or leaves the primary when it comes back', async () => {
    const { clock, p1, store, health, sys } = twoServers();
    let started = false;
    const f = new ShardFailover({
      planStore: store, health, servers: ['a', 'b'], backupFactor: 1, transport: sys.transport, job: 'fo', clock, log: silentLogger(),
      appliedOf: async () => (started ? 0 : null),
    });
    try {
      for (const n of ['a', 'b']) health.set(n, 'alive');
      health.set('a', 'dead');
      await f.settled();
      assert.equal((await store.get())!.placement.replicas.a!.primary, 'a', 'b has no replica of a yet: nothing promoted');
      clock.increment(10_001);
      assert.match(f.overdue(10_000) ?? '', /shard\(s\) a \(last held by a, b\): no live replica/, 'unavailable meanwhile, for server_recovery_timeout');
      started = true;
      clock.increment(500);
      await f.settled();
      await until(async () => (await store.get())!.placement.replicas.a!.primary === 'b', 'b promoted once it answers', 2_000);
      assert.equal(f.overdue(10_000), null);

      // Again with b's replica of a never answering, and a back: a stays primary, nothing is written for it.
      const f2store = memoryPlanStore(p1);
      const g = new ShardFailover({ planStore: f2store, health, servers: ['a', 'b'], backupFactor: 1, transport: sys.transport, job: 'fo', clock, log: silentLogger(), appliedOf: async () => null });
      health.set('a', 'dead');
      await g.settled();
      health.set('a', 'alive');
      await g.settled();
      clock.increment(600);
      await g.settled();
      assert.equal((await f2store.get())!.placement.replicas.a!.primary, 'a');
      assert.equal(g.overdue(0), null, 'served again');
      g.dispose();
    } finally {
      f.dispose();
      await sys.stop();
    }
  });
});
