import { test } from 'node:test';
import assert from 'node:assert/strict';
import { z } from 'zod';
import {
  ActorSystem, InProcessBroker, Transport, SeededRandom, SimulatedClock, systemClock, HandlerError, NoRespondersError, PayloadTooLargeError,
  TimeoutError, ValidationError, UnknownMessageTypeError, JSON_CONTENT_TYPE, encode, transferAttemptMs, type Clock, type ActorDefinition,
} from '../../runtime/mod.ts';

function system(broker: InProcessBroker, node: string, clock: Clock = systemClock) {
  const transport = new Transport(broker.client(), { clientId: node, clock, reassemblyTimeoutMs: 1_000 });
  return new ActorSystem({ transport, job: 'test', node, clock, random: new SeededRandom(1), defaultRequestTimeoutMs: 2_000 });
}

const echoMessages = {
  echo: z.object({ n: z.number() }),
  boom: z.object({}),
  slow: z.object({ n: z.number(), delayMs: z.number() }),
  blob: z.object({ data: z.instanceof(Float32Array) }),
};

function echoActor(log: number[]): ActorDefinition<typeof echoMessages> {
  return {
    kind: 'actor', id: 'echo', messages: echoMessages,
    handlers: {
      echo: (m) => { log.push(m.n); return { n: m.n, from: m.from, seq: m.seq }; },
      boom: () => { throw new Error('kaboom'); },
      slow: async (m) => { await new Promise((r) => setTimeout(r, m.delayMs)); log.push(m.n); return { n: m.n }; },
      blob: (m) => ({ sum: m.data.reduce((a, b) => a + b, 0), length: m.data.length }),
    },
  };
}

test('request/reply carries fields and the sender identity', async () => {
  const broker = new InProcessBroker();
  const a = system(broker, 'a'); const b = system(broker, 'b');
  const log: number[] = [];
  await a.spawn(echoActor(log));
  const r = await b.ref('actor', 'echo').request<{ n: number; from: string; seq: number }>('echo', { n: 7 });
  assert.equal(r.n, 7);
  assert.equal(r.from, b.senderId);
  assert.ok(r.seq > 0);
  await a.stop(); await b.stop();
});

test('a handler that throws is answered with HandlerError and the actor keeps serving', async () => {
  const broker = new InProcessBroker();
  const a = system(broker, 'a'); const b = system(broker, 'b');
  const actor = await a.spawn(echoActor([]));
  const ref = b.ref('actor', 'echo');
  await assert.rejects(ref.request('boom', {}), (e: unknown) => e instanceof HandlerError && /kaboom/.test((e as Error).message));
  const r = await ref.request<{ n: number }>('echo', { n: 1 });
  assert.equal(r.n, 1);
  assert.equal(actor.stats.handlerErrors, 1);
  await a.stop();
});

test('a slow handler does not reorder messages', async () => {
  const broker = new InProcessBroker();
  const a = system(broker, 'a'); const b = system(broker, 'b');
  const log: number[] = [];
  await a.spawn(echoActor(log));
  const ref = b.ref('actor', 'echo');
  const all: Promise<unknown>[] = [];
  for (let i = 0; i < 50; i++) {
    // Mix slow async and fast sync handlers; fast ones must wait their turn.
    all.push(i % 5 === 0 ? ref.request('slow', { n: i, delayMs: 20 - (i % 20) }) : ref.request('echo', { n: i }));
  }
  await Promise.all(all);
  assert.deepEqual(log, Array.from({ length: 50 }, (_, i) => i));
  await a.stop();
});

test('malformed, unknown and invalid messages are rejected with the right class and counted', async () => {
  const broker = new InProcessBroker();
  const a = system(broker, 'a'); const b = system(broker, 'b');
  const actor = await a.spawn(echoActor([]));
  const ref = b.ref('actor', 'echo');
  await assert.rejects(ref.request('echo', { n: 'not a number' }), ValidationError);
  await assert.rejects(ref.request('nope', {}), UnknownMessageTypeError);
  // Raw garbage straight onto the subject.
  const garbage = await b.transport.request(`${actor.address}.echo`, new Uint8Array([0xc1, 0xff, 0x00]), { timeoutMs: 1_000 });
  assert.ok(garbage.data.byteLength > 0);
  assert.equal(actor.stats.rejected, 3);
  assert.equal(actor.stats.rejectedByReason.DecodeError, 1);
  const r = await ref.request<{ n: number }>('echo', { n: 3 });
  assert.equal(r.n, 3);
  await a.stop();
});

