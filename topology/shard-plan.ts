/**
 * Where parameters live: dense parameters cut into blocks, sparse ids hashed
 * into partitions, each block and partition owned by one shard. Plain data
 * and plain functions — actors ask the plan and never compute placement
 * themselves, so later plans (hotness- and capacity-aware, after a live
 * migration) change placement without touching the actors.
 */
import { ConfigError } from '../runtime/errors.ts';
import { placeReplicas, validatePlacement, type ReplicaPlacement } from './replication.ts';

export interface DenseParamSize { name: string; size: number }
export interface SparseTableSpec { name: string; dim: number }

export interface DenseBlock {
  /** Index into `plan.dense`; stable for the life of the plan. */
  id: number;
  param: string;
  /** Element offset inside the parameter. */
  offset: number;
  length: number;
  shard: string;
}

export interface ShardPlan {
  /** Increases with every new plan (migration, regroup); pushes and pulls name the version they used. */
  version: number;
  shards: string[];
  denseParams: DenseParamSize[];
  dense: DenseBlock[];
  sparseTables: SparseTableSpec[];
  /** Sparse id → partition = mix(id) mod partitions. */
  partitions: number;
  /** Owner shard of each partition. */
  partitionOwner: string[];
  /**
   * Which server node holds each shard's primary and backups
   * (topology/replication.ts). Failover and re-replication write a new plan
   * version with only this changed; the layout above stays.
   */
  placement: ReplicaPlacement;
}

/** Dense blocks per shard at least (where the model is big enough): see buildShardPlan. */
export const DENSE_BLOCKS_PER_SHARD = 4;
/** Blocks are not cut below this many elements (16 KiB of float32) for balance: a small model's imbalance costs nothing. */
export const MIN_BALANCED_BLOCK_ELEMS = 4096;

export interface BuildShardPlanOptions {
  version: number;
  shards: string[];
  denseParams: DenseParamSize[];
  sparseTables: SparseTableSpec[];
  /** Default: 64 per shard (`partitionCount`), so a later plan can move load in small steps. */
  partitions: number | null;
  /**
   * Hotness sharding: the floats one batch moves to and from each partition
   * (`partitionLoads`, from a warm-up sample of the training data; length
   * `partitions`). Given, partitions go hottest first to the shard with the
   * least load so far (its dense blocks' floats included), so hot ids land on
   * different shards and the shards' traffic evens out; absent, they are dealt
   * round-robin.
   */
  partitionLoads?: ArrayLike<number> | null;
  /**
   * Relative capacity of server nodes (`nodes.<server>.capacity`; absent: 1):
   * a shard whose primary the initial placement puts on a server of
   * capacity c is filled to c times the load of one on a server of capacity
   * 1 — dense blocks by floats, partitions by their loads (or by count
   * without hotness statistics).
   */
  serverCapacity?: Readonly<Record<string, number>> | null;
  /** Largest dense block in bytes (keep it under the server's max_payload). */
  maxBlockBytes: number;
  /** Backups per shard (fault_tolerance.backup_factor); default 0. */
  backupFactor?: number;
  /** The server nodes replicas may live on; default: the shards (one server per shard). */
  servers?: string[];
}

/**
 * The shards of `perServer` shards on each server node: the first on each
 * is named after its server, the k-th (k ≥ 2) `<server>~k`; server by
 * server for each k, so shard i's primary is server i mod servers (see
 * placeReplicas) and consecutive shards sit on different servers.
 */
export function shardNames(servers: readonly string[], perServer: number): string[] {
  if (!Number.isInteger(perServer) || perServer < 1) throw new ConfigError(`cluster.shards_per_server must be a positive integer, got ${perServer}`);
  const names: string[] = [];
  for (let k = 1; k <= perServer; k++) for (const s of servers) names.push(k === 1 ? s : `${s}~${k}`);
  return names;
}

/**
 * The plan of a fresh job: dense blocks balanced by bytes, partitions dealt
 * round-robin or by measured hotness; both for the servers' capacities.
 */
