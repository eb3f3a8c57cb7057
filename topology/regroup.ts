/**
 * When to regroup, and what a regroup moves. The article (§3.1): grouping is
 * not one-off; a node whose speed drops *persistently* (thermal throttling)
 * triggers a regroup, but a regroup costs a global sync, so the trigger must
 * not be twitchy. Three things make this one calm:
 * - the median of the last `window` step times, so one slow step (a GC pause,
 *   a checkpoint) moves nothing until half the window is slow;
 * - the median must stay above baseline × (1 + threshold) for `sustainMs`;
 * - after a regroup, none for `cooldownMs`.
 * Plain functions over plain data: the caller keeps the state between checks.
 */
import { ConfigError } from '../runtime/errors.ts';
import type { Grouping, NodeGroup, NodeProfile } from './grouping.ts';

export interface DegradationPolicy {
  /** A node is slow when its median step time exceeds baseline × (1 + threshold). */
  threshold: number;
  /** Step times per node the median is taken over; fewer than this and the node is not judged yet. */
  window: number;
  /** How long a node must stay slow before it counts as degraded. */
  sustainMs: number;
  /** No new regroup this soon after the last one. */
  cooldownMs: number;
}

export const DEFAULT_DEGRADATION_POLICY: DegradationPolicy = { threshold: 0.5, window: 20, sustainMs: 30_000, cooldownMs: 120_000 };

export interface NodeStepTimes {
  node: string;
  /** The node's normal step time: from its profile, or the median of its first window (see `baselineStepMs`). */
  baselineMs: number;
  /** Recent step times, oldest first; only the last `window` are read. */
  stepMs: readonly number[];
}

/** Carried from one check to the next. */
export interface DegradationState {
  /** When each currently-slow node was first seen slow (ms, caller's clock). */
  slowSince: Record<string, number>;
  /** When the last regroup happened; null: never. */
  lastRegroupMs: number | null;
}

export const INITIAL_DEGRADATION_STATE: DegradationState = { slowSince: {}, lastRegroupMs: null };

export interface DegradationReport {
  /** Nodes slow for at least `sustainMs`; ratio = recent median / baseline. */
  degraded: { node: string; ratio: number; slowForMs: number }[];
  /** Slow now but not yet for long enough. */
  suspect: { node: string; ratio: number; slowForMs: number }[];
  /** Some node is degraded and the cooldown has passed: re-run grouping (see `regroupPlan` for whether anything moves). */
  shouldRegroup: boolean;
  state: DegradationState;
}

export function medianOf(xs: readonly number[]): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** A baseline from the first `window` step times (null until there are that many). */
export function baselineStepMs(stepMs: readonly number[], window = DEFAULT_DEGRADATION_POLICY.window): number | null {
  return stepMs.length >= window ? medianOf(stepMs.slice(0, window)) : null;
}

function checkPolicy(p: DegradationPolicy): void {
  if (!(p.threshold > 0)) throw new ConfigError(`degradation threshold must be > 0, got ${p.threshold}`);
  if (!(Number.isInteger(p.window) && p.window >= 1)) throw new ConfigError(`degradation window must be an integer ≥ 1, got ${p.window}`);
  if (!(p.sustainMs >= 0)) throw new ConfigError(`degradation sustainMs must be ≥ 0, got ${p.sustainMs}`);
  if (!(p.cooldownMs >= 0)) throw new ConfigError(`degradation cooldownMs must be ≥ 0, got ${p.cooldownMs}`);
}

/**
 * One check at time `nowMs`. A node with fewer than `window` step times, or a
 * baseline that is not a positive number, is not judged (and loses any
 * slow-since mark). Nodes absent from `nodes` are forgotten.
 */
export function detectDegradation(
  nodes: readonly NodeStepTimes[],
  nowMs: number,
  state: DegradationState = INITIAL_DEGRADATION_STATE,
  policy: Partial<DegradationPolicy> = {},
): DegradationReport {
  const p = { ...DEFAULT_DEGRADATION_POLICY, ...policy };
  checkPolicy(p);
  const slowSince: Record<string, number> = {};
  const degraded: DegradationReport['degraded'] = [];
  const suspect: DegradationReport['suspect'] = [];
  for (const n of nodes) {
    if (n.stepMs.length < p.window || !(n.baselineMs > 0)) continue;
    const ratio = medianOf(n.stepMs.slice(-p.window)) / n.baselineMs;
    if (!(ratio > 1 + p.threshold)) continue;
    const since = state.slowSince[n.node] ?? nowMs;
    slowSince[n.node] = since;
    const entry = { node: n.node, ratio: +ratio.toFixed(3), slowForMs: nowMs - since };
    (entry.slowForMs >= p.sustainMs ? degraded : suspect).push(entry);
  }
  const coolingDown = state.lastRegroupMs !== null && nowMs - state.lastRegroupMs < p.cooldownMs;
  return {
    degraded,
    suspect,
    shouldRegroup: degraded.length > 0 && !coolingDown,
    state: { slowSince, lastRegroupMs: state.lastRegroupMs },
  };
}

