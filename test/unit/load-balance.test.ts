/**
 * Load balancing: the rule (topology/load-balance.ts: server loads from the
 * replicas' traffic, the imbalance, which primary moves where, the seed and
 * handover placements) and the scheduler's balancer moving a primary while
 * pulls and pushes go on, on the in-process bus with real shard hosts,
 * replicas and the failover's plan writes: every push is applied once on
 * every replica, the replicas end equal, and the model is the one the same
 * pushes give without a move.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ActorSystem, InProcessBroker, SeededRandom, Transport, isRetryable, silentLogger, systemClock } from '../../runtime/mod.ts';
import {
  MIN_MEASURED_BUSY, buildShardPlan, busyFractions, handOver, imbalanceOf, measuredCapacities, planMigration, relativeLoads, seedReplica, serverLoads, trafficRates, withPlacement,
  type ReplicaPlacement, type ShardPlan, type TrafficRate,
} from '../../topology/mod.ts';
import { ShardState, type PushRequest } from '../../actors/mod.ts';
import { ShardHost } from '../../actors/shard/shard-host.ts';
import { replicaId } from '../../actors/shard/replica.ts';
import type { IntegrityReply } from '../../actors/shard/shard.messages.ts';
import { memoryPlanStore } from '../../actors/store/plan-store.ts';
import { ShardFailover, createFailoverActor } from '../../actors/scheduler/failover.ts';
import { LoadBalancer } from '../../actors/scheduler/load-balancer.ts';
import type { HealthState, HealthView } from '../../actors/health/health.types.ts';
import { until } from '../support/until.ts';

const placement = (replicas: ReplicaPlacement['replicas'], servers = ['n1', 'n2']): ReplicaPlacement => ({ servers, replicas });
const rates = (r: Record<string, [number, number]>) => new Map<string, TrafficRate>(Object.entries(r).map(([k, [pull, push]]) => [k, { pull, push }]));

describe('the rule', () => {
  test('rates between two samples; a replica that is new or whose counters went down counts from zero', () => {
    const r = trafficRates(
      [{ shard: 'a', node: 'n1', pulled: 100, pushed: 50 }, { shard: 'b', node: 'n1', pulled: 500, pushed: 500 }],
      [{ shard: 'a', node: 'n1', pulled: 300, pushed: 90 }, { shard: 'b', node: 'n1', pulled: 40, pushed: 20 }, { shard: 'a', node: 'n2', pulled: 0, pushed: 30 }],
      2,
    );
    assert.deepEqual(Object.fromEntries(r), { 'a@n1': { pull: 100, push: 20 }, 'b@n1': { pull: 20, push: 10 }, 'a@n2': { pull: 0, push: 15 } });
    assert.equal(trafficRates([], [{ shard: 'a', node: 'n1', pulled: 1, pushed: 1 }], 0).size, 0, 'no interval, no rates');
  });

  test('a primary costs its pulls, its pushes and streaming each push to every follower; a backup applies the stream', () => {
    const p = placement({ a: { primary: 'n1', backups: ['n2'], seeding: [] }, b: { primary: 'n1', backups: [], seeding: ['n2'] } });
    const loads = serverLoads(p, rates({ 'a@n1': [100, 10], 'a@n2': [0, 10], 'b@n1': [50, 5], 'b@n2': [0, 5] }), ['n1', 'n2']);
    assert.deepEqual(Object.fromEntries(loads), { n1: 100 + 10 * 2 + 50 + 5 * 2, n2: 15 });
    assert.deepEqual(imbalanceOf(loads), { imbalance: (180 - 15) / 180, busiest: 'n1', idlest: 'n2' });
    assert.deepEqual(imbalanceOf(new Map([['n1', 0], ['n2', 0]])), { imbalance: 0, busiest: 'n1', idlest: 'n1' });
  });

  test('both primaries on one server: one moves to the server holding its backup, which leaves the busiest load lowest', () => {
    const p = placement({ a: { primary: 'n1', backups: ['n2'], seeding: [] }, b: { primary: 'n1', backups: ['n2'], seeding: [] } });
    const r = rates({ 'a@n1': [100, 10], 'a@n2': [0, 10], 'b@n1': [300, 30], 'b@n2': [0, 30] });
    const m = planMigration(p, r, ['n1', 'n2'], 0.3)!;
    // Moving b: n1 = 120 + 30 = 150, n2 = 10 + 360 = 370 (worse); moving a: n1 = 360 + 10 = 370 − … → a is the one.
    assert.equal(m.shard, 'a');
    assert.deepEqual([m.from, m.to, m.seed], ['n1', 'n2', false]);
    assert.deepEqual(Object.fromEntries(m.predicted), { n1: 360 + 10, n2: 30 + 120 });
    assert.ok(m.predictedImbalance < imbalanceOf(serverLoads(p, r, ['n1', 'n2'])).imbalance);
  });

  test('no move within the threshold, nor one that would not lower the busiest load (no shard traded back and forth)', () => {
    const p = placement({ a: { primary: 'n1', backups: ['n2'], seeding: [] }, b: { primary: 'n2', backups: ['n1'], seeding: [] } });
    assert.equal(planMigration(p, rates({ 'a@n1': [100, 10], 'a@n2': [0, 10], 'b@n2': [90, 10], 'b@n1': [0, 10] }), ['n1', 'n2'], 0.3), null, 'balanced');
    // One hot shard alone on n1: moving it only makes n2 the hot one.
    assert.equal(planMigration(p, rates({ 'a@n1': [1000, 10], 'a@n2': [0, 10], 'b@n2': [10, 1], 'b@n1': [0, 1] }), ['n1', 'n2'], 0.3), null);
    // Two unprotected shards on n1 (no backups): of 100 and 4, moving either leaves a peak of 100, under MIN_GAIN off 104.
    const two = placement({ a: { primary: 'n1', backups: [], seeding: [] }, b: { primary: 'n1', backups: [], seeding: [] } });
    assert.equal(planMigration(two, rates({ 'a@n1': [100, 0], 'b@n1': [4, 0] }), ['n1', 'n2'], 0.3), null);
    const split = planMigration(two, rates({ 'a@n1': [70, 0], 'b@n1': [50, 0] }), ['n1', 'n2'], 0.3)!;
    assert.deepEqual([split.to, split.seed, Math.max(...split.predicted.values())], ['n2', true, 70], 'of 70 and 50, either move leaves 70 of 120');
  });

  test('servers of unequal capacity: loads are compared per unit of capacity (twice the load on a server of twice the capacity is balanced)', () => {
    const two = placement({ a: { primary: 'n1', backups: [], seeding: [] }, b: { primary: 'n1', backups: [], seeding: [] }, c: { primary: 'n2', backups: [], seeding: [] } });
    const r = rates({ 'a@n1': [100, 0], 'b@n1': [100, 0], 'c@n2': [100, 0] });
    // Equal servers: n1 carries 200 against 100, imbalance 0.5 — a move, though it only trades the peak.
    assert.equal(imbalanceOf(relativeLoads(serverLoads(two, r, ['n1', 'n2']), null)).imbalance, 0.5);
    // n1 has twice n2's capacity: 200 / 2 against 100 / 1, balanced, no move.
    const cap = new Map([['n1', 2]]);
    assert.equal(imbalanceOf(relativeLoads(serverLoads(two, r, ['n1', 'n2']), cap)).imbalance, 0);
    assert.equal(planMigration(two, r, ['n1', 'n2'], 0.3, cap), null);
    // n2 has four times n1's capacity: n1 at 200 against n2 at 100 / 4 — a primary moves to n2.
    const m = planMigration(two, r, ['n1', 'n2'], 0.3, new Map([['n1', 1], ['n2', 4]]))!;
    assert.deepEqual([m.from, m.to, Object.fromEntries(m.predicted)], ['n1', 'n2', { n1: 100, n2: 200 }]);
    assert.equal(m.predictedImbalance, 0.5, '100 / 1 against 200 / 4');
  });

  test('measured capacity: traffic per second each server\'s event loop is busy; loads divided by it are how busy the servers are, so equal traffic on a server that takes longer over it is an imbalance', () => {
    assert.deepEqual(Object.fromEntries(busyFractions(
      [{ node: 'n1', busyMs: 1_000 }, { node: 'n2', busyMs: 5_000 }, { node: 'n3', busyMs: 10 }],
      [{ node: 'n1', busyMs: 2_600 }, { node: 'n2', busyMs: 100 }, { node: 'n4', busyMs: 50 }], 2,
    )), { n1: 0.8 }, 'busy seconds per second; a restarted process (counter down) or a server in one sample only has none');
    // Four shards, equal traffic: two primaries on each server. n1 is busy 0.8 of the time over it, n2 0.2.
    const four = placement({ a: { primary: 'n1', backups: [], seeding: [] }, b: { primary: 'n1', backups: [], seeding: [] }, c: { primary: 'n2', backups: [], seeding: [] }, d: { primary: 'n2', backups: [], seeding: [] } });
    const r = rates({ 'a@n1': [100, 0], 'b@n1': [100, 0], 'c@n2': [100, 0], 'd@n2': [100, 0] });
    const loads = serverLoads(four, r, ['n1', 'n2']);
    assert.equal(planMigration(four, r, ['n1', 'n2'], 0.3), null, 'by traffic alone they are balanced');
    const cap = measuredCapacities(loads, new Map([['n1', 0.8], ['n2', 0.2]]))!;
    assert.deepEqual(Object.fromEntries(cap), { n1: 250, n2: 1_000 }, 'floats per busy second');
    assert.deepEqual(Object.fromEntries(relativeLoads(loads, cap)), { n1: 0.8, n2: 0.2 }, 'the loads compared are how busy the servers are');
    const m = planMigration(four, r, ['n1', 'n2'], 0.3, cap)!;
    assert.deepEqual([m.shard, m.from, m.to, m.seed], ['a', 'n1', 'n2', true]);
    assert.deepEqual(Object.fromEntries(relativeLoads(m.predicted, cap)), { n1: 0.4, n2: 0.3 }, 'how busy each server is expected to be after the move');
    // A server that cannot be measured (idle, below MIN_MEASURED_BUSY, or without a figure) takes the mean of the measured ones.
    const three = new Map([['n1', 200], ['n2', 200], ['n3', 0]]);
    assert.deepEqual(Object.fromEntries(measuredCapacities(three, new Map([['n1', 0.8], ['n2', 0.2], ['n3', 0.01]]))!), { n1: 250, n2: 1_000, n3: 625 });
    assert.deepEqual(Object.fromEntries(measuredCapacities(three, new Map([['n1', 0.8]]))!), { n1: 250, n2: 250, n3: 250 });
    assert.equal(measuredCapacities(three, new Map([['n1', MIN_MEASURED_BUSY / 2]])), null, 'nothing to measure from');
    // Seen on real processes: the slow n1 (a backup of both shards now) busy half the time, the fast n2 (both
    // primaries) busy 4 % of it over twice the traffic. n2 is measured too, so nothing moves back onto n1 (at a 5 %
    // floor n2 took n1's capacity, and the traffic moved a primary back).
    const after = placement({ a: { primary: 'n2', backups: ['n1'], seeding: [] }, b: { primary: 'n2', backups: ['n1'], seeding: [] } });
    const late = rates({ 'a@n2': [300_000, 60_000], 'b@n2': [300_000, 80_000], 'a@n1': [0, 180_000], 'b@n1': [0, 200_000] });
    const lateCap = measuredCapacities(serverLoads(after, late, ['n1', 'n2']), new Map([['n1', 0.509], ['n2', 0.039]]))!;
    assert.ok(lateCap.get('n2')! > 20 * lateCap.get('n1')!, JSON.stringify(Object.fromEntries(lateCap)));
    assert.equal(planMigration(after, late, ['n1', 'n2'], 0.3, lateCap), null);
  });

  test('a server holding no replica of the shard is seeded first; ties go to a caught-up backup', () => {
    const p = placement({ a: { primary: 'n1', backups: ['n2'], seeding: [] }, b: { primary: 'n1', backups: ['n2'], seeding: [] } }, ['n1', 'n2', 'n3']);
    const m = planMigration(p, rates({ 'a@n1': [100, 0], 'b@n1': [100, 0] }), ['n1', 'n2', 'n3'], 0.3)!;
    assert.deepEqual([m.shard, m.to, m.seed], ['a', 'n2', false], 'n2 and n3 leave the same loads: n2 holds a backup');
    const busy = planMigration(p, rates({ 'a@n1': [100, 0], 'b@n1': [100, 0], 'a@n2': [50, 0] }), ['n1', 'n2', 'n3'], 0.3)!;
    assert.deepEqual([busy.to, busy.seed], ['n3', true], 'n2 is busier: the move goes to n3, seeded first');
  });

  test('seed and handover placements: the target seeds, then serves; the old primary is dropped', () => {
    const p = placement({ a: { primary: 'n1', backups: ['n2'], seeding: [] } }, ['n1', 'n2', 'n3']);
    assert.deepEqual(seedReplica(p, 'a', 'n3')!.replicas.a, { primary: 'n1', backups: ['n2'], seeding: ['n3'] });
    assert.equal(seedReplica(p, 'a', 'n2'), null, 'n2 holds one already');
    assert.deepEqual(handOver(p, 'a', 'n2')!.replicas.a, { primary: 'n2', backups: [], seeding: [] });
    assert.equal(handOver(seedReplica(p, 'a', 'n3')!, 'a', 'n3'), null, 'a replica still seeding is not handed the shard');
    assert.equal(handOver(p, 'zz', 'n2'), null);
  });
});

// ---------------------------------------------------------------- the balancer, on the in-process bus

const SHARDS = ['a', 'b'];

/** Both primaries on n1 (as after a failover to it), both backups on n2; `servers` may add nodes that hold nothing yet. */
function layout(servers = ['n1', 'n2']): ShardPlan {
  const p = buildShardPlan({
    version: 1, shards: SHARDS, servers: ['n1', 'n2'], backupFactor: 1, partitions: 4, maxBlockBytes: 16,
    denseParams: [{ name: 'w', size: 8 }], sparseTables: [],
  });
  return { ...p, placement: { servers, initial_version: 1, replicas: { a: { primary: 'n1', backups: ['n2'], seeding: [] }, b: { primary: 'n1', backups: ['n2'], seeding: [] } } } };
}

