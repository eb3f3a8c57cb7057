/**
 * Big envelopes (≥ 256 KiB) are written into pooled buffers that the
 * transport hands back only once the bus has provably sent them (a flush that
 * started after the publish resolved). These tests pin the pool's rules and
 * the transport's: never one buffer for two messages, never back before the
 * flush, nothing back after a failed flush, and every message intact.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { z } from 'zod';
import {
  ActorSystem, InProcessBroker, InProcessBus, SeededRandom, Transport, bigEnvelopePoolStats, encodeEnvelope, isPooledBigEnvelope,
  recycleBigEnvelope, silentLogger, systemClock, zbytes, type Bus,
} from '../../runtime/mod.ts';

const BIG = 1024 * 1024;

function big(fill: number, n = BIG): Uint8Array {
  return new Uint8Array(n).fill(fill);
}

function envelope(fill: number, n = BIG): Uint8Array {
  return encodeEnvelope({ type: 'blob', from: 'w1', seq: fill }, { data: big(fill, n) });
}

test('a big envelope comes from the pool; one handed back is issued again, and never to two messages at once', () => {
  const a = envelope(1);
  assert.ok(isPooledBigEnvelope(a), 'a 1 MiB envelope is pooled');
  const b = envelope(2);
  assert.notEqual(a.buffer, b.buffer, 'two envelopes not handed back have their own buffers');
  assert.equal(recycleBigEnvelope(a), true);
  assert.equal(recycleBigEnvelope(a), false, 'handing one back twice is ignored (it would be issued twice)');
  const reusedBefore = bigEnvelopePoolStats.reused;
  const c = envelope(3);
  assert.equal(c.buffer, a.buffer, 'the buffer handed back is issued again');
  assert.equal(bigEnvelopePoolStats.reused, reusedBefore + 1);
  const d = envelope(4);
  assert.notEqual(d.buffer, c.buffer, 'while c holds it, it is not issued again');
  // Every envelope still carries its own bytes.
  for (const [e, fill] of [[b, 2], [c, 3], [d, 4]] as const) assert.equal(e[e.length - 1], fill);
  recycleBigEnvelope(b); recycleBigEnvelope(c); recycleBigEnvelope(d);
});

test('only buffers the pool issued are taken back, and small envelopes are not pooled', () => {
  const mine = new Uint8Array(BIG);
  assert.equal(recycleBigEnvelope(mine), false, "a caller's own buffer is never pooled");
  const small = encodeEnvelope({ type: 'blob', from: 'w1', seq: 1 }, { data: big(1, 4096) });
  assert.equal(isPooledBigEnvelope(small), false);
  assert.equal(recycleBigEnvelope(small), false);
  const e = envelope(5);
  assert.equal(recycleBigEnvelope(e.subarray(1)), false, 'a view that does not start the buffer is refused');
  assert.equal(recycleBigEnvelope(e), true);
});

test('a pooled buffer is reused only for a message of up to twice its size, and a bigger one gets a new buffer', () => {
  const a = envelope(6, 2 * BIG);
  recycleBigEnvelope(a);
  const small = envelope(7, 512 * 1024);
  assert.notEqual(small.buffer, a.buffer, 'a 0.5 MiB message does not take a 2 MiB buffer');
  const bigger = envelope(8, 3 * BIG);
  assert.notEqual(bigger.buffer, a.buffer, 'a 3 MiB message does not fit a 2 MiB buffer');
  assert.equal(bigger[bigger.length - 1], 8);
  const same = envelope(9, 2 * BIG - 1000);
  assert.equal(same.buffer, a.buffer);
  for (const e of [small, bigger, same]) recycleBigEnvelope(e);
});

/** An in-process bus whose flushes wait until the test lets them go (or fail). */
function heldFlushBus(inner: Bus): { bus: Bus; release: () => void; fail: () => void; pending: () => number } {
  let waiting: { resolve: () => void; reject: (e: Error) => void }[] = [];
  const bus: Bus = {
    kind: inner.kind, maxPayload: inner.maxPayload, connectedServer: inner.connectedServer,
    publish: (s, d, o) => inner.publish(s, d, o),
    subscribe: (s, h, o) => inner.subscribe(s, h, o),
    flush: () => new Promise<void>((resolve, reject) => { waiting.push({ resolve, reject }); }),
    onStatus: (l) => inner.onStatus(l),
    close: () => inner.close(),
  };
  const settle = (ok: boolean) => { const w = waiting; waiting = []; for (const x of w) (ok ? x.resolve() : x.reject(new Error('connection closed'))); };
  return { bus, release: () => settle(true), fail: () => settle(false), pending: () => waiting.length };
}

