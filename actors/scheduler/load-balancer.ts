/**
 * Load balancing while training runs (the reference article's dynamic
 * parameter migration; the rule is topology/load-balance.ts): the
 * scheduler samples every replica's traffic counters, and once the server
 * nodes' loads have been further apart than
 * `load_balancing.imbalance_threshold` for `sustain_seconds`, it moves one
 * shard's primary off the busiest server — seeding the target first when it
 * holds no replica of the shard, then handing the shard over to it through
 * a new plan (ShardFailover writes both, in the order of its other plan
 * changes). Nothing is paused: requests routed by the old plan are refused
 * by the deposed primary and retried at the new one, and a push applied
 * there but never confirmed by the new primary was never acknowledged.
 *
 * It waits while failover has work in hand (a dead server, a shard without
 * a live replica), while any replica is still being seeded (not one its
 * primary reported it cannot seed: that one stays seeding), and while any
 * server node is not alive; a handover never overlaps a checkpoint's cut.
 */
import type { ActorSystem, Clock, Logger, Timer, Transport } from '../../runtime/mod.ts';
import {
  busyFractions, imbalanceOf, measuredCapacities, planMigration, relativeLoads, serverLoads, trafficRates, type Migration, type ReplicaTraffic, type ServerBusy, type ShardPlan,
} from '../../topology/mod.ts';
import type { HealthView } from '../health/health.types.ts';
import { publishEvent } from '../monitor/monitor.messages.ts';
import { allReplicas, replicaId } from '../shard/replica.ts';
import type { PlanStore } from '../store/plan-store.ts';
import type { ShardFailover } from './failover.ts';

export interface LoadBalancerOptions {
  failover: ShardFailover;
  planStore: PlanStore;
  /** Asks the replicas for their stats. */
  system: ActorSystem;
  health: HealthView;
  servers: readonly string[];
  /** load_balancing.imbalance_threshold */
  threshold: number;
  /** load_balancing.sustain_seconds */
  sustainS: number;
  /** nodes.<server>.capacity where given (the others count 1): loads are compared divided by it. */
  capacity?: Readonly<Record<string, number>> | null;
  /** load_balancing.capacity: `measured` compares the servers by the capacity each shows (traffic per second its event loop is busy), over the declared one; default `declared`. */
  capacityFrom?: 'declared' | 'measured';
  /** Runs a handover between checkpoints (Checkpointer.exclusive); default: at once. */
  exclusive?: <T>(fn: () => Promise<T>) => Promise<T>;
  transport: Transport;
  job: string;
  clock: Clock;
  log: Logger;
  /** Between samples; default a sixth of sustain_seconds, within 0.25–2 s. */
  sampleMs?: number;
  /** How long a seeded target may take to catch up before the move is given up; default 10 × sustain_seconds, at least 60 s. */
  seedWaitMs?: number;
}

/** One move, as the summary and `status` report it. */
export interface MigrationRecord {
  shard: string;
  from: string;
  to: string;
  /** The plan version that made `to` the primary. */
  epoch: number;
  /** The target held no replica: it was seeded first. */
  seeded: boolean;
  /** Server loads (floats per second) when the move was decided, and the imbalance they had for sustain_seconds (of the loads divided by the capacities). */
  loads: Record<string, number>;
  imbalance: number;
  /** The capacities the loads were compared by (floats per busy second where measured); null: every server counted alike. */
  capacity: Record<string, number> | null;
  /** The loads and imbalance the move was expected to leave. */
  expected_loads: Record<string, number>;
  expected_imbalance: number;
  /** From the decision to the new primary serving. */
  took_ms: number;
  at: string;
  /** The loads over the first full rate window (RATE_WINDOW samples) once the move had settled (the old primary seeded again where it is wanted), while traffic went on; null until then. */
  measured_after: { loads: Record<string, number>; imbalance: number } | null;
}

export interface LoadBalancingReport {
  threshold: number;
  sustain_seconds: number;
  migrations: MigrationRecord[];
  /** The last sample's server loads (floats per second) and imbalance while there was traffic; null before two such samples. */
  loads: Record<string, number> | null;
  imbalance: number | null;
  /** Why the balancer does not act, when it does not (e.g. async replication). */
  inactive: string | null;
  /** Where the capacities the loads are compared by come from, and the last ones used (floats per busy second where measured; null: all alike). */
  capacity_from: 'declared' | 'measured';
  capacity: Record<string, number> | null;
  /** The last sample's fraction of the time each server's event loop was busy (0–1), with traffic; null before two such samples. */
  busy: Record<string, number> | null;
}

