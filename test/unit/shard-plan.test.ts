import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, SeededRandom } from '../../runtime/mod.ts';
import {
  DENSE_BLOCKS_PER_SHARD, MIN_BALANCED_BLOCK_ELEMS, buildShardPlan, denseBlocksByShard, shardNames, partitionLoadsOf, partitionOf, shardLoadsOf, shardOfSparseId, splitIdsByShard, validateShardPlan,
  type BuildShardPlanOptions, type ShardPlan,
} from '../../topology/mod.ts';

function options(over: Partial<BuildShardPlanOptions> = {}): BuildShardPlanOptions {
  return {
    version: 1, shards: ['a', 'b', 'c'], partitions: null, maxBlockBytes: 4096,
    denseParams: [{ name: 'fc1.w', size: 10_000 }, { name: 'fc1.b', size: 64 }, { name: 'out.w', size: 3_333 }, { name: 'out.b', size: 1 }],
    sparseTables: [{ name: 'emb', dim: 16 }, { name: 'wide', dim: 1 }],
    ...over,
  };
}

test('dense blocks stay under maxBlockBytes and cover each parameter exactly once, in order', () => {
  const rng = new SeededRandom(3);
  for (let trial = 0; trial < 20; trial++) {
    const maxBlockBytes = 4 * (1 + Math.floor(rng.next() * 500));
    const denseParams = Array.from({ length: 1 + Math.floor(rng.next() * 6) }, (_, i) => ({ name: `p${i}`, size: 1 + Math.floor(rng.next() * 5000) }));
    const plan = buildShardPlan(options({ maxBlockBytes, denseParams, shards: ['x', 'y'] }));
    validateShardPlan(plan);
    plan.dense.forEach((b, i) => {
      assert.equal(b.id, i);
      assert.ok(b.length * 4 <= maxBlockBytes, `block ${b.id} has ${b.length * 4} bytes > ${maxBlockBytes}`);
    });
    for (const p of denseParams) {
      const blocks = plan.dense.filter((b) => b.param === p.name);
      let end = 0;
      for (const b of blocks) { assert.equal(b.offset, end); end += b.length; }
      assert.equal(end, p.size, `${p.name} covered exactly`);
    }
  }
});

test('dense bytes are balanced over shards: loads differ by at most one block', () => {
  const plan = buildShardPlan(options({ shards: ['a', 'b', 'c', 'd'], maxBlockBytes: 1024 }));
  const load = new Map(plan.shards.map((s) => [s, 0]));
  for (const b of plan.dense) load.set(b.shard, load.get(b.shard)! + b.length);
  const loads = [...load.values()];
  assert.ok(Math.max(...loads) - Math.min(...loads) <= 256, `loads ${loads.join(', ')}`);
  const byShard = denseBlocksByShard(plan);
  assert.deepEqual([...byShard.keys()], plan.shards);
  assert.equal([...byShard.values()].reduce((n, l) => n + l.length, 0), plan.dense.length);
  assert.deepEqual(buildShardPlan(options({ shards: ['a', 'b', 'c', 'd'], maxBlockBytes: 1024 })), plan, 'deterministic');
});

test('one parameter most of the model (a tower\'s first layer) under a large maxBlockBytes: still cut, the shards\' dense loads within a quarter share of each other', () => {
  const denseParams = [{ name: 'fc1.w', size: 65_536 }, { name: 'fc1.b', size: 256 }, { name: 'fc2.w', size: 32_768 }, { name: 'fc2.b', size: 128 }, { name: 'out.w', size: 128 }, { name: 'out.b', size: 1 }];
  const total = denseParams.reduce((n, p) => n + p.size, 0);
  for (const shards of [['a', 'b'], ['a', 'b', 'c', 'd'], ['a', 'b', 'c']]) {
    const plan = buildShardPlan(options({ shards, maxBlockBytes: 1 << 20, denseParams }));
    validateShardPlan(plan);
    const load = new Map(plan.shards.map((s) => [s, 0]));
    for (const b of plan.dense) load.set(b.shard, load.get(b.shard)! + b.length);
    const loads = [...load.values()];
    const share = total / shards.length;
    assert.ok(Math.max(...loads) - Math.min(...loads) <= share / DENSE_BLOCKS_PER_SHARD + 1, `${shards.length} shards: loads ${loads.join(', ')} (share ${share})`);
  }
  // One shard: nothing to balance, blocks as large as maxBlockBytes allows.
  assert.equal(buildShardPlan(options({ shards: ['a'], maxBlockBytes: 1 << 20, denseParams })).dense.length, denseParams.length);
  // A small model is not cut below MIN_BALANCED_BLOCK_ELEMS for balance: its blocks stay whole parameters.
  const small = [{ name: 'w', size: 3_000 }, { name: 'b', size: 8 }];
  assert.ok(3_008 < MIN_BALANCED_BLOCK_ELEMS);
  assert.deepEqual(buildShardPlan(options({ shards: ['a', 'b', 'c', 'd'], maxBlockBytes: 1 << 20, denseParams: small })).dense.map((b) => b.length), [3_000, 8]);
});

