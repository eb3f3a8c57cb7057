/**
 * ShardClient on the in-process bus: a push in flight to a primary that
 * stopped answering is sent again to the new primary as soon as the plan it
 * follows names one (a failover), with the same seq, instead of waiting out
 * its attempt timeout.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { z } from 'zod';
import { ActorSystem, InProcessBroker, SeededRandom, Transport, silentLogger, systemClock, type ActorDefinition } from '../../runtime/mod.ts';
import { buildShardPlan, failover, withPlacement } from '../../topology/mod.ts';
import { memoryPlanStore } from '../../actors/store/plan-store.ts';
import { PlanView } from '../../actors/store/plan-view.ts';
import { ShardClient } from '../../actors/worker/shard-client.ts';
import type { PushRequest } from '../../actors/shard/shard.messages.ts';

function system(broker: InProcessBroker, node: string): ActorSystem {
  const transport = new Transport(broker.client(), { clientId: node, clock: systemClock, reassemblyTimeoutMs: 1_000 });
  return new ActorSystem({ transport, job: 'reroute', node, clock: systemClock, random: new SeededRandom(1), defaultRequestTimeoutMs: 2_000 });
}

/** A replica that records the (from, seq) of each push; `hang` never answers. */
function replica(id: string, seen: { id: string; from: string; seq: number }[], hang: boolean): ActorDefinition<{ push: z.ZodObject<Record<string, z.ZodTypeAny>> }> {
  return {
    kind: 'shard', id, messages: { push: z.object({}).passthrough() },
    handlers: {
      push: async (m) => {
        seen.push({ id, from: m.from, seq: m.seq });
        if (hang) await new Promise(() => undefined);
        return { version: 1, applied: true, staleness: 0, lr_scale: 1, refused: false };
      },
    },
  };
}

test('a push waiting on a silent primary goes to the new primary the moment the plan names it, with the same seq', async () => {
  const broker = new InProcessBroker();
  const n1 = system(broker, 'n1');
  const n2 = system(broker, 'n2');
  const worker = system(broker, 'w');
  const v1 = buildShardPlan({
    version: 1, shards: ['s0'], servers: ['n1', 'n2'], backupFactor: 1, partitions: 4, maxBlockBytes: 16,
    denseParams: [{ name: 'w', size: 4 }], sparseTables: [{ name: 'emb', dim: 2 }],
  });
  assert.equal(v1.placement.replicas.s0!.primary, 'n1');
  const store = memoryPlanStore(v1);
  const seen: { id: string; from: string; seq: number }[] = [];
  await n1.spawn(replica('s0@n1', seen, true));
  await n2.spawn(replica('s0@n2', seen, false));
  const plans = PlanView.follow(v1, store);
  // An attempt timeout far longer than the test: only the plan change can end the first attempt.
  const client = new ShardClient(worker, { requestTimeoutMs: 60_000, attemptTimeoutMs: 60_000, log: silentLogger(), shouldStop: () => false, plans });
  try {
    const req = { plan_version: 1, round: null, expected: null, weight: 1, base_version: 0, dense: [], sparse: [], later_steps: [], batches: ['b1'] } as unknown as PushRequest;
    const t0 = Date.now();
    const pushing = client.push('s0', req);
    while (seen.length === 0) await new Promise((r) => setTimeout(r, 5));
    await new Promise((r) => setTimeout(r, 100));
    const v2 = withPlacement({ ...v1, version: 2 }, failover(v1.placement, new Set(['n1']))!.placement);
    await store.put(v2);
    const reply = await pushing;
    const took = Date.now() - t0;
    assert.equal(reply.applied, true);
    assert.ok(took < 5_000, `answered ${took} ms after the push, not after the 60 s attempt`);
    assert.deepEqual(seen.map((s) => s.id), ['s0@n1', 's0@n2']);
    assert.equal(seen[0]!.seq, seen[1]!.seq, 'the same seq: a primary that has it answers, never applies it twice');
    assert.equal(seen[0]!.from, seen[1]!.from);
    assert.equal(client.rerouted, 1);
  } finally {
    plans.dispose();
    await worker.stop();
    await n1.stop({ timeoutMs: 100 }).catch(() => undefined);
    await n2.stop();
  }
});

