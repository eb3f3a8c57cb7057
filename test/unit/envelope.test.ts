import { test } from 'node:test';
import assert from 'node:assert/strict';
import { z } from 'zod';
import { encode } from '../../runtime/codec.ts';
import {
  PROTOCOL_VERSION, decodeEnvelope, defineMessages, encodeEnvelope,
  zf32, zf64, zi32, zi64, zu16, zu32,
} from '../../runtime/envelope.ts';
import {
  DecodeError, HetpsError, ProtocolVersionError, UnknownMessageTypeError, ValidationError,
} from '../../runtime/errors.ts';
import { SeededRandom } from '../../runtime/random.ts';

const schemas = defineMessages({
  ping: z.object({ at: z.number() }),
  push: z.object({
    shard: z.string(), step: z.number().int(), grad: zf32(), keys: zi64(), half: zu16().nullable(),
  }),
  grad: z.object({ grad: zf32() }),
  batch: z.object({ items: z.array(z.object({ x: z.number() })) }),
  sized: z.object({ w: zf32({ length: 4 }), ids: zi32({ maxLength: 2 }) }),
});

const header = { type: 'ping', from: 'worker-1', seq: 7 };

/** Copies `bytes` into a fresh buffer so that byte `at` of it lands on an 8-byte boundary. */
function alignByteAt(bytes: Uint8Array, at: number): Uint8Array {
  const shift = (8 - (at % 8)) % 8;
  const buf = new Uint8Array(bytes.length + 8);
  buf.set(bytes, shift);
  return buf.subarray(shift, shift + bytes.length);
}

function throwsWith<E extends HetpsError>(
  fn: () => unknown, cls: new (...a: never[]) => E, check: (e: E) => void = () => {},
): void {
  let caught: unknown = null;
  try {
    fn();
  } catch (e) {
    caught = e;
  }
  assert.ok(caught instanceof cls, `expected ${cls.name}, got ${String(caught)}`);
  check(caught as E);
}

test('an envelope round-trips with its header and typed fields', () => {
  const grad = new Float32Array([1.5, NaN, -Infinity]);
  const keys = new BigInt64Array([-(2n ** 63n), 2n ** 63n - 1n]);
  const bytes = encodeEnvelope({ type: 'push', from: 'w-3', seq: 2 ** 40 }, { shard: 's1', step: 3, grad, keys, half: null });
  const msg = decodeEnvelope(bytes, schemas);
  assert.equal(msg.type, 'push');
  if (msg.type !== 'push') return;
  const typed: { grad: Float32Array; keys: BigInt64Array; half: Uint16Array | null } = msg; // the union narrows by `type`
  assert.deepEqual({ v: msg.v, from: msg.from, seq: msg.seq, shard: msg.shard, step: msg.step }, {
    v: PROTOCOL_VERSION, from: 'w-3', seq: 2 ** 40, shard: 's1', step: 3,
  });
  assert.deepEqual([...typed.grad], [...grad]);
  assert.deepEqual([...typed.keys], [...keys]);
  assert.equal(typed.half, null);
});

test('the wire form is one flat map with the envelope keys first', () => {
  const bytes = encodeEnvelope(header, { at: 1 });
  // fixmap of 5: v, type, from, seq, at
  assert.equal(bytes[0], 0x85);
  assert.deepEqual([...bytes.subarray(1, 4)], [0xa1, 'v'.charCodeAt(0), PROTOCOL_VERSION]);
});

test('validated typed arrays are the decoded instances: views on the input, not copies', () => {
  const grad = new Float32Array(1024).map((_, i) => i / 3);
  const bytes = encodeEnvelope({ type: 'grad', from: 'w', seq: 1 }, { grad });
  const input = alignByteAt(bytes, bytes.length - grad.byteLength); // grad is the last field
  const msg = decodeEnvelope(input, schemas);
  assert.ok(msg.type === 'grad');
  assert.equal(msg.grad.buffer, input.buffer);
  assert.deepEqual(msg.grad, grad);

  const schema = schemas.schemaOf('push')!;
  const keys = new BigInt64Array(2);
  const half = new Uint16Array(3);
  const parsed = schema.parse({ shard: 's', step: 1, grad, keys, half });
  assert.equal(parsed.grad, grad);
  assert.equal(parsed.keys, keys);
  assert.equal(parsed.half, half);
  for (const [make, value] of [[zf32, grad], [zf64, new Float64Array(1)], [zu32, new Uint32Array(1)]] as const) {
    assert.equal(make().parse(value), value);
  }
});