test('a request to an address nobody serves fails fast with NoRespondersError; a silent one times out', async () => {
  const broker = new InProcessBroker();
  const b = system(broker, 'b');
  await assert.rejects(b.ref('actor', 'ghost').request('echo', { n: 1 }), NoRespondersError);
  const silent = b.transport.subscribe('hps.test.actor.mute.>', () => {});
  await assert.rejects(b.ref('actor', 'mute').request('echo', { n: 1 }, { timeoutMs: 50 }), TimeoutError);
  silent.unsubscribe();
});

test('messages above max_payload are chunked and reassembled transparently', async () => {
  const broker = new InProcessBroker(64 * 1024);
  const a = system(broker, 'a'); const b = system(broker, 'b');
  await a.spawn(echoActor([]));
  const data = new Float32Array(200_000).map((_, i) => i % 7);
  const r = await b.ref('actor', 'echo').request<{ sum: number; length: number }>('blob', { data });
  assert.equal(r.length, 200_000);
  assert.equal(r.sum, data.reduce((x, y) => x + y, 0));
  assert.ok(b.transport.stats.chunksSent > 10);
  assert.equal(a.transport.stats.reassembled, 1);
  await a.stop();
});

test('a reply over the responder\'s message limit is answered at once with PayloadTooLargeError naming communication.max_message_bytes (not left to time out); a retry of the same seq gets the same answer; a send over the limit throws', async () => {
  const broker = new InProcessBroker(64 * 1024);
  const limit = 1024 * 1024;
  const limited = (node: string) => new ActorSystem({
    transport: new Transport(broker.client(), { clientId: node, clock: systemClock, reassemblyTimeoutMs: 1_000, maxMessageBytes: limit }),
    job: 'test', node, clock: systemClock, random: new SeededRandom(1), defaultRequestTimeoutMs: 20_000,
  });
  const a = limited('a'); const b = limited('b');
  let served = 0;
  await a.spawn({
    kind: 'actor', id: 'state', idempotent: true,
    messages: { dump: z.object({ floats: z.number() }) },
    handlers: { dump: (m) => { served++; return { values: new Float32Array(m.floats) }; } },
  });
  const ref = b.ref('actor', 'state');
  // Under the limit, chunked: answered.
  const small = await ref.request<{ values: Float32Array }>('dump', { floats: 200_000 });
  assert.equal(small.values.length, 200_000);
  const tooLarge = (e: unknown) => e instanceof PayloadTooLargeError && /communication\.max_message_bytes/.test((e as Error).message)
    && /its reply could not be sent/.test((e as Error).message) && (e as PayloadTooLargeError).data?.limit === limit;
  const t0 = performance.now();
  await assert.rejects(ref.request('dump', { floats: 300_000 }, { seq: 77 }), tooLarge);
  assert.ok(performance.now() - t0 < 5_000, `answered in ${Math.round(performance.now() - t0)} ms, not after the 20 s timeout`);
  await assert.rejects(ref.request('dump', { floats: 300_000 }, { seq: 77 }), tooLarge);
  assert.equal(served, 2, 'the retry was answered from the reply cache');
  // The sender's own limit: refused before anything is sent.
  assert.throws(() => ref.tell('dump', { floats: 1, pad: new Uint8Array(limit + 1) }), (e: unknown) => e instanceof PayloadTooLargeError && /raise communication\.max_message_bytes/.test((e as Error).message));
  // The actor keeps serving.
  assert.equal((await ref.request<{ values: Float32Array }>('dump', { floats: 10 })).values.length, 10);
  await a.stop(); await b.stop();
});

test('an idempotent actor applies each (from, seq) once and replays the reply on retry', async () => {
  const broker = new InProcessBroker();
  const a = system(broker, 'a'); const b = system(broker, 'b');
  let applied = 0;
  const actor = await a.spawn({
    kind: 'actor', id: 'counter', idempotent: true,
    messages: { add: z.object({ k: z.number() }) },
    handlers: { add: (m) => { applied += m.k; return { total: applied }; } },
  });
  const ref = b.ref('actor', 'counter');
  const first = await ref.request<{ total: number }>('add', { k: 5 }, { seq: 100 });
  const again = await ref.request<{ total: number }>('add', { k: 5 }, { seq: 100 });
  assert.deepEqual(first, { total: 5 });
  assert.deepEqual(again, { total: 5 });
  assert.equal(applied, 5);
  assert.equal(actor.stats.duplicates, 1);
  await a.stop();
});

/** A system on a simulated clock whose crash-loop threshold is 3 errors per second. */
function supervisedSystem() {
  const broker = new InProcessBroker();
  const clock = new SimulatedClock(0);
  const transport = new Transport(broker.client(), { clientId: 'a', clock });
  const a = new ActorSystem({
    transport, job: 'test', node: 'a', clock, random: new SeededRandom(1),
    supervision: { crashLoopThreshold: 3, crashLoopWindowMs: 1_000, initialBackoffMs: 500, maxBackoffMs: 4_000 },
  });
  return { broker, clock, a };
}

