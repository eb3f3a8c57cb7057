/**
 * The wire codec: msgpack with typed arrays as extension types.
 *
 * A typed array travels as the raw little-endian bytes of its view inside an
 * ext of the type number below; `Uint8Array` stays msgpack `bin`. Decoding
 * returns a *view* on the input bytes when the payload is aligned for its
 * element size (no copy) and a fresh array otherwise, so decoded arrays and
 * `bin` values may alias the input: a caller must not reuse the input buffer
 * while the decoded value is alive.
 *
 * Also carried: nil/bool/number/string, plain objects, arrays, `Date` (the
 * standard msgpack timestamp, ext -1). `undefined` is written as nil and reads
 * back as `null` (wire types use `T | null`). Refused on encode with a
 * `TypeError` rather than silently written as `{}`: `Map`, `Set`,
 * `ArrayBuffer`, class instances, functions, symbols and plain `bigint`
 * (decoding int64 as bigint would also turn every integer ≥ 2^32 such as a
 * millisecond timestamp into a bigint; send 64-bit ids in a `BigInt64Array`).
 */
import {
  Decoder, Encoder, ExtData, EXT_TIMESTAMP, encodeTimestampExtension, decodeTimestampExtension,
  type ExtensionCodecType,
} from '@msgpack/msgpack';
import { DecodeError } from './errors.ts';

if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
  // Payloads are the raw bytes of the view; a big-endian host would need a byte swap on both sides.
  throw new Error('hetps codec: big-endian platforms are not supported (typed arrays travel as little-endian bytes)');
}

type TypedArrayCtor =
  | Float32ArrayConstructor | Float64ArrayConstructor | Int32ArrayConstructor | Uint32ArrayConstructor
  | BigInt64ArrayConstructor | Uint16ArrayConstructor | Int8ArrayConstructor | Int16ArrayConstructor
  | BigUint64ArrayConstructor;

/** The typed arrays that travel as msgpack extensions. */
export type WireTypedArray =
  | Float32Array | Float64Array | Int32Array | Uint32Array | BigInt64Array | Uint16Array
  | Int8Array | Int16Array | BigUint64Array;

/**
 * Extension type numbers. Stable: part of the wire protocol, never renumber;
 * add new kinds at 10 and up.
 */
export const EXT_TYPES = {
  Float32Array: 1,
  Float64Array: 2,
  Int32Array: 3,
  Uint32Array: 4,
  BigInt64Array: 5,
  /** fp16 values travel as their raw bits in a Uint16Array. */
  Uint16Array: 6,
  Int8Array: 7,
  Int16Array: 8,
  BigUint64Array: 9,
} as const;

const CTOR_BY_EXT: (TypedArrayCtor | undefined)[] = [];
CTOR_BY_EXT[EXT_TYPES.Float32Array] = Float32Array;
CTOR_BY_EXT[EXT_TYPES.Float64Array] = Float64Array;
CTOR_BY_EXT[EXT_TYPES.Int32Array] = Int32Array;
CTOR_BY_EXT[EXT_TYPES.Uint32Array] = Uint32Array;
CTOR_BY_EXT[EXT_TYPES.BigInt64Array] = BigInt64Array;
CTOR_BY_EXT[EXT_TYPES.Uint16Array] = Uint16Array;
CTOR_BY_EXT[EXT_TYPES.Int8Array] = Int8Array;
CTOR_BY_EXT[EXT_TYPES.Int16Array] = Int16Array;
CTOR_BY_EXT[EXT_TYPES.BigUint64Array] = BigUint64Array;

const EXT_BY_CTOR = new Map<unknown, number>();
CTOR_BY_EXT.forEach((ctor, ext) => { if (ctor) EXT_BY_CTOR.set(ctor, ext); });

/** Nesting limit for decoded containers, the same as the encoder's default (100). */
const MAX_DEPTH = 100;

let zeroCopyViews = 0;
let alignedCopies = 0;

/** How many typed arrays `decode` returned as views on the input vs. copied because their payload was misaligned. */
export function codecStats(): { zeroCopyViews: number; alignedCopies: number } {
  return { zeroCopyViews, alignedCopies };
}

function extTypeOf(view: ArrayBufferView): number | undefined {
  const ext = EXT_BY_CTOR.get(view.constructor);
  if (ext !== undefined || view instanceof Uint8Array || view instanceof DataView) return ext;
  // A subclass of a supported array: rare, so the slow lookup is fine.
  for (const [ctor, n] of EXT_BY_CTOR) if (view instanceof (ctor as TypedArrayCtor)) return n;
  return undefined;
}

function describe(value: unknown): string {
  if (typeof value !== 'object' || value === null) return typeof value;
  return Object.prototype.toString.call(value).slice(8, -1);
}

