/**
 * IEEE 754 binary16 ("half") conversion for gradient compression.
 *
 * Halves travel as raw bit patterns in a `Uint16Array`. Both directions work on
 * a `Uint32Array` view of the float buffer, so NaN payloads survive (a float
 * read into a JS number may be canonicalised) and no element allocates.
 */
import { InvalidTensorError } from '../runtime/errors.ts';

const F32_INF = 0x7f800000;

/*
 * Encoding is table driven on the top 9 bits (sign + exponent) of the float32:
 * the half is `base + round(x >> shift)`, where x is the float32 mantissa (with
 * its implicit bit when the half will be subnormal) and the rounding is ties to
 * even. One shape of arithmetic for every input keeps the loop free of
 * data-dependent branches, which matters for gradients that straddle the
 * normal/subnormal border of fp16 (|g| ≈ 6e-5): this measured ~1.5–3× faster
 * than a branch per range.
 */
const ENCODE_BASE = new Uint16Array(512);
const ENCODE_SHIFT = new Uint8Array(512);
const ENCODE_IMPLICIT = new Uint32Array(512);
for (let e9 = 0; e9 < 512; e9++) {
  const sign = e9 & 0x100 ? 0x8000 : 0;
  const e = e9 & 0xff;
  if (e >= 143) {
    // ≥ 2^16 (and inf): the mantissa term must vanish, which shift 25 guarantees.
    ENCODE_BASE[e9] = sign | 0x7c00;
    ENCODE_SHIFT[e9] = 25;
  } else if (e >= 113) {
    // Normal half: re-bias the exponent; a rounding carry out of the mantissa
    // bumps the exponent (and 65520 and up reach 0x7c00 = inf), as it should.
    ENCODE_BASE[e9] = sign | ((e - 112) << 10);
    ENCODE_SHIFT[e9] = 13;
  } else {
    // Subnormal half or zero: value in units of 2^-24 is (1.m) >> (126 - e).
    // Shift 25 already rounds everything to zero; float32 subnormals (e = 0) have no implicit bit.
    ENCODE_BASE[e9] = sign;
    ENCODE_SHIFT[e9] = Math.min(126 - e, 25);
    ENCODE_IMPLICIT[e9] = e === 0 ? 0 : 0x800000;
  }
}

let decodeTable: Uint32Array | null = null;

/** float32 bit pattern of one half bit pattern; the reference path, used to build the decode table. */
export function halfBitsToFloatBits(h: number): number {
  const sign = (h & 0x8000) << 16;
  const exponent = (h >>> 10) & 0x1f;
  let mantissa = h & 0x3ff;
  if (exponent === 0x1f) return (sign | F32_INF | (mantissa << 13)) >>> 0;
  if (exponent !== 0) return (sign | ((exponent + 112) << 23) | (mantissa << 13)) >>> 0;
  if (mantissa === 0) return sign >>> 0;
  // Subnormal half: normalise, since every half subnormal is a normal float32.
  let e = 113;
  while ((mantissa & 0x400) === 0) { mantissa <<= 1; e--; }
  return (sign | (e << 23) | ((mantissa & 0x3ff) << 13)) >>> 0;
}

function getDecodeTable(): Uint32Array {
  if (decodeTable === null) {
    // 256 KiB once per process; decoding is then one load per element.
    const t = new Uint32Array(65536);
    for (let h = 0; h < 65536; h++) t[h] = halfBitsToFloatBits(h);
    decodeTable = t;
  }
  return decodeTable;
}

/**
 * float32 → half bit patterns, rounding to nearest, ties to even. Subnormals are
 * produced exactly, |x| ≥ 65520 becomes ±inf, NaN stays NaN (quiet, top payload
 * bits kept), the sign of zero is kept. `dst`, when given, must have `src.length`.
 */
export function encodeFp16(src: Float32Array, dst?: Uint16Array): Uint16Array {
  const n = src.length;
  const out = dst ?? new Uint16Array(n);
  if (out.length !== n) {
    throw new InvalidTensorError(`encodeFp16: dst has ${out.length} elements, src has ${n}`, { data: { tensor: 'dst', expected: n, actual: out.length } });
  }
  const bits = new Uint32Array(src.buffer, src.byteOffset, n);
  for (let i = 0; i < n; i++) {
    const u = bits[i]!;
    if ((u & 0x7fffffff) > F32_INF) {
      // NaN: keep it quiet and keep the top payload bits (never taken on sane gradients).
      out[i] = ((u >>> 16) & 0x8000) | 0x7e00 | ((u >>> 13) & 0x3ff);
      continue;
    }
    const e9 = u >>> 23;
    const shift = ENCODE_SHIFT[e9]!;
    const x = (u & 0x7fffff) | ENCODE_IMPLICIT[e9]!;
    // round half to even: add just under half, plus one when the kept lowest bit is odd
    out[i] = ENCODE_BASE[e9]! + ((x + (1 << (shift - 1)) - 1 + ((x >>> shift) & 1)) >>> shift);
  }
  return out;
}