/** A worker system and node n1 on one broker, and a plan whose one shard s0 lives on n1 (no backups). */
function oneShardOnN1() {
  const broker = new InProcessBroker();
  return {
    n1: system(broker, 'n1'),
    worker: system(broker, 'w'),
    plan: buildShardPlan({
      version: 1, shards: ['s0'], servers: ['n1'], backupFactor: 0, partitions: 4, maxBlockBytes: 16,
      denseParams: [{ name: 'w', size: 4 }], sparseTables: [{ name: 'emb', dim: 2 }],
    }),
  };
}

test('a push or pull whose answer takes longer than an attempt (a slow link) is answered in the end: each unanswered attempt doubles the next one\'s time', { timeout: 20_000 }, async () => {
  const { n1, worker, plan } = oneShardOnN1();
  const seen: { type: string; seq: number; at: number }[] = [];
  // Every answer leaves 350 ms after its request arrived, longer than the 100 ms attempt: as if its bytes took that long on the link.
  const slow = (type: string, reply: Record<string, unknown>) => async (m: { seq: number }) => {
    seen.push({ type, seq: m.seq, at: Date.now() });
    await new Promise((r) => setTimeout(r, 350));
    return reply;
  };
  await n1.spawn({
    kind: 'shard', id: 's0@n1', messages: { push: z.object({}).passthrough(), pull: z.object({}).passthrough() },
    handlers: {
      push: slow('push', { version: 1, applied: true, staleness: 0, lr_scale: 1, refused: false }),
      pull: slow('pull', { version: 1, dense: [], sparse: [] }),
    },
  });
  let stop = false;
  const client = new ShardClient(worker, { requestTimeoutMs: 60_000, attemptTimeoutMs: 100, log: silentLogger(), shouldStop: () => stop, plans: plan });
  try {
    const req = { plan_version: 1, round: null, expected: null, weight: 1, base_version: 0, dense: [], sparse: [], later_steps: [], batches: ['b1'] } as unknown as PushRequest;
    const t0 = Date.now();
    const reply = await client.push('s0', req);
    assert.equal(reply.applied, true);
    const pushes = seen.filter((s) => s.type === 'push');
    // With a fixed 100 ms attempt no answer could ever arrive in time. The shard takes the attempts one after
    // another (as a link carries them), so a few go unanswered before one waits long enough; all carry one seq.
    assert.ok(pushes.length >= 2 && pushes.length <= 6, `attempts at ${JSON.stringify(pushes.map((p) => p.at - t0))} ms`);
    assert.equal(new Set(pushes.map((p) => p.seq)).size, 1, 'one seq: applied once at a real shard');
    const pulled = await client.pull('s0', { plan_version: 1, dense: [], sparse: [], min_round: null } as never);
    assert.equal(pulled.version, 1);
    assert.ok(seen.filter((s) => s.type === 'pull').length >= 2);
  } finally {
    stop = true; // a client still re-sending (the test timed out) gives up
    await worker.stop();
    await n1.stop({ timeoutMs: 1_000 }).catch(() => undefined);
  }
});

test('a compressed pull reply that is malformed is refused naming the field, not retried', async () => {
  const { n1, worker, plan } = oneShardOnN1();
  let pulls = 0;
  await n1.spawn({
    kind: 'shard', id: 's0@n1', messages: { pull: z.object({}).passthrough() },
    // A half-precision tensor whose scale no sender makes (|exp| ≥ 200).
    handlers: { pull: () => { pulls++; return { version: 1, round: 0, dense: [{ f16: new Uint16Array(4), exp: 999 }], sparse: [] }; } },
  });
  const client = new ShardClient(worker, { requestTimeoutMs: 5_000, log: silentLogger(), shouldStop: () => false, plans: plan });
  try {
    await assert.rejects(
      client.pull('s0', { plan_version: 1, dense: Int32Array.of(0), sparse: [], min_round: null, compression: 'fp16' }),
      (e: unknown) => e instanceof Error && e.name === 'ValidationError' && /^shard s0: malformed compressed pull reply: dense\.0\.exp: /.test(e.message),
    );
    assert.equal(pulls, 1, 'not sent again');
  } finally {
    await worker.stop();
    await n1.stop({ timeoutMs: 1_000 }).catch(() => undefined);
  }
});
