/**
 * `communication.compression: adaptive`: when a worker sends its gradients
 * (pushes, hps group slices) as fp16 and when as float32. The reference
 * article: compression starts once network bandwidth utilisation exceeds
 * `compression_threshold` (default 0.5); raise the threshold to compress
 * less often.
 *
 * Link utilisation is the fraction of the worker's recent wall time during
 * which its link was busy transferring (pull replies, pushes, group slices),
 * over a sliding window of the last LINK_UTILISATION_WINDOW_MS (10 s) of
 * wall time, or since the link's first transfer when that is shorter.
 * Overlapping transfers count once (the union of busy intervals), so it lies
 * in [0, 1]. The worker measures it (actors/worker/link-usage.ts):
 * - with an emulated link (`emulate.bandwidth_mbps`), exactly: the time the
 *   emulated link spends carrying bytes;
 * - over NATS without one, as the time its bytes (pulls both ways, pushes,
 *   the group slices it sends) take at the bandwidth its profile measured
 *   when it joined, queued one after another: the link's own share of each
 *   request, without the receiver's handling;
 * - over NATS without a measured bandwidth (no profile), as the time the
 *   worker waits on its pull and push requests and its group-slice sends.
 *   That is an upper bound of the link's busy time: it includes the
 *   receiver's handling (a shard applying a push) and retries. A bsp pull
 *   waiting for its round is not counted (that wait is the round's
 *   barrier, not the link);
 * - on the embedded in-process bus without an emulated link there is no
 *   link: utilisation is never measured (null) and gradients stay float32.
 *
 * The rule, with hysteresis so the choice does not flap:
 * - float32 → fp16 when utilisation > threshold;
 * - fp16 → float32 when utilisation < threshold × ADAPTIVE_COMPRESSION_OFF_FRACTION (0.8):
 *   compressing lowers the utilisation it is judged on (a push's gradients
 *   shrink by half), so switching back at the threshold itself would undo
 *   the switch at once;
 * - after a switch the choice is held for `holdMs` (default one window), so
 *   every later decision is made on utilisation measured entirely under the
 *   current choice;
 * - no decision before LINK_UTILISATION_MIN_SPAN_MS (1 s) of the link's
 *   activity has been seen (utilisation null): one slow first pull says
 *   nothing.
 * threshold 1 never compresses; 0 compresses once the link carried anything.
 * Plain functions over plain data: the caller keeps the state between calls.
 */
import { ConfigError } from '../runtime/errors.ts';

/** How a worker's gradients leave it: scaled halves or float32. */
export type CompressionChoice = 'fp16' | 'none';

/** A worker's gradient compression: always fp16, adaptive (by link utilisation), or null (float32). */
export type GradientCompressionMode = 'fp16' | 'adaptive' | null;

/** communication.compression and compression_threshold as the workers apply them. */
export interface GradientCompressionSetting {
  mode: GradientCompressionMode;
  /** Link utilisation in [0, 1] above which adaptive compression switches to fp16. */
  threshold: number;
}

/** Sliding window link utilisation is measured over (wall time, ms). */
export const LINK_UTILISATION_WINDOW_MS = 10_000;
/** Link activity (ms since its first transfer) before utilisation is judged at all. */
export const LINK_UTILISATION_MIN_SPAN_MS = 1_000;
/** fp16 is switched off below threshold × this. */
export const ADAPTIVE_COMPRESSION_OFF_FRACTION = 0.8;
/** A switch is held this long (one window) before the next decision. */
export const ADAPTIVE_COMPRESSION_HOLD_MS = LINK_UTILISATION_WINDOW_MS;
/** communication.compression_threshold's default (the article's 50 %). */
export const DEFAULT_COMPRESSION_THRESHOLD = 0.5;

/** Carried from one decision to the next. */
export interface AdaptiveCompressionState {
  choice: CompressionChoice;
  /** When (caller's clock, ms) the current choice was taken; null: the initial float32, never switched. */
  sinceMs: number | null;
}

export const INITIAL_ADAPTIVE_COMPRESSION_STATE: AdaptiveCompressionState = { choice: 'none', sinceMs: null };

export interface AdaptiveCompressionInput {
  /** Link utilisation over the recent window, in [0, 1]; null: not measured long enough yet (no decision). */
  utilisation: number | null;
  /** communication.compression_threshold, in [0, 1]. */
  threshold: number;
  /** Now, on the clock `state.sinceMs` is on. */
  nowMs: number;
  /** How long a switch is held; default ADAPTIVE_COMPRESSION_HOLD_MS. */
  holdMs?: number;
}

/** Throws a ConfigError naming communication.compression_threshold unless `threshold` is a number in [0, 1]. */
export function checkCompressionThreshold(threshold: number): void {
  if (!(typeof threshold === 'number' && threshold >= 0 && threshold <= 1)) {
    throw new ConfigError(`communication.compression_threshold must be a number in [0, 1] (a link utilisation), got ${threshold}`);
  }
}

/** Utilisation below which an adaptive worker that compresses goes back to float32. */
export function compressionOffBelow(threshold: number): number {
  return threshold * ADAPTIVE_COMPRESSION_OFF_FRACTION;
}

/**
 * The choice after one decision (see the module comment); `state` itself is
 * returned when nothing changes. A NaN or out-of-range utilisation, or a
 * threshold outside [0, 1], is an error naming it.
 */
export function adaptiveCompression(input: AdaptiveCompressionInput, state: AdaptiveCompressionState): AdaptiveCompressionState {
  const { utilisation, threshold, nowMs } = input;
  checkCompressionThreshold(threshold);
  if (utilisation !== null && !(typeof utilisation === 'number' && utilisation >= 0 && utilisation <= 1)) {
    throw new RangeError(`link utilisation must be a number in [0, 1] (the busy fraction of the recent window), got ${utilisation}`);
  }
  const holdMs = input.holdMs ?? ADAPTIVE_COMPRESSION_HOLD_MS;
  if (!(holdMs >= 0)) throw new RangeError(`adaptive compression holdMs must be ≥ 0, got ${holdMs}`);
  if (!Number.isFinite(nowMs)) throw new RangeError(`adaptive compression nowMs must be a finite number, got ${nowMs}`);
  if (utilisation === null) return state;
  if (state.sinceMs !== null && nowMs - state.sinceMs < holdMs) return state;
  if (state.choice === 'none' && utilisation > threshold) return { choice: 'fp16', sinceMs: nowMs };
  if (state.choice === 'fp16' && utilisation < compressionOffBelow(threshold)) return { choice: 'none', sinceMs: nowMs };
  return state;
}