test('a crash loop pauses the mailbox with growing back-off (simulated clock)', async () => {
  const { broker, clock, a } = supervisedSystem();
  let calls = 0;
  const actor = await a.spawn({
    kind: 'actor', id: 'crashy', messages: { go: z.object({}) },
    handlers: { go: () => { calls++; throw new Error('always'); } },
  });
  const sender = system(broker, 's');
  for (let i = 0; i < 6; i++) sender.ref('actor', 'crashy').tell('go', {});
  await new Promise((r) => setImmediate(r));
  assert.equal(calls, 3, 'the third error in the window pauses the mailbox');
  assert.equal(actor.stats.crashLoopPauses, 1);
  assert.equal(actor.mailboxDepth, 3);
  clock.increment(499);
  assert.equal(calls, 3);
  clock.increment(1);
  assert.equal(calls, 6, 'after the back-off the queued messages are handled');
  assert.equal(actor.stats.crashLoopPauses, 2);
});

test('refusals (a HetpsError thrown on purpose) are answered but do not count towards a crash loop', async () => {
  const { broker, clock, a } = supervisedSystem();
  let calls = 0;
  const actor = await a.spawn({
    kind: 'actor', id: 'strict', messages: { go: z.object({}) },
    handlers: { go: () => { calls++; throw new ValidationError('bad input'); } },
  });
  const sender = system(broker, 's');
  for (let i = 0; i < 6; i++) sender.ref('actor', 'strict').tell('go', {});
  await new Promise((r) => setImmediate(r));
  assert.equal(calls, 6, 'no pause');
  assert.equal(actor.stats.crashLoopPauses, 0);
  assert.equal(actor.stats.handlerErrors, 6);
});

test('idempotentTypes limits deduplication to the listed types (reads are not remembered)', async () => {
  const broker = new InProcessBroker();
  const a = system(broker, 'a'); const b = system(broker, 'b');
  let writes = 0;
  let reads = 0;
  const actor = await a.spawn({
    kind: 'actor', id: 'store', idempotent: true, idempotentTypes: ['write'],
    messages: { write: z.object({}), read: z.object({}) },
    handlers: { write: () => ({ writes: ++writes }), read: () => ({ reads: ++reads }) },
  });
  const ref = b.ref('actor', 'store');
  assert.deepEqual(await ref.request('write', {}, { seq: 9 }), { writes: 1 });
  assert.deepEqual(await ref.request('write', {}, { seq: 9 }), { writes: 1 });
  assert.deepEqual(await ref.request('read', {}, { seq: 10 }), { reads: 1 });
  assert.deepEqual(await ref.request('read', {}, { seq: 10 }), { reads: 2 }, 'a read with a repeated seq runs again');
  assert.equal(actor.stats.duplicates, 1);
  await a.stop();
});

test('the dedup window keeps at least dedupWindow recent replies; older seqs count as applied', async () => {
  const broker = new InProcessBroker();
  const a = system(broker, 'a'); const b = system(broker, 'b');
  let applied = 0;
  await a.spawn({
    kind: 'actor', id: 'windowed', idempotent: true, dedupWindow: 8,
    messages: { add: z.object({}) },
    handlers: { add: () => ({ n: ++applied }) },
  });
  const ref = b.ref('actor', 'windowed');
  for (let seq = 1; seq <= 40; seq++) await ref.request('add', {}, { seq });
  assert.equal(applied, 40);
  for (let seq = 33; seq <= 40; seq++) assert.deepEqual(await ref.request('add', {}, { seq }), { n: seq }, `seq ${seq} replayed`);
  await assert.rejects(ref.request('add', {}, { seq: 1 }), /already applied; its reply is no longer kept/);
  assert.equal(applied, 40, 'nothing applied twice');
  await a.stop();
});

test('JSON callers (any NATS client) can drive an actor by Content-Type', async () => {
  const broker = new InProcessBroker();
  const a = system(broker, 'a'); const b = system(broker, 'b');
  const actor = await a.spawn(echoActor([]));
  const m = await b.transport.request(`${actor.address}.echo`, new TextEncoder().encode('{"n": 42}'), {
    timeoutMs: 1_000, headers: { 'Content-Type': JSON_CONTENT_TYPE },
  });
  assert.equal(m.headers?.['Content-Type'], JSON_CONTENT_TYPE);
  const body = JSON.parse(new TextDecoder().decode(m.data));
  assert.equal(body.type, 'reply');
  assert.equal(body.result.n, 42);
  const bad = await b.transport.request(`${actor.address}.echo`, new TextEncoder().encode('{"n": '), {
    timeoutMs: 1_000, headers: { 'Content-Type': JSON_CONTENT_TYPE },
  });
  assert.equal(JSON.parse(new TextDecoder().decode(bad.data)).error.name, 'DecodeError');
  await a.stop();
});

