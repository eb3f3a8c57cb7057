/**
 * Hardware grouping: nodes of similar measured speed share a worker group
 * (synchronous inside, asynchronous between groups). As the article's §3.1
 * says, the grouping is by measurement, not by card model: compute, bandwidth,
 * memory and stability, clustered with a K-means variant into (usually) 3–5
 * groups. Plain functions over plain data; no I/O.
 *
 * Features (one per row, transformed, then standardised):
 * | feature     | from                                   | weight | noise floor |
 * |-------------|----------------------------------------|--------|-------------|
 * | matmul      | ln matmul_gflops                       | 1      | 0.10        |
 * | gather      | ln gather_rows_per_s                   | 1      | 0.10        |
 * | bandwidth   | ln bandwidth_mbps (see embedded below) | 1      | 0.20        |
 * | memory      | ln memory_gb                           | 0.5    | 0.10        |
 * | rtt         | ln max(rtt_ms, 10)                     | 0.5    | 0.30        |
 * | stability   | step_ms_variance ?? variance (CV)      | 0.5    | 0.05        |
 *
 * Why logs: speeds are ratios (an A100 is "3× a V100"), so 100 vs 200 GFLOP/s
 * must be as far apart as 10 vs 20; a log also makes the unit irrelevant
 * (GiB or MiB only shifts it). Compute gets two features because step time is
 * mostly compute; memory, latency and stability weigh half: they separate
 * nodes of like compute but should not outvote it.
 *
 * In-process (`link: 'embedded'`) nodes: their bandwidth is a memory copy
 * timed over well under a millisecond, so the number is mostly timer noise
 * (5 to 150 Gbit/s between runs). Grouping uses one nominal value for all of
 * them (EMBEDDED_BANDWIDTH_MBPS, faster than any network) and the rtt floor,
 * so an embedded job groups on compute and on emulated bandwidth only.
 *
 * Standardisation: z = weight × (x − mean) / max(sd, noise floor). Plain
 * z-scores would blow a feature that differs only by measurement noise (ten
 * identical boxes whose bandwidth jitters by 5%) up to the same weight as a
 * real 10× compute gap; dividing by at least the noise floor (in the feature's
 * own log units, so still unit-free) keeps such a feature small. A constant
 * feature (sd 0) contributes nothing: it is dropped.
 */
import { ConfigError } from '../runtime/errors.ts';
import { SeededRandom, type Random } from '../runtime/random.ts';
import { token } from '../runtime/subjects.ts';
import type { HetpsConfig, WorkerGroupConfig } from './config.ts';

// ---------------------------------------------------------------- types

/**
 * What grouping knows about a node: the device profile (`hetps profile`) plus
 * the network as seen from the node. Nulls mean "not measured".
 */
export interface NodeProfile {
  node: string;
  matmul_gflops: number;
  gather_rows_per_s: number;
  memory_gb: number;
  cpus: number;
  /** Execution providers ONNX Runtime lists on the node (`cpu`, `cuda`). */
  providers: string[];
  /** Coefficient of variation of repeated matmul runs at profile time. */
  variance: number;
  /** Client↔server throughput to the NATS cluster (or the emulated link). */
  bandwidth_mbps: number;
  /** Median small request/reply round trip through the NATS server. */
  rtt_ms: number;
  /** Coefficient of variation of training step times, once training has run; preferred over `variance`. */
  step_ms_variance: number | null;
  /** True when compute or bandwidth were scaled/overridden by the node's `emulate` settings. */
  emulated: boolean;
  /**
   * Where `bandwidth_mbps` comes from: `nats` measured to the NATS server,
   * `embedded` measured on the in-process bus (memory speed, not a network),
   * `emulated` the node's `emulate.bandwidth_mbps`; null: not said (a
   * hand-written file, taken as a real link).
   */
  link: 'nats' | 'embedded' | 'emulated' | null;
}

export type GroupingCriterion = 'silhouette' | 'fixed' | 'config';

/** A group's centre in natural units (geometric means for the logged features). */
export interface GroupCentroid {
  matmul_gflops: number;
  gather_rows_per_s: number;
  bandwidth_mbps: number;
  memory_gb: number;
  rtt_ms: number;
  variance: number;
}

export interface NodeGroup {
  /** `g0` is the fastest group (highest mean compute), `g1` the next, … */
  name: string;
  /** Sorted by name. */
  nodes: string[];
  /** null for groups that come from the YAML rather than from profiles. */
  centroid: GroupCentroid | null;
}