export function buildShardPlan(o: BuildShardPlanOptions): ShardPlan {
  if (o.shards.length === 0) throw new ConfigError('a shard plan needs at least one shard (cluster.server_nodes is empty)');
  if (new Set(o.shards).size !== o.shards.length) throw new ConfigError(`shard names must be unique: ${o.shards.join(', ')}`);
  // Blocks of at most a quarter of a shard's fair share as well, so that the least-loaded dealing below leaves the
  // shards' dense bytes within a quarter share of each other even where one parameter is most of the model (a
  // tower's first layer): every shard then pulls, pushes — and in hps, its group reducer sends — about as many.
  const totalElems = o.denseParams.reduce((n, p) => n + (Number.isInteger(p.size) && p.size > 0 ? p.size : 0), 0);
  const shareElems = o.shards.length > 1 ? Math.max(MIN_BALANCED_BLOCK_ELEMS, Math.ceil(totalElems / (DENSE_BLOCKS_PER_SHARD * o.shards.length))) : Infinity;
  const blockElems = Math.max(1, Math.min(Math.floor(o.maxBlockBytes / 4), shareElems));
  const partitions = partitionCount(o.shards.length, o.partitions);
  const placement = { ...placeReplicas(o.shards, o.servers ?? o.shards, o.backupFactor ?? 0), initial_version: o.version };
  const capacity = shardCapacities(o.shards, placement.replicas, o.serverCapacity ?? null);
  const load = new Map(o.shards.map((s) => [s, 0]));
  const dense: DenseBlock[] = [];
  for (const p of o.denseParams) {
    if (!Number.isInteger(p.size) || p.size <= 0) throw new ConfigError(`dense parameter ${p.name} has size ${p.size}`);
    for (let offset = 0; offset < p.size; offset += blockElems) {
      const length = Math.min(blockElems, p.size - offset);
      // Least-loaded shard first (for its server's capacity); ties by shard order, so the plan is deterministic.
      const best = leastLoaded(o.shards, load, capacity, length);
      load.set(best, load.get(best)! + length);
      dense.push({ id: dense.length, param: p.name, offset, length, shard: best });
    }
  }
  const loads = o.partitionLoads ?? null;
  if (loads !== null && loads.length !== partitions) throw new ConfigError(`partition loads cover ${loads.length} partitions; the plan has ${partitions}`);
  const partitionOwner = loads !== null
    ? hottestFirst(loads, o.shards, load, capacity)
    // Unequal servers and no statistics: partitions by count, in proportion to capacity.
    : capacity !== null
      ? hottestFirst(new Array<number>(partitions).fill(1), o.shards, new Map(o.shards.map((s) => [s, 0])), capacity)
      : Array.from({ length: partitions }, (_, i) => o.shards[i % o.shards.length]!);
  return { version: o.version, shards: [...o.shards], denseParams: o.denseParams.map((p) => ({ ...p })), dense, sparseTables: o.sparseTables.map((t) => ({ ...t })), partitions, partitionOwner, placement };
}

/** Partitions of a plan over `shards` shards: `partitions`, or 64 per shard. */
export function partitionCount(shards: number, partitions: number | null): number {
  const n = partitions ?? 64 * shards;
  if (!Number.isInteger(n) || n < shards) throw new ConfigError(`partitions must be an integer ≥ the number of shards (${shards}), got ${n}`);
  return n;
}

/**
 * Owners of the partitions, hottest first each to the shard with the least
 * load so far (longest-processing-time first: within the hottest
 * partition's load of the best split). `load` starts as each shard's dense
 * floats and ends with its partitions added; ties go by index and shard order.
 */
function hottestFirst(loads: ArrayLike<number>, shards: readonly string[], load: Map<string, number>, capacity: ReadonlyMap<string, number> | null): string[] {
  const order = Array.from({ length: loads.length }, (_, i) => i);
  for (const i of order) {
    const v = loads[i]!;
    if (!Number.isFinite(v) || v < 0) throw new ConfigError(`partition ${i} has load ${v}; loads must be finite and ≥ 0`);
  }
  order.sort((a, b) => loads[b]! - loads[a]! || a - b);
  const owner = new Array<string>(loads.length);
  for (const i of order) {
    const best = leastLoaded(shards, load, capacity, loads[i]!);
    load.set(best, load.get(best)! + loads[i]!);
    owner[i] = best;
  }
  return owner;
}

/**
 * The shard to take `add` more: the least loaded (ties: shard order), or
 * with unequal servers the one that would carry it at the lowest load for
 * its capacity (longest-processing-time on machines of unequal speed).
 */
