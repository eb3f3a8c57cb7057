import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decodeFp16, encodeFp16 } from '../../native-bridge/fp16.ts';
import { InvalidTensorError } from '../../runtime/errors.ts';

/** The textbook definition of a half, evaluated in float64. */
function referenceHalfValue(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const mantissa = h & 0x3ff;
  if (exponent === 0x1f) return mantissa === 0 ? sign * Infinity : NaN;
  if (exponent === 0) return sign * mantissa * 2 ** -24;
  return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15);
}

const isNaNHalf = (h: number): boolean => (h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0;

/** Nearest half by brute force over the sorted positive finite halves, ties to the even pattern. */
const positiveHalves = Array.from({ length: 0x7c00 }, (_, h) => referenceHalfValue(h));
function referenceEncode(x: number): number {
  if (Number.isNaN(x)) return 0x7e00;
  const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0;
  const a = Math.abs(x);
  if (a >= 65520) return sign | 0x7c00;
  let lo = 0;
  let hi = positiveHalves.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (positiveHalves[mid]! <= a) lo = mid; else hi = mid;
  }
  const dLo = a - positiveHalves[lo]!;
  const dHi = positiveHalves[hi]! - a;
  const h = dLo < dHi ? lo : dHi < dLo ? hi : (lo & 1 ? hi : lo);
  return sign | h;
}

const allHalves = (): Uint16Array => Uint16Array.from({ length: 65536 }, (_, i) => i);

test('decode matches the textbook value for all 65 536 halves, sign of zero included', () => {
  const decoded = decodeFp16(allHalves());
  for (let h = 0; h < 65536; h++) {
    const want = referenceHalfValue(h);
    const got = decoded[h]!;
    if (Number.isNaN(want)) assert.ok(Number.isNaN(got), `half 0x${h.toString(16)} should decode to NaN`);
    else assert.ok(Object.is(got, want), `half 0x${h.toString(16)}: got ${got}, want ${want}`);
  }
});

test('encode(decode(h)) gives h back for every non-NaN half, and NaN stays NaN', () => {
  const halves = allHalves();
  const back = encodeFp16(decodeFp16(halves));
  for (let h = 0; h < 65536; h++) {
    if (isNaNHalf(h)) assert.ok(isNaNHalf(back[h]!), `NaN half 0x${h.toString(16)} came back as 0x${back[h]!.toString(16)}`);
    else assert.equal(back[h], h, `half 0x${h.toString(16)}`);
  }
});

test('midpoints between adjacent halves round to the even one; a float32 ulp either side decides', () => {
  const xs: number[] = [];
  const want: number[] = [];
  for (const sign of [0, 0x8000]) {
    for (let h = 0; h < 0x7bff; h++) {
      const a = referenceHalfValue(sign | h);
      const b = referenceHalfValue(sign | (h + 1));
      const mid = (a + b) / 2;
      assert.equal(Math.fround(mid), mid, 'midpoints of halves are float32 values');
      xs.push(mid);
      want.push(sign | ((h & 1) === 0 ? h : h + 1));
      // one float32 ulp toward each neighbour
      const f = new Float32Array([mid]);
      const u = new Uint32Array(f.buffer);
      u[0] = u[0]! + 1; xs.push(f[0]!); want.push(sign | (h + 1));
      u[0] = u[0]! - 2; xs.push(f[0]!); want.push(sign | h);
    }
  }
  const got = encodeFp16(Float32Array.from(xs));
  for (let i = 0; i < xs.length; i++) assert.equal(got[i], want[i], `x = ${xs[i]}`);
});

test('boundaries: max half, overflow to inf at 65520, subnormal edges, specials', () => {
  const cases: Array<[number, number]> = [
    [65504, 0x7bff],
    [65519.99609375, 0x7bff], // largest float32 below 65520
    [65520, 0x7c00], // tie between 65504 and 2^16 goes to the even pattern: inf
    [-65520, 0xfc00],
    [1e10, 0x7c00],
    [Infinity, 0x7c00],
    [-Infinity, 0xfc00],
    [0, 0x0000],
    [-0, 0x8000],
    [2 ** -24, 0x0001], // smallest subnormal
    [2 ** -25, 0x0000], // exactly half of it: tie to even → 0
    [2 ** -25 + 2 ** -48, 0x0001],
    [3 * 2 ** -25, 0x0002], // tie between 1 and 2 → 2
    [2 ** -14, 0x0400], // smallest normal
    [1023 * 2 ** -24, 0x03ff], // largest subnormal
    [1023.5 * 2 ** -24, 0x0400], // tie between largest subnormal and smallest normal → even (0x400)
    [1e-30, 0x0000],
    [-1e-30, 0x8000],
    [1.401298464324817e-45, 0x0000], // smallest float32 subnormal
    [1, 0x3c00],
    [-2, 0xc000],
    [0.1, 0x2e66],
  ];
  const got = encodeFp16(Float32Array.from(cases.map(([x]) => x)));
  cases.forEach(([x, h], i) => assert.equal(got[i], h, `encode(${x}) = 0x${got[i]!.toString(16)}, want 0x${h.toString(16)}`));
  const nan = encodeFp16(new Float32Array([NaN]))[0]!;
  assert.ok(isNaNHalf(nan));
});

test('random float32 bit patterns encode like the brute-force nearest-half reference', () => {
  const n = 200_000;
  const bits = new Uint32Array(n);
  let s = 12345;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    // bias toward the half range (exponents 100..150) but cover everything
    bits[i] = i % 4 === 0 ? s : ((s & 0x807fffff) | ((100 + (s >>> 24) % 50) << 23)) >>> 0;
  }
  const floats = new Float32Array(bits.buffer);
  const got = encodeFp16(floats);
  for (let i = 0; i < n; i++) {
    const x = floats[i]!;
    if (Number.isNaN(x)) { assert.ok(isNaNHalf(got[i]!)); continue; }
    assert.equal(got[i], referenceEncode(x), `x = ${x} (bits 0x${bits[i]!.toString(16)})`);
  }
});

test('works on views at an offset and into a caller-provided buffer; rejects a wrong-length dst', () => {
  const backing = new Float32Array([9, 1.5, -2.25, 9]);
  const view = backing.subarray(1, 3);
  const out = new Uint16Array(2);
  assert.equal(encodeFp16(view, out), out);
  assert.deepEqual([...out], [0x3e00, 0xc080]);
  const decoded = new Float32Array(4);
  decodeFp16(out, decoded.subarray(2, 4));
  assert.deepEqual([...decoded], [0, 0, 1.5, -2.25]);
  assert.throws(() => encodeFp16(view, new Uint16Array(3)), InvalidTensorError);
  assert.throws(() => decodeFp16(out, new Float32Array(1)), InvalidTensorError);
});