export interface FeatureStats {
  name: FeatureName;
  weight: number;
  mean: number;
  sd: number;
  /** What (x − mean) was divided by: max(sd, noise floor). */
  scale: number;
  /** True when the feature is constant across the nodes and so plays no part. */
  dropped: boolean;
}

export interface Grouping {
  k: number;
  criterion: GroupingCriterion;
  /** Mean silhouette coefficient of the chosen grouping; null when it is undefined (k = 1, or config groups). */
  score: number | null;
  /** Why this k, in words. */
  reason: string;
  /**
   * Every k tried with its silhouette (empty when k was not searched);
   * `refused` says why a k was not eligible: two of its groups differ by no
   * more than measurement noise on every feature.
   */
  candidates: { k: number; score: number; refused?: string }[];
  groups: NodeGroup[];
  /** How each feature was standardised (empty for config groups). */
  features: FeatureStats[];
}

export interface GroupingOptions {
  /** A fixed number of groups (clamped to the number of nodes); null: choose by silhouette within `kRange`. */
  k: number | null;
  /** Inclusive range searched when `k` is null; the article's experience is 3–5. */
  kRange: readonly [number, number];
  seed: number;
  /** K-means runs per k from different k-means++ seeds; the lowest inertia wins. */
  restarts: number;
  maxIterations: number;
}

export const DEFAULT_GROUPING_OPTIONS: GroupingOptions = { k: null, kRange: [3, 5], seed: 0, restarts: 10, maxIterations: 100 };

// ---------------------------------------------------------------- features

export type FeatureName = 'matmul' | 'gather' | 'bandwidth' | 'memory' | 'rtt' | 'stability';

/**
 * Round trips below this are one site to grouping (and keep ln finite): next to
 * a training step of tens to hundreds of ms, 0.2 against 8 ms is the noise of a
 * loaded machine, not a property of the node (on the tc-linked benchmark
 * cluster, the least round trip of like ~1 ms links measured up to 8.3 ms for
 * one of ten nodes joining at once on 2 cores, and split it off); a WAN link's
 * tens of ms is a property.
 */
export const RTT_FLOOR_MS = 10;
/** What grouping takes as the bandwidth of an in-process (`link: 'embedded'`) node: above any real link. */
export const EMBEDDED_BANDWIDTH_MBPS = 100_000;

interface FeatureSpec {
  name: FeatureName;
  weight: number;
  /** Smallest sd treated as a real difference, in the transformed unit. */
  noiseFloor: number;
  value: (p: NodeProfile) => number;
}

const FEATURES: readonly FeatureSpec[] = [
  { name: 'matmul', weight: 1, noiseFloor: 0.1, value: (p) => Math.log(p.matmul_gflops) },
  { name: 'gather', weight: 1, noiseFloor: 0.1, value: (p) => Math.log(p.gather_rows_per_s) },
  { name: 'bandwidth', weight: 1, noiseFloor: 0.2, value: (p) => Math.log(p.link === 'embedded' ? EMBEDDED_BANDWIDTH_MBPS : p.bandwidth_mbps) },
  { name: 'memory', weight: 0.5, noiseFloor: 0.1, value: (p) => Math.log(p.memory_gb) },
  { name: 'rtt', weight: 0.5, noiseFloor: 0.3, value: (p) => Math.log(p.link === 'embedded' ? RTT_FLOOR_MS : Math.max(p.rtt_ms, RTT_FLOOR_MS)) },
  { name: 'stability', weight: 0.5, noiseFloor: 0.05, value: (p) => p.step_ms_variance ?? p.variance },
];

/** Raw (transformed, unstandardised) feature rows, one per profile, in FEATURES order. */
function rawFeatures(profiles: readonly NodeProfile[]): number[][] {
  return profiles.map((p) => FEATURES.map((f) => f.value(p)));
}

function standardise(raw: readonly number[][]): { points: number[][]; stats: FeatureStats[] } {
  const n = raw.length;
  const stats = FEATURES.map((f, j): FeatureStats => {
    const mean = raw.reduce((a, r) => a + r[j]!, 0) / n;
    const sd = Math.sqrt(raw.reduce((a, r) => a + (r[j]! - mean) ** 2, 0) / n);
    // Relative to the mean's size so float noise in a constant column does not count.
    const dropped = sd <= 1e-12 * Math.max(1, Math.abs(mean));
    return { name: f.name, weight: f.weight, mean, sd, scale: Math.max(sd, f.noiseFloor), dropped };
  });
  const used = stats.map((s, j) => ({ s, j })).filter(({ s }) => !s.dropped);
  const points = raw.map((r) => used.map(({ s, j }) => (s.weight * (r[j]! - s.mean)) / s.scale));
  return { points, stats };
}

