/**
 * Staleness between groups: a push computed from parameter version `base`
 * that reaches a shard at version `now` is `now - base` updates stale. Such
 * updates are scaled down (learning rate / (1 + staleness)) and refused
 * beyond `max_staleness`, so a slow group cannot drag the model back.
 */
export interface StalenessPolicy {
  /** Refuse pushes staler than this (null: never refuse). */
  maxStaleness: number | null;
  /** `inverse`: lr / (1 + staleness); `none`: apply at full rate (measured only). */
  scaling: 'inverse' | 'none';
}

export interface StalenessDecision {
  admit: boolean;
  /** Multiplier for the learning rate of this update (1 when fresh). */
  lrScale: number;
  staleness: number;
}

export function stalenessOf(shardVersion: number, baseVersion: number): number {
  return Math.max(0, shardVersion - baseVersion);
}

export function stalenessScaledLearningRate(staleness: number, scaling: StalenessPolicy['scaling'] = 'inverse'): number {
  if (!(staleness >= 0)) throw new RangeError(`staleness must be ≥ 0, got ${staleness}`);
  return scaling === 'inverse' ? 1 / (1 + staleness) : 1;
}

export function decideStaleness(shardVersion: number, baseVersion: number, policy: StalenessPolicy): StalenessDecision {
  const staleness = stalenessOf(shardVersion, baseVersion);
  const admit = policy.maxStaleness === null || staleness <= policy.maxStaleness;
  return { admit, lrScale: admit ? stalenessScaledLearningRate(staleness, policy.scaling) : 0, staleness };
}
