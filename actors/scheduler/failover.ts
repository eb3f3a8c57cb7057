/**
 * Shard failover and re-replication, driven by the health actor's verdicts
 * (the scheduler's part of fault tolerance; the rules are
 * topology/replication.ts):
 *
 * - a server node is **dead** → every shard whose primary it held gets its
 *   first live backup as primary, and its other replicas are dropped: a new
 *   plan version written by compare-and-set on the plan bucket (a concurrent
 *   writer makes it re-read and decide again);
 * - a shard below `backup_factor` replicas gets a new replica (`seeding`) on
 *   the live server holding the fewest; its primary seeds it and reports
 *   `replica_ready` once it has caught up, and the next plan makes it a backup;
 * - a backup its primary cannot seed (a restarted backup whose shard's state
 *   no longer fits communication.max_message_bytes) is reported
 *   `replica_unseedable`, and the next plan moves it back to seeding: it
 *   holds no copy, so pushes do not wait for it and no failover promotes it.
 *
 * Served as actor `scheduler/failover` (`hps.<job>.scheduler.failover.*`):
 * `replica_ready` and `replica_unseedable` from primaries, `status` for anyone.
 */
import { z } from 'zod';
import type { ActorDefinition, Clock, Logger, Timer, Transport } from '../../runtime/mod.ts';
import { demoteToSeeding, failover, handOver, promoteSeeded, rereplicate, seedReplica, unprotectedShards, withPlacement, type ShardPlan } from '../../topology/mod.ts';
import type { HealthState, HealthView } from '../health/health.types.ts';
import { publishEvent } from '../monitor/monitor.messages.ts';
import type { PlanStore } from '../store/plan-store.ts';
import { FAILOVER_ACTOR_ID } from '../shard/shard-host.ts';

export const failoverMessages = {
  /** A primary's seeded replica has caught up: make it a backup. */
  replica_ready: z.object({ shard: z.string().min(1), node: z.string().min(1), epoch: z.number().int().nonnegative() }),
  /** A primary cannot seed its backup on `node` (`why`: the error): move it back to seeding. */
  replica_unseedable: z.object({ shard: z.string().min(1), node: z.string().min(1), epoch: z.number().int().nonnegative(), why: z.string() }),
  /** The failovers so far and the current placement. */
  status: z.object({}),
};

/** One promotion, as the summary and `status` report it. */
export interface FailoverRecord {
  shard: string;
  from: string;
  to: string;
  /** Plan version that made `to` the primary. */
  epoch: number;
  /** Milliseconds from the dead verdict to the plan being written. */
  decided_ms: number;
  at: string;
}

export interface ReplicaRecord { shard: string; node: string; epoch: number; at: string; kind: 'seeding' | 'backup' }

export interface FailoverOptions {
  planStore: PlanStore;
  health: HealthView;
  servers: readonly string[];
  backupFactor: number;
  transport: Transport;
  job: string;
  clock: Clock;
  log: Logger;
  /**
   * The last update of its primary's stream a backup applied (its stats'
   * `applied_rseq`), so the failover promotes the backup that has the most.
   * Given, a backup that answers null (no state yet: waiting for its seed)
   * or does not answer is not promoted; absent: the plan's order decides.
   */
  appliedOf?: (shard: string, node: string) => Promise<number | null>;
}

/** How soon a failover waiting for a backup to answer decides again. */
const WAITING_RETRY_MS = 500;

export class ShardFailover {
  readonly failovers: FailoverRecord[] = [];
  readonly replicas: ReplicaRecord[] = [];
  /** Shards that lost every replica (nothing to promote), with when they lost the last one (monotonic ms). */
  private readonly lostSince = new Map<string, number>();
  /** Shards with a dead primary whose backups have not answered yet, since when (monotonic ms). */
  private readonly waitingSince = new Map<string, number>();
  private retry: Timer | null = null;
  private readonly dead = new Set<string>();
  private chain: Promise<void> = Promise.resolve();
  private readonly unsubscribe: () => void;
  private stopped = false;
  private current: ShardPlan | null = null;
  /** `shard@node` of the replicas their primary reported it cannot seed, until one of them catches up after all. */
  private readonly unseedable = new Set<string>();

  constructor(private readonly o: FailoverOptions) {
    this.unsubscribe = o.health.onChange((node, state) => this.onVerdict(node, state));
    for (const s of o.servers) if (o.health.stateOf(s) === 'dead') this.dead.add(s);
  }