// A hand-written codec instead of msgpack's ExtensionCodec: that one calls
// every registered encoder for every object; this does one check per object.
const extensionCodec: ExtensionCodecType<undefined> = {
  tryToEncode(object: unknown): ExtData | null {
    if (ArrayBuffer.isView(object)) {
      const ext = extTypeOf(object);
      if (ext === undefined) return null; // Uint8Array, Buffer, DataView, Uint8ClampedArray → bin
      // A view on the array's own bytes: the encoder copies it once into its buffer.
      return new ExtData(ext, new Uint8Array(object.buffer, object.byteOffset, object.byteLength));
    }
    const proto: unknown = Object.getPrototypeOf(object);
    if (proto === Object.prototype || proto === Array.prototype || proto === null) return null;
    if (object instanceof Date) return new ExtData(EXT_TIMESTAMP, encodeTimestampExtension(object)!);
    const hint = typeof object === 'bigint' ? ' (send 64-bit integers in a BigInt64Array)' : '';
    throw new TypeError(`codec: cannot encode a value of type ${describe(object)}${hint}; the wire carries plain objects, arrays, typed arrays, strings, numbers, booleans, null`);
  },
  decode(data: Uint8Array, extType: number): unknown {
    const ctor = CTOR_BY_EXT[extType];
    if (ctor === undefined) {
      if (extType === EXT_TIMESTAMP) return decodeTimestampExtension(data);
      throw new DecodeError(`unknown msgpack extension type ${extType}`);
    }
    const size = ctor.BYTES_PER_ELEMENT;
    if (data.byteLength % size !== 0) {
      throw new DecodeError(`${ctor.name} payload of ${data.byteLength} bytes is not a multiple of ${size}`);
    }
    if (data.byteOffset % size === 0) {
      zeroCopyViews++;
      // The cast only narrows the buffer's TS type: a SharedArrayBuffer works the same way.
      return new ctor(data.buffer as ArrayBuffer, data.byteOffset, data.byteLength / size);
    }
    alignedCopies++;
    // Copy by hand: `data` may be a Node Buffer, whose slice() is a view, not a copy.
    const out = new ctor(data.byteLength / size);
    new Uint8Array(out.buffer).set(data);
    return out;
  },
};

// 64 KiB start: most messages fit without a resize; the buffer grows to twice
// the largest message encoded through it and is reused afterwards.
const encoder = new Encoder({ extensionCodec, initialBufferSize: 64 * 1024 });
const decoder = new Decoder({ extensionCodec });

/** At or above this many typed-array bytes, a message gets its own right-sized encoder buffer. */
const BIG_MESSAGE_BYTES = 256 * 1024;
/** Encoded messages up to this size are carved out of a shared slab (see `encode`). */
const SLAB_MAX_MESSAGE = 1024;
const SLAB_SIZE = 8 * 1024;
let slab = new ArrayBuffer(SLAB_SIZE);
let slabUsed = 0;
/**
 * Envelopes (`encodeMapAfterHead`) up to 16 KiB come from a 256 KiB slab: an
 * ArrayBuffer per 4 KiB message was much of its send cost (with the cached
 * header, sending one went from ~2.7 to ~0.8 µs of hetps' own CPU). Not used
 * by `encode`, whose results (replies) may be kept for a long time and would
 * pin a whole slab each. Not zero-filled, like Node's Buffer pool: every byte
 * of a result is written before it is returned.
 */
const MID_SLAB_MAX_MESSAGE = 16 * 1024;
const MID_SLAB_SIZE = 256 * 1024;
const newMidSlab = (): ArrayBuffer => Buffer.allocUnsafeSlow(MID_SLAB_SIZE).buffer as ArrayBuffer;
let midSlab = newMidSlab();
let midSlabUsed = 0;

/**
 * Encodes a value to msgpack. Throws `TypeError` for values the wire does not
 * carry (see the module comment).
 *
 * Small results (≤ 1 KiB) are views into a shared 8 KiB slab, as Node's
 * `Buffer` pool does: allocating an ArrayBuffer per message costs more than
 * encoding it. So never transfer or detach `.buffer` of a result, and copy a
 * small result (`.slice()`) before keeping it for long. Results start at an
 * 8-byte aligned offset.
 */
export function encode(value: unknown): Uint8Array {
  const tensorBytes = topLevelTypedArrayBytes(value);
  if (tensorBytes >= BIG_MESSAGE_BYTES) {
    // A throwaway encoder sized for the message: its buffer becomes the
    // result, which saves the second copy of the tensors that `encode()` makes.
    const own = new Encoder({ extensionCodec, initialBufferSize: tensorBytes + 64 * 1024 });
    const out = own.encodeSharedRef(value);
    return out.byteLength * 1.25 < out.buffer.byteLength ? out.slice() : out;
  }
  const ref = encoder.encodeSharedRef(value);
  const n = ref.byteLength;
  if (n > SLAB_MAX_MESSAGE) return ref.slice();
  const out = smallSlabBytes(n);
  out.set(ref);
  return out;
}

/** `n` ≤ SLAB_MAX_MESSAGE bytes of the small slab, at an 8-byte aligned offset (a fresh slab when this one is full). */
function smallSlabBytes(n: number): Uint8Array {
  if (slabUsed + n > SLAB_SIZE) {
    slab = new ArrayBuffer(SLAB_SIZE);
    slabUsed = 0;
  }
  const out = new Uint8Array(slab, slabUsed, n);
  slabUsed = (slabUsed + n + 7) & ~7;
  return out;
}

/** `n` ≤ MID_SLAB_MAX_MESSAGE bytes of the envelopes' slab, likewise. */
function midSlabBytes(n: number): Uint8Array {
  if (midSlabUsed + n > MID_SLAB_SIZE) {
    midSlab = newMidSlab();
    midSlabUsed = 0;
  }
  const out = new Uint8Array(midSlab, midSlabUsed, n);
  midSlabUsed = (midSlabUsed + n + 7) & ~7;
  return out;
}