/** True when every feature's spread (an sd per feature, in the transformed unit) is within its measurement noise. */
function withinNoise(sd: readonly number[]): boolean {
  return FEATURES.every((f, j) => sd[j]! <= f.noiseFloor);
}

/** True when no feature differs across the nodes by more than its measurement noise. */
function nodesAlike(stats: readonly FeatureStats[]): boolean {
  return withinNoise(stats.map((s) => (s.dropped ? 0 : s.sd)));
}

/** The node indices of each of the k clusters of `assign` (a cluster may be empty). */
function membersOf(assign: readonly number[], k: number): number[][] {
  return Array.from({ length: k }, (_, c) => assign.map((_, i) => i).filter((i) => assign[i] === c));
}

/** The mean of the raw feature rows `idx`, per feature. */
function meanRow(raw: readonly number[][], idx: readonly number[]): number[] {
  return FEATURES.map((_, j) => idx.reduce((a, i) => a + raw[i]![j]!, 0) / idx.length);
}

/**
 * The first pair of groups of `assign` that differ by no more than measurement
 * noise on every feature, in words; null when every pair differs somewhere.
 * Two groups' centres taken as two points have an sd of half their distance,
 * so "within noise" is the nodes-alike test applied to the pair: |Δ| ≤ 2 ×
 * the feature's noise floor, in the transformed unit. Silhouette alone does
 * not see this: it is scale-free, so two tight pairs of like nodes whose links
 * the join probe measured 20.4 and 15.6 Mbit/s (ln ratio 0.27, a run of
 * bench:hetero on like 20 Mbit/s links) score above one group of four.
 */
function alikeGroups(sorted: readonly NodeProfile[], raw: readonly number[][], assign: readonly number[], k: number): string | null {
  const members = membersOf(assign, k).filter((m) => m.length > 0);
  const centre = members.map((m) => meanRow(raw, m));
  for (let a = 0; a < members.length; a++) {
    for (let b = a + 1; b < members.length; b++) {
      const gaps = FEATURES.map((f, j) => ({ f, gap: Math.abs(centre[a]![j]! - centre[b]![j]!) }));
      if (!withinNoise(gaps.map(({ gap }) => gap / 2))) continue;
      const widest = gaps.reduce((x, y) => (y.gap / y.f.noiseFloor > x.gap / x.f.noiseFloor ? y : x));
      const names = (m: number[]) => m.map((i) => sorted[i]!.node).join(',');
      return `groups [${names(members[a]!)}] and [${names(members[b]!)}] differ by no more than measurement noise on any feature (widest: ${widest.f.name} ${round(widest.gap, 3)} against ${round(2 * widest.f.noiseFloor, 3)})`;
    }
  }
  return null;
}

// ---------------------------------------------------------------- k-means

function dist2(a: readonly number[], b: readonly number[]): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += (a[i]! - b[i]!) ** 2;
  return s;
}

interface Clustering { assign: number[]; centers: number[][]; inertia: number }

/** k-means++ seeding: each next centre is drawn with probability ∝ squared distance to the nearest chosen one. */
function seedCenters(points: readonly number[][], k: number, rng: Random): number[][] {
  const n = points.length;
  const chosen = new Set<number>();
  const first = rng.int(n);
  chosen.add(first);
  const centers = [[...points[first]!]];
  const d2 = points.map((p) => dist2(p, points[first]!));
  while (centers.length < k) {
    const total = d2.reduce((a, b) => a + b, 0);
    let pick = -1;
    if (total > 0) {
      let r = rng.next() * total;
      for (let i = 0; i < n; i++) {
        if (d2[i]! <= 0) continue;
        r -= d2[i]!;
        if (r < 0) { pick = i; break; }
      }
      // Float round-off can leave r ≥ 0 after the loop: take the last point with mass.
      if (pick < 0) for (let i = n - 1; i >= 0; i--) if (d2[i]! > 0) { pick = i; break; }
    } else {
      // Every point coincides with a centre (duplicates): any unchosen point will do.
      const rest = [...Array(n).keys()].filter((i) => !chosen.has(i));
      pick = rest[rng.int(rest.length)]!;
    }
    chosen.add(pick);
    centers.push([...points[pick]!]);
    for (let i = 0; i < n; i++) d2[i] = Math.min(d2[i]!, dist2(points[i]!, points[pick]!));
  }
  return centers;
}