function leastLoaded(shards: readonly string[], load: ReadonlyMap<string, number>, capacity: ReadonlyMap<string, number> | null, add: number): string {
  let best = shards[0]!;
  let bestAt = Infinity;
  for (const s of shards) {
    const at = capacity === null ? load.get(s)! : (load.get(s)! + add) / capacity.get(s)!;
    if (at < bestAt) { best = s; bestAt = at; }
  }
  return best;
}

/** Each shard's capacity: its initial primary server's; null when every server is alike (the unweighted rule). */
function shardCapacities(shards: readonly string[], replicas: ReplicaPlacement['replicas'], servers: Readonly<Record<string, number>> | null): Map<string, number> | null {
  if (servers === null) return null;
  for (const [node, c] of Object.entries(servers)) {
    if (!Number.isFinite(c) || c <= 0) throw new ConfigError(`server ${node} has capacity ${c}; a capacity must be a positive number`);
  }
  const out = new Map(shards.map((s) => [s, servers[replicas[s]!.primary] ?? 1]));
  return new Set(out.values()).size > 1 ? out : null;
}

/**
 * Hotness statistics of a warm-up sample: the floats one batch moves per
 * partition, on average over the sampled batches. `batches` yields each
 * batch's distinct ids (a pull asks each id once, a push sends its row
 * once); `floatsPerId` is the sum of the sparse tables' dims.
 */
export function partitionLoadsOf(batches: Iterable<Int32Array>, partitions: number, floatsPerId: number): { loads: Float64Array; batches: number } {
  const loads = new Float64Array(partitions);
  let n = 0;
  for (const ids of batches) {
    for (let k = 0; k < ids.length; k++) loads[partitionOf(ids[k]!, partitions)]! += floatsPerId;
    n++;
  }
  if (n > 0) for (let i = 0; i < partitions; i++) loads[i]! /= n;
  return { loads, batches: n };
}

/** Floats one batch moves per shard under `plan`: its dense blocks' lengths plus its partitions' loads. */
export function shardLoadsOf(plan: ShardPlan, partitionLoads: ArrayLike<number>): Record<string, number> {
  const out: Record<string, number> = Object.fromEntries(plan.shards.map((s) => [s, 0]));
  for (const b of plan.dense) out[b.shard]! += b.length;
  for (let i = 0; i < plan.partitions; i++) out[plan.partitionOwner[i]!]! += partitionLoads[i]!;
  return out;
}