const tick = () => new Promise((r) => setImmediate(r));

/** A transport over a held-flush bus, and a send: an envelope of `fill` published and released. */
function heldTransport() {
  const held = heldFlushBus(new InProcessBus(new InProcessBroker(8 * 1024 * 1024)));
  const t = new Transport(held.bus, { clientId: 'send' });
  const send = (fill: number): Uint8Array => {
    const e = envelope(fill);
    t.publish('it.big', e);
    t.releaseWhenSent(e);
    return e;
  };
  return { held, t, send };
}

test('the transport hands a published envelope back only after a flush that began after it resolves', async () => {
  const { held, t, send } = heldTransport();
  const a = send(10);
  await tick();
  assert.equal(held.pending(), 1, 'one flush asked for');
  assert.ok(isPooledBigEnvelope(a), 'not handed back while the flush is pending');
  const b = send(11); // published after the pending flush began: needs a flush of its own
  assert.notEqual(b.buffer, a.buffer);
  held.release();
  await tick();
  assert.equal(isPooledBigEnvelope(a), false, 'a is back in the pool once its flush resolved');
  assert.ok(isPooledBigEnvelope(b), 'b waits for the flush that began after it');
  assert.equal(held.pending(), 1, 'a second flush covers b');
  held.release();
  await tick();
  assert.equal(isPooledBigEnvelope(b), false);
  await t.close();
});

test('a flush that fails hands nothing back: the bus may still hold the bytes', async () => {
  const { held, t, send } = heldTransport();
  const a = send(12);
  await tick();
  held.fail();
  await tick(); await tick();
  assert.ok(isPooledBigEnvelope(a), 'still issued: never handed back, left to the collector');
  const b = envelope(13);
  assert.notEqual(b.buffer, a.buffer);
  await t.close();
});

test('tell and request hand their big envelopes back once sent; every message arrives with its own bytes', async () => {
  const broker = new InProcessBroker(512 * 1024); // chunked: 1 MiB messages in 512 KiB pieces
  const ta = new Transport(new InProcessBus(broker), { clientId: 'recv' });
  const tb = new Transport(new InProcessBus(broker), { clientId: 'send' });
  const a = new ActorSystem({ transport: ta, job: 'pool', node: 'a', clock: systemClock, random: new SeededRandom(1), logger: silentLogger() });
  const b = new ActorSystem({ transport: tb, job: 'pool', node: 'b', clock: systemClock, random: new SeededRandom(2), logger: silentLogger() });
  const got: number[][] = [];
  await a.spawn({
    kind: 'actor', id: 'sink', messages: { blob: z.object({ data: zbytes() }) },
    handlers: {
      blob: (m) => {
        const d = m.data;
        const first = d[0]!;
        assert.ok(d.every((x) => x === first), 'a message is one fill from end to end');
        got.push([first, d.length]);
        return { n: d.length };
      },
    },
  });
  const sink = b.ref('actor', 'sink');
  const reusedBefore = bigEnvelopePoolStats.reused;
  for (let i = 1; i <= 6; i++) {
    sink.tell('blob', { data: big(i) });
    await tb.flush();
    await tick();
  }
  for (let i = 7; i <= 9; i++) assert.deepEqual(await sink.request('blob', { data: big(i) }), { n: BIG });
  await tick(); await tick();
  assert.deepEqual(got.map((g) => g[0]), [1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.ok(got.every((g) => g[1] === BIG));
  assert.ok(bigEnvelopePoolStats.reused - reusedBefore >= 7, `envelopes reused ${bigEnvelopePoolStats.reused - reusedBefore} times in 9 sends`);
  await a.stop(); await b.stop(); await ta.close(); await tb.close();
});
