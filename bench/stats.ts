/** The statistics the benchmarks report: medians, ranges, time to a target. */

/** The median of `xs` (the mean of the middle two for an even count); null for none. */
export function median(xs: readonly number[]): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

export const round = (x: number, digits: number): number => Number(x.toFixed(digits));

/** Median and range of the finite values; `n` counts them. */
export function stat(xs: readonly (number | null)[], digits: number): { median: number | null; min: number | null; max: number | null; n: number } {
  const v = xs.filter((x): x is number => x !== null && Number.isFinite(x));
  return v.length === 0 ? { median: null, min: null, max: null, n: 0 } : { median: round(median(v)!, digits), min: round(Math.min(...v), digits), max: round(Math.max(...v), digits), n: v.length };
}

/**
 * Time to target over a peer's runs. A run that never reaches the target
 * (null) counts as infinitely slow, not as absent: the median is that of all
 * runs (null when the median run did not reach it), `max` is null when any
 * run did not, `n` counts the runs and `reached` those that got there.
 */
export function targetStat(xs: readonly (number | null)[], digits: number): { median: number | null; min: number | null; max: number | null; n: number; reached: number } {
  const reached = xs.filter((x): x is number => x !== null && Number.isFinite(x));
  const m = median(xs.map((x) => (x === null || !Number.isFinite(x) ? Infinity : x)));
  return {
    median: m !== null && Number.isFinite(m) ? round(m, digits) : null,
    min: reached.length > 0 ? round(Math.min(...reached), digits) : null,
    max: reached.length > 0 && reached.length === xs.length ? round(Math.max(...reached), digits) : null,
    n: xs.length,
    reached: reached.length,
  };
}
