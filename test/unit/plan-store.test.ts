import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError } from '../../runtime/mod.ts';
import { buildShardPlan, type ShardPlan } from '../../topology/mod.ts';
import { StalePlanError, memoryPlanStore } from '../../actors/mod.ts';

function planV(version: number, shards = ['s0', 's1']): ShardPlan {
  return buildShardPlan({
    version, shards, partitions: 4, maxBlockBytes: 64,
    denseParams: [{ name: 'w', size: 40 }], sparseTables: [{ name: 'emb', dim: 8 }],
  });
}

const tick = () => new Promise((r) => setImmediate(r));

test('memory plan store: versions only move forward, each reader gets its own copy', async () => {
  const store = memoryPlanStore();
  assert.equal(await store.get(), null);
  await store.put(planV(1));
  const got = await store.get();
  assert.deepEqual(got, planV(1));
  got!.shards.push('mutated');
  assert.deepEqual(await store.get(), planV(1), 'a reader cannot change the stored plan');
  await store.put(planV(1)); // the same plan again: a no-op
  await assert.rejects(store.put(planV(1, ['s0'])), (e: unknown) => e instanceof StalePlanError && /already stored with different content/.test(e.message));
  await store.put(planV(3));
  await assert.rejects(store.put(planV(2)), (e: unknown) => e instanceof StalePlanError && /v2 is older than the stored v3/.test(e.message));
  const broken = planV(4);
  broken.partitionOwner[0] = 'ghost';
  await assert.rejects(store.put(broken), ConfigError);
  assert.equal((await store.get())!.version, 3);
});

test('memory plan store: a watch sees the current plan, then newer ones, until stopped', async () => {
  const store = memoryPlanStore(planV(1));
  const seen: number[] = [];
  const stop = store.watch((p) => seen.push(p.version));
  await tick();
  assert.deepEqual(seen, [1]);
  await store.put(planV(2));
  await store.put(planV(5));
  await tick();
  assert.deepEqual(seen, [1, 2, 5]);
  stop();
  await store.put(planV(6));
  await tick();
  assert.deepEqual(seen, [1, 2, 5]);
  const errors: Error[] = [];
  store.watch(() => { throw new Error('boom'); }, (e) => errors.push(e));
  await tick();
  assert.equal(errors[0]?.message, 'boom', 'a throwing watcher reports to onError');
});
