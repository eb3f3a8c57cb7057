import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EXT_TYPES, codecStats, decode, encode, type WireTypedArray } from '../../runtime/codec.ts';
import { DecodeError } from '../../runtime/errors.ts';
import { SeededRandom } from '../../runtime/random.ts';

type Kind = keyof typeof EXT_TYPES;
const CTORS: Record<Kind, new (n: number) => WireTypedArray> = {
  Float32Array, Float64Array, Int32Array, Uint32Array, BigInt64Array, Uint16Array, Int8Array, Int16Array, BigUint64Array,
};
const KINDS = Object.keys(CTORS) as Kind[];

function bytesOf(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/** Random contents, with the edge values of the type first. */
function randomArray(kind: Kind, n: number, rnd: SeededRandom): WireTypedArray {
  const a = new CTORS[kind](n);
  const raw = new Uint8Array(a.buffer);
  for (let i = 0; i < raw.length; i++) raw[i] = rnd.int(256);
  const edges: Record<Kind, unknown[]> = {
    Float32Array: [NaN, Infinity, -Infinity, -0, 3.4028234663852886e38, 1.401298464324817e-45],
    Float64Array: [NaN, Infinity, -Infinity, -0, Number.MAX_VALUE, Number.MIN_VALUE],
    Int32Array: [-(2 ** 31), 2 ** 31 - 1, 0, -1],
    Uint32Array: [0, 2 ** 32 - 1],
    BigInt64Array: [-(2n ** 63n), 2n ** 63n - 1n, 0n, -1n],
    BigUint64Array: [0n, 2n ** 64n - 1n],
    Uint16Array: [0, 0xffff, 0x7c00, 0xfc00, 0x7e00], // fp16 bits: 0, NaN-ish, +Inf, -Inf, NaN
    Int8Array: [-128, 127, 0],
    Int16Array: [-32768, 32767, 0],
  };
  const e = edges[kind];
  for (let i = 0; i < Math.min(n, e.length); i++) (a as unknown as unknown[])[i] = e[i];
  return a;
}

function assertSameArray(actual: unknown, expected: WireTypedArray): void {
  assert.ok(actual instanceof expected.constructor, `expected ${expected.constructor.name}, got ${String(actual?.constructor?.name)}`);
  // Byte equality: also pins NaN payloads and -0.
  assert.deepEqual(bytesOf(actual as WireTypedArray), bytesOf(expected));
}

/** Copies `bytes` into a fresh buffer so that byte `payloadAt` of it lands at an offset ≡ `residue` (mod 8). */
function placeAt(bytes: Uint8Array, payloadAt: number, residue: number): Uint8Array {
  const shift = (((residue - payloadAt) % 8) + 8) % 8;
  const buf = new Uint8Array(bytes.length + 16);
  buf.set(bytes, shift + 8);
  return buf.subarray(shift + 8, shift + 8 + bytes.length);
}

test('every typed array kind round-trips with random and edge contents', () => {
  const rnd = new SeededRandom(1);
  for (const kind of KINDS) {
    for (const n of [1, 2, 7, 100, 1000]) {
      const a = randomArray(kind, n, rnd);
      assertSameArray(decode(encode(a)), a);
    }
  }
});

test('empty arrays of every kind round-trip', () => {
  for (const kind of KINDS) {
    const out = decode(encode({ x: new CTORS[kind](0) })) as { x: WireTypedArray };
    assert.ok(out.x instanceof CTORS[kind]);
    assert.equal(out.x.length, 0);
  }
});

test('typed arrays nested in objects and arrays round-trip, next to plain values', () => {
  const rnd = new SeededRandom(2);
  const value = {
    a: KINDS.map((k) => randomArray(k, 5, rnd)),
    b: { c: [{ d: randomArray('Float32Array', 33, rnd) }], e: 'text', f: -1.5, g: true, h: null },
    big: 2 ** 40,
    bytes: new Uint8Array([1, 2, 3]),
  };
  const out = decode(encode(value)) as typeof value;
  value.a.forEach((arr, i) => assertSameArray(out.a[i], arr));
  assertSameArray(out.b.c[0]!.d, value.b.c[0]!.d);
  assert.deepEqual({ ...out.b, c: null }, { ...value.b, c: null });
  assert.equal(out.big, 2 ** 40);
  assert.ok(out.bytes instanceof Uint8Array);
  assert.deepEqual([...out.bytes], [1, 2, 3]);
});

test('a subarray view is encoded as its own elements only', () => {
  const base = new Float64Array([1, 2, 3, 4, 5]);
  assertSameArray(decode(encode(base.subarray(1, 3))), new Float64Array([2, 3]));
});

test('an 8 MiB Float32Array round-trips', () => {
  const rnd = new SeededRandom(3);
  const a = randomArray('Float32Array', 2 * 1024 * 1024, rnd);
  const bytes = encode({ grad: a, step: 9 });
  assert.ok(bytes.length > 8 * 1024 * 1024);
  const out = decode(bytes) as { grad: Float32Array; step: number };
  assertSameArray(out.grad, a);
  assert.equal(out.step, 9);
});

test('extension type numbers are the documented ones and Uint8Array stays bin', () => {
  assert.deepEqual(EXT_TYPES, {
    Float32Array: 1, Float64Array: 2, Int32Array: 3, Uint32Array: 4, BigInt64Array: 5,
    Uint16Array: 6, Int8Array: 7, Int16Array: 8, BigUint64Array: 9,
  });
  for (const kind of KINDS) {
    const bytes = encode(new CTORS[kind](1));
    // One element of 1, 2, 4 or 8 bytes is a fixext: head byte, ext type, payload.
    assert.equal(bytes[1], EXT_TYPES[kind], kind);
    assert.equal(bytes.length, 2 + new CTORS[kind](1).byteLength, kind);
  }
  assert.deepEqual([...encode(new Uint8Array([7, 8]))], [0xc4, 2, 7, 8]);
  assert.ok(decode(encode(Buffer.from([1]))) instanceof Uint8Array);
});

test('payloads are little-endian on the wire', () => {
  assert.deepEqual([...encode(new Uint32Array([0x04030201]))], [0xd6, EXT_TYPES.Uint32Array, 1, 2, 3, 4]);
});

test('an aligned payload decodes to a view on the input buffer, without a copy', () => {
  const rnd = new SeededRandom(4);
  for (const kind of KINDS) {
    const a = randomArray(kind, 64, rnd);
    const bytes = encode(a);
    const input = placeAt(bytes, bytes.length - a.byteLength, 0);
    const before = codecStats();
    const out = decode(input) as WireTypedArray;
    assertSameArray(out, a);
    assert.equal(out.buffer, input.buffer, `${kind} should be a view on the input`);
    assert.equal(codecStats().zeroCopyViews, before.zeroCopyViews + 1);
    assert.equal(codecStats().alignedCopies, before.alignedCopies);
  }
});

test('the zero-copy view aliases the input bytes', () => {
  const bytes = encode(new Float32Array([1, 2]));
  const input = placeAt(bytes, 2, 0);
  const out = decode(input) as Float32Array;
  new Float32Array(input.buffer, input.byteOffset + 2 + 4, 1)[0] = 42;
  assert.equal(out[1], 42);
});

test('a misaligned payload decodes to correct values through a copy', () => {
  const rnd = new SeededRandom(5);
  for (const kind of KINDS) {
    if (kind === 'Int8Array') continue; // one-byte elements are always aligned
    const a = randomArray(kind, 64, rnd);
    const bytes = encode({ x: a });
    const input = placeAt(bytes, bytes.length - a.byteLength, 1);
    const before = codecStats();
    const out = (decode(input) as { x: WireTypedArray }).x;
    assertSameArray(out, a);
    assert.notEqual(out.buffer, input.buffer);
    assert.equal(out.byteOffset, 0);
    assert.equal(codecStats().alignedCopies, before.alignedCopies + 1);
  }
});

test('a misaligned payload inside a Node Buffer is copied, not misread (Buffer#slice is a view)', () => {
  const a = new Float64Array([1.25, -2.5, NaN, 1e300]);
  const bytes = encode({ x: a });
  const payloadAt = bytes.length - a.byteLength;
  const backing = Buffer.alloc(bytes.length + 16);
  const shift = ((3 - payloadAt) % 8 + 8) % 8 + 8; // payload lands at an offset ≡ 3 (mod 8)
  backing.set(bytes, shift);
  const input = backing.subarray(shift, shift + bytes.length); // a Buffer, as nats.js delivers
  const out = (decode(input) as { x: Float64Array }).x;
  assertSameArray(out, a);
  assert.notEqual(out.buffer, backing.buffer);
});

test('an ext payload whose length is not a multiple of the element size is a DecodeError', () => {
  // ext 8, 3 bytes, type Float32Array
  assert.throws(() => decode(new Uint8Array([0xc7, 3, EXT_TYPES.Float32Array, 1, 2, 3])), (e: unknown) =>
    e instanceof DecodeError && /not a multiple of 4/.test(e.message));
  assert.throws(() => decode(new Uint8Array([0xd4, EXT_TYPES.BigInt64Array, 0])), DecodeError);
});

test('an unknown extension type is a DecodeError', () => {
  assert.throws(() => decode(new Uint8Array([0xd4, 42, 0])), /unknown msgpack extension type 42/);
});

test('Date travels as the msgpack timestamp', () => {
  const d = new Date(1_712_345_678_901);
  const out = decode(encode({ at: d })) as { at: Date };
  assert.ok(out.at instanceof Date);
  assert.equal(out.at.getTime(), d.getTime());
});

test('undefined is written as nil and reads back as null', () => {
  assert.deepEqual(decode(encode({ a: undefined, b: [undefined, 1] })), { a: null, b: [null, 1] });
});

test('values the wire does not carry are refused on encode instead of becoming {}', () => {
  class Point { x = 1 }
  for (const bad of [new Map([[1, 2]]), new Set([1]), new ArrayBuffer(4), 5n, () => 1, Symbol('s'), new Point()]) {
    assert.throws(() => encode({ field: bad }), TypeError, String(typeof bad));
  }
  assert.throws(() => encode({ id: 5n }), /BigInt64Array/);
});

test('results of successive encodes do not share bytes that later writes change', () => {
  const outs = Array.from({ length: 500 }, (_, i) => encode({ i, s: 'x'.repeat(i % 90) }));
  outs.forEach((b, i) => assert.deepEqual(decode(b), { i, s: 'x'.repeat(i % 90) }));
  for (const b of outs) assert.equal(b.byteOffset % 8, 0);
});

test('decode rejects input that is not a Uint8Array', () => {
  for (const bad of ['abc', 12, null, [1, 2], new ArrayBuffer(1), new Uint16Array(1)]) {
    assert.throws(() => decode(bad as unknown as Uint8Array), DecodeError);
  }
});

test('malformed msgpack is a DecodeError that keeps the cause where msgpack threw', () => {
  const cases: number[][] = [
    [], // nothing
    [0xc1], // never-used byte
    [0x92, 0x01], // array of 2 with one item
    [0x01, 0x02], // trailing byte
    [0xa5, 0x61], // str of 5 with 1 byte
    [0xcb, 0, 0], // float64 cut short
    [0xdc, 0x00], // array16 header cut short
    [0x81, 0x91, 0x01, 0x01], // map key that is an array
    [0x81, 0xa9, ...Buffer.from('__proto__'), 0x01], // __proto__ key
  ];
  for (const c of cases) assert.throws(() => decode(new Uint8Array(c)), DecodeError, JSON.stringify(c));
  assert.throws(() => decode(new Uint8Array([0x81, 0x91, 0x01, 0x01])), (e: unknown) => e instanceof DecodeError && e.cause instanceof Error);
});

test('huge declared lengths fail at once instead of allocating', () => {
  const cases: number[][] = [
    [0xc6, 0xff, 0xff, 0xff, 0xff, 1, 2, 3], // bin32 claiming 4 GiB
    [0xdb, 0xff, 0xff, 0xff, 0xff, 0x61], // str32
    [0xc9, 0xff, 0xff, 0xff, 0xff, 1, 0, 0], // ext32
    [0xdd, 0x00, 0x98, 0x96, 0x80], // array32 of ten million: msgpack would preallocate 80 MB
    [0xdf, 0x7f, 0xff, 0xff, 0xff, 0x01], // map32
    [0x91, 0x91, 0xdd, 0x00, 0x98, 0x96, 0x80, 0x01], // nested
  ];
  for (const c of cases) assert.throws(() => decode(new Uint8Array(c)), DecodeError, JSON.stringify(c));
});

test('nesting is limited to 100 levels', () => {
  const nested = (k: number) => new Uint8Array([...new Array<number>(k).fill(0x91), 0x01]);
  let v = decode(nested(100));
  for (let i = 0; i < 100; i++) v = (v as unknown[])[0];
  assert.equal(v, 1);
  assert.throws(() => decode(nested(101)), /nesting deeper than 100/);
});

test('random bytes only ever throw DecodeError', { timeout: 60_000 }, () => {
  const rnd = new SeededRandom(6);
  let ok = 0;
  for (let i = 0; i < 5000; i++) {
    const b = new Uint8Array(1 + rnd.int(48));
    for (let j = 0; j < b.length; j++) b[j] = rnd.int(256);
    try {
      decode(b);
      ok++;
    } catch (e) {
      assert.ok(e instanceof DecodeError, `${String(e)} for ${Buffer.from(b).toString('hex')}`);
    }
  }
  assert.ok(ok < 5000);
});

// The top-level map (every envelope) is read by hand; an array at the top goes through msgpack's Decoder whole.
test('a top-level map decodes to what msgpack gives for the same map nested in an array', () => {
  const rnd = new SeededRandom(11);
  const word = (n: number) => Array.from({ length: n }, () => String.fromCharCode(97 + rnd.int(26))).join('');
  const values: (() => unknown)[] = [
    () => rnd.int(128), () => -1 - rnd.int(32), () => rnd.int(256), () => rnd.int(65536), () => rnd.int(2 ** 32),
    () => -rnd.int(128), () => -rnd.int(32768), () => -rnd.int(2 ** 31), () => 2 ** 53 - 1 - rnd.int(1000), () => -(2 ** 53) + 1 + rnd.int(1000),
    () => rnd.next() * 1e6 - 5e5, () => NaN, () => -Infinity, () => null, () => true, () => false,
    () => word(rnd.int(33)), () => word(33 + rnd.int(300)), () => 'ü€😀'.repeat(1 + rnd.int(80)), () => '',
    () => new Uint8Array(rnd.int(300)).map(() => rnd.int(256)), () => randomArray(KINDS[rnd.int(KINDS.length)]!, rnd.int(40), rnd),
    () => new Date(1_700_000_000_000 + rnd.int(1e9)), () => [1, 'a', { b: new Float32Array([1, 2]) }], () => ({ nested: { deep: [null] } }),
    () => new Float64Array(0), () => [],
  ];
  for (let i = 0; i < 2000; i++) {
    const map: Record<string, unknown> = {};
    const n = rnd.int(20);
    for (let k = 0; k < n; k++) map[k % 3 === 0 ? word(1 + rnd.int(40)) : `k${k}`] = values[rnd.int(values.length)]!();
    const viaMsgpack = (decode(encode([map])) as unknown[])[0];
    assert.deepEqual(decode(encode(map)), viaMsgpack);
  }
  // Map 16 and map 32 headers.
  for (const n of [16, 70_000]) {
    const big = Object.fromEntries(Array.from({ length: n }, (_, i) => [`f${i}`, i]));
    assert.deepEqual(decode(encode(big)), big);
  }
  // Integer keys: msgpack reads the whole map.
  assert.deepEqual(decode(new Uint8Array([0x82, 0x01, 0xa1, 0x61, 0xa1, 0x62, 0x02])), { 1: 'a', b: 2 });
});

test('many distinct short strings of one length decode right past the string cache', () => {
  for (let i = 0; i < 3000; i++) {
    const s = `s${String(i).padStart(6, '0')}`;
    assert.deepEqual(decode(encode({ [s]: s, from: `w${i % 40}` })), { [s]: s, from: `w${i % 40}` });
  }
});