/**
 * Big envelopes (≥ 256 KiB) come from a small pool of buffers that the
 * transport hands back once the bus has provably sent them
 * (`recycleBigEnvelope`, called by `Transport.releaseWhenSent`). Writing an
 * 8 MiB envelope into memory the process has not touched before cost ~5–9 ms
 * (page faults included) against ~0.6 ms into a reused buffer. A buffer that
 * is never handed back is simply collected; one handed back that the pool did
 * not issue, or twice, is ignored, so the pool never issues one buffer to two
 * messages.
 */
const BIG_POOL_GRAIN = 64 * 1024;
const BIG_POOL_MAX_BUFFERS = 8;
const BIG_POOL_MAX_BYTES = 128 * 1024 * 1024;
const bigPool: Uint8Array[] = [];
let bigPoolBytes = 0;
const bigIssued = new WeakSet<ArrayBuffer>();

/** How often a big envelope was written into a pooled buffer rather than a new one. */
export const bigEnvelopePoolStats = { reused: 0 };

/** `n` bytes for a big envelope: a pooled buffer of capacity n..2n when one is free, else a new one (capacity rounded up to 64 KiB). */
function takeBigEnvelope(n: number): Uint8Array {
  let best = -1;
  for (let i = 0; i < bigPool.length; i++) {
    const cap = bigPool[i]!.byteLength;
    if (cap >= n && cap <= 2 * n && (best < 0 || cap < bigPool[best]!.byteLength)) best = i;
  }
  let whole: Uint8Array;
  if (best >= 0) {
    whole = bigPool.splice(best, 1)[0]!;
    bigPoolBytes -= whole.byteLength;
    bigEnvelopePoolStats.reused++;
  } else {
    whole = new Uint8Array(Buffer.allocUnsafeSlow(Math.ceil(n / BIG_POOL_GRAIN) * BIG_POOL_GRAIN).buffer);
  }
  bigIssued.add(whole.buffer as ArrayBuffer);
  return whole.subarray(0, n);
}

/**
 * Hands a big envelope back to the pool. Only for bytes that nothing holds any
 * more (the bus has sent them: see `Transport.releaseWhenSent`); anything the
 * pool did not issue is ignored. Returns whether it was taken back.
 */
export function recycleBigEnvelope(bytes: Uint8Array): boolean {
  const ab = bytes.buffer as ArrayBuffer;
  if (bytes.byteOffset !== 0 || !bigIssued.has(ab)) return false;
  bigIssued.delete(ab);
  const whole = new Uint8Array(ab);
  if (whole.byteLength > BIG_POOL_MAX_BYTES) return false;
  while (bigPool.length >= BIG_POOL_MAX_BUFFERS || bigPoolBytes + whole.byteLength > BIG_POOL_MAX_BYTES) {
    bigPoolBytes -= bigPool.shift()!.byteLength; // the oldest goes to the collector
  }
  bigPool.push(whole);
  bigPoolBytes += whole.byteLength;
  return true;
}

/** Whether `bytes` is a big envelope the pool issued and has not had back yet. */
export function isPooledBigEnvelope(bytes: Uint8Array): boolean {
  return bytes.byteOffset === 0 && bytes.byteLength >= BIG_MESSAGE_BYTES && bigIssued.has(bytes.buffer as ArrayBuffer);
}

// Encodes the fields of an envelope (`encodeMapAfterHead`): one level below the
// envelope map, so it allows one level less nesting than `encoder`.
const fieldsEncoder = new Encoder({ extensionCodec, initialBufferSize: 64 * 1024, maxDepth: 99 });

/**
 * Encodes one map whose first entries are already encoded: `head` holds
 * `headCount` entries, the last one cut short after its key, whose value is
 * the unsigned safe integer `tail`; the entries of the plain object `rest`
 * follow. Same bytes as `encode` of the merged object, but the head's strings
 * are not encoded again: an envelope header (`v`, `type`, `from`, key `seq`)
 * is the same for every message of one sender and type. Results up to 16 KiB
 * are views into a shared slab (see `encode`): copy one before keeping it.
 *
 * Flat fields (numbers, ASCII strings, booleans, null, `bin`, typed arrays)
 * are written by hand, each payload copied once; other fields go through
 * msgpack's Encoder. Returns null where `encode` of the merged object must be
 * used instead: when `rest` has a non-flat field and carries ≥ 256 KiB of
 * typed arrays (that path writes tensors once) or is not a plain object
 * (spread, it would lose its prototype).
 */
export function encodeMapAfterHead(head: Uint8Array, headCount: number, tail: number, rest: Record<string, unknown>): Uint8Array | null {
  const proto: unknown = Object.getPrototypeOf(rest);
  if (proto !== Object.prototype && proto !== null) return null;
  const flat = encodeFlatAfterHead(head, headCount, tail, rest);
  if (flat !== null) return flat;
  // Depth 2 below the fields reaches what depth 3 below the envelope does.
  if (typedArrayBytes(rest, 2) >= BIG_MESSAGE_BYTES) return null;
  const body = fieldsEncoder.encodeSharedRef(rest);
  const h = body[0]!;
  let restCount: number;
  let skip: number;
  if (h >= 0x80 && h <= 0x8f) { restCount = h & 0x0f; skip = 1; }
  else if (h === 0xde) { restCount = (body[1]! << 8) | body[2]!; skip = 3; }
  else { restCount = ((body[1]! << 24) >>> 0) + ((body[2]! << 16) | (body[3]! << 8) | body[4]!); skip = 5; } // 0xdf
  const { out, pos } = startAfterHead(head, headCount + restCount, tail, body.length - skip);
  out.set(body.subarray(skip), pos);
  return out;
}