function newState(shard: string, p: ShardPlan): ShardState {
  return new ShardState({
    shard, plan: p, initialDense: new Map([['w', Float32Array.from([1, 2, 3, 4, 5, 6, 7, 8])]]),
    denseOptimizer: { type: 'sgd', learningRate: 0.05 }, sparseOptimizer: { type: 'sgd', learningRate: 0.05 },
    sparseInitScale: 0.1, seed: 3, clock: systemClock, staleness: null,
  });
}

function pushOf(p: ShardPlan, shard: string, k: number): PushRequest {
  const blocks = p.dense.filter((b) => b.shard === shard);
  return {
    plan_version: p.version, round: null, expected: null, weight: 1, base_version: 0, later_steps: [], lr_mult: 1,
    dense: blocks.map((b) => ({ block: b.id, grad: Float32Array.from({ length: b.length }, (_, j) => ((k * 7 + j) % 5) - 2) })),
    sparse: [], batches: [`${shard}-${k}`],
  };
}

function health(states: Record<string, HealthState>): HealthView & { set(n: string, s: HealthState): void } {
  const s = new Map(Object.entries(states));
  return { stateOf: (n) => s.get(n) ?? null, onChange: () => () => {}, set: (n, st) => { s.set(n, st); } };
}

/** Shard hosts on `servers` over the in-process bus, the failover's plan writes, a balancer, and one client per shard pulling and pushing. */
async function balancerLab(first: ShardPlan, servers: string[], job: string) {
  const broker = new InProcessBroker();
  const sys = (node: string) => new ActorSystem({
    transport: new Transport(broker.client(), { clientId: node, clock: systemClock }), job, node, clock: systemClock, random: new SeededRandom(1), defaultRequestTimeoutMs: 2_000,
  });
  const store = memoryPlanStore(first);
  const systems = servers.map(sys);
  const hosts = servers.map((node, i) => new ShardHost({ node, system: systems[i]!, planStore: store, log: silentLogger(), replication: 'sync', lagLimit: 8, requestTimeoutMs: 300, newState }));
  for (const h of hosts) await h.start(first);
  const sched = sys('scheduler');
  const client = sys('client');
  // One client system per shard: a push's (from, seq) is its identity for the replicas' dedup.
  const clients: Record<string, ActorSystem> = Object.fromEntries(SHARDS.map((s) => [s, sys(`client-${s}`)]));
  const view = health(Object.fromEntries(servers.map((n) => [n, 'alive'])));
  const failover = new ShardFailover({ planStore: store, health: view, servers, backupFactor: 1, transport: sched.transport, job, clock: systemClock, log: silentLogger() });
  await sched.spawn(createFailoverActor(failover));
  const balancer = new LoadBalancer({
    failover, planStore: store, system: sched, health: view, servers, threshold: 0.3, sustainS: 0.3, sampleMs: 60,
    transport: sched.transport, job, clock: systemClock, log: silentLogger(),
  });
  const acked = new Map<string, number>();
  const pushed: Record<string, number> = Object.fromEntries(SHARDS.map((s) => [s, 0]));
  let stop = false;
  let retries = 0;
  // Per shard, in order: pull, then push (the same seq on every retry, wherever the plan routes it).
  const drive = async (shard: string) => {
    for (let k = 0, seq = 1; !stop; k++, seq++) {
      await new Promise((r) => setTimeout(r, 1));
      for (;;) {
        const p = (await store.get())!;
        const ref = clients[shard]!.ref('shard', replicaId(shard, p.placement.replicas[shard]!.primary));
        try {
          await ref.request('pull', { plan_version: p.version, min_round: null, dense: Int32Array.from(p.dense.filter((b) => b.shard === shard).map((b) => b.id)), sparse: [], compression: null });
          await ref.request('push', pushOf(p, shard, k) as unknown as Record<string, unknown>, { seq });
          acked.set(`${shard}-${k}`, (acked.get(`${shard}-${k}`) ?? 0) + 1);
          pushed[shard]!++;
          break;
        } catch (e) {
          assert.ok(isRetryable(e), `only retryable errors while primaries move: ${(e as Error).message}`);
          retries++;
          await new Promise((r) => setTimeout(r, 10));
        }
      }
    }
  };
  let drivers: Promise<void>[] = [];
  return {
    store, failover, balancer, client, health: view, pushed, acked, get retries() { return retries; },
    startTraffic() { drivers = SHARDS.map((s) => drive(s)); },
    async stopTraffic() { stop = true; await Promise.all(drivers); },
    /** The shard's replicas (primary first) equal, every acknowledged push applied once on each, and the model the same pushes give a shard that never moved. */
    async checkShard(shard: string): Promise<void> {
      const r = (await store.get())!.placement.replicas[shard]!;
      const got = await Promise.all([r.primary, ...r.backups].map((n) => client.ref('shard', replicaId(shard, n)).request<IntegrityReply & Record<string, unknown>>('integrity', {})));
      const ref = newState(shard, first);
      for (let k = 0; k < pushed[shard]!; k++) ref.push(pushOf(first, shard, k));
      for (const g of got) {
        assert.equal(g.hash, ref.stateHash(), `${shard} on ${g.node}: the model the pushes give without a move`);
        assert.equal(Object.keys(g.applied).length, pushed[shard], `${shard} on ${g.node}: every acknowledged push applied`);
        assert.ok(Object.values(g.applied).every((n) => n === 1), `${shard} on ${g.node}: none applied twice`);
      }
      assert.deepEqual([...acked.values()].filter((n) => n !== 1), []);
    },
    async close() {
      stop = true;
      await Promise.all(drivers).catch(() => undefined);
      await balancer.dispose();
      failover.dispose();
      for (const h of hosts) await h.stop().catch(() => undefined);
      for (const x of [...systems, sched, client, ...Object.values(clients)]) await x.stop().catch(() => undefined);
    },
  };
}

