/**
 * The shard's own error conditions. Registered with the runtime's wire
 * registry on import, so a remote caller that imports `actors/mod.ts` gets
 * the same class back from `request()`.
 */
import { HetpsError, registerErrorClass } from '../../runtime/mod.ts';

/**
 * The request names a shard-plan version other than the shard's. Retryable:
 * the caller re-reads the plan (or waits until the shard has the new one) and
 * sends again. `data`: `{ shard, shard_plan_version, request_plan_version }`.
 */
export class StalePlanError extends HetpsError {
  override readonly code: string = 'ERR_STALE_PLAN';
  override readonly retryable: boolean = true;
}

/**
 * A synchronous contribution for a round that is already applied, or for one
 * further ahead than the next round, or whose `expected` disagrees with the
 * round's. Not retryable: the sender's view of the rounds is wrong.
 * `data`: `{ shard, round, current_round }`.
 */
export class SyncRoundError extends HetpsError {
  override readonly code: string = 'ERR_SYNC_ROUND';
  override readonly retryable: boolean = false;
}

/**
 * An asynchronous push computed from parameters more than `max_staleness`
 * updates behind the shard (hps). Nothing was applied. Not retryable as it
 * is: the same gradient is only staler later. The sender drops it, pulls
 * fresh parameters and goes on (hetps workers acknowledge the batches and
 * count them as dropped stale). `data`: `{ shard, staleness, max_staleness,
 * version, base_version }`.
 */
export class StaleUpdateError extends HetpsError {
  override readonly code: string = 'ERR_STALE_UPDATE';
  override readonly retryable: boolean = false;
}

registerErrorClass(StalePlanError);
registerErrorClass(SyncRoundError);
registerErrorClass(StaleUpdateError);

/**
 * A replica under a newer plan refused an update from a primary that is no
 * longer the primary (it was deposed while paused or cut off). The sender
 * stops serving: it applies nothing more and waits to be re-seeded as a
 * backup. Not retryable. `data`: `{ shard, epoch, replica_epoch }`.
 */
export class FencedError extends HetpsError {
  override readonly code: string = 'ERR_FENCED';
  override readonly retryable: boolean = false;
}

registerErrorClass(FencedError);