function lloyd(points: readonly number[][], initial: number[][], maxIterations: number): Clustering {
  const n = points.length;
  const k = initial.length;
  const dim = points[0]!.length;
  let centers = initial;
  let assign = new Array<number>(n).fill(-1);
  for (let iter = 0; iter < maxIterations; iter++) {
    const next = points.map((p) => {
      let best = 0;
      let bestD = Infinity;
      for (let c = 0; c < k; c++) {
        const d = dist2(p, centers[c]!);
        if (d < bestD) { bestD = d; best = c; } // ties go to the lower index: deterministic
      }
      return best;
    });
    fillEmptyClusters(points, next, centers, k);
    const changed = next.some((c, i) => c !== assign[i]);
    assign = next;
    centers = Array.from({ length: k }, (_, c) => {
      const sum = new Array<number>(dim).fill(0);
      let count = 0;
      for (let i = 0; i < n; i++) {
        if (assign[i] !== c) continue;
        count++;
        for (let d = 0; d < dim; d++) sum[d]! += points[i]![d]!;
      }
      return sum.map((s) => s / count);
    });
    if (!changed) break;
  }
  const inertia = points.reduce((a, p, i) => a + dist2(p, centers[assign[i]!]!), 0);
  return { assign, centers, inertia };
}

/**
 * A cluster left empty takes the point farthest from its own centre among
 * clusters with more than one member, so k-means always returns k groups
 * (n ≥ k is guaranteed by the caller).
 */
function fillEmptyClusters(points: readonly number[][], assign: number[], centers: number[][], k: number): void {
  const sizes = new Array<number>(k).fill(0);
  for (const c of assign) sizes[c]!++;
  for (let c = 0; c < k; c++) {
    if (sizes[c]! > 0) continue;
    let far = -1;
    let farD = -1;
    for (let i = 0; i < points.length; i++) {
      if (sizes[assign[i]!]! < 2) continue;
      const d = dist2(points[i]!, centers[assign[i]!]!);
      if (d > farD) { farD = d; far = i; }
    }
    sizes[assign[far]!]!--;
    assign[far] = c;
    sizes[c] = 1;
    centers[c] = [...points[far]!];
  }
}

/** Best of `restarts` k-means++ runs by inertia; a tie keeps the earlier run. */
function kmeans(points: readonly number[][], k: number, rng: Random, restarts: number, maxIterations: number): Clustering {
  let best: Clustering | null = null;
  for (let r = 0; r < restarts; r++) {
    const run = lloyd(points, seedCenters(points, k, rng), maxIterations);
    if (!best || run.inertia < best.inertia - 1e-12 * Math.max(1, best.inertia)) best = run;
  }
  return best!;
}

// ---------------------------------------------------------------- silhouette

/**
 * Mean silhouette coefficient (Rousseeuw 1987): for each node, a = mean
 * distance to the rest of its group, b = mean distance to the nearest other
 * group, s = (b − a) / max(a, b). A node alone in its group scores 0, so
 * k = n scores 0. Undefined for k = 1.
 */
export function silhouette(dist: readonly (readonly number[])[], assign: readonly number[], k: number): number {
  const n = assign.length;
  const sizes = new Array<number>(k).fill(0);
  for (const c of assign) sizes[c]!++;
  let total = 0;
  for (let i = 0; i < n; i++) {
    const own = assign[i]!;
    if (sizes[own]! < 2) continue;
    const sums = new Array<number>(k).fill(0);
    for (let j = 0; j < n; j++) if (j !== i) sums[assign[j]!]! += dist[i]![j]!;
    const a = sums[own]! / (sizes[own]! - 1);
    let b = Infinity;
    for (let c = 0; c < k; c++) if (c !== own && sizes[c]! > 0) b = Math.min(b, sums[c]! / sizes[c]!);
    const m = Math.max(a, b);
    total += m > 0 ? (b - a) / m : 0;
  }
  return total / n;
}

// ---------------------------------------------------------------- grouping

/**
 * Groups nodes by their profiles.
 *
 * Choosing k (when `opts.k` is null): k-means is run for every k in
 * `kRange` and the k with the highest mean silhouette wins; a tie (within
 * 1e-9) goes to the smaller k, since every extra group adds inter-group
 * staleness. The upper end is clamped to n; the lower end to n/2 (but at
 * least 2), so a small cluster is not forced into groups of one: 4 nodes that
 * are 2 fast + 2 slow get k = 2 even with the default 3–5 (k = n still scores
 * 0, so it wins only when nothing else scores above 0). A k is not eligible
 * when two of its groups differ by no more than measurement noise on every
 * feature (`alikeGroups`): that split is of noise, however high it scores.
 * When no k in the range is eligible, the best eligible k below it is taken,
 * else one group. k = 1 has no silhouette: it is chosen
 * when there is one node, or when the nodes are alike (no feature's spread
 * exceeds its noise floor) — then any split would be a split of noise.
 *
 * Deterministic for a seed and independent of the input order (nodes are
 * sorted by name before clustering).
 */