/** Sample intervals the loads are measured over (the rates between the oldest kept sample and the newest). */
const RATE_WINDOW = 3;

const round = (x: number) => Math.round(x);
const fmtLoads = (m: ReadonlyMap<string, number>) => Object.fromEntries([...m].map(([k, v]) => [k, round(v)]));
const showLoads = (m: ReadonlyMap<string, number>) => [...m].map(([k, v]) => `${k} ${(v / 1e6).toFixed(2)} M`).join(', ');

export class LoadBalancer {
  readonly migrations: MigrationRecord[] = [];
  private timer: Timer | null = null;
  private stopped = false;
  /** The recent samples under the current plan, oldest first (at most RATE_WINDOW + 1). */
  private recent: { at: number; traffic: ReplicaTraffic[]; busy: ServerBusy[] }[] = [];
  private recentEpoch = -1;
  private loads: Map<string, number> | null = null;
  private imbalance: number | null = null;
  private lastCapacity: ReadonlyMap<string, number> | null = null;
  private lastBusy: ReadonlyMap<string, number> | null = null;
  /** Since when (monotonic ms) the imbalance has been over the threshold; null when it is not. */
  private overSince: number | null = null;
  private moving: Promise<void> | null = null;
  /** The last reason an imbalance over the threshold was not acted on, said once per change. */
  private held: string | null = null;
  private readonly capacity: ReadonlyMap<string, number> | null;
  private readonly sampleMs: number;

  constructor(private readonly o: LoadBalancerOptions, private readonly inactive: string | null = null) {
    this.capacity = o.capacity ? new Map(Object.entries(o.capacity)) : null;
    this.sampleMs = o.sampleMs ?? Math.min(2_000, Math.max(250, (o.sustainS * 1000) / 6));
  }

  start(): void {
    if (this.inactive !== null) {
      this.o.log.info(`load balancing: off (${this.inactive})`);
      return;
    }
    this.schedule();
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = this.o.clock.setTimeout(() => {
      this.timer = null;
      void this.tick().catch((e: unknown) => this.o.log.warn({ err: (e as Error).message }, 'load balancing: a sample failed; trying again'))
        .finally(() => this.schedule());
    }, this.sampleMs);
  }

  /** Why no move may start now, or null. */
  private holdReason(plan: ShardPlan): string | null {
    if (this.o.failover.unsettled) return 'failover has work in hand';
    for (const s of this.o.servers) if (this.o.health.stateOf(s) !== 'alive') return `server ${s} is not alive`;
    // A replica its primary cannot seed stays seeding (for as long as the job runs): no seed to wait for there.
    const seeding = Object.entries(plan.placement.replicas).filter(([s, r]) => r.seeding.some((n) => !this.o.failover.isUnseedable(s, n))).map(([s]) => s);
    if (seeding.length) return `shard(s) ${seeding.join(', ')} still seeding a replica`;
    return null;
  }