/**
 * The output of `encodeMapAfterHead` for a map of `count` entries with
 * `bodyBytes` bytes of entries after the head: allocated (from a slab when
 * small), its map header, head and tail written; `pos` is where the body goes.
 */
function startAfterHead(head: Uint8Array, count: number, tail: number, bodyBytes: number): { out: Uint8Array; pos: number } {
  const mapHeader = count < 16 ? 1 : count < 0x10000 ? 3 : 5;
  const n = mapHeader + head.length + intSize(tail) + bodyBytes;
  // A big one is not zero-filled either (~0.5 ms of an 8 MiB message): every byte is written before it is returned.
  const out = n <= SLAB_MAX_MESSAGE ? smallSlabBytes(n) : n <= MID_SLAB_MAX_MESSAGE ? midSlabBytes(n) : n < BIG_MESSAGE_BYTES ? new Uint8Array(Buffer.allocUnsafeSlow(n).buffer, 0, n) : takeBigEnvelope(n);
  let pos = 0;
  if (mapHeader === 1) out[pos++] = 0x80 | count;
  else if (mapHeader === 3) { out[pos++] = 0xde; out[pos++] = count >>> 8; out[pos++] = count & 0xff; }
  else { out[pos++] = 0xdf; pos = writeU32(out, pos, count); }
  pos = copyBytes(out, pos, head);
  return { out, pos: writeInt(out, pos, tail) };
}

/** Copies `src` into `out` at `pos`; a byte loop for short runs (cheaper than `set` there). */
function copyBytes(out: Uint8Array, pos: number, src: Uint8Array): number {
  const n = src.length;
  if (n <= 48) for (let i = 0; i < n; i++) out[pos + i] = src[i]!;
  else out.set(src, pos);
  return pos + n;
}

// ---- flat fields, written by hand --------------------------------------------------------------
//
// Most envelopes carry only numbers, ASCII strings, booleans, `bin` and typed
// arrays. Their entries are written here straight into the result: no
// msgpack Encoder state per message, keys encoded once per process, and each
// payload copied once (msgpack's path copies it into its buffer, then into
// the result). The bytes are the ones msgpack's Encoder writes for the same
// values. A field holding anything else (an array, an object, a Date, a
// DataView) sends the whole message through msgpack.

const keyCache = new Map<string, Uint8Array>();
const MAX_CACHED_KEYS = 1024;
const asciiEncoder = new TextEncoder();

/** The encoded key (string header + ASCII), cached; null for a key that is not ASCII. */
function keyBytes(key: string): Uint8Array | null {
  let kb = keyCache.get(key);
  if (kb === undefined) {
    const n = asciiLength(key);
    if (n < 0) return null;
    if (keyCache.size >= MAX_CACHED_KEYS) keyCache.clear();
    kb = new Uint8Array(strHeaderSize(n) + n);
    writeAscii(kb, 0, key, n);
    keyCache.set(key, kb);
  }
  return kb;
}

/**
 * The length of an ASCII string, or -1: other strings go through msgpack,
 * whose UTF-8 writer differs from TextEncoder on lone surrogates.
 */
function asciiLength(s: string): number {
  const n = s.length;
  for (let i = 0; i < n; i++) if (s.charCodeAt(i) >= 0x80) return -1;
  return n;
}
function strHeaderSize(n: number): number { return n < 32 ? 1 : n < 0x100 ? 2 : n < 0x10000 ? 3 : 5; }

function writeAscii(out: Uint8Array, pos: number, s: string, n: number): number {
  if (n < 32) out[pos++] = 0xa0 + n;
  else if (n < 0x100) { out[pos++] = 0xd9; out[pos++] = n; }
  else if (n < 0x10000) { out[pos++] = 0xda; out[pos++] = n >>> 8; out[pos++] = n & 0xff; }
  else { out[pos++] = 0xdb; pos = writeU32(out, pos, n); }
  if (n <= 64) for (let i = 0; i < n; i++) out[pos + i] = s.charCodeAt(i);
  else asciiEncoder.encodeInto(s, out.subarray(pos, pos + n));
  return pos + n;
}

function intSize(x: number): number {
  if (x >= 0) return x < 0x80 ? 1 : x < 0x100 ? 2 : x < 0x10000 ? 3 : x < 0x100000000 ? 5 : 9;
  return x >= -0x20 ? 1 : x >= -0x80 ? 2 : x >= -0x8000 ? 3 : x >= -0x80000000 ? 5 : 9;
}