test('partitions default to 64 per shard, dealt round-robin; partitionOf spreads consecutive ids', () => {
  const plan = buildShardPlan(options());
  assert.equal(plan.partitions, 192);
  assert.deepEqual(plan.partitionOwner.slice(0, 4), ['a', 'b', 'c', 'a']);
  const counts = new Map(plan.shards.map((s) => [s, 0]));
  for (let id = 0; id < 30_000; id++) counts.set(shardOfSparseId(plan, id), counts.get(shardOfSparseId(plan, id))! + 1);
  for (const n of counts.values()) assert.ok(Math.abs(n - 10_000) < 600, `ids per shard ${[...counts.values()].join(', ')}`);
  assert.equal(partitionOf(-1, 7), partitionOf(0xffffffff, 7), 'an int32 id is its unsigned value');
});

test('hotness sharding: partitions go hottest first to the least-loaded shard, dense blocks counted; hot partitions land on different shards and the loads even out where round-robin leaves them apart', () => {
  // 192 partitions: three very hot ones that round-robin deals to the same shard (0, 3, 6 → a), the rest light.
  const loads = Array.from({ length: 192 }, (_, i) => (i === 0 || i === 3 || i === 6 ? 5_000 : 100 + (i % 5)));
  const base = options({ denseParams: [{ name: 'w', size: 3_000 }], maxBlockBytes: 4_000 });
  const rr = buildShardPlan(base);
  const hot = buildShardPlan({ ...base, partitionLoads: loads });
  validateShardPlan(hot);
  assert.deepEqual([0, 3, 6].map((i) => rr.partitionOwner[i]), ['a', 'a', 'a']);
  assert.equal(new Set([0, 3, 6].map((i) => hot.partitionOwner[i])).size, 3, 'the three hot partitions on three shards');
  const spread = (l: Record<string, number>) => { const v = Object.values(l); return (Math.max(...v) - Math.min(...v)) / Math.max(...v); };
  const rrLoads = shardLoadsOf(rr, loads);
  const hotLoads = shardLoadsOf(hot, loads);
  assert.ok(spread(rrLoads) > 0.3, `round-robin: ${JSON.stringify(rrLoads)}`);
  // Within one partition's load of each other (the greedy's bound), here 0.5 %.
  assert.ok(spread(hotLoads) < 0.005, `hotness: ${JSON.stringify(hotLoads)}`);
  const total = (l: Record<string, number>) => Object.values(l).reduce((a, b) => a + b, 0);
  assert.equal(total(hotLoads), total(rrLoads), 'the same work, placed differently');
  // Deterministic: the same statistics give the same plan.
  assert.deepEqual(buildShardPlan({ ...base, partitionLoads: loads }).partitionOwner, hot.partitionOwner);
  // A shard already holding more dense floats takes fewer partitions: two shards, dense blocks of 1 000 and 500.
  const two = { ...options({ shards: ['a', 'b'], denseParams: [{ name: 'w', size: 1_500 }], maxBlockBytes: 4_000 }) };
  const flat = Array.from({ length: 128 }, () => 10);
  const p2 = buildShardPlan({ ...two, partitionLoads: flat });
  const dense = Object.fromEntries(['a', 'b'].map((s) => [s, p2.dense.filter((b) => b.shard === s).reduce((n, b) => n + b.length, 0)]));
  assert.notEqual(dense.a, dense.b, `the dense part is uneven: ${JSON.stringify(dense)}`);
  const l2 = shardLoadsOf(p2, flat);
  assert.ok(Math.abs(l2.a! - l2.b!) <= 10, `dense and sparse together even out: ${JSON.stringify(l2)} (dense ${JSON.stringify(dense)})`);
});

