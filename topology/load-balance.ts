/**
 * Load balancing between server nodes (the reference article's dynamic
 * parameter migration): plain functions over the shard plan's placement and
 * the replicas' traffic counters, so the scheduler's balancer (which samples
 * and acts), the shard hosts (which follow plans) and the tests agree on one
 * rule.
 *
 * A server's load is the parameter traffic its replicas carry, in floats per
 * second: a primary serves its shard's pulls, takes its pushes and streams
 * each update to every other replica; a backup (or a replica being seeded)
 * applies that stream. So a primary costs `pull + push × (1 + followers)`
 * and a backup `push`, from the counters each replica reports in its stats
 * (`pulled_floats`, `pushed_floats`).
 *
 * Servers of unequal capacity compare their loads divided by it: declared
 * (`nodes.<server>.capacity`), or measured from how busy each server's event
 * loop is (`load_balancing.capacity: measured`, `measuredCapacities`), so
 * that the loads compared are the servers' utilisation, as the reference
 * article's balancer watches CPU utilisation.
 *
 * The servers are imbalanced when `(max − min) / max` of their loads is over
 * `load_balancing.imbalance_threshold`; once that has held for
 * `sustain_seconds`, one shard's primary moves from the busiest server to
 * the server that leaves the busiest load lowest: the handover of
 * replication.ts (a caught-up backup becomes the primary, the old primary is
 * dropped and seeded again as a backup where the backup factor wants one),
 * preceded by seeding the target when it holds no replica of the shard.
 */
import { replicaNodes, type ReplicaPlacement, type ShardReplicas } from './replication.ts';

/** One replica's cumulative traffic counters (floats), as its stats report them. */
export interface ReplicaTraffic {
  shard: string;
  node: string;
  /** Floats its pulls returned (dense values and embedding rows). */
  pulled: number;
  /** Gradient floats it took: pushes on a primary, the replicated stream on a backup. */
  pushed: number;
}

/** Floats per second of one replica between two samples. */
export interface TrafficRate { pull: number; push: number }

function key(shard: string, node: string): string { return `${shard}@${node}`; }

/**
 * Per-replica rates over `seconds` between two samples. A replica missing
 * from `before`, or whose counters went down (a new replica, a restarted
 * process), counts from zero.
 */
export function trafficRates(before: readonly ReplicaTraffic[], after: readonly ReplicaTraffic[], seconds: number): Map<string, TrafficRate> {
  const prev = new Map(before.map((r) => [key(r.shard, r.node), r]));
  const out = new Map<string, TrafficRate>();
  if (!(seconds > 0)) return out;
  for (const r of after) {
    const p = prev.get(key(r.shard, r.node));
    const fresh = p === undefined || r.pulled < p.pulled || r.pushed < p.pushed;
    out.set(key(r.shard, r.node), {
      pull: (r.pulled - (fresh ? 0 : p.pulled)) / seconds,
      push: (r.pushed - (fresh ? 0 : p.pushed)) / seconds,
    });
  }
  return out;
}

/** Replicas a primary streams every update to (its backups and the ones being seeded). */
function followers(r: ShardReplicas): number { return r.backups.length + r.seeding.length; }

/** What the primary of a shard costs its server, per second: its pulls, its pushes, and streaming each push to every follower. */
export function primaryCost(r: ShardReplicas, rate: TrafficRate): number {
  return rate.pull + rate.push * (1 + followers(r));
}

/** The load of each server in `servers` (floats per second): Σ over the replicas the placement puts on it. */
export function serverLoads(p: ReplicaPlacement, rates: ReadonlyMap<string, TrafficRate>, servers: readonly string[]): Map<string, number> {
  const loads = new Map(servers.map((s) => [s, 0]));
  for (const [shard, r] of Object.entries(p.replicas)) {
    for (const node of replicaNodes(r)) {
      if (!loads.has(node)) continue;
      const rate = rates.get(key(shard, node)) ?? { pull: 0, push: 0 };
      loads.set(node, loads.get(node)! + (node === r.primary ? primaryCost(r, rate) : rate.pull + rate.push));
    }
  }
  return loads;
}

/**
 * Loads for comparing servers of unequal capacity (`nodes.<server>.capacity`):
 * each divided by its server's capacity (1 where none is given). Unchanged
 * without capacities.
 */
