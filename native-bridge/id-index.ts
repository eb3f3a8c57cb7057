/**
 * Row id (uint32) → int32, open addressing over typed arrays. A JS `Map` or
 * `Set` holds at most 2^24 entries, fewer than the rows of a real embedding
 * table on one shard, so code that indexes a whole table uses this instead.
 */
import { mix32 } from './sparse-table.ts';

const MAX_LOAD = 0.7;

export class IdIndex {
  private keys: Uint32Array;
  private vals: Int32Array;
  private used: Uint8Array;
  private mask: number;
  private count = 0;

  constructor(expected = 16) {
    let cap = 16;
    while (cap * MAX_LOAD < expected) cap *= 2;
    this.keys = new Uint32Array(cap);
    this.vals = new Int32Array(cap);
    this.used = new Uint8Array(cap);
    this.mask = cap - 1;
  }

  get size(): number { return this.count; }

  /** The value of `id`, or `absent`. */
  get(id: number, absent = -1): number {
    const h = this.slot(id >>> 0);
    return this.used[h] ? this.vals[h]! : absent;
  }

  /** The value of `id`; when absent, `id` is set to `value` and `value` returned (one probe for a lookup-or-insert). */
  getOrSet(id: number, value: number): number {
    if ((this.count + 1) > (this.mask + 1) * MAX_LOAD) this.grow();
    const k = id >>> 0;
    const h = this.slot(k);
    if (this.used[h]) return this.vals[h]!;
    this.insertAt(h, k, value);
    return value;
  }

  /** Forgets every id, keeping the room it has grown to (a caller that fills it again and again allocates once). */
  clear(): void {
    if (this.count === 0) return;
    this.used.fill(0);
    this.count = 0;
  }

  set(id: number, value: number): void {
    if ((this.count + 1) > (this.mask + 1) * MAX_LOAD) this.grow();
    const k = id >>> 0;
    const h = this.slot(k);
    if (this.used[h]) this.vals[h] = value;
    else this.insertAt(h, k, value);
  }

  /** The slot holding key `k`, or the empty slot where it would go (linear probing). */
  private slot(k: number): number {
    let h = mix32(k) & this.mask;
    while (this.used[h] && this.keys[h] !== k) h = (h + 1) & this.mask;
    return h;
  }

  private insertAt(h: number, k: number, value: number): void {
    this.used[h] = 1;
    this.keys[h] = k;
    this.vals[h] = value;
    this.count++;
  }

  private grow(): void {
    const { keys, vals, used } = this;
    const cap = (this.mask + 1) * 2;
    this.keys = new Uint32Array(cap);
    this.vals = new Int32Array(cap);
    this.used = new Uint8Array(cap);
    this.mask = cap - 1;
    this.count = 0;
    for (let h = 0; h < used.length; h++) if (used[h]) this.set(keys[h]!, vals[h]!);
  }
}
