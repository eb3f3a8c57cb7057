/** A seeded generator (xoshiro128**), so every actor's randomness is reproducible from the job seed. */
export interface Random {
  /** Uniform in [0, 1). */
  next(): number;
  /** Uniform integer in [0, n). */
  int(n: number): number;
  /** Standard normal (Box–Muller). */
  normal(): number;
  /** A new independent stream derived from this one and a label. */
  fork(label: string): Random;
}

function splitmix32(a: number): () => number {
  return () => {
    a = (a + 0x9e3779b9) | 0;
    let t = a ^ (a >>> 16);
    t = Math.imul(t, 0x21f0aaad);
    t = t ^ (t >>> 15);
    t = Math.imul(t, 0x735a2d97);
    return (t ^ (t >>> 15)) >>> 0;
  };
}

/** FNV-1a over a string, used to turn labels into seeds. */
export function hashString(s: string, seed = 0x811c9dc5): number {
  let h = seed >>> 0;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

export class SeededRandom implements Random {
  private s0: number; private s1: number; private s2: number; private s3: number;
  private spare: number | null = null;
  readonly seed: number;
  constructor(seed: number) {
    this.seed = seed >>> 0;
    const sm = splitmix32(this.seed);
    this.s0 = sm(); this.s1 = sm(); this.s2 = sm(); this.s3 = sm();
  }
  private nextU32(): number {
    const r = Math.imul(this.rotl(Math.imul(this.s1, 5), 7), 9) >>> 0;
    const t = this.s1 << 9;
    this.s2 ^= this.s0; this.s3 ^= this.s1; this.s1 ^= this.s2; this.s0 ^= this.s3;
    this.s2 ^= t; this.s3 = this.rotl(this.s3, 11);
    return r;
  }
  private rotl(x: number, k: number): number { return (x << k) | (x >>> (32 - k)); }
  next(): number { return this.nextU32() / 4294967296; }
  int(n: number): number { return Math.floor(this.next() * n); }
  normal(): number {
    if (this.spare !== null) { const s = this.spare; this.spare = null; return s; }
    let u = 0; while (u === 0) u = this.next();
    const v = this.next();
    const m = Math.sqrt(-2 * Math.log(u));
    this.spare = m * Math.sin(2 * Math.PI * v);
    return m * Math.cos(2 * Math.PI * v);
  }
  fork(label: string): Random { return new SeededRandom(hashString(label, this.seed ^ 0x5bd1e995)); }
}
