/**
 * Where the replicas of each shard live, and how that changes when a server
 * dies or comes back: plain functions over the shard plan, so the scheduler
 * (which writes plans), the shard hosts (which follow them) and the tests
 * agree on one rule.
 *
 * A shard is a primary plus `backup_factor` backups, each on a different
 * server node. Every change is a new plan version (the epoch): requests name
 * the version they were routed by, and a replica refuses any other one, so a
 * deposed primary can never apply an update under an old epoch.
 *
 * A new backup first appears as `seeding`: it receives a snapshot and then
 * the stream of updates, but the primary does not wait for it; once it has
 * caught up, a later plan moves it to `backups`. The same handover serves a
 * live migration of a hot shard (seed the target, then make it primary).
 */
import { ConfigError } from '../runtime/errors.ts';

/** The replicas of one shard, by server node name. */
export interface ShardReplicas {
  primary: string;
  /** Live, caught-up backups: the primary replies only after each applied an update. */
  backups: string[];
  /** Backups being seeded (snapshot, then the updates since); not waited for. */
  seeding: string[];
}

/** What a plan's placement must say: every shard's replicas, on the server nodes. */
export interface ReplicaPlacement {
  /** The server nodes the job may place replicas on. */
  servers: string[];
  /** By shard name. */
  replicas: Record<string, ShardReplicas>;
  /**
   * The plan version the job's replicas all started under, from the job's
   * initial values: a replica created under it needs no seed; one created
   * later (a node that joined or came back mid-job) waits for its primary's.
   */
  initial_version?: number;
}

/**
 * The placement of a fresh job: shard i's primary on its own server (shard
 * names are server names at start), its k-th backup on server i+k (a ring),
 * so every server holds the same number of replicas and no two replicas of a
 * shard share a node.
 */
export function placeReplicas(shards: readonly string[], servers: readonly string[], backupFactor: number): ReplicaPlacement {
  if (!Number.isInteger(backupFactor) || backupFactor < 0) throw new ConfigError(`fault_tolerance.backup_factor must be a non-negative integer, got ${backupFactor}`);
  if (backupFactor > 0 && backupFactor >= servers.length) {
    throw new ConfigError(`fault_tolerance.backup_factor ${backupFactor} needs at least ${backupFactor + 1} server nodes (one per replica), the cluster has ${servers.length}: lower backup_factor or add servers to cluster.server_nodes`);
  }
  const replicas: Record<string, ShardReplicas> = {};
  shards.forEach((shard, i) => {
    const home = servers.includes(shard) ? servers.indexOf(shard) : i % servers.length;
    const backups: string[] = [];
    for (let k = 1; k <= backupFactor; k++) backups.push(servers[(home + k) % servers.length]!);
    replicas[shard] = { primary: servers[home]!, backups, seeding: [] };
  });
  return { servers: [...servers], replicas };
}

/** The default backup factor: 1 when there are two or more servers, else 0. */
export function defaultBackupFactor(servers: number, configured: number | undefined): number {
  return configured ?? (servers >= 2 ? 1 : 0);
}

/** Checks a placement against the plan's shards (every shard placed, distinct nodes, known servers). */
export function validatePlacement(where: string, shards: readonly string[], p: ReplicaPlacement): void {
  const servers = new Set(p.servers);
  if (servers.size === 0) throw new ConfigError(`${where}: placement lists no server nodes`);
  for (const shard of shards) {
    const r = p.replicas[shard];
    if (r === undefined) throw new ConfigError(`${where}: shard ${shard} has no replicas in the placement`);
    const nodes = [r.primary, ...r.backups, ...r.seeding];
    for (const n of nodes) if (!servers.has(n)) throw new ConfigError(`${where}: shard ${shard} has a replica on ${n}, which is not one of the server nodes (${p.servers.join(', ')})`);
    if (new Set(nodes).size !== nodes.length) throw new ConfigError(`${where}: shard ${shard} has two replicas on one node (${nodes.join(', ')})`);
  }
  for (const shard of Object.keys(p.replicas)) if (!shards.includes(shard)) throw new ConfigError(`${where}: placement names shard ${shard}, which is not in the plan`);
}