export function relativeLoads(loads: ReadonlyMap<string, number>, capacity: ReadonlyMap<string, number> | null): ReadonlyMap<string, number> {
  if (capacity === null) return loads;
  return new Map([...loads].map(([s, l]) => [s, l / (capacity.get(s) ?? 1)]));
}

/** How long one server process's event loop has been busy, cumulative ms, as its replicas' stats report it. */
export interface ServerBusy { node: string; busyMs: number }

/**
 * The fraction of the time each server's event loop was busy between two
 * samples (0–1). A server missing from either sample, or whose counter went
 * down (a restarted process), has none.
 */
export function busyFractions(before: readonly ServerBusy[], after: readonly ServerBusy[], seconds: number): Map<string, number> {
  const prev = new Map(before.map((c) => [c.node, c.busyMs]));
  const out = new Map<string, number>();
  if (!(seconds > 0)) return out;
  for (const c of after) {
    const p = prev.get(c.node);
    if (p === undefined || c.busyMs < p) continue;
    out.set(c.node, (c.busyMs - p) / 1000 / seconds);
  }
  return out;
}

/**
 * The least busy fraction a server's capacity is measured from. A measured
 * server's load per capacity is its busy fraction whatever its traffic, so
 * housekeeping that inflates an idle server's figure only makes it look a
 * little busier; the floor keeps a server busy next to never from having a
 * capacity without bound. (At 0.05 a fast server carrying much traffic at
 * 4 % busy took a slow one's capacity, and a primary moved back onto the
 * slow one: test/chaos/server-throttled.test.ts.)
 */
export const MIN_MEASURED_BUSY = 0.01;

/**
 * Capacities measured (`load_balancing.capacity: measured`): each server's
 * parameter traffic per second its event loop was busy (floats per busy
 * second), over the same window. A server that takes longer over the same
 * traffic — a slower machine, or one whose CPU other work contends for —
 * has less capacity, and a load divided by it (`relativeLoads`) is how busy
 * the server is. A server that cannot be measured (no traffic, busy less
 * than MIN_MEASURED_BUSY, no figure) takes the mean of the measured ones.
 * Null when none can be measured.
 */
export function measuredCapacities(loads: ReadonlyMap<string, number>, busy: ReadonlyMap<string, number>): Map<string, number> | null {
  const measured = new Map<string, number>();
  for (const [s, load] of loads) {
    const b = busy.get(s);
    if (b !== undefined && b >= MIN_MEASURED_BUSY && load > 0) measured.set(s, load / b);
  }
  if (measured.size === 0) return null;
  const mean = [...measured.values()].reduce((a, b) => a + b, 0) / measured.size;
  return new Map([...loads.keys()].map((s) => [s, measured.get(s) ?? mean]));
}

export interface Imbalance {
  /** (max − min) / max; 0 when every server is idle. */
  imbalance: number;
  busiest: string | null;
  idlest: string | null;
}

/** How far apart the busiest and the idlest server are (ties: the first in name order). */
export function imbalanceOf(loads: ReadonlyMap<string, number>): Imbalance {
  let busiest: string | null = null;
  let idlest: string | null = null;
  for (const s of [...loads.keys()].sort()) {
    const l = loads.get(s)!;
    if (busiest === null || l > loads.get(busiest)!) busiest = s;
    if (idlest === null || l < loads.get(idlest)!) idlest = s;
  }
  if (busiest === null || idlest === null) return { imbalance: 0, busiest: null, idlest: null };
  const max = loads.get(busiest)!;
  return { imbalance: max > 0 ? (max - loads.get(idlest)!) / max : 0, busiest, idlest };
}

/** The least a move must take off the busiest server's load, as a fraction of it. */
export const MIN_GAIN = 0.05;

/** One planned move of a shard's primary. */
export interface Migration {
  shard: string;
  from: string;
  to: string;
  /** The target holds no caught-up replica of the shard yet: it is seeded first. */
  seed: boolean;
  /** The server loads expected once the move is done. */
  predicted: Map<string, number>;
  /** Their imbalance. */
  predictedImbalance: number;
}