export function groupNodes(profiles: readonly NodeProfile[], options: Partial<GroupingOptions> = {}): Grouping {
  const opts = { ...DEFAULT_GROUPING_OPTIONS, ...options };
  checkOptions(opts);
  checkProfiles(profiles);
  const sorted = [...profiles].sort((a, b) => (a.node < b.node ? -1 : a.node > b.node ? 1 : 0));
  const n = sorted.length;
  const raw = rawFeatures(sorted);
  const { points, stats } = standardise(raw);
  const dist = points.map((p) => points.map((q) => Math.sqrt(dist2(p, q))));
  const rng = new SeededRandom(opts.seed);
  const cluster = (k: number): number[] => (k === 1 ? new Array<number>(n).fill(0) : kmeans(points, k, rng.fork(`k=${k}`), opts.restarts, opts.maxIterations).assign);
  const finish = (k: number, assign: number[], criterion: GroupingCriterion, score: number | null, reason: string, candidates: Grouping['candidates']): Grouping => ({
    k, criterion, score: score === null ? null : round(score, 4), reason, candidates, groups: nameGroups(sorted, raw, assign, k), features: stats,
  });

  if (opts.k !== null) {
    const k = Math.min(opts.k, n);
    const assign = cluster(k);
    const reason = k < opts.k ? `fixed by the caller: asked ${opts.k}, clamped to the ${n} node${n === 1 ? '' : 's'} there are` : `fixed by the caller: ${k}`;
    return finish(k, assign, 'fixed', k >= 2 ? silhouette(dist, assign, k) : null, reason, []);
  }
  if (n === 1) return finish(1, [0], 'silhouette', null, 'one node: one group', []);
  if (nodesAlike(stats)) return finish(1, cluster(1), 'silhouette', null, 'nodes alike: no feature differs by more than its measurement noise, so one group', []);

  // Small clusters: the lower end drops to n/2 so the range cannot force groups of one.
  const lo = Math.max(2, Math.min(opts.kRange[0], Math.floor(n / 2)));
  const hi = Math.min(opts.kRange[1], n);
  if (hi < 2) return finish(1, cluster(1), 'silhouette', null, `k range ${opts.kRange[0]}–${opts.kRange[1]} allows only one group`, []);
  const candidates: Grouping['candidates'] = [];
  const search = (from: number, to: number) => {
    let best: { k: number; assign: number[]; score: number } | null = null;
    for (let k = from; k <= to; k++) {
      const assign = cluster(k);
      const score = silhouette(dist, assign, k);
      const refused = alikeGroups(sorted, raw, assign, k);
      candidates.push(refused === null ? { k, score: round(score, 4) } : { k, score: round(score, 4), refused });
      if (refused === null && (!best || score > best.score + 1e-9)) best = { k, assign, score };
    }
    return best;
  };
  const best = search(lo, hi);
  if (best) {
    const refused = candidates.filter((c) => c.refused).map((c) => c.k);
    const others = refused.length ? `; k=${refused.join(', ')} refused: groups within measurement noise of each other` : '';
    const reason = lo === hi
      ? `k=${best.k}: the only k tried for ${n} nodes (range ${opts.kRange[0]}–${opts.kRange[1]})`
      : `k=${best.k}: highest mean silhouette (${round(best.score, 3)}) of k=${lo}..${hi}${others}`;
    return finish(best.k, best.assign, 'silhouette', best.score, reason, candidates);
  }
  // Every k in the range splits alike nodes apart: fewer groups than the range asks, down to one.
  const below = lo > 2 ? search(2, lo - 1) : null;
  if (below) {
    return finish(below.k, below.assign, 'silhouette', below.score,
      `k=${below.k}: every k in ${lo}..${hi} put two groups within measurement noise of each other, so fewer groups; highest mean silhouette (${round(below.score, 3)}) of k=2..${lo - 1}`, candidates);
  }
  const tried = candidates.map((c) => c.k);
  return finish(1, cluster(1), 'silhouette', null, `every k tried (${Math.min(...tried)}..${Math.max(...tried)}) put two groups within measurement noise of each other: one group`, candidates);
}