test('servers of unequal capacity: the shards on a server of capacity 3 take three times the dense floats and partitions of one on a server of capacity 1; equal capacities change nothing; bad ones are named', () => {
  const two = options({ shards: ['a', 'b'], servers: ['a', 'b'], denseParams: [{ name: 'w', size: 40_000 }], maxBlockBytes: 4_000 });
  const byCount = buildShardPlan({ ...two, serverCapacity: { a: 3 } });
  const count = (p: ShardPlan, s: string) => p.partitionOwner.filter((o) => o === s).length;
  assert.deepEqual([count(byCount, 'a'), count(byCount, 'b')], [96, 32], 'partitions by count, 3 : 1');
  const dense = (p: ShardPlan, s: string) => p.dense.filter((b) => b.shard === s).reduce((n, b) => n + b.length, 0);
  assert.deepEqual([dense(byCount, 'a'), dense(byCount, 'b')], [30_000, 10_000], 'dense floats 3 : 1');
  const loads = Array.from({ length: 128 }, (_, i) => 50 + (i % 13) * 10);
  const hot = buildShardPlan({ ...two, partitionLoads: loads, serverCapacity: { a: 3, b: 1 } });
  const l = shardLoadsOf(hot, loads);
  assert.ok(Math.abs(l.a! / 3 - l.b!) / l.b! < 0.01, `hotness, dense and rows together 3 : 1: ${JSON.stringify(l)}`);
  assert.deepEqual(buildShardPlan({ ...two, serverCapacity: { a: 2, b: 2 } }).partitionOwner, buildShardPlan(two).partitionOwner, 'alike servers: the unweighted plan');
  assert.throws(() => buildShardPlan({ ...two, serverCapacity: { a: 0 } }), (e: unknown) => e instanceof ConfigError && /server a has capacity 0/.test(e.message));
});

test('hotness statistics: floats per batch per partition, averaged over the sampled batches; bad loads are refused naming the partition', () => {
  const parts = 16;
  const a = Int32Array.from([1, 2, 3]);
  const b = Int32Array.from([1, 4]);
  const { loads, batches } = partitionLoadsOf([a, b], parts, 17);
  assert.equal(batches, 2);
  const want = new Float64Array(parts);
  for (const id of [1, 2, 3, 1, 4]) want[partitionOf(id, parts)]! += 17 / 2;
  assert.deepEqual([...loads], [...want]);
  assert.deepEqual([...partitionLoadsOf([], parts, 17).loads], new Array(parts).fill(0), 'no batches: no load');
  assert.throws(() => buildShardPlan(options({ partitionLoads: [1, 2, 3] })), (e: unknown) => e instanceof ConfigError && /3 partitions; the plan has 192/.test(e.message));
  const nan = new Array(192).fill(1); nan[7] = Number.NaN;
  assert.throws(() => buildShardPlan(options({ partitionLoads: nan })), (e: unknown) => e instanceof ConfigError && /partition 7 has load NaN/.test(e.message));
  const neg = new Array(192).fill(1); neg[9] = -1;
  assert.throws(() => buildShardPlan(options({ partitionLoads: neg })), (e: unknown) => e instanceof ConfigError && /partition 9 has load -1/.test(e.message));
});

test('splitIdsByShard keeps positions so rows scatter back to the caller\'s order', () => {
  const plan = buildShardPlan(options({ partitions: 17 }));
  const rng = new SeededRandom(9);
  const ids = Int32Array.from({ length: 1000 }, () => Math.floor((rng.next() - 0.5) * 2 ** 31));
  ids[10] = ids[20]!; // a duplicate stays at both positions
  const split = splitIdsByShard(plan, ids);
  const seen = new Int32Array(ids.length);
  const back = new Int32Array(ids.length);
  for (const [shard, part] of split) {
    assert.equal(part.ids.length, part.positions.length);
    assert.ok(part.ids.length > 0, 'only shards with ids are listed');
    for (let k = 0; k < part.ids.length; k++) {
      assert.equal(shardOfSparseId(plan, part.ids[k]!), shard);
      const pos = part.positions[k]!;
      if (k > 0) assert.ok(pos > part.positions[k - 1]!, 'first-seen order');
      back[pos] = part.ids[k]!;
      seen[pos]!++;
    }
  }
  assert.deepEqual(back, ids, 'scattering each shard\'s ids to their positions rebuilds the input');
  assert.ok(seen.every((n) => n === 1), 'every position exactly once');
  assert.equal(splitIdsByShard(plan, new Int32Array(0)).size, 0);
});