test('unknown extra fields are stripped', () => {
  const msg = decodeEnvelope(encodeEnvelope(header, { at: 1, extra: 'x' }), schemas);
  assert.deepEqual({ ...msg }, { at: 1, v: 1, type: 'ping', from: 'worker-1', seq: 7 });
});

test('a plain { type: schema } record works as the registry too', () => {
  const plain = { ping: z.object({ at: z.number() }) };
  const msg = decodeEnvelope(encodeEnvelope(header, { at: 5 }), plain);
  assert.equal(msg.at, 5);
  throwsWith(() => decodeEnvelope(encodeEnvelope({ ...header, type: 'pong' }, { at: 5 }), plain), UnknownMessageTypeError);
});

test('encodeEnvelope refuses a field named like an envelope key', () => {
  for (const key of ['v', 'type', 'from', 'seq']) {
    throwsWith(() => encodeEnvelope(header, { at: 1, [key]: 2 }), ValidationError, (e) => {
      assert.match(e.message, new RegExp(`field '${key}'`));
      assert.equal(e.data?.key, key);
    });
  }
});

test('encodeEnvelope refuses a malformed header', () => {
  for (const bad of [{ seq: -1 }, { seq: 1.5 }, { seq: 2 ** 53 }, { from: '' }, { from: 'x'.repeat(257) }, { type: '' }]) {
    throwsWith(() => encodeEnvelope({ ...header, ...bad }, { at: 1 }), ValidationError);
  }
});

test('defineMessages refuses a schema that declares an envelope key', () => {
  throwsWith(() => defineMessages({ bad: z.object({ seq: z.number() }) }), ValidationError, (e) => assert.match(e.message, /'seq'/));
});

test('a wrong or missing protocol version is a ProtocolVersionError naming the spoken versions', () => {
  for (const v of [2, 0, '1', null, undefined]) {
    const bytes = encode({ v, type: 'ping', from: 'worker-9', seq: 1, at: 1 });
    throwsWith(() => decodeEnvelope(bytes, schemas), ProtocolVersionError, (e) => {
      assert.match(e.message, /speaks version 1/);
      assert.match(e.message, /worker-9/);
      assert.equal(e.data?.type, 'ping');
      assert.equal(e.data?.from, 'worker-9');
    });
  }
  throwsWith(() => decodeEnvelope(encode({ type: 'ping', from: 'a', seq: 1, at: 1 }), schemas), ProtocolVersionError,
    (e) => assert.match(e.message, /no protocol version/));
});

test('a malformed type, from or seq is a ValidationError that still names what it could read', () => {
  const base = { v: 1, type: 'ping', from: 'worker-2', seq: 3, at: 1 };
  const cases: [Record<string, unknown>, RegExp][] = [
    [{ seq: -1 }, /seq/], [{ seq: 1.5 }, /seq/], [{ seq: '3' }, /seq/], [{ seq: undefined }, /seq/],
    [{ seq: 2 ** 53 }, /seq/], [{ seq: null }, /seq/],
    [{ from: undefined }, /from/], [{ from: '' }, /from/], [{ from: 'x'.repeat(257) }, /from/], [{ from: 5 }, /from/],
    [{ type: undefined }, /type/], [{ type: '' }, /type/], [{ type: 12 }, /type/],
  ];
  for (const [patch, re] of cases) {
    const msg: Record<string, unknown> = { ...base, ...patch };
    for (const k of Object.keys(patch)) if (patch[k] === undefined) delete msg[k];
    throwsWith(() => decodeEnvelope(encode(msg), schemas), ValidationError, (e) => {
      assert.match(e.message, re, JSON.stringify(patch));
      assert.ok(e.data && 'type' in e.data && 'from' in e.data);
      if (!('from' in patch)) assert.equal(e.data.from, 'worker-2');
    });
  }
  // A 256-character sender is fine.
  assert.equal(decodeEnvelope(encode({ ...base, from: 'x'.repeat(256) }), schemas).from.length, 256);
});