/** Groups named by speed: `g0` has the highest mean ln(matmul)+ln(gather); ties go to the smaller first node name. */
function nameGroups(sorted: readonly NodeProfile[], raw: readonly number[][], assign: readonly number[], k: number): NodeGroup[] {
  const parts = membersOf(assign, k);
  const speed = (idx: number[]) => idx.reduce((a, i) => a + raw[i]![0]! + raw[i]![1]!, 0) / idx.length;
  const ordered = parts
    .filter((idx) => idx.length > 0)
    .map((idx) => ({ idx, speed: speed(idx), first: sorted[idx[0]!]!.node }))
    .sort((a, b) => b.speed - a.speed || (a.first < b.first ? -1 : a.first > b.first ? 1 : 0));
  return ordered.map(({ idx }, g) => ({
    name: `g${g}`,
    nodes: idx.map((i) => sorted[i]!.node),
    centroid: centroidOf(meanRow(raw, idx)),
  }));
}

/** A group's centre in natural units from its mean feature row (geometric means for the logged features). */
function centroidOf(mean: readonly number[]): GroupCentroid {
  const geo = (j: number) => round(Math.exp(mean[j]!), 4, true);
  return {
    matmul_gflops: geo(0),
    gather_rows_per_s: geo(1),
    bandwidth_mbps: geo(2),
    memory_gb: geo(3),
    rtt_ms: geo(4),
    variance: round(mean[5]!, 4),
  };
}

function round(x: number, digits: number, significant = false): number {
  if (!Number.isFinite(x) || x === 0) return x;
  return significant ? +x.toPrecision(digits) : +x.toFixed(digits);
}

function checkOptions(o: GroupingOptions): void {
  if (o.k !== null && !(Number.isInteger(o.k) && o.k >= 1)) throw new ConfigError(`k must be an integer ≥ 1 (or null to choose it), got ${o.k}`);
  const [lo, hi] = o.kRange;
  if (!(Number.isInteger(lo) && Number.isInteger(hi) && lo >= 1 && lo <= hi)) throw new ConfigError(`kRange must be two integers 1 ≤ lo ≤ hi, got [${lo}, ${hi}]`);
  if (!(Number.isInteger(o.restarts) && o.restarts >= 1)) throw new ConfigError(`restarts must be an integer ≥ 1, got ${o.restarts}`);
  if (!(Number.isInteger(o.maxIterations) && o.maxIterations >= 1)) throw new ConfigError(`maxIterations must be an integer ≥ 1, got ${o.maxIterations}`);
}

function checkProfiles(profiles: readonly NodeProfile[]): void {
  if (profiles.length === 0) throw new ConfigError('no node profiles to group');
  const issues = profiles.flatMap((p, i) => profileIssues(p, i));
  const seen = new Map<string, number>();
  profiles.forEach((p, i) => {
    const prev = seen.get(p.node);
    if (prev !== undefined) issues.push(`[${i}].node ${JSON.stringify(p.node)} repeats [${prev}].node; node names must be unique`);
    else seen.set(p.node, i);
  });
  if (issues.length) throw new ConfigError(`bad node profiles:\n  ${issues.join('\n  ')}`, { data: { issues } });
}

// ---------------------------------------------------------------- validation

function describe(v: unknown): string {
  if (v === undefined) return 'nothing';
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'object') return 'a mapping';
  if (typeof v === 'string') return `${JSON.stringify(v)} (a string)`;
  return String(v);
}

type Check = (v: unknown) => string | null;
const positive: Check = (v) => (typeof v === 'number' && Number.isFinite(v) && v > 0 ? null : 'a number > 0');
const nonNegative: Check = (v) => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? null : 'a number ≥ 0');
const positiveInt: Check = (v) => (typeof v === 'number' && Number.isInteger(v) && v >= 1 ? null : 'a positive integer');
const stringList: Check = (v) => (Array.isArray(v) && v.every((x) => typeof x === 'string' && x.length > 0) ? null : 'a list of provider names (strings)');

const REQUIRED: Record<string, Check> = {
  matmul_gflops: positive,
  gather_rows_per_s: positive,
  memory_gb: positive,
  cpus: positiveInt,
  providers: stringList,
  variance: nonNegative,
  bandwidth_mbps: positive,
  rtt_ms: nonNegative,
};