function plan(): ShardPlan {
  return buildShardPlan(options({ maxBlockBytes: 16_000 }));
}

function rejects(mutate: (p: ShardPlan) => void, message: RegExp): void {
  const p = structuredClone(plan());
  mutate(p);
  assert.throws(() => validateShardPlan(p), (e: unknown) => e instanceof ConfigError && message.test(e.message), `expected ${message}`);
}

test('validateShardPlan accepts built plans and names what is wrong in broken ones', () => {
  validateShardPlan(plan());
  rejects((p) => { p.partitionOwner.pop(); }, /191 partition owners for 192 partitions/);
  rejects((p) => { p.partitionOwner[5] = 'z'; }, /partition owned by unknown shard z/);
  rejects((p) => { p.dense[1]!.shard = 'z'; }, /dense block 1 owned by unknown shard z/);
  rejects((p) => { p.dense[0]!.param = 'nope'; }, /dense block 0 of unknown parameter nope/);
  rejects((p) => { p.dense[0]!.length -= 1; }, /blocks of fc1\.w cover 9999 of 10000 elements/);
  rejects((p) => { p.dense.pop(); }, /blocks of out\.b cover 0 of 1 elements/);
  rejects((p) => { p.dense[1]!.id = 7; }, /index 1 has id 7/);
  rejects((p) => { p.dense[0]!.length += 10; p.dense[1]!.length -= 10; }, new RegExp(`fc1\\.w overlap at element ${plan().dense[0]!.length}`));
  rejects((p) => { p.dense[2]!.offset += 1; }, /outside its 10000 elements|leave a gap/);
  rejects((p) => { p.shards.push('a'); }, /shard names must be unique/);
  rejects((p) => { p.sparseTables.push({ name: 'emb', dim: 3 }); }, /sparse table emb is listed twice/);
  rejects((p) => { p.sparseTables[0]!.dim = 0; }, /sparse table emb has dim 0/);
});

test('buildShardPlan refuses impossible inputs with ConfigError', () => {
  assert.throws(() => buildShardPlan(options({ shards: [] })), ConfigError);
  assert.throws(() => buildShardPlan(options({ shards: ['a', 'a'] })), /unique/);
  assert.throws(() => buildShardPlan(options({ partitions: 2 })), /partitions must be an integer ≥ the number of shards \(3\)/);
  assert.throws(() => buildShardPlan(options({ denseParams: [{ name: 'x', size: 0 }] })), /dense parameter x has size 0/);
});

test('shardNames: one shard per server named after it, further ones <server>~k, server by server; placement puts shard i on server i mod servers', () => {
  assert.deepEqual(shardNames(['s1', 's2'], 1), ['s1', 's2']);
  const names = shardNames(['s1', 's2'], 3);
  assert.deepEqual(names, ['s1', 's2', 's1~2', 's2~2', 's1~3', 's2~3']);
  const plan = buildShardPlan(options({ shards: names, servers: ['s1', 's2'], backupFactor: 1 }));
  validateShardPlan(plan);
  assert.deepEqual(names.map((n) => [plan.placement.replicas[n]!.primary, plan.placement.replicas[n]!.backups]), [
    ['s1', ['s2']], ['s2', ['s1']], ['s1', ['s2']], ['s2', ['s1']], ['s1', ['s2']], ['s2', ['s1']],
  ]);
  // The parameters are spread over all six.
  assert.deepEqual([...denseBlocksByShard(plan).values()].map((b) => b.length > 0), names.map(() => true));
  assert.deepEqual(new Set(plan.partitionOwner), new Set(names));
  for (const bad of [0, -1, 1.5, Number.NaN]) assert.throws(() => shardNames(['s1'], bad), (e) => e instanceof ConfigError && /cluster\.shards_per_server must be a positive integer/.test(e.message));
  // A generated name that is also a server's name is refused with the plan's duplicate check.
  assert.throws(() => buildShardPlan(options({ shards: shardNames(['a', 'a~2'], 2), servers: ['a', 'a~2'] })), (e) => e instanceof ConfigError && /shard names must be unique/.test(e.message));
});