/** murmur3's finaliser: spreads consecutive and Zipf-hot ids evenly over partitions. */
export function mixId(id: number): number {
  let h = id >>> 0;
  h ^= h >>> 16; h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13; h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

export function partitionOf(id: number, partitions: number): number {
  return mixId(id) % partitions;
}

export function shardOfSparseId(plan: ShardPlan, id: number): string {
  return plan.partitionOwner[partitionOf(id, plan.partitions)]!;
}

export interface IdsForShard {
  /** The ids this shard owns, in first-seen order. */
  ids: Int32Array;
  /** Where each of those ids sits in the caller's array. */
  positions: Int32Array;
}

/** Splits ids by owning shard, keeping each id's position so rows can be scattered back. */
export function splitIdsByShard(plan: ShardPlan, ids: Int32Array): Map<string, IdsForShard> {
  const owner = new Int32Array(ids.length);
  const counts = new Int32Array(plan.shards.length);
  const index = new Map(plan.shards.map((s, i) => [s, i]));
  for (let k = 0; k < ids.length; k++) {
    const s = index.get(plan.partitionOwner[partitionOf(ids[k]!, plan.partitions)]!)!;
    owner[k] = s;
    counts[s]!++;
  }
  const out = new Map<string, IdsForShard>();
  const fill = new Int32Array(plan.shards.length);
  const parts = plan.shards.map((_, s) => ({ ids: new Int32Array(counts[s]!), positions: new Int32Array(counts[s]!) }));
  for (let k = 0; k < ids.length; k++) {
    const s = owner[k]!;
    const part = parts[s]!;
    part.ids[fill[s]!] = ids[k]!;
    part.positions[fill[s]!] = k;
    fill[s]!++;
  }
  plan.shards.forEach((name, s) => { if (counts[s]! > 0) out.set(name, parts[s]!); });
  return out;
}

export function denseBlocksByShard(plan: ShardPlan): Map<string, DenseBlock[]> {
  const out = new Map<string, DenseBlock[]>(plan.shards.map((s) => [s, []]));
  for (const b of plan.dense) out.get(b.shard)!.push(b);
  return out;
}

/** Checks a plan read from the KV store before anyone routes by it. */
export function validateShardPlan(plan: ShardPlan): void {
  const v = `shard plan v${plan.version}`;
  const shards = new Set(plan.shards);
  if (shards.size === 0) throw new ConfigError(`${v}: no shards`);
  if (shards.size !== plan.shards.length) throw new ConfigError(`${v}: shard names must be unique: ${plan.shards.join(', ')}`);
  if (!Number.isInteger(plan.partitions) || plan.partitions < 1) throw new ConfigError(`${v}: partitions must be a positive integer, got ${plan.partitions}`);
  if (plan.partitionOwner.length !== plan.partitions) throw new ConfigError(`${v}: ${plan.partitionOwner.length} partition owners for ${plan.partitions} partitions`);
  for (const s of plan.partitionOwner) if (!shards.has(s)) throw new ConfigError(`${v}: partition owned by unknown shard ${s}`);
  const tables = new Set<string>();
  for (const t of plan.sparseTables) {
    if (tables.has(t.name)) throw new ConfigError(`${v}: sparse table ${t.name} is listed twice`);
    tables.add(t.name);
    if (!Number.isInteger(t.dim) || t.dim < 1) throw new ConfigError(`${v}: sparse table ${t.name} has dim ${t.dim}`);
  }
  validatePlacement(v, plan.shards, plan.placement);
  const sizes = new Map(plan.denseParams.map((p) => [p.name, p.size]));
  if (sizes.size !== plan.denseParams.length) throw new ConfigError(`${v}: a dense parameter is listed twice`);
  const covered = new Map(plan.denseParams.map((p) => [p.name, 0]));
  const blocksOf = new Map<string, DenseBlock[]>();
  plan.dense.forEach((b, i) => {
    // Shards index their blocks by id, and requests name blocks by id.
    if (b.id !== i) throw new ConfigError(`${v}: dense block at index ${i} has id ${b.id}; ids must equal positions`);
    if (!shards.has(b.shard)) throw new ConfigError(`${v}: dense block ${b.id} owned by unknown shard ${b.shard}`);
    const size = sizes.get(b.param);
    if (size === undefined) throw new ConfigError(`${v}: dense block ${b.id} of unknown parameter ${b.param}`);
    if (!Number.isInteger(b.offset) || !Number.isInteger(b.length) || b.offset < 0 || b.length < 1 || b.offset + b.length > size) {
      throw new ConfigError(`${v}: dense block ${b.id} covers ${b.param}[${b.offset}..${b.offset + b.length}) outside its ${size} elements`);
    }
    covered.set(b.param, covered.get(b.param)! + b.length);
    let list = blocksOf.get(b.param);
    if (list === undefined) { list = []; blocksOf.set(b.param, list); }
    list.push(b);
  });
  for (const p of plan.denseParams) {
    if (covered.get(p.name) !== p.size) throw new ConfigError(`${v}: blocks of ${p.name} cover ${covered.get(p.name)} of ${p.size} elements`);
    // Equal totals could still hide an overlap plus a gap.
    const sorted = [...(blocksOf.get(p.name) ?? [])].sort((a, b) => a.offset - b.offset);
    let end = 0;
    for (const b of sorted) {
      if (b.offset !== end) throw new ConfigError(`${v}: blocks of ${p.name} ${b.offset < end ? 'overlap' : 'leave a gap'} at element ${Math.min(b.offset, end)} (block ${b.id})`);
      end = b.offset + b.length;
    }
  }
}

/** A plan with a new placement (failover, re-replication): the next version, the layout unchanged. */
export function withPlacement(plan: ShardPlan, placement: ReplicaPlacement): ShardPlan {
  return { ...plan, version: plan.version + 1, placement };
}

/** True when two plans cut the parameters the same way (only the placement or the version differ). */
export function sameLayout(a: ShardPlan, b: ShardPlan): boolean {
  return JSON.stringify([a.shards, a.denseParams, a.dense, a.sparseTables, a.partitions, a.partitionOwner])
    === JSON.stringify([b.shards, b.denseParams, b.dense, b.sparseTables, b.partitions, b.partitionOwner]);
}