test('an unknown type is an UnknownMessageTypeError naming it and the known types', () => {
  const bytes = encodeEnvelope({ type: 'pong', from: 'w-1', seq: 1 }, {});
  throwsWith(() => decodeEnvelope(bytes, schemas), UnknownMessageTypeError, (e) => {
    assert.match(e.message, /"pong"/);
    assert.match(e.message, /known: ping, push, grad, batch, sized/);
    assert.deepEqual({ type: e.data?.type, from: e.data?.from }, { type: 'pong', from: 'w-1' });
  });
  // Names that exist on Object.prototype are not message types.
  for (const type of ['constructor', '__proto__', 'toString', 'hasOwnProperty']) {
    throwsWith(() => decodeEnvelope(encodeEnvelope({ type, from: 'w', seq: 1 }, {}), schemas), UnknownMessageTypeError);
  }
  const many = defineMessages(Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`type-${i}`, z.object({})])));
  throwsWith(() => decodeEnvelope(bytes, many), UnknownMessageTypeError, (e) => {
    assert.match(e.message, /type-0, type-1, .*\(\+28 more\)/);
  });
});

test('fields failing the schema are a ValidationError listing each issue path', () => {
  const bytes = encodeEnvelope({ type: 'push', from: 'w-5', seq: 9 }, {
    shard: 's', step: 1.5, grad: new Float64Array(2), keys: new BigInt64Array(1), half: null,
  });
  throwsWith(() => decodeEnvelope(bytes, schemas), ValidationError, (e) => {
    assert.match(e.message, /fields\.grad: expected Float32Array, got a Float64Array/);
    assert.match(e.message, /fields\.step: /);
    assert.match(e.message, /"push" from "w-5" \(seq 9\)/);
    assert.deepEqual({ type: e.data?.type, from: e.data?.from, seq: e.data?.seq }, { type: 'push', from: 'w-5', seq: 9 });
    const paths = (e.data?.issues as { path: string }[]).map((i) => i.path).sort();
    assert.deepEqual(paths, ['fields.grad', 'fields.step']);
  });
  const missing = encodeEnvelope({ type: 'push', from: 'w', seq: 1 }, { shard: 's', step: 1, keys: new BigInt64Array(1), half: null });
  throwsWith(() => decodeEnvelope(missing, schemas), ValidationError, (e) => assert.match(e.message, /fields\.grad: expected Float32Array, got nothing/));
  const nested = encodeEnvelope({ type: 'batch', from: 'w', seq: 1 }, { items: [{ x: 1 }, { x: 'no' }] });
  throwsWith(() => decodeEnvelope(nested, schemas), ValidationError, (e) => assert.match(e.message, /fields\.items\[1\]\.x: /));
});

test('typed-array length limits are checked with a message that says so', () => {
  const ok = encodeEnvelope({ type: 'sized', from: 'w', seq: 1 }, { w: new Float32Array(4), ids: new Int32Array(2) });
  assert.equal(decodeEnvelope(ok, schemas).type, 'sized');
  const bad = encodeEnvelope({ type: 'sized', from: 'w', seq: 1 }, { w: new Float32Array(3), ids: new Int32Array(3) });
  throwsWith(() => decodeEnvelope(bad, schemas), ValidationError, (e) => {
    assert.match(e.message, /fields\.w: expected Float32Array of length 4, got length 3/);
    assert.match(e.message, /fields\.ids: expected Int32Array of length 0\.\.2, got length 3/);
  });
});