/**
 * The move that leaves the busiest of `live` servers' loads lowest, or null
 * when none lowers it (or the loads are not imbalanced enough to care,
 * `threshold`). Candidates: every shard whose primary is on the busiest
 * server, to every other live server. The expected loads count the old
 * primary as a backup again where the target was one already (the backup
 * factor has it seeded again; on another server it would only be lower),
 * and as holding nothing of the shard where the target is seeded first (it
 * takes the old primary's place). A move must lower the busiest load by
 * MIN_GAIN of it at least: a move that only makes another server the
 * busiest at the same load is no move, so two servers never trade one shard
 * back and forth, and noise in the rates does not churn primaries.
 */
export function planMigration(
  p: ReplicaPlacement, rates: ReadonlyMap<string, TrafficRate>, live: readonly string[], threshold: number,
  capacity: ReadonlyMap<string, number> | null = null,
): Migration | null {
  const loads = serverLoads(p, rates, live);
  // Compared for capacity: each server's load per unit of its capacity.
  const relative = relativeLoads(loads, capacity);
  const now = imbalanceOf(relative);
  if (now.busiest === null || now.imbalance <= threshold) return null;
  const hot = now.busiest;
  const hotLoad = loads.get(hot)!;
  const max = relative.get(hot)!;
  let best: Migration | null = null;
  let bestMax = max;
  for (const shard of Object.keys(p.replicas).sort()) {
    const r = p.replicas[shard]!;
    if (r.primary !== hot) continue;
    const rate = rates.get(key(shard, hot)) ?? { pull: 0, push: 0 };
    const cost = primaryCost(r, rate);
    if (cost <= 0) continue;
    for (const to of live) {
      if (to === hot) continue;
      const holder = r.backups.includes(to);
      const predicted = new Map(loads);
      if (holder) {
        // The target stops applying the stream and serves instead; the old primary applies it again.
        const followerCost = (rates.get(key(shard, to)) ?? { pull: 0, push: rate.push }).push;
        predicted.set(hot, hotLoad - cost + rate.push);
        predicted.set(to, loads.get(to)! - followerCost + cost);
      } else {
        predicted.set(hot, hotLoad - cost);
        predicted.set(to, loads.get(to)! + cost);
      }
      const newMax = Math.max(...relativeLoads(predicted, capacity).values());
      if (newMax > max * (1 - MIN_GAIN)) continue;
      // Ties go to a target that is a caught-up backup already (no seed).
      const better = best === null || newMax < bestMax || (newMax === bestMax && best.seed && holder);
      if (!better) continue;
      bestMax = newMax;
      best = { shard, from: hot, to, seed: !holder, predicted, predictedImbalance: imbalanceOf(relativeLoads(predicted, capacity)).imbalance };
    }
  }
  return best;
}

function clone(p: ReplicaPlacement): ReplicaPlacement {
  const replicas: Record<string, ShardReplicas> = {};
  for (const [s, r] of Object.entries(p.replicas)) replicas[s] = { primary: r.primary, backups: [...r.backups], seeding: [...r.seeding] };
  return { servers: [...p.servers], replicas, ...(p.initial_version !== undefined ? { initial_version: p.initial_version } : {}) };
}

/**
 * `node` gets a new replica of `shard`, seeded by its primary (it becomes a
 * backup once caught up: `promoteSeeded`). Null when it holds one already.
 */
export function seedReplica(p: ReplicaPlacement, shard: string, node: string): ReplicaPlacement | null {
  const r = p.replicas[shard];
  if (r === undefined || replicaNodes(r).includes(node)) return null;
  const next = clone(p);
  next.replicas[shard]!.seeding.push(node);
  return next;
}

/**
 * The handover: `to`, a caught-up backup of `shard`, becomes its primary; the
 * old primary is dropped (its server stops and fences its replica, and is
 * seeded again if the backup factor wants a replica there). Every update the
 * old primary acknowledged is on `to` already (sync replication), and one it
 * applied but could not get `to` to confirm was never acknowledged: its
 * pusher retries at `to`. Null when `to` is not a backup of the shard.
 */
export function handOver(p: ReplicaPlacement, shard: string, to: string): ReplicaPlacement | null {
  const r = p.replicas[shard];
  if (r === undefined || !r.backups.includes(to)) return null;
  const next = clone(p);
  const n = next.replicas[shard]!;
  n.primary = to;
  n.backups = n.backups.filter((b) => b !== to);
  return next;
}