function writeInt(out: Uint8Array, pos: number, x: number): number {
  if (x >= 0) {
    if (x < 0x80) out[pos++] = x;
    else if (x < 0x100) { out[pos++] = 0xcc; out[pos++] = x; }
    else if (x < 0x10000) { out[pos++] = 0xcd; out[pos++] = x >>> 8; out[pos++] = x & 0xff; }
    else if (x < 0x100000000) { out[pos++] = 0xce; pos = writeU32(out, pos, x); }
    else { out[pos++] = 0xcf; pos = writeU32(out, pos, Math.floor(x / 0x100000000)); pos = writeU32(out, pos, x >>> 0); }
  } else if (x >= -0x20) out[pos++] = 0xe0 | (x + 0x20);
  else if (x >= -0x80) { out[pos++] = 0xd0; out[pos++] = x & 0xff; }
  else if (x >= -0x8000) { out[pos++] = 0xd1; out[pos++] = (x >> 8) & 0xff; out[pos++] = x & 0xff; }
  else if (x >= -0x80000000) { out[pos++] = 0xd2; pos = writeU32(out, pos, x >>> 0); }
  else { out[pos++] = 0xd3; pos = writeU32(out, pos, Math.floor(x / 0x100000000) >>> 0); pos = writeU32(out, pos, x >>> 0); }
  return pos;
}

function binHeaderSize(n: number): number { return n < 0x100 ? 2 : n < 0x10000 ? 3 : 5; }
function extHeaderSize(n: number): number {
  return n === 1 || n === 2 || n === 4 || n === 8 || n === 16 ? 2 : n < 0x100 ? 3 : n < 0x10000 ? 4 : 6;
}

/**
 * Bytes the value takes when it is flat, or -1. Strings' lengths go to
 * `stringLengths` at `i` (so the write pass does not count them again).
 */
function flatSize(v: unknown, i: number): number {
  switch (typeof v) {
    case 'number': return Number.isSafeInteger(v) ? intSize(v) : 9;
    case 'string': { const n = asciiLength(v); stringLengths[i] = n; return n < 0 ? -1 : strHeaderSize(n) + n; }
    case 'boolean': case 'undefined': return 1;
    case 'object': {
      if (v === null) return 1;
      if (v instanceof Uint8Array) return binHeaderSize(v.byteLength) + v.byteLength;
      if (ArrayBuffer.isView(v) && !(v instanceof DataView)) {
        const ext = EXT_BY_CTOR.get(v.constructor);
        if (ext !== undefined) return extHeaderSize(v.byteLength) + v.byteLength;
      }
      return -1;
    }
    default: return -1;
  }
}
let stringLengths = new Int32Array(64);
/** The encoded keys the size pass looked up, for the write pass. */
const keyRefs: Uint8Array[] = [];

function encodeFlatAfterHead(head: Uint8Array, headCount: number, tail: number, rest: Record<string, unknown>): Uint8Array | null {
  const keys = Object.keys(rest);
  const count = keys.length;
  if (count > stringLengths.length) stringLengths = new Int32Array(count);
  let bodyBytes = 0;
  for (let i = 0; i < count; i++) {
    const key = keys[i]!;
    const kb = keyBytes(key);
    const size = kb === null ? -1 : flatSize(rest[key], i);
    if (size < 0) return null;
    bodyBytes += kb!.length + size;
    keyRefs[i] = kb!;
  }
  const started = startAfterHead(head, headCount + count, tail, bodyBytes);
  const out = started.out;
  let pos = started.pos;
  for (let i = 0; i < count; i++) {
    const key = keys[i]!;
    pos = copyBytes(out, pos, keyRefs[i]!);
    const v = rest[key];
    switch (typeof v) {
      case 'number':
        if (Number.isSafeInteger(v)) pos = writeInt(out, pos, v);
        else { out[pos++] = 0xcb; f64Scratch.setFloat64(0, v); for (let j = 0; j < 8; j++) out[pos++] = f64Scratch.getUint8(j); }
        break;
      case 'string': pos = writeAscii(out, pos, v, stringLengths[i]!); break;
      case 'boolean': out[pos++] = v ? 0xc3 : 0xc2; break;
      case 'undefined': out[pos++] = 0xc0; break;
      default: {
        if (v === null) { out[pos++] = 0xc0; break; }
        const view = v as ArrayBufferView;
        const n = view.byteLength;
        const bytes = view instanceof Uint8Array ? view : new Uint8Array(view.buffer, view.byteOffset, n);
        if (view instanceof Uint8Array) {
          if (n < 0x100) { out[pos++] = 0xc4; out[pos++] = n; }
          else if (n < 0x10000) { out[pos++] = 0xc5; out[pos++] = n >>> 8; out[pos++] = n & 0xff; }
          else { out[pos++] = 0xc6; pos = writeU32(out, pos, n); }
        } else {
          if (n === 1) out[pos++] = 0xd4;
          else if (n === 2) out[pos++] = 0xd5;
          else if (n === 4) out[pos++] = 0xd6;
          else if (n === 8) out[pos++] = 0xd7;
          else if (n === 16) out[pos++] = 0xd8;
          else if (n < 0x100) { out[pos++] = 0xc7; out[pos++] = n; }
          else if (n < 0x10000) { out[pos++] = 0xc8; out[pos++] = n >>> 8; out[pos++] = n & 0xff; }
          else { out[pos++] = 0xc9; pos = writeU32(out, pos, n); }
          out[pos++] = EXT_BY_CTOR.get(view.constructor)!;
        }
        pos = copyBytes(out, pos, bytes);
      }
    }
  }
  return out;
}

/**
 * The `head` of `encodeMapAfterHead`: the encoded entries of `entries`, whose
 * last value must be 0 (it is cut off; the tail takes its place).
 */