test('a schema that throws while checking is reported as a ValidationError', () => {
  const s = defineMessages({ boom: z.object({ a: z.number().refine(() => { throw new Error('bug in refine'); }) }) });
  throwsWith(() => decodeEnvelope(encodeEnvelope({ type: 'boom', from: 'w', seq: 1 }, { a: 1 }), s), ValidationError,
    (e) => assert.equal((e.cause as Error).message, 'bug in refine'));
});

test('bytes that are not an envelope map are a DecodeError', () => {
  for (const value of [[1, 2], 5, 'str', null, new Float32Array(2), new Uint8Array(2), new Date(0)]) {
    throwsWith(() => decodeEnvelope(encode(value), schemas), DecodeError, (e) => {
      assert.match(e.message, /not a map/);
      assert.deepEqual(e.data, { type: null, from: null });
    });
  }
  throwsWith(() => decodeEnvelope(new Uint8Array([0xc1]), schemas), DecodeError, (e) => assert.deepEqual(e.data, { type: null, from: null }));
});

test('an ext payload of the wrong length inside an envelope is a DecodeError', () => {
  const good = encodeEnvelope({ type: 'grad', from: 'w', seq: 1 }, { grad: new Float32Array([1, 2]) });
  // ... 0xd7 (fixext 8) type payload[8] at the end: turn it into ext 8 of 7 bytes.
  const head = good.subarray(0, good.length - 10);
  const bad = new Uint8Array([...head, 0xc7, 7, 1, 0, 0, 0, 0, 0, 0, 0]);
  throwsWith(() => decodeEnvelope(bad, schemas), DecodeError, (e) => assert.match(e.message, /not a multiple of 4/));
});

test('a huge declared length is a DecodeError', () => {
  // A map whose `from` value claims a 4 GiB bin with 3 bytes behind it.
  const prefix = encodeEnvelope(header, { at: 1 }).subarray(0, 1);
  throwsWith(() => decodeEnvelope(new Uint8Array([...prefix, 0xa1, 0x76, 0xc6, 0xff, 0xff, 0xff, 0xff, 1, 2, 3]), schemas), DecodeError);
  throwsWith(() => decodeEnvelope(new Uint8Array([0xc6, 0xff, 0xff, 0xff, 0xff, 1, 2, 3]), schemas), DecodeError);
  throwsWith(() => decodeEnvelope(new Uint8Array([0xdf, 0xff, 0xff, 0xff, 0xff]), schemas), DecodeError);
});

// ---- fuzz ----------------------------------------------------------------------------------------

const EXPECTED = [DecodeError, ProtocolVersionError, ValidationError, UnknownMessageTypeError];

/** Decodes, and fails the test for anything but success or one of the four envelope errors. */
function decodeOrExpectedError(bytes: Uint8Array): 'ok' | string {
  try {
    const msg = decodeEnvelope(bytes, schemas);
    assert.equal(msg.v, PROTOCOL_VERSION);
    assert.ok(schemas.has(msg.type));
    assert.ok(Number.isSafeInteger(msg.seq) && msg.seq >= 0);
    return 'ok';
  } catch (e) {
    if (e instanceof assert.AssertionError) throw e;
    assert.ok(EXPECTED.some((cls) => e instanceof cls), `unexpected ${String(e)} for ${Buffer.from(bytes).toString('hex').slice(0, 200)}`);
    const data = (e as HetpsError).data;
    assert.ok(data && 'type' in data && 'from' in data, `error data lacks type/from: ${JSON.stringify(data)}`);
    return (e as Error).name;
  }
}