const settled = async (store: { get(): Promise<ShardPlan | null> }) => {
  const p = (await store.get())!;
  return SHARDS.every((s) => p.placement.replicas[s]!.backups.length === 1 && p.placement.replicas[s]!.seeding.length === 0);
};

describe('the balancer', () => {
  test('a primary that sees itself demoted straight to seeding (without the plan that dropped it) starts again fresh and is seeded; its new primary is not deposed', { timeout: 30_000 }, async () => {
    const first = layout();
    const lab = await balancerLab(first, ['n1', 'n2'], 'lbd');
    try {
      for (let k = 0; k < 5; k++) await lab.client.ref('shard', replicaId('a', 'n1')).request('push', pushOf(first, 'a', k) as unknown as Record<string, unknown>);
      // One plan: a's primary on n2, n1 seeding (the handover and the re-replication as one step). No push follows
      // until n1 is a backup: a seed that leaves nothing to stream is caught up at once.
      await lab.store.put(withPlacement(first, { ...first.placement, replicas: { ...first.placement.replicas, a: { primary: 'n2', backups: [], seeding: ['n1'] } } }));
      await until(async () => ((await lab.store.get())!.placement.replicas.a!.backups.includes('n1')), 'n1 seeded by n2 and made a backup of a', 10_000);
      const stats = (n: string) => lab.client.ref('shard', replicaId('a', n)).request<{ role: string }>('stats', {});
      assert.deepEqual([(await stats('n2')).role, (await stats('n1')).role], ['primary', 'backup']);
      await lab.client.ref('shard', replicaId('a', 'n2')).request('push', pushOf((await lab.store.get())!, 'a', 5) as unknown as Record<string, unknown>);
      lab.pushed.a = 6;
      await lab.checkShard('a');
    } finally {
      await lab.close();
    }
  });

  test('moves a primary off the busier server to its backup while pulls and pushes go on: each push applied once everywhere, replicas equal, the same model as without the move', { timeout: 60_000 }, async (t) => {
    const lab = await balancerLab(layout(), ['n1', 'n2'], 'lb');
    try {
      lab.balancer.start();
      lab.startTraffic();
      await until(() => lab.balancer.migrations.length === 1, 'one primary moved', 20_000);
      await until(() => settled(lab.store), 'the old primary seeded again as a backup', 20_000);
      const at = { ...lab.pushed };
      await until(() => SHARDS.every((s) => lab.pushed[s]! >= at[s]! + 20), '20 more pushes to each shard after the move', 10_000);
      await until(() => lab.balancer.migrations[0]!.measured_after !== null, 'the loads measured after the move', 10_000);
      await lab.stopTraffic();
      await lab.balancer.dispose();
      await lab.failover.settled();
      const m = lab.balancer.migrations[0]!;
      // A move under load answers some requests "re-read the plan"; they were retried at the new primary.
      t.diagnostic(`moved ${m.shard} in ${m.took_ms} ms; ${lab.retries} request(s) retried; pushes ${JSON.stringify(lab.pushed)}; after ${JSON.stringify(m.measured_after)}`);
      assert.deepEqual([m.from, m.to, m.seeded], ['n1', 'n2', false], 'n2 held a caught-up backup');
      assert.ok(m.imbalance > 0.3 && m.expected_imbalance < 0.3 && m.measured_after!.imbalance < 0.3, JSON.stringify(m));
      assert.equal(lab.balancer.migrations.length, 1, 'balanced afterwards: no move back');
      // The replicas' stats carry how long their process's event loop has been busy (one process here: the same for both servers).
      const rep = lab.balancer.report();
      assert.equal(rep.capacity_from, 'declared');
      assert.ok(rep.busy !== null && rep.busy.n1! > 0 && rep.busy.n1! <= 1 && Math.abs(rep.busy.n1! - rep.busy.n2!) <= 0.2 * Math.max(rep.busy.n1!, rep.busy.n2!), `busy fractions of the servers' process: ${JSON.stringify(rep.busy)}`);
      const final = (await lab.store.get())!;
      assert.deepEqual(SHARDS.map((s) => final.placement.replicas[s]!.primary).sort(), ['n1', 'n2'], 'one primary on each server');
      assert.ok(lab.failover.replicas.some((r) => r.node === 'n1' && r.shard === m.shard && r.kind === 'backup'), 'n1 seeded again and caught up');
      for (const shard of SHARDS) await lab.checkShard(shard);
    } finally {
      await lab.close();
    }
  });

  test('a server holding nothing is seeded first, then handed the shard; the old primary is dropped (the backup factor is met without it)', { timeout: 60_000 }, async () => {
    const lab = await balancerLab(layout(['n1', 'n2', 'n3']), ['n1', 'n2', 'n3'], 'lbs');
    try {
      lab.balancer.start();
      lab.startTraffic();
      await until(() => lab.balancer.migrations.length === 1, 'one primary moved', 20_000);
      const m = lab.balancer.migrations[0]!;
      assert.deepEqual([m.from, m.to, m.seeded], ['n1', 'n3', true], JSON.stringify(m));
      const at = { ...lab.pushed };
      await until(() => SHARDS.every((s) => lab.pushed[s]! >= at[s]! + 20), '20 more pushes to each shard after the move', 10_000);
      await lab.stopTraffic();
      await lab.balancer.dispose();
      await lab.failover.settled();
      const r = (await lab.store.get())!.placement.replicas[m.shard]!;
      assert.deepEqual(r, { primary: 'n3', backups: ['n2'], seeding: [] });
      assert.deepEqual(lab.failover.replicas.filter((x) => x.shard === m.shard).map((x) => [x.node, x.kind]), [['n3', 'seeding'], ['n3', 'backup']]);
      for (const shard of SHARDS) await lab.checkShard(shard);
    } finally {
      await lab.close();
    }
  });

  test('no move while a server is not alive, however long the imbalance lasts; one once every server is', { timeout: 30_000 }, async () => {
    const lab = await balancerLab(layout(), ['n1', 'n2'], 'lbh');
    try {
      lab.health.set('n2', 'suspect');
      lab.balancer.start();
      lab.startTraffic();
      await until(() => (lab.balancer.report().imbalance ?? 0) > 0.3, 'the imbalance measured', 10_000);
      await new Promise((r) => setTimeout(r, 1_500));
      assert.equal(lab.balancer.migrations.length, 0, '5 × sustain_seconds of imbalance with n2 suspect: no move');
      lab.health.set('n2', 'alive');
      await until(() => lab.balancer.migrations.length === 1, 'moved once n2 is alive', 10_000);
      await lab.stopTraffic();
      for (const shard of SHARDS) await lab.checkShard(shard);
    } finally {
      await lab.close();
    }
  });
});