  get plan(): ShardPlan | null { return this.current; }
  /** Shards that lost every replica (nothing to promote). */
  get lost(): Set<string> { return new Set(this.lostSince.keys()); }
  /** A dead server is known, or a shard waits for a backup to answer or has no live replica: failover has work in hand. */
  get unsettled(): boolean { return this.dead.size > 0 || this.lostSince.size > 0 || this.waitingSince.size > 0; }

  private onVerdict(node: string, state: HealthState): void {
    if (!this.o.servers.includes(node)) return;
    const at = this.o.clock.monotonic();
    if (state === 'dead') this.dead.add(node);
    else if (state === 'alive') this.dead.delete(node);
    else return;
    this.enqueue(() => this.reconcile(state === 'dead' ? { node, at } : null));
  }

  private enqueue(step: () => Promise<void>): Promise<void> {
    const next = this.chain.then(step).catch((e: unknown) => this.o.log.error({ err: (e as Error).message }, 'shard failover step failed'));
    this.chain = next;
    return next;
  }

  /** Writes `make(plan)` by compare-and-set, re-reading and deciding again when another writer was first. */
  private async write(make: (plan: ShardPlan) => ShardPlan | null): Promise<ShardPlan | null> {
    for (let attempt = 0; attempt < 20 && !this.stopped; attempt++) {
      const plan = await this.o.planStore.get();
      if (plan === null) return null;
      this.current = plan;
      const next = make(plan);
      if (next === null) return null;
      try {
        await this.o.planStore.put(next);
        this.current = next;
        return next;
      } catch (e) {
        if ((e as Error).name !== 'StalePlanError') throw e;
      }
    }
    return null;
  }

  /** The last update each live backup of a shard with a dead primary applied (asked with `appliedOf`; unknown: null). */
  private async appliedPositions(): Promise<Map<string, number | null>> {
    const out = new Map<string, number | null>();
    const ask = this.o.appliedOf;
    const plan = ask ? await this.o.planStore.get().catch(() => null) : null;
    if (!ask || plan === null) return out;
    const asks: Promise<void>[] = [];
    for (const [shard, r] of Object.entries(plan.placement.replicas)) {
      if (!this.dead.has(r.primary)) continue;
      for (const n of r.backups) if (!this.dead.has(n)) asks.push(ask(shard, n).then((v) => { out.set(`${shard}@${n}`, v); }, () => { out.set(`${shard}@${n}`, null); }));
    }
    await Promise.all(asks);
    return out;
  }

  /** Promotes past the dead servers, then re-replicates onto the live ones. */
  private async reconcile(death: { node: string; at: number } | null): Promise<void> {
    let changes: ReturnType<typeof failover> = null;
    const applied = await this.appliedPositions();
    const written = await this.write((plan) => {
      changes = failover(plan.placement, this.dead, (shard, node) => applied.get(`${shard}@${node}`) ?? null,
        this.o.appliedOf ? (shard, node) => typeof applied.get(`${shard}@${node}`) === 'number' : null);
      if (changes === null || changes.changes.length === 0) return null;
      return withPlacement(plan, changes.placement);
    });
    const result = changes as ReturnType<typeof failover>;
    if (result !== null) {
      for (const s of result.lost) {
        if (this.lostSince.has(s)) continue;
        this.lostSince.set(s, death?.at ?? this.o.clock.monotonic());
        this.o.log.error({ shard: s }, `shard ${s}: every replica is dead; its updates since the last checkpoint are lost unless a server comes back`);
        publishEvent(this.o.transport, this.o.job, 'scheduler', { kind: 'shard_lost', node: null, text: `shard ${s}: no live replica` });
      }
    }
    this.noteWaiting(result?.waiting ?? []);
    if (written !== null && result !== null) {
      for (const c of result.changes) {
        if (c.promoted !== null) {
          const rec: FailoverRecord = {
            shard: c.shard, from: c.promoted.from, to: c.promoted.to, epoch: written.version,
            decided_ms: death ? Math.round(this.o.clock.monotonic() - death.at) : 0, at: new Date().toISOString(),
          };
          this.failovers.push(rec);
          this.o.log.warn(rec, `failover: shard ${c.shard} primary ${c.promoted.from} → ${c.promoted.to} (plan v${written.version})`);
          publishEvent(this.o.transport, this.o.job, 'scheduler', {
            kind: 'failover', node: c.promoted.from, text: `shard ${c.shard}: primary ${c.promoted.from} is dead; ${c.promoted.to} promoted (plan v${written.version})`,
          });
        }
        if (c.dropped.length) this.o.log.warn({ shard: c.shard, dropped: c.dropped }, `shard ${c.shard}: replica(s) on ${c.dropped.join(', ')} dropped (dead)`);
      }
    }
    this.noteRecovered();
    await this.rereplicate();
  }