export function encodeHead(entries: Record<string, unknown>): { head: Uint8Array; count: number } {
  const b = encoder.encodeSharedRef(entries);
  const h = b[0]!;
  if (h < 0x81 || h > 0x8f || b[b.length - 1] !== 0) throw new TypeError('codec: a head is 1 to 15 entries, the last with the value 0');
  return { head: b.slice(1, b.length - 1), count: h & 0x0f };
}

function writeU32(b: Uint8Array, pos: number, x: number): number {
  b[pos] = x >>> 24; b[pos + 1] = (x >>> 16) & 0xff; b[pos + 2] = (x >>> 8) & 0xff; b[pos + 3] = x & 0xff;
  return pos + 4;
}

/**
 * Bytes of the typed arrays in `value`, looking up to three containers deep:
 * far enough for tensors in lists of entries (`dense: [{ block, grad }]`) and
 * in replies (`{ result: { dense: [...] } }`), shallow enough to stay cheap.
 */
function topLevelTypedArrayBytes(value: unknown): number {
  return typedArrayBytes(value, 3);
}

function typedArrayBytes(value: unknown, depth: number): number {
  if (typeof value !== 'object' || value === null) return 0;
  if (ArrayBuffer.isView(value)) return value.byteLength;
  if (depth === 0) return 0;
  let n = 0;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const x: unknown = value[i];
      if (typeof x === 'object' && x !== null) n += typedArrayBytes(x, depth - 1);
    }
  } else {
    for (const k in value) {
      const x = (value as Record<string, unknown>)[k];
      if (typeof x === 'object' && x !== null) n += typedArrayBytes(x, depth - 1);
    }
  }
  return n;
}

/**
 * Decodes exactly one msgpack value. Every failure (bad bytes, truncation,
 * extra bytes, a bad extension payload, nesting deeper than 100) is a `DecodeError`
 * with the underlying error as `cause`.
 */