describe('the balancer\'s samples', () => {
  /** A balancer over fake replicas whose counters grow as `rates` says (floats per tick); `silent` ones never answer. */
  function fakeBalancer(silent: Set<string>, plan = layout(), unseedable = new Set<string>(), o: {
    perTick?: Record<string, [number, number]>; busyPerS?: Record<string, number>; capacityFrom?: 'declared' | 'measured';
  } = {}) {
    const store = memoryPlanStore(plan);
    const counters = new Map<string, { pulled: number; pushed: number }>();
    const perTick: Record<string, [number, number]> = o.perTick ?? { 'a@n1': [1000, 100], 'b@n1': [1000, 100], 'a@n2': [0, 100], 'b@n2': [0, 100] };
    const t0 = performance.now();
    const handovers: string[] = [];
    const system = {
      ref: (_kind: string, id: string) => ({
        request: async () => {
          if (silent.has(id)) throw new Error(`${id} does not answer (test)`);
          const c = counters.get(id) ?? { pulled: 0, pushed: 0 };
          const [pull, push] = perTick[id] ?? [0, 0];
          counters.set(id, { pulled: c.pulled + pull, pushed: c.pushed + push });
          // Each server's event loop is busy at its own rate (busy seconds per second), whichever replica reports it.
          const node = id.split('@')[1]!;
          const busy = o.busyPerS?.[node] === undefined ? {} : { loop_busy_ms: o.busyPerS[node]! * (performance.now() - t0) };
          return { pulled_floats: c.pulled + pull, pushed_floats: c.pushed + push, role: handovers.length ? 'primary' : 'backup', epoch: 99, ...busy };
        },
      }),
    } as unknown as ActorSystem;
    const failover = {
      unsettled: false, seedFor: async () => null, handOver: async (shard: string, to: string) => { handovers.push(`${shard}→${to}`); return 2; },
      isUnseedable: (shard: string, node: string) => unseedable.has(`${shard}@${node}`),
    } as unknown as ShardFailover;
    const balancer = new LoadBalancer({
      failover, planStore: store, system, health: health({ n1: 'alive', n2: 'alive' }), servers: ['n1', 'n2'], threshold: 0.3, sustainS: 0.05, sampleMs: 20,
      ...(o.capacityFrom === undefined ? {} : { capacityFrom: o.capacityFrom }),
      transport: { publish: () => {} } as unknown as Transport, job: 'lbf', clock: systemClock, log: silentLogger(),
    });
    return { balancer, handovers };
  }

  test('a sample with a replica that does not answer is no sample: its server would count as idle and draw a move onto it', { timeout: 10_000 }, async () => {
    const silent = fakeBalancer(new Set(['b@n2']));
    const answering = fakeBalancer(new Set());
    silent.balancer.start();
    answering.balancer.start();
    try {
      await until(() => answering.handovers.length === 1, 'the control balancer, every replica answering, moves a primary', 5_000);
      await new Promise((r) => setTimeout(r, 300));
      assert.deepEqual([silent.handovers, silent.balancer.report().loads], [[], null], 'no loads measured, no move, while b@n2 is silent');
    } finally {
      await silent.balancer.dispose();
      await answering.balancer.dispose();
    }
  });

  test('a replica still seeding holds every move; one its primary reported it cannot seed (it stays seeding) does not', { timeout: 10_000 }, async () => {
    // a's replica on n2 is seeding; b's is a backup: b could move to n2.
    const plan = layout();
    plan.placement.replicas.a = { primary: 'n1', backups: [], seeding: ['n2'] };
    const waiting = fakeBalancer(new Set(), plan);
    const unseedable = fakeBalancer(new Set(), plan, new Set(['a@n2']));
    waiting.balancer.start();
    unseedable.balancer.start();
    try {
      await until(() => unseedable.handovers.length === 1, 'a move while the only seeding replica is one that cannot be seeded', 5_000);
      assert.deepEqual(unseedable.handovers, ['b→n2']);
      await new Promise((r) => setTimeout(r, 300));
      assert.deepEqual(waiting.handovers, [], 'no move while a seed is in progress');
    } finally {
      await waiting.balancer.dispose();
      await unseedable.balancer.dispose();
    }
  });

  test('load_balancing.capacity measured: equal traffic, but one server is busy four times as long over it — its primary moves; compared by declared capacity, nothing moves', { timeout: 10_000 }, async () => {
    // a's primary on n1, b's on n2, each backed up on the other: the same traffic on both servers.
    const plan = layout();
    plan.placement.replicas.b = { primary: 'n2', backups: ['n1'], seeding: [] };
    const perTick: Record<string, [number, number]> = { 'a@n1': [1000, 100], 'b@n2': [1000, 100], 'a@n2': [0, 100], 'b@n1': [0, 100] };
    const busyPerS = { n1: 0.8, n2: 0.2 };
    const measured = fakeBalancer(new Set(), plan, new Set(), { perTick, busyPerS, capacityFrom: 'measured' });
    const declared = fakeBalancer(new Set(), plan, new Set(), { perTick, busyPerS });
    measured.balancer.start();
    declared.balancer.start();
    try {
      await until(() => measured.handovers.length === 1, 'a move by measured capacity', 5_000);
      assert.deepEqual(measured.handovers, ['a→n2'], 'the primary on the busier server moves to its backup');
      const rec = measured.balancer.migrations[0]!;
      assert.ok(rec.capacity !== null && rec.capacity.n1! < rec.capacity.n2!, `n1 measured with less capacity: ${JSON.stringify(rec.capacity)}`);
      const rep = measured.balancer.report();
      assert.equal(rep.capacity_from, 'measured');
      assert.ok(Math.abs(rep.busy!.n1! - 0.8) < 0.05 && Math.abs(rep.busy!.n2! - 0.2) < 0.05, `busy fractions as reported: ${JSON.stringify(rep.busy)}`);
      await new Promise((r) => setTimeout(r, 300));
      assert.deepEqual(declared.handovers, [], 'by traffic (declared capacities: none) the servers are balanced');
      assert.equal(declared.balancer.report().capacity, null);
    } finally {
      await measured.balancer.dispose();
      await declared.balancer.dispose();
    }
  });
});