/**
 * The state after a regroup at `nowMs`: slow marks are cleared (the caller
 * should also take new baselines, since the slow speed is now the node's
 * normal) and the cooldown starts.
 */
export function noteRegrouped(state: DegradationState, nowMs: number): DegradationState {
  return { slowSince: {}, lastRegroupMs: nowMs };
}

/**
 * A profile as it looks after slowing down by `ratio` (step time ×ratio):
 * compute divided by it. Feed the results to `groupNodes` to regroup on
 * current speed rather than profile-time speed.
 */
export function slowedProfile(profile: NodeProfile, ratio: number): NodeProfile {
  if (!(ratio > 0)) throw new ConfigError(`slowdown ratio must be > 0, got ${ratio}`);
  return { ...profile, matmul_gflops: profile.matmul_gflops / ratio, gather_rows_per_s: profile.gather_rows_per_s / ratio };
}

/**
 * How much slower a node runs now than at its baseline: the median of its
 * last `window` step times / its baseline (2 = twice as slow), times the
 * slowdown `carried` from before the baseline was taken (a regroup takes new
 * baselines, but the profile still describes the node as it joined). 1 when
 * the node cannot be judged yet (no baseline, or fewer than `window` recent
 * steps): its profile stands as measured.
 */
export function observedSlowdown(o: { baselineMs: number | null; stepMs: readonly number[]; window: number; carried?: number }): number {
  const carried = o.carried ?? 1;
  if (o.baselineMs === null || !(o.baselineMs > 0) || o.stepMs.length < o.window) return carried;
  const ratio = medianOf(o.stepMs.slice(-o.window)) / o.baselineMs;
  return Number.isFinite(ratio) && ratio > 0 ? carried * ratio : carried;
}

/**
 * Profiles as the nodes run now: each node's compute (matmul, gather) divided
 * by its observed slowdown (`slowedProfile`), so a node measured fast at join
 * that has been running 3× slower since groups with the slow nodes. Nodes
 * without an entry in `slowdown` keep their profile.
 */
export function profilesAtObservedSpeed(profiles: readonly NodeProfile[], slowdown: ReadonlyMap<string, number> | Readonly<Record<string, number>>): NodeProfile[] {
  const of = (node: string) => (slowdown instanceof Map ? slowdown.get(node) : (slowdown as Readonly<Record<string, number>>)[node]);
  return profiles.map((p) => {
    const s = of(p.node);
    return s === undefined || s === 1 ? { ...p } : slowedProfile(p, s);
  });
}

export interface RegroupMove {
  node: string;
  /** Old group; null for a node that was in no group. */
  from: string | null;
  /** New group; null for a node that is in no group now. */
  to: string | null;
}

export interface RegroupPlan {
  /** Nodes whose group changes, by node name. */
  moves: RegroupMove[];
  /** Nodes that keep their group (under the new name). */
  stay: string[];
  /** Old group name → the new group that continues it (most shared members); absent for groups that dissolve. */
  continues: Record<string, string>;
  /** False when the new grouping has the same memberships (names aside): no regroup needed. */
  changed: boolean;
}

/**
 * Which nodes move between two groupings. Names are not identities (`g0` is
 * just "the fastest group now"), so new groups are matched to old ones by
 * shared members, greedily, largest overlap first (ties: old name, then new
 * name); a node moves when its new group is not the one continuing its old
 * group.
 */