/** Problems with one profile, each naming the index and field: `[3].rtt_ms must be a number ≥ 0, got "x" (a string)`. */
function profileIssues(p: unknown, i: number): string[] {
  if (typeof p !== 'object' || p === null || Array.isArray(p)) return [`[${i}] must be a mapping (a node profile), got ${describe(p)}`];
  const o = p as Record<string, unknown>;
  const issues: string[] = [];
  const where = typeof o.node === 'string' && o.node ? ` (node ${JSON.stringify(o.node)})` : '';
  if (typeof o.node !== 'string' || o.node.length === 0) issues.push(`[${i}].node ${o.node === undefined ? 'is required' : `must be a non-empty string, got ${describe(o.node)}`}`);
  else {
    try { token(o.node, 'node name'); } catch (e) { issues.push(`[${i}].node: ${(e as Error).message}`); }
  }
  for (const [field, check] of Object.entries(REQUIRED)) {
    const v = o[field];
    if (v === undefined) { issues.push(`[${i}].${field}${where} is required`); continue; }
    const want = check(v);
    if (want) issues.push(`[${i}].${field}${where} must be ${want}, got ${describe(v)}`);
  }
  if (o.step_ms_variance !== undefined && o.step_ms_variance !== null && nonNegative(o.step_ms_variance)) {
    issues.push(`[${i}].step_ms_variance${where} must be a number ≥ 0 or null, got ${describe(o.step_ms_variance)}`);
  }
  if (o.emulated !== undefined && typeof o.emulated !== 'boolean') issues.push(`[${i}].emulated${where} must be true or false, got ${describe(o.emulated)}`);
  if (o.link !== undefined && o.link !== null && !['nats', 'embedded', 'emulated'].includes(o.link as string)) issues.push(`[${i}].link${where} must be "nats", "embedded", "emulated" or null, got ${describe(o.link)}`);
  return issues;
}

/**
 * Validates parsed JSON (an array of `hetps profile --json` objects plus
 * `bandwidth_mbps` and `rtt_ms`) into profiles. Every problem is reported in
 * one ConfigError, each naming the index and the field. Unknown fields are
 * ignored; missing optional ones get `step_ms_variance: null`,
 * `emulated: false`, `link: null`.
 */
export function parseNodeProfiles(raw: unknown, source: string): NodeProfile[] {
  if (!Array.isArray(raw)) throw new ConfigError(`${source} must hold a JSON array of node profiles, got ${describe(raw)}`, { data: { file: source } });
  if (raw.length === 0) throw new ConfigError(`${source} holds no node profiles (an empty array)`, { data: { file: source } });
  const issues = raw.flatMap((p, i) => profileIssues(p, i));
  const seen = new Map<string, number>();
  raw.forEach((p, i) => {
    const node = (p as { node?: unknown } | null)?.node;
    if (typeof node !== 'string') return;
    const prev = seen.get(node);
    if (prev !== undefined) issues.push(`[${i}].node ${JSON.stringify(node)} repeats [${prev}].node; node names must be unique`);
    else seen.set(node, i);
  });
  if (issues.length) {
    const head = `${source}: ${issues.length} problem${issues.length === 1 ? '' : 's'} in the node profiles`;
    throw new ConfigError(`${head}:\n  ${issues.join('\n  ')}`, { data: { file: source, issues } });
  }
  return (raw as Record<string, unknown>[]).map((o) => ({
    node: o.node as string,
    matmul_gflops: o.matmul_gflops as number,
    gather_rows_per_s: o.gather_rows_per_s as number,
    memory_gb: o.memory_gb as number,
    cpus: o.cpus as number,
    providers: [...(o.providers as string[])],
    variance: o.variance as number,
    bandwidth_mbps: o.bandwidth_mbps as number,
    rtt_ms: o.rtt_ms as number,
    step_ms_variance: (o.step_ms_variance as number | null | undefined) ?? null,
    emulated: (o.emulated as boolean | undefined) ?? false,
    link: (o.link as NodeProfile['link'] | undefined) ?? null,
  }));
}

// ---------------------------------------------------------------- the YAML's groups

/**
 * The worker groups the YAML lists, as a Grouping (criterion `config`), or
 * null when it lists none. Groups written by hand win over measured ones: an
 * operator who names groups knows something the profiles do not.
 */
export function groupsFromConfig(config: HetpsConfig): Grouping | null {
  const groups = config.cluster.worker_groups;
  if (groups.length === 0) return null;
  return {
    k: groups.length,
    criterion: 'config',
    score: null,
    reason: `the ${groups.length} worker group${groups.length === 1 ? '' : 's'} listed in ${config.source.file}`,
    candidates: [],
    groups: groups.map((g) => ({ name: g.name, nodes: [...g.nodes], centroid: null })),
    features: [],
  };
}

/** The YAML's groups when it lists any, else groups measured from `profiles`. */
export function planGroups(config: HetpsConfig, profiles: readonly NodeProfile[], options: Partial<GroupingOptions> = {}): Grouping {
  return groupsFromConfig(config) ?? groupNodes(profiles, options);
}