  /**
   * Shards with a dead primary and no backup answering yet (its server still
   * starting): nothing is promoted; the decision is taken again shortly, and
   * the shard counts as unavailable for server_recovery_timeout meanwhile.
   */
  private noteWaiting(shards: readonly string[]): void {
    const now = this.o.clock.monotonic();
    for (const s of [...this.waitingSince.keys()]) if (!shards.includes(s)) this.waitingSince.delete(s);
    for (const s of shards) {
      if (this.waitingSince.has(s)) continue;
      this.waitingSince.set(s, now);
      this.o.log.warn({ shard: s }, `shard ${s}: its primary is dead and no backup answers yet (not started?); nothing promoted: waiting for a backup to answer or the primary to come back`);
    }
    if (shards.length > 0 && !this.stopped && this.retry === null) {
      this.retry = this.o.clock.setTimeout(() => {
        this.retry = null;
        if (!this.stopped) void this.enqueue(() => this.reconcile(null));
      }, WAITING_RETRY_MS);
    }
  }

  /** A lost shard whose primary is alive again (a healed partition, a continued process) is served again. */
  private noteRecovered(): void {
    const plan = this.current;
    if (plan === null) return;
    for (const s of [...this.lostSince.keys()]) {
      const r = plan.placement.replicas[s];
      if (r === undefined || this.dead.has(r.primary)) continue;
      this.lostSince.delete(s);
      this.o.log.warn({ shard: s, primary: r.primary }, `shard ${s}: its primary ${r.primary} is alive again; the shard is served again`);
    }
  }

  /**
   * fault_tolerance.server_recovery_timeout: why the job cannot go on — a
   * shard with no live replica for longer than `limitMs` (its parameters are
   * unreachable, and every request to it would wait forever); null otherwise.
   */
  overdue(limitMs: number): string | null {
    const now = this.o.clock.monotonic();
    const late = [...new Set([...this.lostSince, ...this.waitingSince].filter(([, at]) => now - at > limitMs).map(([s]) => s))].sort();
    if (late.length === 0) return null;
    // The servers whose copy of a shard was complete (a replica still seeding is not).
    const holders = (s: string) => {
      const r = this.current?.placement.replicas[s];
      return r === undefined ? '?' : [r.primary, ...r.backups].join(', ');
    };
    const where = late.map((s) => `${s} (last held by ${holders(s)})`).join(', ');
    return `shard(s) ${where}: no live replica for more than ${Math.round(limitMs / 1000)} s (fault_tolerance.server_recovery_timeout), so their parameters are unreachable; `
      + 'bring one of those servers back, or raise backup_factor so a shard survives the loss of its servers';
  }

  private async rereplicate(): Promise<void> {
    const live = new Set(this.o.servers.filter((s) => !this.dead.has(s) && this.o.health.stateOf(s) !== 'dead'));
    let added: { shard: string; node: string }[] = [];
    const written = await this.write((plan) => {
      const r = rereplicate(plan.placement, live, this.o.backupFactor);
      if (r === null) return null;
      added = r.added;
      return withPlacement(plan, r.placement);
    });
    if (written === null) return;
    for (const a of added) {
      this.replicas.push({ shard: a.shard, node: a.node, epoch: written.version, at: new Date().toISOString(), kind: 'seeding' });
      this.o.log.info(a, `shard ${a.shard}: new replica on ${a.node} being seeded (plan v${written.version})`);
      publishEvent(this.o.transport, this.o.job, 'scheduler', { kind: 'replica_seeding', node: a.node, text: `shard ${a.shard}: seeding a new replica on ${a.node}` });
    }
  }

  /** A seeded replica caught up: from the next plan on, its primary waits for it. */
  async replicaReady(shard: string, node: string): Promise<{ epoch: number | null }> {
    this.unseedable.delete(`${shard}@${node}`);
    const epoch = await this.placementChange((p) => promoteSeeded(p, shard, node), (written) => {
      this.replicas.push({ shard, node, epoch: written.version, at: new Date().toISOString(), kind: 'backup' });
      this.o.log.info({ shard, node, epoch: written.version }, `shard ${shard}: replica on ${node} caught up; a backup from plan v${written.version}`);
      publishEvent(this.o.transport, this.o.job, 'scheduler', { kind: 'replica_ready', node, text: `shard ${shard}: replica on ${node} is a backup (plan v${written.version})` });
    });
    return { epoch };
  }