/** Half bit patterns → float32, exact (every half is a float32). `dst`, when given, must have `src.length`. */
export function decodeFp16(src: Uint16Array, dst?: Float32Array): Float32Array {
  const n = src.length;
  const out = dst ?? new Float32Array(n);
  if (out.length !== n) {
    throw new InvalidTensorError(`decodeFp16: dst has ${out.length} elements, src has ${n}`, { data: { tensor: 'dst', expected: n, actual: out.length } });
  }
  const table = getDecodeTable();
  const outBits = new Uint32Array(out.buffer, out.byteOffset, n);
  for (let i = 0; i < n; i++) outBits[i] = table[src[i]!]!;
  return out;
}

export interface Fp16MeasureOptions {
  /** Floats per encoded tensor; default 1 Mi (a 4 MiB gradient). */
  floats?: number;
  /** Keep encoding for at least this long; default 300 ms. */
  minMillis?: number;
}

function measure(kind: 'encode' | 'decode', options: Fp16MeasureOptions): number {
  const floats = options.floats ?? 1 << 20;
  const minMillis = options.minMillis ?? 300;
  const grad = new Float32Array(floats);
  // Gradient-like magnitudes, spread over normal and subnormal halves.
  let s = 0x12345678;
  for (let i = 0; i < floats; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    grad[i] = ((s / 4294967296) - 0.5) * 2 ** ((s & 31) - 20);
  }
  const halves = encodeFp16(grad);
  const back = new Float32Array(floats);
  const run = kind === 'encode' ? () => encodeFp16(grad, halves) : () => decodeFp16(halves, back);
  for (let i = 0; i < 3; i++) run(); // let the JIT settle
  let reps = 0;
  const t0 = performance.now();
  let elapsed = 0;
  do {
    run();
    reps++;
    elapsed = performance.now() - t0;
  } while (elapsed < minMillis);
  // MB = 10^6 bytes of float32 data (the uncompressed side) per second.
  return (reps * floats * 4) / 1e6 / (elapsed / 1000);
}

/** Encode throughput in MB/s of float32 input (10^6 bytes), measured on this machine. */
export function measureFp16EncodeMbPerS(options: Fp16MeasureOptions = {}): number {
  return measure('encode', options);
}

/** Decode throughput in MB/s of float32 output (10^6 bytes), measured on this machine. */
export function measureFp16DecodeMbPerS(options: Fp16MeasureOptions = {}): number {
  return measure('decode', options);
}

// ---------------------------------------------------------------- gradient compression (communication.compression: fp16)

/**
 * A gradient on the wire as scaled halves: element i is
 * `decodeFp16(f16)[i] · 2^-exp`. The power-of-two scale puts the tensor's
 * largest magnitude in [2^14, 2^15), so nothing overflows (fp16 ends at
 * 65504) and small gradients keep fp16's 11 bits instead of falling into its
 * subnormals or to zero; scaling by a power of two is exact both ways.
 */
export interface Fp16Gradient { f16: Uint16Array<ArrayBuffer>; exp: number }

/** Tensors shorter than this stay float32: the bytes saved would not pay for the work (biases, small blocks). */
export const FP16_MIN_ELEMENTS = 64;

/** |exp| this large or larger is never a scale compressGradient makes (float32 spans 2^-149 … 2^128). */
export const FP16_MAX_EXP = 200;

/**
 * A gradient for the wire: scaled halves (`Fp16Gradient`, half the bytes),
 * or `src` itself when it is shorter than FP16_MIN_ELEMENTS, holds a NaN or
 * an infinity (sent as it is, so the receiver's check names the bad
 * element), or is all zeros. Relative error per element ≤ 2^-11 of the
 * tensor's largest magnitude's binade; elements under 2^-39 of the largest
 * become 0.
 */
export function compressGradient(src: Float32Array<ArrayBuffer>): Float32Array<ArrayBuffer> | Fp16Gradient {
  const n = src.length;
  if (n < FP16_MIN_ELEMENTS) return src;
  let max = 0;
  for (let i = 0; i < n; i++) {
    const a = Math.abs(src[i]!);
    if (!(a <= max)) {
      if (!Number.isFinite(a)) return src; // NaN (the comparison fails) or ±inf
      max = a;
    }
  }
  if (max === 0) return src;
  // max in [2^k, 2^(k+1)) → max·2^(14−k) in [2^14, 2^15).
  const exp = 14 - Math.floor(Math.log2(max));
  const scale = 2 ** exp;
  const scaled = new Float32Array(n);
  for (let i = 0; i < n; i++) scaled[i] = src[i]! * scale;
  return { f16: encodeFp16(scaled) as Uint16Array<ArrayBuffer>, exp };
}

/** The float32 values of a compressed gradient (exact: every half times a power of two is a float32, bar float32 underflow). */
export function decompressGradient(g: Fp16Gradient): Float32Array<ArrayBuffer> {
  if (!Number.isInteger(g.exp) || Math.abs(g.exp) >= FP16_MAX_EXP) {
    throw new InvalidTensorError(`fp16 gradient: exp must be an integer with |exp| < ${FP16_MAX_EXP}, got ${g.exp}`, { data: { tensor: 'exp' } });
  }
  const out = decodeFp16(g.f16) as Float32Array<ArrayBuffer>;
  const unscale = 2 ** -g.exp;
  if (g.exp !== 0) for (let i = 0; i < out.length; i++) out[i] = out[i]! * unscale;
  return out;
}