function sampleMessages(rnd: SeededRandom): Uint8Array[] {
  const f32 = (n: number) => new Float32Array(n).map(() => rnd.normal());
  return [
    encodeEnvelope({ type: 'ping', from: 'worker-1', seq: 1 }, { at: 1_712_345_678_901 }),
    encodeEnvelope({ type: 'push', from: 'wörker-2', seq: 2 ** 33 }, {
      shard: 'shard-7', step: 12, grad: f32(700), keys: new BigInt64Array([1n, -5n, 2n ** 62n]), half: new Uint16Array([0x3c00, 0x7c00]),
    }),
    encodeEnvelope({ type: 'batch', from: 'worker-3', seq: 3 }, { items: Array.from({ length: 150 }, (_, i) => ({ x: i * 1.5 })) }),
    encodeEnvelope({ type: 'grad', from: 'w', seq: 4 }, { grad: f32(300) }),
    encodeEnvelope({ type: 'sized', from: 'w', seq: 5 }, { w: f32(4), ids: new Int32Array([1, 2]), extra: { deep: [1, [2, [3]]] } }),
  ].map((b) => b.slice());
}

test('fuzz: every truncation of valid envelopes is a DecodeError', { timeout: 120_000 }, () => {
  const messages = sampleMessages(new SeededRandom(11));
  let count = 0;
  for (const m of messages) {
    assert.equal(decodeOrExpectedError(m), 'ok');
    for (let len = 0; len < m.length; len++) {
      assert.equal(decodeOrExpectedError(m.subarray(0, len)), 'DecodeError');
      count++;
    }
  }
  assert.ok(count >= 5000, `only ${count} truncations`);
});

test('fuzz: single-byte mutations of valid envelopes only throw the four envelope errors', { timeout: 120_000 }, () => {
  const rnd = new SeededRandom(12);
  const messages = sampleMessages(rnd);
  const seen = new Map<string, number>();
  for (let i = 0; i < 8000; i++) {
    const m = messages[rnd.int(messages.length)]!.slice();
    // Half the mutations hit the first 48 bytes, where the envelope header lives.
    const at = i % 2 === 0 ? rnd.int(Math.min(48, m.length)) : rnd.int(m.length);
    m[at] = rnd.int(256);
    const r = decodeOrExpectedError(m);
    seen.set(r, (seen.get(r) ?? 0) + 1);
  }
  // The mutations reach every outcome, so the fuzz exercises each path.
  for (const name of ['ok', 'DecodeError', 'ProtocolVersionError', 'ValidationError', 'UnknownMessageTypeError']) {
    assert.ok((seen.get(name) ?? 0) > 0, `no ${name} in ${JSON.stringify([...seen])}`);
  }
});

test('fuzz: random byte strings only throw the four envelope errors', { timeout: 120_000 }, () => {
  const rnd = new SeededRandom(13);
  for (let i = 0; i < 6000; i++) {
    const b = new Uint8Array(rnd.int(80));
    for (let j = 0; j < b.length; j++) b[j] = rnd.int(256);
    // A third start like a map, so decoding gets past the first byte more often.
    if (i % 3 === 0 && b.length > 0) b[0] = 0x80 + rnd.int(16);
    decodeOrExpectedError(b);
  }
});

test('an envelope encodes to the same bytes as the merged object, for every seq width and field count', () => {
  const many = Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`k${i}`, i]));
  const fieldSets: Record<string, unknown>[] = [{}, { at: 1 }, { data: new Uint8Array(64) }, { s: 'x'.repeat(5000) }, many, { g: new Float32Array(70_000) }];
  for (const seq of [0, 127, 128, 255, 256, 65535, 65536, 2 ** 32 - 1, 2 ** 32, 2 ** 53 - 1]) {
    for (const fields of fieldSets) {
      const got = encodeEnvelope({ type: 'ping', from: 'worker-1', seq }, fields);
      const want = encode({ v: PROTOCOL_VERSION, type: 'ping', from: 'worker-1', seq, ...fields });
      assert.deepEqual([...got], [...want], `seq ${seq}, ${Object.keys(fields).length} field(s)`);
    }
  }
});