/** Every node holding a replica of `shard`: primary first, then backups, then the ones seeding. */
export function replicaNodes(r: ShardReplicas): string[] {
  return [r.primary, ...r.backups, ...r.seeding];
}

export type ReplicaRole = 'primary' | 'backup' | 'seeding';

/** The role `node` has for `shard` under `p`, or null when it holds no replica of it. */
export function roleOf(p: ReplicaPlacement, shard: string, node: string): ReplicaRole | null {
  const r = p.replicas[shard];
  if (r === undefined) return null;
  if (r.primary === node) return 'primary';
  if (r.backups.includes(node)) return 'backup';
  if (r.seeding.includes(node)) return 'seeding';
  return null;
}

/** The shards `node` holds a replica of, with its role in each. */
export function replicasOn(p: ReplicaPlacement, node: string): { shard: string; role: ReplicaRole }[] {
  const out: { shard: string; role: ReplicaRole }[] = [];
  for (const shard of Object.keys(p.replicas)) {
    const role = roleOf(p, shard, node);
    if (role !== null) out.push({ shard, role });
  }
  return out;
}

function clonePlacement(p: ReplicaPlacement): ReplicaPlacement {
  const replicas: Record<string, ShardReplicas> = {};
  for (const [s, r] of Object.entries(p.replicas)) replicas[s] = { primary: r.primary, backups: [...r.backups], seeding: [...r.seeding] };
  return { servers: [...p.servers], replicas, ...(p.initial_version !== undefined ? { initial_version: p.initial_version } : {}) };
}

export interface FailoverChange {
  shard: string;
  /** The dead primary and the backup promoted in its place. */
  promoted: { from: string; to: string } | null;
  /** Backups (or seeding ones) dropped because their node is dead. */
  dropped: string[];
}

export interface FailoverResult {
  placement: ReplicaPlacement;
  changes: FailoverChange[];
  /** Shards whose every replica is dead: nothing could be promoted; their primary is left as it was. */
  lost: string[];
  /** Shards with a dead primary whose live backups have not answered yet (`answered`): none promoted now; decide again later. */
  waiting: string[];
}

/**
 * The promotion rule. For every shard with a replica on a dead node: a dead
 * primary is replaced by a live backup (never a seeding replica: only a
 * caught-up backup has every acknowledged update) — the one that applied the
 * most of the old primary's stream (`applied(shard, node)`, its last update
 * number; unknown counts as none, ties go to the plan's order). The other
 * live backups stay backups: every acknowledged update is on each of them,
 * and the new primary sends them what they lack of its own stream (or seeds
 * one it cannot catch up). Dead backups and seeding replicas are dropped.
 * With `answered`, only a backup whose replica answered is promoted: one on a
 * server that is still starting holds nothing yet, so a shard whose live
 * backups have all not answered is left `waiting` (the caller decides again
 * shortly) rather than handed to an empty replica.
 * Null when nothing changes.
 */