  /** One sample: the loads since the last, and a move once they stayed imbalanced for sustain_seconds. */
  async tick(): Promise<void> {
    if (this.stopped || this.moving !== null) return;
    const plan = await this.o.planStore.get();
    if (plan === null) return;
    const at = this.o.clock.monotonic();
    const sample = await this.sample(plan);
    // A replica that did not answer would count as idle and draw a move onto a busy server: no sample then.
    if (sample === null) { this.recent = []; return; }
    const { traffic, busy: loopBusy } = sample;
    // Rates only between samples under one plan: a plan change moves traffic between replicas.
    if (plan.version !== this.recentEpoch) { this.recent = []; this.recentEpoch = plan.version; this.overSince = null; }
    this.recent.push({ at, traffic, busy: loopBusy });
    if (this.recent.length > RATE_WINDOW + 1) this.recent.shift();
    if (this.recent.length < 2) return;
    // Over the last RATE_WINDOW intervals, so an hps window's burst of pushes does not swing one sample's loads.
    const prev = this.recent[0]!;
    const rates = trafficRates(prev.traffic, traffic, (at - prev.at) / 1000);
    const live = this.o.servers.filter((s) => this.o.health.stateOf(s) !== 'dead');
    const loads = serverLoads(plan.placement, rates, live);
    const busyFraction = busyFractions(prev.busy, loopBusy, (at - prev.at) / 1000);
    // Measured over the same window as the loads; declared where nothing can be measured yet.
    const capacity = (this.o.capacityFrom === 'measured' ? measuredCapacities(loads, busyFraction) : null) ?? this.capacity;
    const { imbalance } = imbalanceOf(relativeLoads(loads, capacity));
    const busy = [...loads.values()].some((l) => l > 0);
    // The report keeps the last sample with traffic (not the idle one after training).
    if (busy) { this.loads = loads; this.imbalance = imbalance; this.lastCapacity = capacity; this.lastBusy = busyFraction; }
    const hold = this.holdReason(plan);
    const lastMove = this.migrations.at(-1);
    // Over a full rate window, as moves are decided: one interval right after a move is one hps window's burst of pushes.
    if (hold === null && busy && lastMove !== undefined && lastMove.measured_after === null && this.recent.length === RATE_WINDOW + 1) {
      lastMove.measured_after = { loads: fmtLoads(loads), imbalance: Number(imbalance.toFixed(3)) };
      this.o.log.info(lastMove.measured_after, `load balancing: after moving shard ${lastMove.shard}, server loads ${showLoads(loads)} floats/s, imbalance ${imbalance.toFixed(2)}`);
    }
    if (imbalance > this.o.threshold && hold !== this.held) {
      this.held = hold;
      if (hold !== null) this.o.log.info({ imbalance: Number(imbalance.toFixed(3)), hold }, `load balancing: server loads ${showLoads(loads)} floats/s, imbalance ${imbalance.toFixed(2)} > ${this.o.threshold}; not moving while ${hold}`);
    }
    if (hold !== null || imbalance <= this.o.threshold) { this.overSince = null; return; }
    this.overSince ??= this.recent.at(-2)!.at;
    if (at - this.overSince < this.o.sustainS * 1000) return;
    const move = planMigration(plan.placement, rates, live, this.o.threshold, capacity);
    if (move === null) return;
    this.moving = this.migrate(move, loads, imbalance, capacity)
      .catch((e: unknown) => this.o.log.warn({ err: (e as Error).message, shard: move.shard }, `load balancing: moving shard ${move.shard} failed: ${(e as Error).message}`))
      .finally(() => { this.moving = null; this.overSince = null; this.recent = []; });
    await this.moving;
  }

  /** Every replica's traffic counters and how long each server's event loop has been busy; null when a replica does not answer in time (or was deposed). */
  private async sample(plan: ShardPlan): Promise<{ traffic: ReplicaTraffic[]; busy: ServerBusy[] } | null> {
    const out: ReplicaTraffic[] = [];
    const busy = new Map<string, number>();
    const replicas = allReplicas(plan);
    await Promise.all(replicas.map(async ({ shard, node }) => {
      const s = await this.o.system.ref('shard', replicaId(shard, node))
        .request<{ pulled_floats?: number; pushed_floats?: number; role?: string; loop_busy_ms?: number }>('stats', {}, { timeoutMs: 1_000 })
        .catch(() => null);
      if (s === null || typeof s.pulled_floats !== 'number' || typeof s.pushed_floats !== 'number' || s.role === 'fenced') return;
      out.push({ shard, node, pulled: s.pulled_floats, pushed: s.pushed_floats });
      // One process per server node: any of its replicas says it (the latest answer, should they differ by a few ms).
      if (typeof s.loop_busy_ms === 'number') busy.set(node, Math.max(busy.get(node) ?? 0, s.loop_busy_ms));
    }));
    if (out.length < replicas.length) return null;
    return { traffic: out, busy: [...busy].map(([node, busyMs]) => ({ node, busyMs })) };
  }

