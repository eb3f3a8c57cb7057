/**
 * The transport against real nats-server processes: chunking across a
 * cluster route with a small max_payload, reassembly timeouts, and every
 * authentication method the config offers.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { z } from 'zod';
import { createUser } from '@nats-io/nkeys';
import { startTestCluster } from '../support/cluster.ts';
import { startSingleServer } from '../support/single-server.ts';
import {
  ActorSystem, ConnectionError, NatsBus, SeededRandom, Transport, connectTransport, systemClock, zf32, CHUNK_HEADER_NAME,
  decode, encodeEnvelope, isPooledBigEnvelope,
} from '../../runtime/mod.ts';
import { until } from '../support/until.ts';

test('a tensor far above max_payload crosses a cluster route in chunks and arrives intact', { timeout: 120_000 }, async (t) => {
  await using nats = await startTestCluster({ nodes: 3, maxPayload: 64 * 1024, jetstream: false });
  const ta = await connectTransport({ servers: [nats.urls[0]!], name: 'recv' });
  const tb = await connectTransport({ servers: [nats.urls[2]!], name: 'send' });
  t.after(async () => { await ta.close(); await tb.close(); });
  if (nats.cluster) assert.equal(tb.bus.maxPayload, 64 * 1024, 'max_payload is read from the server');
  const a = new ActorSystem({ transport: ta, job: 'it', node: 'a', clock: systemClock, random: new SeededRandom(1) });
  const b = new ActorSystem({ transport: tb, job: 'it', node: 'b', clock: systemClock, random: new SeededRandom(2) });
  await a.spawn({
    kind: 'actor', id: 'mirror', messages: { mirror: z.object({ x: zf32() }) },
    handlers: { mirror: (m) => ({ y: m.x.map((v) => v * 2) }) },
  });
  const x = new Float32Array(300_000);
  for (let i = 0; i < x.length; i++) x[i] = Math.sin(i);
  const r = await b.ref('actor', 'mirror').request<{ y: Float32Array }>('mirror', { x }, { timeoutMs: 30_000, retries: 3 });
  assert.ok(r.y instanceof Float32Array);
  assert.equal(r.y.length, x.length);
  for (let i = 0; i < x.length; i += 997) assert.equal(r.y[i], Math.fround(x[i]! * 2));
  assert.ok(tb.stats.chunksSent >= Math.ceil(x.byteLength / (64 * 1024)), `request split into ${tb.stats.chunksSent} chunks`);
  assert.ok(ta.stats.chunksSent > 1, 'the reply was chunked too');
  await a.stop(); await b.stop();
});

test('big envelopes: pooled buffers are reused once sent, and across a lost server no message ever carries another one\'s bytes', { timeout: 120_000 }, async (t) => {
  await using nats = await startTestCluster({ nodes: 3, jetstream: false });
  if (!nats.cluster) { t.diagnostic('reusing NATS_URL: cannot kill a server here'); return; }
  const recv = await connectTransport({ servers: [nats.urls[0]!], name: 'recv' });
  const send = await connectTransport({ servers: [nats.urls[1]!], name: 'send' });
  t.after(async () => { await recv.close(); await send.close(); });
  const got: { seq: number; fill: number; intact: boolean }[] = [];
  recv.subscribe('it.pool', (m) => {
    const e = decode(m.data) as { seq: number; data: Uint8Array };
    const d = e.data;
    got.push({ seq: e.seq, fill: d[0]!, intact: d.length === 1024 * 1024 && d.every((x) => x === d[0]) });
  });
  await recv.flush();
  const publish = (fill: number): Uint8Array => {
    const bytes = encodeEnvelope({ type: 'blob', from: 'send', seq: fill }, { data: new Uint8Array(1024 * 1024).fill(fill) });
    send.publish('it.pool', bytes);
    send.releaseWhenSent(bytes);
    return bytes;
  };
  // Connected: sent, flushed, handed back, and the next envelope reuses the buffer.
  const first = publish(1);
  await until(() => !isPooledBigEnvelope(first), 'the first envelope handed back after its flush', 10_000);
  const second = publish(2);
  assert.equal(second.buffer, first.buffer, 'the next envelope is written into the buffer handed back');
  await until(() => got.length === 2, 'two messages received', 10_000);
  // Cut off: the sender's server dies. What it publishes now is held by the
  // client, then dropped when it reconnects (nats.js v3 starts each connection
  // with an empty outbound buffer; hetps' requests re-send): the flush that
  // would hand those buffers back fails, so they are never reused while held.
  const statuses: string[] = [];
  send.bus.onStatus((s) => statuses.push(s.type));
  await nats.kill('n2');
  await until(() => statuses.includes('disconnect'), 'the sender sees its server gone', 10_000);
  const held = [publish(3), publish(4), publish(5)];
  assert.equal(new Set(held.map((b) => b.buffer)).size, 3, 'three envelopes in flight, three buffers');
  await until(() => statuses.includes('reconnect'), 'the sender reconnects to another server', 30_000);
  // Reconnected: every message sent now arrives, each with its own bytes, in buffers handed back again.
  for (let fill = 6; fill <= 9; fill++) {
    const b = publish(fill);
    await until(() => !isPooledBigEnvelope(b), `envelope ${fill} handed back after its flush`, 10_000);
  }
  await until(() => got.some((g) => g.seq === 9), 'the messages sent after the reconnect received', 30_000, () => JSON.stringify({ got, statuses }));
  t.diagnostic(`received ${JSON.stringify(got.map((g) => g.seq))}; statuses ${statuses.join(',')}`);
  for (const g of got) assert.ok(g.intact && g.fill === g.seq, `message ${g.seq} carries its own bytes (${JSON.stringify(g)})`);
  const seqs = got.map((g) => g.seq);
  for (const s of [1, 2, 6, 7, 8, 9]) assert.equal(seqs.filter((x) => x === s).length, 1, `message ${s} received once`);
  for (const s of [3, 4, 5]) assert.ok(seqs.filter((x) => x === s).length <= 1, `message ${s} received at most once`);
});

test('a chunked message that never completes is dropped after the reassembly timeout and reported', { timeout: 60_000 }, async () => {
  await using nats = await startTestCluster({ nodes: 1, jetstream: false });
  const drops: string[] = [];
  const recvBus = await NatsBus.connect({ servers: nats.urls, name: 'recv' });
  const recv = new Transport(recvBus, { clientId: 'recv', clock: systemClock, reassemblyTimeoutMs: 300, onDrop: (e) => drops.push(e.message) });
  const sendBus = await NatsBus.connect({ servers: nats.urls, name: 'send' });
  let got = 0;
  recv.subscribe('it.partial', () => { got++; });
  await recv.flush();
  // First chunk of three, then silence: the sender "died".
  sendBus.publish('it.partial', new Uint8Array(1000), { headers: { [CHUNK_HEADER_NAME]: 'dead:1/0/3', 'Hps-Chunk-Bytes': '3000' } });
  await sendBus.flush();
  await new Promise((r) => setTimeout(r, 800));
  assert.equal(got, 0);
  assert.equal(drops.length, 1);
  assert.match(drops[0]!, /stalled at chunk 1\/3/);
  assert.equal(recv.stats.reassemblyDropped, 1);
  await recv.close(); await sendBus.close();
});

async function roundTrip(servers: string[], auth: Parameters<typeof connectTransport>[0]['auth'], tls: Parameters<typeof connectTransport>[0]['tls'] = null): Promise<void> {
  const t1 = await connectTransport({ servers, name: 'auth-a', auth, tls, connectTimeoutMs: 5_000 });
  const t2 = await connectTransport({ servers, name: 'auth-b', auth, tls, connectTimeoutMs: 5_000 });
  const a = new ActorSystem({ transport: t1, job: 'auth', node: 'a', clock: systemClock, random: new SeededRandom(1) });
  const b = new ActorSystem({ transport: t2, job: 'auth', node: 'b', clock: systemClock, random: new SeededRandom(1) });
  await a.spawn({ kind: 'actor', id: 'e', messages: { ping: z.object({}) }, handlers: { ping: () => ({ pong: true }) } });
  assert.deepEqual(await b.ref('actor', 'e').request('ping', {}), { pong: true });
  await a.stop(); await t1.close(); await t2.close();
}

const noAuth = { user: null, pass: null, token: null, nkeySeed: null, credsFile: null };

test('user/password authentication, and a wrong password fails fast with a clear error', { timeout: 60_000 }, async () => {
  await using srv = await startSingleServer('authorization { user: "hetps", password: "s3cret" }');
  await roundTrip([srv.url], { ...noAuth, user: 'hetps', pass: 's3cret' });
  await assert.rejects(
    connectTransport({ servers: [srv.url], name: 'bad', auth: { ...noAuth, user: 'hetps', pass: 'wrong' }, connectTimeoutMs: 5_000 }),
    (e: unknown) => e instanceof ConnectionError && /cannot connect to NATS/.test((e as Error).message) && /credentials/.test((e as Error).message),
  );
});

test('token authentication', { timeout: 60_000 }, async () => {
  await using srv = await startSingleServer('authorization { token: "t0ken-abc" }');
  await roundTrip([srv.url], { ...noAuth, token: 't0ken-abc' });
});

test('nkey authentication', { timeout: 60_000 }, async () => {
  const user = createUser();
  await using srv = await startSingleServer(`authorization { users: [ { nkey: "${user.getPublicKey()}" } ] }`);
  await roundTrip([srv.url], { ...noAuth, nkeySeed: new TextDecoder().decode(user.getSeed()) });
});

test('TLS with a CA file', { timeout: 60_000 }, async () => {
  const dir = (await import('node:fs')).mkdtempSync(join((await import('node:os')).tmpdir(), 'hetps-tls-'));
  try {
    execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', join(dir, 'key.pem'), '-out', join(dir, 'cert.pem'),
      '-days', '1', '-subj', '/CN=localhost', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost'], { stdio: 'ignore' });
    await using srv = await startSingleServer(`tls { cert_file: "${join(dir, 'cert.pem')}", key_file: "${join(dir, 'key.pem')}" }`, { scheme: 'tls' });
    await roundTrip([srv.url], null, { caFile: join(dir, 'cert.pem'), certFile: null, keyFile: null, handshakeFirst: false });
  } finally {
    (await import('node:fs')).rmSync(dir, { recursive: true, force: true });
  }
});
