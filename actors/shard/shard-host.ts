/**
 * The replicas one server node holds, following the shard plan: a replica
 * actor for every shard the plan places on this node (as primary, backup or
 * seeding), each told of every newer plan, and stopped when a plan no longer
 * places it here (a deposed primary, a dropped backup). Re-seeded later, a
 * dropped replica starts again from a fresh state and its primary's seed.
 */
import { type Actor, type ActorSystem, type Logger } from '../../runtime/mod.ts';
import { replicasOn, sameLayout, type ReplicaRole, type ShardPlan } from '../../topology/mod.ts';
import type { PlanStore } from '../store/plan-store.ts';
import { ShardState, type ShardStateOptions } from './shard.actor.ts';
import { Replica, createReplicaActor, type ReplicaActorDefinition } from './replica.ts';

/** The scheduler's address for a seeded replica that caught up, or one that cannot be seeded (`hps.<job>.scheduler.failover.replica_ready`, `….replica_unseedable`). */
export const FAILOVER_ACTOR_ID = 'failover';

export interface ShardHostOptions {
  node: string;
  system: ActorSystem;
  planStore: PlanStore;
  log: Logger;
  replication: 'sync' | 'async';
  lagLimit: number;
  /** A fresh shard state of `shard` under `plan` (the job's initial values). */
  newState: (shard: string, plan: ShardPlan) => ShardState;
  /** Replication request timeout; default 1000 ms. */
  requestTimeoutMs?: number;
  /** How long the process's event loop has been busy so far (ms); default its event loop utilization (tests give each in-process node its own). */
  busyMs?: () => number;
}

interface Hosted { def: ReplicaActorDefinition; actor: Actor<never> }

export class ShardHost {
  private readonly hosted = new Map<string, Hosted>();
  private first: ShardPlan | null = null;
  private stopWatch: (() => void) | null = null;
  private chain: Promise<void> = Promise.resolve();
  private stopped = false;

  constructor(private readonly o: ShardHostOptions) {}

  /** Hosts the replicas of `plan` now, then follows every newer plan. */
  async start(plan: ShardPlan): Promise<void> {
    this.first = plan;
    await this.apply(plan);
    this.stopWatch = this.o.planStore.watch(
      (p) => { this.chain = this.chain.then(() => this.apply(p)).catch((e: unknown) => this.o.log.error({ err: (e as Error).message }, 'following the shard plan failed')); },
      (e) => this.o.log.warn({ err: e.message }, 'shard plan watch'),
    );
  }

  /** The replicas on this node, by shard. */
  replicas(): Map<string, Replica> {
    return new Map([...this.hosted].map(([s, h]) => [s, h.def.replica]));
  }

  private async apply(plan: ShardPlan): Promise<void> {
    if (this.stopped) return;
    let first = this.first!;
    if (plan.version < first.version) return;
    if (!sameLayout(first, plan) && this.untouched()) {
      // Nothing trained here yet (e.g. this node started while the plan of an earlier run of the job was still stored,
      // and the new run's driver has just written its own): nothing to move, so this node hosts the new layout.
      this.o.log.info({ version: plan.version, from: first.version }, `shard plan v${plan.version} cuts the parameters differently from v${first.version}; nothing was trained here yet: serving v${plan.version}'s layout`);
      for (const h of this.hosted.values()) await this.o.system.despawn(h.actor, { timeoutMs: 2_000 }).catch(() => undefined);
      this.hosted.clear();
      this.first = first = plan;
    }
    if (!sameLayout(first, plan)) {
      this.o.log.error({ version: plan.version }, `shard plan v${plan.version} cuts the parameters differently from v${first.version}; moving blocks between shards is not supported yet: this node keeps serving v${first.version}'s layout`);
      return;
    }
    const mine = new Map<string, ReplicaRole>(replicasOn(plan.placement, this.o.node).map((r) => [r.shard, r.role]));
    for (const [shard, h] of [...this.hosted]) {
      const role = mine.get(shard);
      if (role !== undefined && !h.def.replica.fenced) continue;
      if (role === undefined) h.def.replica.fence(`plan v${plan.version} places no replica of ${shard} on ${this.o.node}`);
      await this.stopHosted(shard, h);
      if (role === undefined) this.o.log.info({ shard, epoch: plan.version }, `shard ${shard}: replica on ${this.o.node} stopped (not in plan v${plan.version})`);
    }
    for (const [shard, role] of mine) {
      const h = this.hosted.get(shard);
      if (h) {
        h.def.replica.follow(plan, role);
        if (!h.def.replica.fenced) continue;
        // Deposed by this very plan (a primary it demotes, as a load-balancing handover may): its state is one the new
        // primary never confirmed, so like any fenced replica with a role it starts again fresh, and is seeded.
        await this.stopHosted(shard, h);
      }
      // A replica that joins after the job's first plan starts empty and waits for its primary's seed.
      // (A node that starts under a later plan than the job's first joined, or came back, mid-job.)
      const fresh = plan === first && plan.version === (plan.placement.initial_version ?? 1);
      const effective: ReplicaRole = fresh || role === 'seeding' ? role : 'seeding';
      const replica = new Replica({
        shard, node: this.o.node, state: this.o.newState(shard, plan), system: this.o.system, log: this.o.log,
        replication: this.o.replication, lagLimit: this.o.lagLimit,
        ...(this.o.requestTimeoutMs !== undefined ? { requestTimeoutMs: this.o.requestTimeoutMs } : {}),
        ...(this.o.busyMs !== undefined ? { busyMs: this.o.busyMs } : {}),
        onCaughtUp: (s, node, epoch) => this.reportCaughtUp(s, node, epoch),
        onUnseedable: (s, node, epoch, why) => this.reportUnseedable(s, node, epoch, why),
      }, plan, effective);
      const def = createReplicaActor(replica);
      const actor = await this.o.system.spawn(def) as unknown as Actor<never>;
      this.hosted.set(shard, { def, actor });
      this.o.log.info({ shard, role: effective, epoch: plan.version }, `shard ${shard}: replica on ${this.o.node} serving as ${effective} (plan v${plan.version})`);
    }
  }

  private async stopHosted(shard: string, h: Hosted): Promise<void> {
    this.hosted.delete(shard);
    await this.o.system.despawn(h.actor, { timeoutMs: 2_000 }).catch(() => undefined);
  }

  /** No replica here has applied an update or been restored (every one at version 0). */
  private untouched(): boolean {
    return [...this.hosted.values()].every((h) => h.def.replica.state.version === 0);
  }

  private async reportCaughtUp(shard: string, node: string, epoch: number): Promise<void> {
    await this.o.system.ref('scheduler', FAILOVER_ACTOR_ID).request('replica_ready', { shard, node, epoch }, { timeoutMs: 5_000 });
  }

  private async reportUnseedable(shard: string, node: string, epoch: number, why: string): Promise<void> {
    await this.o.system.ref('scheduler', FAILOVER_ACTOR_ID).request('replica_unseedable', { shard, node, epoch, why }, { timeoutMs: 5_000 });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.stopWatch?.();
    await this.chain.catch(() => undefined);
    for (const h of this.hosted.values()) await this.o.system.despawn(h.actor).catch(() => undefined);
    this.hosted.clear();
  }
}