/** The grouping options `cluster.grouping` asks for (k fixed, or chosen in k_range; the seed). */
export function groupingOptionsFromConfig(config: HetpsConfig): Partial<GroupingOptions> {
  const g = config.cluster.grouping;
  return { k: g.k, kRange: [g.k_range[0], g.k_range[1]], seed: g.seed };
}

/**
 * True when hps groups this job's workers by their measured profiles at start:
 * the YAML lists no worker_groups (they would override measurement).
 */
export function groupsMeasuredAtStart(config: HetpsConfig): boolean {
  return config.training.mode === 'hps' && groupsFromConfig(config) === null;
}

// ---------------------------------------------------------------- sync settings of measured groups

/** A group's compute speed: the geometric mean of its centroid's matmul GFLOP/s and gather rows/s (the order `g0`, `g1`, … follows). */
export function groupSpeed(centroid: GroupCentroid): number {
  return Math.sqrt(centroid.matmul_gflops * centroid.gather_rows_per_s);
}

export interface SyncSettingsOptions {
  /** sync_steps of the fastest group (`cluster.grouping.sync_steps`). */
  syncSteps: number;
  /** The slowest group goes async below this share of the fastest group's speed; 0: never. */
  asyncBelow: number;
}

export const DEFAULT_SYNC_SETTINGS: SyncSettingsOptions = { syncSteps: 4, asyncBelow: 0.25 };

/**
 * Sync settings for measured groups. With r = a group's speed / the fastest
 * group's (`groupSpeed` of the centroids, to 3 decimals):
 * - the fastest group: `sync`, `syncSteps`;
 * - the slowest group, when there are at least two and r < `asyncBelow`:
 *   `async` (so much slower that a barrier buys nothing: its updates arrive
 *   stale whatever it does);
 * - every other group: `sync` every max(1, round(syncSteps · r)) steps, so
 *   every group's window takes about the same wall time: a group 2/3 as fast
 *   takes 1.5 × as long a step and syncs every 3 steps to the fastest
 *   group's 4.
 *
 * A window's wall time is how stale a group's update is when it reaches the
 * shards, against the other groups' (its steps are computed from the
 * parameters pulled when it started). The article's hand-written example
 * syncs its slower V100s *less* often (every 6 to the A100s' 4, to save
 * exchanges); then their windows last 2.25 × as long, and on the
 * heterogeneity benchmark's cluster that costs final AUC: with the
 * benchmark's medium class (0.6 × as fast) syncing every 6, 2 or 1 steps
 * beside the fast class' 4, hps_config ended at 0.7176 / 0.7209 / 0.7257
 * without the group learning-rate rule and 0.7220 / 0.7253 / 0.7258 with
 * sqrt (medians of 1–3 runs; ctr, tc links,
 * `bench/results/hetero-explore.json` block 14).
 * Groups are returned fastest first. Throws for groups without a centroid (the YAML's).
 */
export function syncSettingsForGroups(groups: Grouping | readonly NodeGroup[], options: Partial<SyncSettingsOptions> = {}): WorkerGroupConfig[] {
  const o = { ...DEFAULT_SYNC_SETTINGS, ...options };
  if (!(Number.isInteger(o.syncSteps) && o.syncSteps >= 1)) throw new ConfigError(`syncSteps must be an integer ≥ 1, got ${o.syncSteps}`);
  if (!(o.asyncBelow >= 0 && o.asyncBelow < 1)) throw new ConfigError(`asyncBelow must be in [0, 1), got ${o.asyncBelow}`);
  const list = 'groups' in groups ? groups.groups : groups;
  if (list.length === 0) return [];
  const speeds = list.map((g) => {
    if (g.centroid === null) throw new ConfigError(`group ${g.name} has no measured centroid: sync settings come from the YAML for groups written there`);
    return { g, speed: groupSpeed(g.centroid) };
  }).sort((a, b) => b.speed - a.speed); // stable: equal speeds keep their order
  const fastest = speeds[0]!.speed;
  return speeds.map(({ g, speed }, i): WorkerGroupConfig => {
    // To 3 decimals: profiles are rounded (GFLOP/s to 0.01, rows/s to 1), so a speed-0.25 node must not read as 0.2499.
    const r = fastest > 0 ? round(speed / fastest, 3) : 1;
    const base = { name: g.name, nodes: [...g.nodes], accumulation_steps: null, adaptive_threshold: null };
    if (i > 0 && i === speeds.length - 1 && r < o.asyncBelow) return { ...base, sync_mode: 'async', sync_steps: null };
    const steps = i === 0 ? o.syncSteps : Math.max(1, Math.round(o.syncSteps * r));
    return { ...base, sync_mode: 'sync', sync_steps: steps };
  });
}