  /** Carries out `move`, decided on `loads` with `imbalance`. */
  private async migrate(move: Migration, loads: Map<string, number>, imbalance: number, capacity: ReadonlyMap<string, number> | null): Promise<void> {
    const { shard, from, to, seed } = move;
    const started = this.o.clock.monotonic();
    const { log } = this.o;
    log.warn({ shard, from, to, seed, loads: fmtLoads(loads), imbalance: Number(imbalance.toFixed(3)) },
      `load balancing: server loads ${showLoads(loads)} floats/s, imbalance ${imbalance.toFixed(2)}${this.o.capacityFrom === 'measured' && capacity !== null ? ' of how busy they are (loads per measured capacity)' : ''} > ${this.o.threshold} for ${this.o.sustainS} s: `
      + `moving shard ${shard}'s primary ${from} → ${to}${seed ? ' (seeding a replica there first)' : ''}`);
    if (seed) {
      const v = await this.o.failover.seedFor(shard, to);
      if (v === null) throw new Error(`the plan no longer lets ${to} take a new replica of ${shard}`);
      await this.waitFor(() => this.o.planStore.get().then((p) => {
        const r = p?.placement.replicas[shard];
        if (r === undefined || r.primary !== from || !(r.backups.includes(to) || r.seeding.includes(to))) throw new Error(`shard ${shard}'s placement changed while ${to} was being seeded`);
        return r.backups.includes(to);
      }), this.o.seedWaitMs ?? Math.max(60_000, this.o.sustainS * 10_000), `${to}'s new replica of ${shard} to catch up`);
    }
    const run = this.o.exclusive ?? (<T>(fn: () => Promise<T>) => fn());
    const epoch = await run(async () => {
      const v = await this.o.failover.handOver(shard, to);
      if (v === null) throw new Error(`${to} is no longer a caught-up backup of ${shard}`);
      // Done when the new primary serves under the new plan (its host follows the plan store's watch).
      await this.waitFor(async () => {
        const s = await this.o.system.ref('shard', replicaId(shard, to)).request<{ role?: string; epoch?: number }>('stats', {}, { timeoutMs: 1_000 }).catch(() => null);
        return s !== null && s.role === 'primary' && (s.epoch ?? 0) >= v;
      }, 30_000, `${to} to serve ${shard} as its primary`);
      return v;
    });
    const rec: MigrationRecord = {
      shard, from, to, epoch, seeded: seed, loads: fmtLoads(loads), imbalance: Number(imbalance.toFixed(3)), capacity: capacity === null ? null : fmtLoads(capacity),
      expected_loads: fmtLoads(move.predicted), expected_imbalance: Number(move.predictedImbalance.toFixed(3)),
      took_ms: round(this.o.clock.monotonic() - started), at: new Date().toISOString(), measured_after: null,
    };
    this.migrations.push(rec);
    log.warn(rec, `load balancing: shard ${shard}'s primary is now ${to} (plan v${epoch}, ${rec.took_ms} ms)`);
    publishEvent(this.o.transport, this.o.job, 'scheduler', {
      kind: 'migration', node: to, text: `shard ${shard}: primary moved ${from} → ${to} to balance the servers' load (imbalance ${imbalance.toFixed(2)}; plan v${epoch})`,
    });
  }

  private async waitFor(done: () => Promise<boolean>, limitMs: number, what: string): Promise<void> {
    const until = this.o.clock.monotonic() + limitMs;
    while (!this.stopped) {
      if (await done()) return;
      if (this.o.clock.monotonic() > until) throw new Error(`gave up waiting for ${what} after ${Math.round(limitMs / 1000)} s`);
      await new Promise<void>((r) => { this.o.clock.setTimeout(r, 100); });
    }
    throw new Error('the job is ending');
  }

  report(): LoadBalancingReport {
    return {
      threshold: this.o.threshold, sustain_seconds: this.o.sustainS, migrations: [...this.migrations],
      loads: this.loads === null ? null : fmtLoads(this.loads), imbalance: this.imbalance === null ? null : Number(this.imbalance.toFixed(3)),
      inactive: this.inactive,
      capacity_from: this.o.capacityFrom ?? 'declared',
      capacity: this.lastCapacity === null ? null : fmtLoads(this.lastCapacity),
      busy: this.lastBusy === null ? null : Object.fromEntries([...this.lastBusy].map(([k, v]) => [k, Number(v.toFixed(3))])),
    };
  }

  /** Stops sampling; a move under way finishes its current step. */
  async dispose(): Promise<void> {
    this.stopped = true;
    this.timer?.cancel();
    this.timer = null;
    await this.moving?.catch(() => undefined);
  }
}
