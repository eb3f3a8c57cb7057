/**
 * Staleness between groups: a push computed from parameter version `base`
 * that reaches a shard at version `now` is `now - base` updates stale.
 *
 * With several groups pushing concurrently some staleness is normal: while
 * one group computes a window, the others' updates land. Pushes up to the
 * tolerance `t` are applied at the full learning rate; staler ones at
 * lr·(1 + t)/(1 + s) (t = 0: the classic lr / (1 + s)), and pushes beyond
 * `max_staleness` are refused, so a slow group cannot drag the model back.
 * `auto` tolerance is the median staleness of the shard's recent pushes
 * (`RecentStaleness`): the concurrency the job actually has.
 *
 * Dense blocks and embedding rows may have their own tolerance: staleness is
 * counted in the shard's updates, and every update changes every dense
 * parameter but only the few rows its batch touched, so an embedding row is
 * usually much less stale than the count says. A dense tower (the mlp)
 * trains best with the strict rule (t = 0), embedding rows with `auto`.
 *
 * For the same reason each kind may have its own bound: a push staler than
 * the dense bound but within the rows' bound has its rows applied and its
 * dense part dropped (and the other way round). A push is refused only when
 * nothing it carries is within its kind's bound.
 */
export interface StalenessPolicy {
  /** Refuse pushes staler than this (null: never refuse); with `sparseMaxStaleness`, the dense blocks' bound. */
  maxStaleness: number | null;
  /** The embedding rows' bound; absent: `maxStaleness`. */
  sparseMaxStaleness?: number | null;
  /** `inverse`: lr·(1 + t)/(1 + staleness) beyond the tolerance t; `none`: apply at full rate (measured only). */
  scaling: 'inverse' | 'none';
  /** Staleness applied at the full rate; `auto`: the median of recent pushes. Absent: 0. */
  tolerance?: number | 'auto';
  /** The tolerance for embedding rows; absent: `tolerance`. */
  sparseTolerance?: number | 'auto';
}

export interface StalenessDecision {
  /** Something the push carries is applied (false: refused whole). */
  admit: boolean;
  /** Multiplier for the learning rate of this update's dense blocks (1 when fresh; 0: beyond the dense bound, not applied). */
  lrScale: number;
  /** Multiplier for its embedding rows (the same as `lrScale` unless the policy has a sparseTolerance or sparseMaxStaleness; 0: not applied). */
  sparseLrScale: number;
  staleness: number;
  /** The push's dense part, or its rows, dropped as beyond their own bound while the rest is applied. */
  dropped: 'dense' | 'sparse' | null;
}

/** What a push carries (a push for a shard may hold only dense blocks, or only rows). */
export interface PushContent {
  dense: boolean;
  sparse: boolean;
}

/** The bound the policy holds embedding rows to (null: none). */
export function rowsMaxStaleness(policy: StalenessPolicy): number | null {
  return policy.sparseMaxStaleness === undefined ? policy.maxStaleness : policy.sparseMaxStaleness;
}

/** Bounds as training.max_staleness writes them: `4`, or `{ dense: 4, sparse: 32 }` where the rows' differs (none: never refused). */
export function describeMaxStaleness(dense: number | null, sparse: number | null = dense): string {
  const t = (b: number | null) => (b === null ? 'none' : String(b));
  return sparse === dense ? t(dense) : `{ dense: ${t(dense)}, sparse: ${t(sparse)} }`;
}

export function stalenessOf(shardVersion: number, baseVersion: number): number {
  return Math.max(0, shardVersion - baseVersion);
}

/** The learning-rate multiplier of a push `staleness` updates stale, `tolerance` of which count as normal. */
export function stalenessScaledLearningRate(staleness: number, scaling: StalenessPolicy['scaling'] = 'inverse', tolerance = 0): number {
  if (!(staleness >= 0)) throw new RangeError(`staleness must be ≥ 0, got ${staleness}`);
  if (!(tolerance >= 0)) throw new RangeError(`staleness tolerance must be ≥ 0, got ${tolerance}`);
  if (scaling === 'none' || staleness <= tolerance) return 1;
  return (1 + tolerance) / (1 + staleness);
}

/**
 * Admit or refuse, and at what rate. `typical`: the median staleness of
 * recent pushes, used when the policy's tolerance is `auto` (0 when none
 * was seen yet). `content`: what the push carries; a push is admitted when
 * a part it carries is within its kind's bound (the other part then gets
 * multiplier 0 and `dropped` names it).
 */
export function decideStaleness(
  shardVersion: number, baseVersion: number, policy: StalenessPolicy, typical = 0, content: PushContent = { dense: true, sparse: true },
): StalenessDecision {
  const staleness = stalenessOf(shardVersion, baseVersion);
  const within = (bound: number | null): boolean => bound === null || staleness <= bound;
  const denseIn = within(policy.maxStaleness);
  const sparseIn = within(rowsMaxStaleness(policy));
  const admit = (content.dense && denseIn) || (content.sparse && sparseIn);
  const scale = (inBound: boolean, t: number | 'auto' | undefined): number => (admit && inBound ? stalenessScaledLearningRate(staleness, policy.scaling, t === 'auto' ? typical : t ?? 0) : 0);
  const lrScale = scale(denseIn, policy.tolerance);
  const sparseLrScale = scale(sparseIn, policy.sparseTolerance === undefined ? policy.tolerance : policy.sparseTolerance);
  const dropped = !admit ? null : content.dense && !denseIn ? 'dense' : content.sparse && !sparseIn ? 'sparse' : null;
  return { admit, lrScale, sparseLrScale, staleness, dropped };
}

/** The median of the last `size` staleness values (a ring; the median is recomputed on demand, O(size)). */
export class RecentStaleness {
  private readonly ring: Int32Array;
  private next = 0;
  private filled = 0;

  constructor(readonly size = 64) {
    if (!(Number.isInteger(size) && size > 0)) throw new RangeError(`size must be a positive integer, got ${size}`);
    this.ring = new Int32Array(size);
  }

  add(staleness: number): void {
    this.ring[this.next] = staleness;
    this.next = (this.next + 1) % this.size;
    if (this.filled < this.size) this.filled++;
  }

  /** The (lower) median of what was added, 0 before anything was. */
  median(): number {
    if (this.filled === 0) return 0;
    const xs = Array.from(this.ring.subarray(0, this.filled)).sort((a, b) => a - b);
    return xs[(this.filled - 1) >> 1]!;
  }
}