export function regroupPlan(oldGroups: Grouping | readonly NodeGroup[], newGroups: Grouping | readonly NodeGroup[]): RegroupPlan {
  const olds = 'groups' in oldGroups ? oldGroups.groups : oldGroups;
  const news = 'groups' in newGroups ? newGroups.groups : newGroups;
  const oldOf = groupIndex(olds);
  const newOf = groupIndex(news);
  const pairs: { o: string; n: string; overlap: number }[] = [];
  for (const og of olds) {
    for (const ng of news) {
      const overlap = og.nodes.filter((x) => newOf.get(x) === ng.name).length;
      if (overlap > 0) pairs.push({ o: og.name, n: ng.name, overlap });
    }
  }
  pairs.sort((a, b) => b.overlap - a.overlap || cmp(a.o, b.o) || cmp(a.n, b.n));
  const continues: Record<string, string> = {};
  const taken = new Set<string>();
  for (const { o, n } of pairs) {
    if (o in continues || taken.has(n)) continue;
    continues[o] = n;
    taken.add(n);
  }
  const nodes = [...new Set([...oldOf.keys(), ...newOf.keys()])].sort(cmp);
  const moves: RegroupMove[] = [];
  const stay: string[] = [];
  for (const node of nodes) {
    const from = oldOf.get(node) ?? null;
    const to = newOf.get(node) ?? null;
    if (from !== null && to !== null && continues[from] === to) stay.push(node);
    else moves.push({ node, from, to });
  }
  const changed = moves.length > 0 || olds.length !== news.length;
  return { moves, stay, continues, changed };
}

function groupIndex(groups: readonly NodeGroup[]): Map<string, string> {
  const m = new Map<string, string>();
  for (const g of groups) for (const n of g.nodes) m.set(n, g.name);
  return m;
}

function cmp(a: string, b: string): number { return a < b ? -1 : a > b ? 1 : 0; }

/**
 * Whether a worker that is alive again after a dead verdict must be taken
 * back into its group by a re-form (job info `rejoining`): only a group that
 * reduces together (every mode but `async`) and has other members dropped
 * it; alone, or pushing on its own, it just goes on.
 */
export function needsRejoin(groups: readonly { name: string; nodes: readonly string[]; sync_mode: string }[], node: string): boolean {
  const g = groups.find((x) => x.nodes.includes(node));
  return g !== undefined && g.sync_mode !== 'async' && g.nodes.length > 1;
}

/**
 * Reducing groups left degraded with every member alive: a member's report
 * has said `degraded` for at least `afterMs` (since: the first of those
 * reports, monotonic ms; null: its latest report says otherwise) while the
 * health verdicts call every member of the group alive (`afterMs` per
 * group: a driver waits longer for a group it re-formed so before). Degraded by a dead
 * verdict, a group waits for the driver to re-form it; a driver that missed
 * the verdict's coming and going (a standby that took over after it, a
 * telemetry gap) would leave it async for the rest of the job. Sorted by name.
 */
export function strandedGroups(
  groups: readonly { name: string; nodes: readonly string[]; sync_mode: string }[],
  degradedSince: (node: string) => number | null, isAlive: (node: string) => boolean, now: number, afterMs: (group: string) => number,
): string[] {
  return groups.filter((g) => g.sync_mode !== 'async' && g.nodes.length > 1 && g.nodes.every(isAlive) && g.nodes.some((n) => {
    const since = degradedSince(n);
    return since !== null && now - since >= afterMs(g.name);
  })).map((g) => g.name).sort(cmp);
}

/** Who trains where: the job info's groups, active workers and standbys. */
export interface Membership<G extends { name: string; nodes: readonly string[] }> {
  groups: G[];
  workers: string[];
  standbys: string[];
}

/**
 * A standby worker takes the place of `dead` (fault_tolerance.standby_workers):
 * the first standby `isAlive` accepts goes into dead's group at its position
 * and among the workers; `dead` becomes a standby (should it come back, it
 * waits to take a place in turn). null when `dead` is in no group or no
 * standby is alive.
 */
export function standbyReplacement<G extends { name: string; nodes: readonly string[] }>(
  m: Membership<G>, dead: string, isAlive: (node: string) => boolean,
): { membership: Membership<G>; standby: string; group: string } | null {
  const g = m.groups.find((x) => x.nodes.includes(dead));
  if (g === undefined || !m.workers.includes(dead)) return null;
  const standby = m.standbys.find((s) => s !== dead && isAlive(s));
  if (standby === undefined) return null;
  const swap = (xs: readonly string[]) => xs.map((x) => (x === dead ? standby : x));
  return {
    standby,
    group: g.name,
    membership: {
      groups: m.groups.map((x) => (x === g ? { ...x, nodes: swap(x.nodes) } : x)),
      workers: swap(m.workers),
      standbys: [...m.standbys.filter((s) => s !== standby), dead],
    },
  };
}