  /**
   * A backup its primary cannot seed holds no copy of the shard: from the
   * next plan on it is seeding again (not waited for, never promoted), and
   * the shard counts as unprotected where it was the only backup.
   */
  async replicaUnseedable(shard: string, node: string, why: string): Promise<{ epoch: number | null }> {
    this.unseedable.add(`${shard}@${node}`);
    const epoch = await this.placementChange((p) => demoteToSeeding(p, shard, node), (written) => {
      this.replicas.push({ shard, node, epoch: written.version, at: new Date().toISOString(), kind: 'seeding' });
      const unprotected = unprotectedShards(written.placement).includes(shard);
      this.o.log.error({ shard, node, epoch: written.version, unprotected, err: why },
        `shard ${shard}: its primary cannot seed the replica on ${node}, which holds no copy; seeding again, no longer a backup (plan v${written.version})`
        + `${unprotected ? ': the shard has no backup now' : ''}. ${why}`);
      publishEvent(this.o.transport, this.o.job, 'scheduler', {
        kind: 'replica_seeding', node, text: `shard ${shard}: replica on ${node} cannot be seeded (${why.slice(0, 200)}); no longer a backup (plan v${written.version})`,
      });
    });
    return { epoch };
  }

  /**
   * Load balancing, first step of a move to a server that holds no replica
   * of `shard`: a new replica there, seeded by the primary (a backup once it
   * has caught up). The plan version written, or null when nothing changed.
   */
  seedFor(shard: string, node: string): Promise<number | null> {
    return this.placementChange((p) => seedReplica(p, shard, node), (written) => {
      this.replicas.push({ shard, node, epoch: written.version, at: new Date().toISOString(), kind: 'seeding' });
      this.o.log.info({ shard, node, epoch: written.version }, `shard ${shard}: new replica on ${node} being seeded for a load-balancing move (plan v${written.version})`);
    });
  }

  /**
   * Load balancing: `to`, a caught-up backup of `shard`, becomes its primary
   * and the old primary is dropped (topology's `handOver`); then the shards
   * below the backup factor get new replicas as after a failover. The plan
   * version of the handover, or null when `to` is not (or no longer) a
   * backup of the shard.
   */
  handOver(shard: string, to: string): Promise<number | null> {
    return this.placementChange((p) => handOver(p, shard, to), () => this.rereplicate());
  }

  /**
   * Writes `change(placement)` as the next plan, in order with every other
   * plan change of this failover, then runs `after` on it. The version
   * written, or null when `change` changed nothing.
   */
  private placementChange(change: (p: ShardPlan['placement']) => ShardPlan['placement'] | null, after: (written: ShardPlan) => Promise<void> | void): Promise<number | null> {
    let out: number | null = null;
    return this.enqueue(async () => {
      const written = await this.write((plan) => {
        const p = change(plan.placement);
        return p === null ? null : withPlacement(plan, p);
      });
      if (written === null) return;
      out = written.version;
      await after(written);
    }).then(() => out);
  }

  /**
   * A replica its primary reported it cannot seed (and that has not caught up
   * since): it stays seeding, so load balancing does not wait for it.
   */
  isUnseedable(shard: string, node: string): boolean {
    return this.unseedable.has(`${shard}@${node}`);
  }

  /** What `status` and the summary report. */
  report(): { plan_version: number | null; placement: ShardPlan['placement'] | null; unprotected: string[]; failovers: FailoverRecord[]; replicas: ReplicaRecord[]; lost: string[] } {
    const p = this.current;
    return {
      plan_version: p?.version ?? null, placement: p?.placement ?? null, unprotected: p ? unprotectedShards(p.placement) : [],
      failovers: [...this.failovers], replicas: [...this.replicas], lost: [...this.lost],
    };
  }

  /** Waits for the steps queued so far (tests, the end of a run). */
  async settled(): Promise<void> { await this.chain; }

  dispose(): void {
    this.stopped = true;
    this.retry?.cancel();
    this.retry = null;
    this.unsubscribe();
  }
}

export type FailoverActorDefinition = ActorDefinition<typeof failoverMessages> & { readonly failover: ShardFailover };

export function createFailoverActor(f: ShardFailover): FailoverActorDefinition {
  return {
    kind: 'scheduler',
    id: FAILOVER_ACTOR_ID,
    messages: failoverMessages,
    failover: f,
    handlers: {
      replica_ready: (m) => f.replicaReady(m.shard, m.node),
      replica_unseedable: (m) => f.replicaUnseedable(m.shard, m.node, m.why),
      status: () => f.report(),
    },
  };
}