export function decode(bytes: Uint8Array): unknown {
  if (!(bytes instanceof Uint8Array)) {
    throw new DecodeError(`codec: expected a Uint8Array, got ${describe(bytes)}`);
  }
  try {
    checkStructure(bytes);
    const h = bytes[0]!;
    // A map at the top (every envelope) is read here; anything else, and every value nested inside it, by msgpack.
    if ((h >= 0x80 && h <= 0x8f) || h === 0xde || h === 0xdf) {
      const map = decodeTopMap(bytes);
      if (map !== null) return map;
    }
    return decoder.decode(bytes);
  } catch (err) {
    if (err instanceof DecodeError) throw err;
    throw new DecodeError(`codec: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  }
}

const depthStack = new Float64Array(MAX_DEPTH + 1);

/**
 * Walks the msgpack headers before decoding. msgpack's decoder preallocates
 * `new Array(n)` for an array header, so five bytes claiming ten million
 * elements cost 80 MB and ~30 ms; here every declared item must have at least
 * one byte left behind it, which bounds what the decoder allocates by the
 * input's length. Also refuses truncation, trailing bytes and deep nesting,
 * all without allocating.
 */
function checkStructure(b: Uint8Array): void {
  const n = b.length;
  let pos = 0;
  let depth = 0;
  let left = 1; // items still to read in the innermost open container (the root counts as one)
  let pending = 1; // items still to read in all open containers
  for (;;) {
    while (left === 0) {
      if (depth === 0) {
        if (pos !== n) throw new DecodeError(`extra ${n - pos} byte(s) after the value at offset ${pos}`);
        return;
      }
      left = depthStack[--depth]!;
    }
    if (pos >= n) throw new DecodeError(`truncated at offset ${pos}: ${pending} more item(s) expected`);
    const start = pos;
    const h = b[pos]!;
    left--;
    pending--;
    let items = 0; // for a container: how many items it opens
    if (h <= 0x7f || h >= 0xe0) { pos += 1; continue; } // fixint
    if (h <= 0x8f) { items = (h & 0x0f) * 2; pos += 1; } // fixmap
    else if (h <= 0x9f) { items = h & 0x0f; pos += 1; } // fixarray
    else if (h <= 0xbf) { pos += 1 + (h & 0x1f); } // fixstr
    else {
      switch (h) {
        case 0xc0: case 0xc2: case 0xc3: pos += 1; break;
        case 0xc4: pos += 2 + u8(b, pos + 1); break; // bin 8
        case 0xc5: pos += 3 + u16(b, pos + 1); break; // bin 16
        case 0xc6: pos += 5 + u32(b, pos + 1); break; // bin 32
        case 0xc7: pos += 3 + u8(b, pos + 1); break; // ext 8
        case 0xc8: pos += 4 + u16(b, pos + 1); break; // ext 16
        case 0xc9: pos += 6 + u32(b, pos + 1); break; // ext 32
        case 0xca: pos += 5; break; // float 32
        case 0xcb: pos += 9; break; // float 64
        case 0xcc: case 0xd0: pos += 2; break;
        case 0xcd: case 0xd1: pos += 3; break;
        case 0xce: case 0xd2: pos += 5; break;
        case 0xcf: case 0xd3: pos += 9; break;
        case 0xd4: pos += 3; break; // fixext 1
        case 0xd5: pos += 4; break;
        case 0xd6: pos += 6; break;
        case 0xd7: pos += 10; break;
        case 0xd8: pos += 18; break; // fixext 16
        case 0xd9: pos += 2 + u8(b, pos + 1); break; // str 8
        case 0xda: pos += 3 + u16(b, pos + 1); break;
        case 0xdb: pos += 5 + u32(b, pos + 1); break;
        case 0xdc: items = u16(b, pos + 1); pos += 3; break; // array 16
        case 0xdd: items = u32(b, pos + 1); pos += 5; break; // array 32
        case 0xde: items = u16(b, pos + 1) * 2; pos += 3; break; // map 16
        case 0xdf: items = u32(b, pos + 1) * 2; pos += 5; break; // map 32
        default: throw new DecodeError(`reserved byte 0x${h.toString(16)} at offset ${pos}`); // 0xc1
      }
    }
    if (pos > n) throw new DecodeError(`truncated: the value at offset ${start} runs past the end of the ${n} byte(s)`);
    if (items > 0) {
      pending += items;
      if (pending > n - pos) {
        throw new DecodeError(`container at offset ${pos} declares ${items} item(s) but only ${n - pos} byte(s) are left`);
      }
      if (depth === MAX_DEPTH) throw new DecodeError(`nesting deeper than ${MAX_DEPTH}`);
      depthStack[depth++] = left;
      left = items;
    }
  }
}

// Header readers; a header cut short reads as a huge length, which the caller reports as truncation.
function u8(b: Uint8Array, i: number): number {
  return i < b.length ? b[i]! : Infinity;
}
function u16(b: Uint8Array, i: number): number {
  return i + 2 <= b.length ? (b[i]! << 8) | b[i + 1]! : Infinity;
}
function u32(b: Uint8Array, i: number): number {
  return i + 4 <= b.length ? ((b[i]! << 24) >>> 0) + ((b[i + 1]! << 16) | (b[i + 2]! << 8) | b[i + 3]!) : Infinity;
}

// ---- the top-level map, read by hand ---------------------------------------------------------
//
// msgpack's Decoder spent ~1.1 µs on a 116-byte envelope: a DataView and a
// reset state stack per call, a generic state machine per value, and a UTF-8
// decode of `type` and `from` (its key cache covers keys only). The envelope
// is one flat map of short strings, numbers, `bin` and typed arrays, so its
// top level is read here (~0.3 µs) and only nested arrays and maps go to
// msgpack. Called after `checkStructure`, so every length read here is known
// to stay inside `b`. Returns the same values msgpack's Decoder would (bins
// are views on `b`, 64-bit integers are numbers, `__proto__` is refused),
// or null to let msgpack decode the whole value (a key that is not a string).

const f64Scratch = new DataView(new ArrayBuffer(8));
const strings = new Array<{ bytes: Uint8Array; str: string }[]>(33);
for (let i = 0; i < strings.length; i++) strings[i] = [];
const STRINGS_PER_LENGTH = 16;
const nextSlot = new Uint8Array(33);
const textDecoder = new TextDecoder();

/** A UTF-8 string of `n` bytes at `pos`; strings of up to 32 bytes (types, senders, keys) come from a cache of recent ones. */
function readString(b: Uint8Array, pos: number, n: number): string {
  if (n === 0) return '';
  if (n > 32) return n > 200 ? textDecoder.decode(b.subarray(pos, pos + n)) : utf8Short(b, pos, n);
  const records = strings[n]!;
  FIND: for (let r = 0; r < records.length; r++) {
    const rec = records[r]!;
    const rb = rec.bytes;
    for (let j = 0; j < n; j++) if (rb[j] !== b[pos + j]) continue FIND;
    return rec.str;
  }
  // Internalized (as a property key is): cached keys then index objects without a string-table lookup.
  const str = Object.keys({ [utf8Short(b, pos, n)]: 0 })[0]!;
  const rec = { bytes: b.slice(pos, pos + n), str };
  if (records.length < STRINGS_PER_LENGTH) records.push(rec);
  else { records[nextSlot[n]!] = rec; nextSlot[n] = (nextSlot[n]! + 1) % STRINGS_PER_LENGTH; }
  return str;
}

function utf8Short(b: Uint8Array, pos: number, n: number): string {
  let ascii = true;
  for (let j = 0; j < n; j++) if (b[pos + j]! >= 0x80) { ascii = false; break; }
  if (!ascii) return textDecoder.decode(b.subarray(pos, pos + n));
  let s = '';
  for (let j = 0; j < n; j++) s += String.fromCharCode(b[pos + j]!);
  return s;
}

/** The offset just past the (well-formed) value at `pos`. */
function skipValue(b: Uint8Array, pos: number): number {
  let left = 1;
  while (left > 0) {
    left--;
    const h = b[pos]!;
    if (h <= 0x7f || h >= 0xe0) { pos += 1; continue; }
    if (h <= 0x8f) { left += (h & 0x0f) * 2; pos += 1; continue; }
    if (h <= 0x9f) { left += h & 0x0f; pos += 1; continue; }
    if (h <= 0xbf) { pos += 1 + (h & 0x1f); continue; }
    switch (h) {
      case 0xc4: case 0xd9: pos += 2 + b[pos + 1]!; break;
      case 0xc5: case 0xda: pos += 3 + be16(b, pos + 1); break;
      case 0xc6: case 0xdb: pos += 5 + be32(b, pos + 1); break;
      case 0xc7: pos += 3 + b[pos + 1]!; break;
      case 0xc8: pos += 4 + be16(b, pos + 1); break;
      case 0xc9: pos += 6 + be32(b, pos + 1); break;
      case 0xdc: left += be16(b, pos + 1); pos += 3; break;
      case 0xdd: left += be32(b, pos + 1); pos += 5; break;
      case 0xde: left += be16(b, pos + 1) * 2; pos += 3; break;
      case 0xdf: left += be32(b, pos + 1) * 2; pos += 5; break;
      default: pos += FIXED_SIZE[h - 0xc0]!; // nil, bool, numbers, fixext
    }
  }
  return pos;
}
// Sizes (head byte included) of the fixed-size kinds 0xc0..0xd8.
const FIXED_SIZE = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 5, 9, 2, 3, 5, 9, 2, 3, 5, 9, 3, 4, 6, 10, 18];

function be16(b: Uint8Array, i: number): number { return (b[i]! << 8) | b[i + 1]!; }
function be32(b: Uint8Array, i: number): number { return ((b[i]! << 24) >>> 0) + ((b[i + 1]! << 16) | (b[i + 2]! << 8) | b[i + 3]!); }

function decodeTopMap(b: Uint8Array): Record<string, unknown> | null {
  const h = b[0]!;
  let count: number;
  let pos: number;
  if (h <= 0x8f) { count = h & 0x0f; pos = 1; }
  else if (h === 0xde) { count = be16(b, 1); pos = 3; }
  else { count = be32(b, 1); pos = 5; }
  const out: Record<string, unknown> = {};
  for (let i = 0; i < count; i++) {
    // The key: a string (anything else: let msgpack do it all).
    const k = b[pos]!;
    let key: string;
    if (k >= 0xa0 && k <= 0xbf) { key = readString(b, pos + 1, k - 0xa0); pos += 1 + (k - 0xa0); }
    else if (k === 0xd9) { const n = b[pos + 1]!; key = readString(b, pos + 2, n); pos += 2 + n; }
    else return null;
    if (key === '__proto__') throw new DecodeError('The key __proto__ is not allowed');
    // The value.
    const v = b[pos]!;
    let value: unknown;
    if (v <= 0x7f) { value = v; pos += 1; }
    else if (v >= 0xe0) { value = v - 0x100; pos += 1; }
    else if (v >= 0xa0 && v <= 0xbf) { const n = v - 0xa0; value = readString(b, pos + 1, n); pos += 1 + n; }
    else {
      switch (v) {
        case 0xc0: value = null; pos += 1; break;
        case 0xc2: value = false; pos += 1; break;
        case 0xc3: value = true; pos += 1; break;
        case 0xcc: value = b[pos + 1]!; pos += 2; break;
        case 0xcd: value = be16(b, pos + 1); pos += 3; break;
        case 0xce: value = be32(b, pos + 1); pos += 5; break;
        case 0xcf: value = be32(b, pos + 1) * 0x100000000 + be32(b, pos + 5); pos += 9; break;
        case 0xd0: value = (b[pos + 1]! << 24) >> 24; pos += 2; break;
        case 0xd1: value = (be16(b, pos + 1) << 16) >> 16; pos += 3; break;
        case 0xd2: value = be32(b, pos + 1) | 0; pos += 5; break;
        case 0xd3: value = (be32(b, pos + 1) | 0) * 0x100000000 + be32(b, pos + 5); pos += 9; break;
        case 0xca: case 0xcb: {
          const n = v === 0xca ? 4 : 8;
          for (let j = 0; j < n; j++) f64Scratch.setUint8(j, b[pos + 1 + j]!);
          value = n === 4 ? f64Scratch.getFloat32(0) : f64Scratch.getFloat64(0);
          pos += 1 + n;
          break;
        }
        case 0xd9: { const n = b[pos + 1]!; value = readString(b, pos + 2, n); pos += 2 + n; break; }
        case 0xda: { const n = be16(b, pos + 1); value = readString(b, pos + 3, n); pos += 3 + n; break; }
        case 0xdb: { const n = be32(b, pos + 1); value = readString(b, pos + 5, n); pos += 5 + n; break; }
        case 0xc4: { const n = b[pos + 1]!; value = b.subarray(pos + 2, pos + 2 + n); pos += 2 + n; break; }
        case 0xc5: { const n = be16(b, pos + 1); value = b.subarray(pos + 3, pos + 3 + n); pos += 3 + n; break; }
        case 0xc6: { const n = be32(b, pos + 1); value = b.subarray(pos + 5, pos + 5 + n); pos += 5 + n; break; }
        case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: {
          const n = 1 << (v - 0xd4);
          value = extensionCodec.decode(b.subarray(pos + 2, pos + 2 + n), (b[pos + 1]! << 24) >> 24, undefined);
          pos += 2 + n;
          break;
        }
        case 0xc7: case 0xc8: case 0xc9: {
          const lenBytes = v === 0xc7 ? 1 : v === 0xc8 ? 2 : 4;
          const n = lenBytes === 1 ? b[pos + 1]! : lenBytes === 2 ? be16(b, pos + 1) : be32(b, pos + 1);
          const at = pos + 1 + lenBytes;
          value = extensionCodec.decode(b.subarray(at + 1, at + 1 + n), (b[at]! << 24) >> 24, undefined);
          pos = at + 1 + n;
          break;
        }
        default: {
          // A nested array or map: msgpack decodes it.
          const end = skipValue(b, pos);
          value = decoder.decode(b.subarray(pos, end));
          pos = end;
        }
      }
    }
    out[key] = value;
  }
  return out;
}