export function failover(
  p: ReplicaPlacement, dead: ReadonlySet<string>, applied: (shard: string, node: string) => number | null = () => null,
  answered: ((shard: string, node: string) => boolean) | null = null,
): FailoverResult | null {
  const next = clonePlacement(p);
  const changes: FailoverChange[] = [];
  const lost: string[] = [];
  const waiting: string[] = [];
  for (const [shard, r] of Object.entries(next.replicas)) {
    const dropped = [...r.backups, ...r.seeding].filter((n) => dead.has(n));
    let promoted: FailoverChange['promoted'] = null;
    const liveBackups = r.backups.filter((n) => !dead.has(n));
    if (dead.has(r.primary)) {
      if (liveBackups.length === 0) { lost.push(shard); continue; }
      // Only a backup whose replica answers holds the shard (one on a server still starting has nothing yet).
      const candidates = answered === null ? liveBackups : liveBackups.filter((n) => answered(shard, n));
      if (candidates.length === 0) { waiting.push(shard); continue; }
      let best = candidates[0]!;
      for (const n of candidates) if ((applied(shard, n) ?? -1) > (applied(shard, best) ?? -1)) best = n;
      promoted = { from: r.primary, to: best };
      r.primary = best;
      r.backups = liveBackups.filter((n) => n !== best);
    } else {
      r.backups = liveBackups;
    }
    r.seeding = r.seeding.filter((n) => !dead.has(n));
    if (promoted !== null || dropped.length > 0) changes.push({ shard, promoted, dropped });
  }
  if (changes.length === 0) return lost.length || waiting.length ? { placement: p, changes, lost, waiting } : null;
  return { placement: next, changes, lost, waiting };
}

/**
 * New backups for shards below `backupFactor` replicas (counting the ones
 * seeding): each goes to the live server with the fewest replicas that holds
 * none of that shard. Null when no shard needs one or no server can take it.
 */
export function rereplicate(p: ReplicaPlacement, live: ReadonlySet<string>, backupFactor: number): { placement: ReplicaPlacement; added: { shard: string; node: string }[] } | null {
  const next = clonePlacement(p);
  const load = new Map(next.servers.filter((s) => live.has(s)).map((s) => [s, 0]));
  for (const r of Object.values(next.replicas)) for (const n of replicaNodes(r)) if (load.has(n)) load.set(n, load.get(n)! + 1);
  const added: { shard: string; node: string }[] = [];
  for (const shard of Object.keys(next.replicas).sort()) {
    const r = next.replicas[shard]!;
    while (r.backups.length + r.seeding.length < backupFactor) {
      const holders = new Set(replicaNodes(r));
      let best: string | null = null;
      for (const [n, c] of load) if (!holders.has(n) && (best === null || c < load.get(best)! || (c === load.get(best)! && n < best))) best = n;
      if (best === null) break;
      r.seeding.push(best);
      load.set(best, load.get(best)! + 1);
      added.push({ shard, node: best });
    }
  }
  return added.length ? { placement: next, added } : null;
}

/** Moves `node` from seeding to the backups of `shard` (it has caught up); null when it is not seeding there. */
export function promoteSeeded(p: ReplicaPlacement, shard: string, node: string): ReplicaPlacement | null {
  return moveReplica(p, shard, node, 'seeding', 'backups');
}

/**
 * Moves `node` from the backups of `shard` back to seeding: its primary
 * cannot seed it (a restarted backup whose shard's state no longer fits one
 * message), so it holds no copy, and a failover must not promote it. Null
 * when it is not a backup there.
 */
export function demoteToSeeding(p: ReplicaPlacement, shard: string, node: string): ReplicaPlacement | null {
  return moveReplica(p, shard, node, 'backups', 'seeding');
}

/** A copy of `p` with `node` moved from one list of `shard`'s replicas to the other; null when it is not in `from`. */
function moveReplica(p: ReplicaPlacement, shard: string, node: string, from: 'seeding' | 'backups', to: 'seeding' | 'backups'): ReplicaPlacement | null {
  if (!p.replicas[shard]?.[from].includes(node)) return null;
  const next = clonePlacement(p);
  const n = next.replicas[shard]!;
  n[from] = n[from].filter((x) => x !== node);
  n[to].push(node);
  return next;
}

/** What a failover of `node` could lose right now: the shards whose only replica it holds (no backup), by name. */
export function unprotectedShards(p: ReplicaPlacement): string[] {
  return Object.entries(p.replicas).filter(([, r]) => r.backups.length === 0).map(([s]) => s).sort();
}