test('flat fields of every kind are written byte for byte as msgpack writes the merged object', () => {
  const rnd = new SeededRandom(21);
  const edges = [0, 127, 128, 255, 256, 65535, 65536, 2 ** 32 - 1, 2 ** 32, -1, -32, -33, -128, -129, -32768, -32769, -(2 ** 31), -(2 ** 31) - 1];
  const values: (() => unknown)[] = [
    () => edges[rnd.int(edges.length)], () => edges[rnd.int(edges.length)], () => edges[rnd.int(edges.length)], () => rnd.int(128), () => 128 + rnd.int(128), () => 256 + rnd.int(65280), () => 65536 + rnd.int(2 ** 31), () => 2 ** 32 + rnd.int(2 ** 20) * 977,
    () => -1 - rnd.int(32), () => -33 - rnd.int(95), () => -129 - rnd.int(32000), () => -32769 - rnd.int(2 ** 30), () => -(2 ** 31) - 1 - rnd.int(2 ** 20) * 977,
    () => 2 ** 53 - 1, () => -(2 ** 53) + 1, () => -0, () => 2 ** 53, () => rnd.next() - 0.5, () => NaN, () => Infinity, () => -Infinity, () => 1e300,
    () => 'a'.repeat(rnd.int(40)), () => 'b'.repeat(31), () => 'c'.repeat(32), () => 'd'.repeat(255), () => 'e'.repeat(256), () => 'f'.repeat(70_000),
    () => 'ü€😀'.repeat(1 + rnd.int(30)), () => 'x\ud800y', () => '', () => true, () => false, () => null, () => undefined,
    () => new Uint8Array(rnd.int(300)), () => new Uint8Array(255), () => new Uint8Array(256), () => new Uint8Array(65536), () => Buffer.from('buffer'),
    () => new Float32Array([1, 2, 3]), () => new Float32Array(1), () => new Float32Array(4), () => new Int8Array(1), () => new Int16Array(1),
    () => new Float64Array(2), () => new BigInt64Array([5n, -5n]), () => new Uint16Array(rnd.int(200)), () => new Int32Array(70_000),
    () => new Uint32Array(new ArrayBuffer(64), 4, 3), () => new Float32Array(0),
  ];
  for (let i = 0; i < 1500; i++) {
    const fields: Record<string, unknown> = {};
    const n = rnd.int(18);
    for (let k = 0; k < n; k++) fields[k % 4 === 0 ? `field_${'é'.repeat(k % 3)}${k}` : `k${k}`] = values[rnd.int(values.length)]!();
    const seq = rnd.int(2 ** 40);
    const got = encodeEnvelope({ type: 'ping', from: 'worker-1', seq }, fields);
    const want = encode({ v: PROTOCOL_VERSION, type: 'ping', from: 'worker-1', seq, ...fields });
    assert.ok(Buffer.compare(got, want) === 0, `differs from msgpack for ${JSON.stringify(Object.entries(fields).map(([k, v]) => [k, ArrayBuffer.isView(v) ? v.constructor.name : typeof v === 'string' ? v.slice(0, 20) : String(v)]))}`);
  }
  // Fields msgpack writes (nested values, Dates, DataViews) come out the same as well.
  for (const fields of [{ a: [1, 'x'], b: 2 }, { when: new Date(5), n: 1 }, { d: new DataView(new ArrayBuffer(3)) }, { o: { p: new Float32Array(2) } }]) {
    const got = encodeEnvelope({ type: 'ping', from: 'worker-1', seq: 7 }, fields);
    assert.deepEqual([...got], [...encode({ v: PROTOCOL_VERSION, type: 'ping', from: 'worker-1', seq: 7, ...fields })]);
  }
});

test('the cached envelope header follows each sender and type', () => {
  for (const [type, from] of [['ping', 'a'], ['grad', 'a'], ['ping', 'b-longer-sender'], ['ping', 'a']] as const) {
    const fields = type === 'ping' ? { at: 2 } : { grad: new Float32Array([1]) };
    const msg = decodeEnvelope(encodeEnvelope({ type, from, seq: 9 }, fields), schemas);
    assert.deepEqual({ type: msg.type, from: msg.from, seq: msg.seq }, { type, from, seq: 9 });
  }
  // A header that was fine before still fails with a bad seq.
  throwsWith(() => encodeEnvelope({ type: 'ping', from: 'a', seq: -1 }, { at: 1 }), ValidationError);
});
