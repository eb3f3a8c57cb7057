/**
 * The learning-rate rule for a group's update (hps). A synchronous group
 * averages its members' gradients of each step index, so one update of the
 * shards stands for `members` batches: the group makes `members`× fewer
 * updates per sample than a worker pushing alone. The rule raises the
 * learning rate of such an update to make up for it:
 *
 * - `linear`: lr · members (Goyal et al. 2017, "Accurate, Large Minibatch
 *   SGD": the linear scaling rule, for SGD);
 * - `sqrt`: lr · √members (the square-root rule, the one that suits Adam and
 *   Adagrad, whose step size does not grow with the gradient's scale);
 * - `none`: lr as configured.
 *
 * Either way with a gradual warm-up (Goyal et al.): the multiplier grows
 * linearly from 1 to its full value over the group's first `warmupWindows`
 * windows, so the first, large-gradient updates are not taken at the raised
 * rate. A push of one worker alone (an async group, a degraded group's
 * member) is always at ×1.
 */
export const GROUP_LR_SCALINGS = ['none', 'linear', 'sqrt'] as const;
/** training.group_update: how a sync group's window reaches the shards (see the config). */
export const GROUP_UPDATES = ['reduce', 'direct'] as const;
export type GroupLrScaling = (typeof GROUP_LR_SCALINGS)[number];

export interface GroupLrRule {
  scaling: GroupLrScaling;
  /** Windows over which the multiplier ramps from 1 to its full value; 0: at once. */
  warmupWindows: number;
}

/**
 * The multiplier of the learning rate for a group update that averages
 * `members` workers' batches, in the group's window `window` (0-based).
 */
export function groupLrMultiplier(rule: GroupLrRule | null, members: number, window: number): number {
  if (rule === null || rule.scaling === 'none' || members <= 1) return 1;
  const full = rule.scaling === 'linear' ? members : Math.sqrt(members);
  const ramp = rule.warmupWindows <= 0 ? 1 : Math.min(1, (window + 1) / rule.warmupWindows);
  return 1 + (full - 1) * ramp;
}