test('stop drains queued work before resolving and later requests are refused', async () => {
  const broker = new InProcessBroker();
  const a = system(broker, 'a'); const b = system(broker, 'b');
  const log: number[] = [];
  await a.spawn(echoActor(log));
  const ref = b.ref('actor', 'echo');
  const inflight = [ref.request('slow', { n: 1, delayMs: 30 }), ref.request('slow', { n: 2, delayMs: 10 })];
  await new Promise((r) => setTimeout(r, 5));
  await a.stop();
  assert.deepEqual(log, [1, 2]);
  await Promise.all(inflight);
  await assert.rejects(ref.request('echo', { n: 3 }), NoRespondersError);
});

test('an encoded envelope with a newer protocol version is refused', async () => {
  const broker = new InProcessBroker();
  const a = system(broker, 'a'); const b = system(broker, 'b');
  const actor = await a.spawn(echoActor([]));
  const m = await b.transport.request(`${actor.address}.echo`, encode({ v: 99, type: 'echo', from: 'x', seq: 1, n: 1 }), { timeoutMs: 1_000 });
  assert.ok(m.data.byteLength > 0);
  assert.equal(actor.stats.rejectedByReason.ProtocolVersionError, 1);
  await a.stop();
});

test('a deferred reply lets the mailbox move on and answers when settled', async () => {
  const { DeferredReply } = await import('../../runtime/mod.ts');
  const broker = new InProcessBroker();
  const a = system(broker, 'a'); const b = system(broker, 'b');
  const waiting: InstanceType<typeof DeferredReply>[] = [];
  let opened = 0;
  await a.spawn({
    kind: 'actor', id: 'gate', idempotent: true,
    messages: { wait: z.object({}), open: z.object({}) },
    handlers: {
      wait: () => { const d = new DeferredReply(); waiting.push(d); return d; },
      open: () => { opened++; for (const d of waiting.splice(0)) d.resolve({ opened }); return { released: true }; },
    },
  });
  const ref = b.ref('actor', 'gate');
  const w1 = ref.request<{ opened: number }>('wait', {}, { seq: 500 });
  const w2 = ref.request<{ opened: number }>('wait', {});
  // The open request is handled while both waits are still pending.
  assert.deepEqual(await ref.request('open', {}), { released: true });
  assert.deepEqual(await w1, { opened: 1 });
  assert.deepEqual(await w2, { opened: 1 });
  // A retry of an answered deferred request replays its reply.
  assert.deepEqual(await ref.request('wait', {}, { seq: 500 }), { opened: 1 });
  await a.stop();
});

test('the dedup window evicts the oldest replies and still refuses a replay older than the window', async () => {
  const broker = new InProcessBroker();
  const a = system(broker, 'a'); const b = system(broker, 'b');
  let applied = 0;
  const actor = await a.spawn({
    kind: 'actor', id: 'small-window', idempotent: true, dedupWindow: 3,
    messages: { add: z.object({}) },
    handlers: { add: () => ({ n: ++applied }) },
  });
  const ref = b.ref('actor', 'small-window');
  for (let seq = 1; seq <= 5; seq++) await ref.request('add', {}, { seq });
  assert.deepEqual(await ref.request('add', {}, { seq: 5 }), { n: 5 }, 'a recent seq replays its reply');
  await assert.rejects(ref.request('add', {}, { seq: 1 }), /already applied; its reply is no longer kept/);
  assert.equal(applied, 5);
  assert.equal(actor.stats.duplicates, 2);
  await a.stop();
});

test('transferAttemptMs: twice the transfer time of the bytes under way at the link rate, never below the base attempt nor above the cap; the base where the rate is unknown', () => {
  // 1 MB at 4 Mbit/s takes 2 s: the attempt is 4 s.
  assert.equal(transferAttemptMs(2_000, 1_000_000, 4), 4_000);
  assert.equal(transferAttemptMs(2_000, 100_000, 4), 2_000, '0.2 s on the link: the base attempt');
  assert.equal(transferAttemptMs(2_000, 1_000_000, null), 2_000);
  assert.equal(transferAttemptMs(2_000, 1_000_000, 0), 2_000);
  assert.equal(transferAttemptMs(2_000, 0, 4), 2_000);
  assert.equal(transferAttemptMs(2_000, 1e9, 1), 600_000, 'capped at 10 minutes');
  assert.equal(transferAttemptMs(2_000, 1_000_000, 4, 3), 6_000);
});
