/**
 * The scheduler lease: which process is the job's scheduler (the driver that
 * supervises it and the one writer of the job). One key in a JetStream KV
 * bucket of the job (`HPS_<job>_lease`, key `scheduler`, JSON so `nats kv
 * get` shows it), written only by compare-and-set on its revision:
 *
 * - the **holder** renews it every `renewMs` (500 ms) with `update(key,
 *   value, revision)`; a renewal that finds the revision moved means another
 *   process took over: the holder steps down (`lost`) and writes nothing more;
 * - a holder that could not renew for `leaseMs` by its own clock (the process
 *   was stopped, its event loop held up, NATS unreachable) may have been
 *   taken over: it reads the key first and steps down if the revision moved,
 *   never writing over the new holder; if the revision is still its own
 *   nobody took over, and its compare-and-set renewal makes that certain;
 * - a **standby** polls the key and takes over (compare-and-set on the
 *   revision it watched) once that revision has stayed the same for the
 *   holder's `lease_ms`, measured on the standby's own clock from when it
 *   first saw that revision, so the two processes' wall clocks never have to
 *   agree. It takes over only a lease that exists and is held: a missing key
 *   is a job not started yet, and a `released` lease (the job ended) that it
 *   saw held before ends the standby;
 * - a driver starting a job (`acquireLease`) creates the key, takes a
 *   released one, or a held one that does not move for `lease_ms` (left by a
 *   process that died); a lease that moves is a live scheduler: it refuses.
 *
 * The holder renews from a time `t` and is valid until `t + leaseMs` by its
 * own clock; a standby sees that renewal after `t` and waits `lease_ms` from
 * then, so the old holder has stopped acting before the standby starts.
 * The rules are pure functions (`observeLease`, `judgeLease`,
 * `holderMayAct`); `LeaseHolder` and `LeaseStandby` run them on a `LeaseKv`
 * (JetStream, or in memory for tests) and a `Clock`.
 */
import { z } from 'zod';
import type { KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { HetpsError, registerErrorClass, streamName, type Clock, type Logger, type Timer } from '../../runtime/mod.ts';
import { createKvBucket, type ReplicaOptions } from '../store/replicas.ts';

/**
 * How long a holder may go without renewing before a standby takes over, ms.
 * (A config key `fault_tolerance.scheduler_lease_ms` would set it.)
 */
export const DEFAULT_SCHEDULER_LEASE_MS = 2_000;
/** How often the holder renews, ms. */
export const DEFAULT_LEASE_RENEW_MS = 500;
/** How often a standby (or a starting driver) reads the key, ms. */
export const DEFAULT_LEASE_POLL_MS = 250;
/** The key of the scheduler lease in the job's lease bucket. */
export const LEASE_KEY = 'scheduler';
/** Takeovers kept in the record (the run summary lists them). */
const KEEP_TAKEOVERS = 20;

/** The lease bucket of a job: `HPS_<job>_lease`. */
export function leaseBucketName(job: string): string {
  return streamName(job, 'lease');
}

// ---------------------------------------------------------------- errors

/** The lease is held by a scheduler that renews it: another driver of this job is running. `data`: the holder, its run, term and lease. */
export class LeaseHeldError extends HetpsError {
  override readonly code: string = 'ERR_LEASE_HELD';
  override readonly retryable: boolean = false;
}

/** This process held the lease and another took it over (or it could not be renewed and moved): it is not the scheduler any more. */
export class LeaseLostError extends HetpsError {
  override readonly code: string = 'ERR_LEASE_LOST';
  override readonly retryable: boolean = false;
}

/** A compare-and-set on the lease key lost: another writer changed it first. */
export class LeaseConflictError extends HetpsError {
  override readonly code: string = 'ERR_LEASE_CONFLICT';
  override readonly retryable: boolean = false;
}

registerErrorClass(LeaseHeldError);
registerErrorClass(LeaseLostError);
registerErrorClass(LeaseConflictError);

// ---------------------------------------------------------------- the record

/** One takeover: who took the job from whom, and how long the lease had gone unrenewed (as the new holder saw it). */
export const takeoverSchema = z.object({
  at: z.string(),
  from: z.string(),
  to: z.string(),
  /** From the last renewal the new holder saw to its takeover, ms. */
  lease_gap_ms: z.number().nonnegative(),
  term: z.number().int().nonnegative(),
});
export type TakeoverRecord = z.infer<typeof takeoverSchema>;

export const leaseRecordSchema = z.object({
  /** `held` while a scheduler runs the job; `released` once it ended it. */
  state: z.enum(['held', 'released']),
  /** Who: `driver@<host>:<pid>`. */
  holder: z.string().min(1),
  /** The holder's actor-system sender id (a restarted process gets a new one). */
  incarnation: z.string().min(1),
  /** The run the holder supervises; null before it has created one. */
  run_id: z.string().min(1).nullable(),
  /** Goes up by one with each new holder (a fencing token). */
  term: z.number().int().nonnegative(),
  /** The holder's promise: it renews at least this often, else it may be taken over. */
  lease_ms: z.number().int().positive(),
  /** Holder's wall clock, for people reading the key; the rules use revisions and each process's own clock. */
  renewed_at_ms: z.number(),
  expires_at_ms: z.number(),
  /** Why it was released; null while held. */
  reason: z.string().nullable(),
  takeovers: z.array(takeoverSchema).default([]),
});
export type LeaseRecord = z.infer<typeof leaseRecordSchema>;

/** The key as read: its revision, and the record (null when the value is deleted or not a lease). */
export interface LeaseEntry {
  revision: number;
  record: LeaseRecord | null;
}

/** The lease key with compare-and-set writes (JetStream KV, or memory). */
export interface LeaseKv {
  /** null: the key was never written. */
  get(): Promise<LeaseEntry | null>;
  /** Writes only when the key has no value; LeaseConflictError otherwise. Returns the new revision. */
  create(record: LeaseRecord): Promise<number>;
  /** Writes only when the key is still at `revision`; LeaseConflictError otherwise. Returns the new revision. */
  update(record: LeaseRecord, revision: number): Promise<number>;
}

// ---------------------------------------------------------------- the rules

/** What a watcher has seen of the key: the revision, its record, and since when (its own monotonic ms) that revision has stood. */
export interface LeaseObservation {
  revision: number | null;
  record: LeaseRecord | null;
  since: number;
}

/** The observation after reading `entry` at `now`: a moved revision restarts the wait. */
export function observeLease(prev: LeaseObservation | null, entry: LeaseEntry | null, now: number): LeaseObservation {
  const revision = entry?.revision ?? null;
  if (prev !== null && prev.revision === revision) return { ...prev, record: entry?.record ?? null };
  return { revision, record: entry?.record ?? null, since: now };
}

/**
 * - `absent`: no lease (never written, or deleted): no scheduler has started the job;
 * - `released`: the job's scheduler ended it;
 * - `live`: held, and renewed within the holder's lease_ms;
 * - `expired`: held, and the revision has not moved for the holder's lease_ms.
 */
export type LeaseVerdict = 'absent' | 'released' | 'live' | 'expired';

export function judgeLease(obs: LeaseObservation, now: number): LeaseVerdict {
  const r = obs.record;
  if (obs.revision === null || r === null) return 'absent';
  if (r.state === 'released') return 'released';
  return now - obs.since >= r.lease_ms ? 'expired' : 'live';
}

/** A holder may act as the scheduler while its last successful renewal was sent less than `leaseMs` ago (its own clock). */
export function holderMayAct(lastRenewalSentAt: number, now: number, leaseMs: number): boolean {
  return now - lastRenewalSentAt < leaseMs;
}

// ---------------------------------------------------------------- the holder

export interface LeaseIdentity {
  /** `driver@<host>:<pid>` */
  holder: string;
  incarnation: string;
}

export interface LeaseTimings {
  /** Default DEFAULT_SCHEDULER_LEASE_MS. */
  leaseMs?: number;
  /** Default DEFAULT_LEASE_RENEW_MS. */
  renewMs?: number;
  /** Default DEFAULT_LEASE_POLL_MS. */
  pollMs?: number;
}

export interface LeaseOptions extends LeaseTimings {
  kv: LeaseKv;
  clock: Clock;
  identity: LeaseIdentity;
  log?: Logger | null;
}

function timings(o: LeaseTimings): Required<LeaseTimings> {
  const leaseMs = o.leaseMs ?? DEFAULT_SCHEDULER_LEASE_MS;
  return { leaseMs, renewMs: o.renewMs ?? Math.min(DEFAULT_LEASE_RENEW_MS, Math.max(1, Math.floor(leaseMs / 4))), pollMs: o.pollMs ?? DEFAULT_LEASE_POLL_MS };
}

function heldRecord(o: LeaseOptions, leaseMs: number, term: number, runId: string | null, takeovers: TakeoverRecord[]): LeaseRecord {
  const now = o.clock.now();
  return {
    state: 'held', holder: o.identity.holder, incarnation: o.identity.incarnation, run_id: runId, term, lease_ms: leaseMs,
    renewed_at_ms: now, expires_at_ms: now + leaseMs, reason: null, takeovers: takeovers.slice(-KEEP_TAKEOVERS),
  };
}

/** The lease as this process holds it: renewed on a timer until released, or lost to another process. */
export class LeaseHolder {
  private revision: number;
  private record: LeaseRecord;
  private lastSentAt: number;
  private timer: Timer | null = null;
  private inFlight: Promise<void> | null = null;
  private state: 'held' | 'lost' | 'released' = 'held';
  private lostError: LeaseLostError | null = null;
  private readonly listeners = new Set<(e: LeaseLostError) => void>();
  private readonly t: Required<LeaseTimings>;
  /** Renewals written (tests, logs). */
  renewals = 0;

  /** @internal Made by `acquireLease` and `LeaseStandby`; `sentAt` is when the write that made `revision` was sent. */
  constructor(private readonly o: LeaseOptions, revision: number, record: LeaseRecord, sentAt: number) {
    this.t = timings(o);
    this.revision = revision;
    this.record = record;
    this.lastSentAt = sentAt;
  }

  get term(): number { return this.record.term; }
  get leaseMs(): number { return this.t.leaseMs; }
  get holder(): string { return this.record.holder; }
  /** The takeovers of the job so far, this one included (from the record). */
  get takeovers(): TakeoverRecord[] { return [...this.record.takeovers]; }
  /** Set once the lease is lost; null while held or after a release. */
  get lost(): LeaseLostError | null { return this.lostError; }
  get held(): boolean { return this.state === 'held'; }

  /** Starts renewing every renewMs. */
  start(): this {
    if (this.timer === null && this.state === 'held') this.timer = this.o.clock.setInterval(() => { void this.renew(); }, this.t.renewMs);
    return this;
  }

  /** Called once if the lease is lost (never after a release). */
  onLost(listener: (e: LeaseLostError) => void): () => void {
    if (this.lostError !== null) { listener(this.lostError); return () => undefined; }
    this.listeners.add(listener);
    return () => { this.listeners.delete(listener); };
  }

  /** The run this holder supervises (written with the next renewal; a standby reads it). */
  async setRunId(runId: string): Promise<void> {
    this.record = { ...this.record, run_id: runId };
    await this.renew();
  }

  /** One renewal (the timer's; tests call it directly). One at a time: a tick while one is in flight waits for it. */
  renew(): Promise<void> {
    if (this.state !== 'held') return Promise.resolve();
    if (this.inFlight !== null) return this.inFlight;
    const p = this.renewOnce().finally(() => { this.inFlight = null; });
    this.inFlight = p;
    return p;
  }

  private async renewOnce(): Promise<void> {
    const now = this.o.clock.monotonic();
    if (!holderMayAct(this.lastSentAt, now, this.t.leaseMs)) {
      // Past our own lease: a standby may have taken over. Look before writing anything.
      let entry: LeaseEntry | null;
      try {
        entry = await this.o.kv.get();
      } catch (e) {
        this.o.log?.warn({ err: (e as Error).message }, 'scheduler lease: cannot read it to renew; trying again');
        return;
      }
      if (entry === null || entry.revision !== this.revision) {
        const by = entry?.record ? `${entry.record.holder} (term ${entry.record.term})` : 'nobody (the key was removed)';
        this.lose(`the scheduler lease moved to ${by} while this process could not renew it for ${Math.round(now - this.lastSentAt)} ms`);
        return;
      }
      this.o.log?.warn({ unrenewed_ms: Math.round(now - this.lastSentAt) }, 'scheduler lease: not renewed for longer than the lease, but nobody took it over; renewing');
    }
    const sentAt = this.o.clock.monotonic();
    const next = { ...heldRecord(this.o, this.t.leaseMs, this.record.term, this.record.run_id, this.record.takeovers) };
    try {
      this.revision = await this.o.kv.update(next, this.revision);
      this.record = next;
      this.lastSentAt = sentAt;
      this.renewals++;
    } catch (e) {
      if (e instanceof LeaseConflictError) {
        this.lose('another process took over the scheduler lease (its revision moved)');
        return;
      }
      // NATS slow or reconnecting: try again at the next tick; the check above decides once the lease has run out.
      this.o.log?.debug({ err: (e as Error).message }, 'scheduler lease: renewal failed; retrying');
    }
  }

  /** Ends the lease for good (the job is over): `released`, so a standby knows there is nothing to take over. */
  async release(reason: string): Promise<void> {
    if (this.state !== 'held') return;
    this.stopTimer();
    this.state = 'released';
    await this.inFlight;
    const now = this.o.clock.now();
    const rec: LeaseRecord = { ...this.record, state: 'released', renewed_at_ms: now, expires_at_ms: now, reason };
    try {
      this.revision = await this.o.kv.update(rec, this.revision);
      this.record = rec;
    } catch (e) {
      this.o.log?.warn({ err: (e as Error).message }, 'scheduler lease: could not release it (a standby takes over after the lease runs out)');
    }
  }

  /** Stops renewing without releasing (a standby takes over after lease_ms). */
  stop(): void { this.stopTimer(); }

  private stopTimer(): void {
    this.timer?.cancel();
    this.timer = null;
  }

  private lose(why: string): void {
    if (this.state !== 'held') return;
    this.state = 'lost';
    this.stopTimer();
    this.lostError = new LeaseLostError(`${this.record.holder} is no longer the scheduler: ${why}`, { data: { holder: this.record.holder, term: this.record.term } });
    this.o.log?.error({ term: this.record.term }, this.lostError.message);
    for (const l of [...this.listeners]) l(this.lostError);
    this.listeners.clear();
  }
}

/** The lease as a starting driver finds it, in words. */
function describeHolder(r: LeaseRecord, now: number): string {
  return `${r.holder} (run ${r.run_id ?? 'not created yet'}, term ${r.term}, renewed ${Math.max(0, Math.round(now - r.renewed_at_ms))} ms ago by its clock)`;
}

/**
 * Takes the lease for a driver that starts a job: creates it, takes a
 * released one, or takes a held one that does not move for its lease_ms
 * (its holder died). A held lease that moves: LeaseHeldError. Returns the
 * holder, renewing.
 */
export async function acquireLease(o: LeaseOptions & {
  runId: string | null; job: string;
  /** How long KV calls that fail for other reasons than a lost compare-and-set (timeouts while the cluster elects leaders) are retried, ms. Default 30 s. */
  retryForMs?: number;
}): Promise<LeaseHolder> {
  const t = timings(o);
  const deadline = o.clock.monotonic() + (o.retryForMs ?? 30_000);
  const retrying = async <T>(what: string, call: () => Promise<T>): Promise<T> => {
    for (;;) {
      try {
        return await call();
      } catch (e) {
        if (e instanceof LeaseConflictError || o.clock.monotonic() >= deadline) throw e;
        o.log?.warn({ err: (e as Error).message }, `scheduler lease: ${what} failed; trying again`);
        await o.clock.sleep(t.pollMs);
      }
    }
  };
  let obs: LeaseObservation | null = null;
  let first: number | null = null;
  /** When our first write was sent: a write whose answer was lost may have landed then. */
  let firstWriteAt: number | null = null;
  for (let attempt = 0; attempt < 1_000; attempt++) {
    const now = o.clock.monotonic();
    const entry = await retrying('reading it', () => o.kv.get());
    if (firstWriteAt !== null && entry?.record?.state === 'held' && entry.record.incarnation === o.identity.incarnation) {
      // Our own write, whose answer was lost (a timeout): it is ours, renewed no later than it was sent.
      return new LeaseHolder(o, entry.revision, entry.record, firstWriteAt).start();
    }
    obs = observeLease(obs, entry, now);
    const verdict = judgeLease(obs, now);
    const old = obs.record;
    if (verdict === 'live') {
      // A live holder renews within its lease: the revision moves. Until it does (or lease_ms passes) a crashed holder looks the same.
      first ??= obs.revision;
      if (old !== null && obs.revision !== first) {
        throw new LeaseHeldError(`job ${o.job} already has an active scheduler: ${describeHolder(old, o.clock.now())}. Another \`hetps up\` is running this job: `
          + 'run this one as a standby (`hetps up --standby`), wait for that job to end, or give this run another job name (--job NAME)', {
          data: { job: o.job, holder: old.holder, run_id: old.run_id, term: old.term, lease_ms: old.lease_ms },
        });
      }
      if (attempt === 0) o.log?.info({ holder: old?.holder ?? null }, `scheduler lease of job ${o.job} is held by ${old ? describeHolder(old, o.clock.now()) : '?'}; checking whether it is still renewed (up to ${old?.lease_ms ?? t.leaseMs} ms)`);
      await o.clock.sleep(t.pollMs);
      continue;
    }
    const sentAt = o.clock.monotonic();
    firstWriteAt ??= sentAt;
    // A new run: the takeovers of an earlier one are not its own.
    const rec = heldRecord(o, t.leaseMs, (old?.term ?? 0) + 1, o.runId, []);
    try {
      const at = obs.revision;
      const revision = await retrying('writing it', () => (at === null ? o.kv.create(rec) : o.kv.update(rec, at)));
      if (verdict === 'expired' && old) o.log?.warn({ previous: old.holder }, `scheduler lease of job ${o.job}: ${old.holder} has not renewed it for ${old.lease_ms} ms; taking it`);
      return new LeaseHolder(o, revision, rec, sentAt).start();
    } catch (e) {
      if (!(e instanceof LeaseConflictError)) throw e;
      // Someone else wrote in between: look again.
      obs = null;
      first = null;
    }
  }
  throw new LeaseHeldError(`job ${o.job}: could not take the scheduler lease (it kept changing)`, { data: { job: o.job } });
}

// ---------------------------------------------------------------- the standby

export type StandbyOutcome =
  | { kind: 'took_over'; holder: LeaseHolder; takeover: TakeoverRecord; previous: LeaseRecord }
  | { kind: 'ended'; record: LeaseRecord }
  | { kind: 'stopped' };

/**
 * Waits on the lease and takes it over once its holder stops renewing.
 * `onHolder` hears each new holder it sees (once per term).
 */
export class LeaseStandby {
  private obs: LeaseObservation | null = null;
  private stopped = false;
  private wake: (() => void) | null = null;
  private readonly t: Required<LeaseTimings>;
  /** Whether this standby has seen the lease held (a release seen before that is an earlier run's). */
  private sawHeld = false;

  constructor(private readonly o: LeaseOptions & { onHolder?: (r: LeaseRecord) => void }) {
    this.t = timings(o);
  }

  /** One look at the key and, if the lease has expired, a takeover attempt. null: keep waiting. */
  async poll(): Promise<StandbyOutcome | null> {
    const { o } = this;
    let entry: LeaseEntry | null;
    try {
      entry = await o.kv.get();
    } catch (e) {
      o.log?.debug({ err: (e as Error).message }, 'standby: cannot read the scheduler lease; trying again');
      return null;
    }
    const now = o.clock.monotonic();
    const prevTerm = this.obs?.record?.state === 'held' ? this.obs.record.term : null;
    this.obs = observeLease(this.obs, entry, now);
    const verdict = judgeLease(this.obs, now);
    const rec = this.obs.record;
    if (verdict === 'released' && rec) {
      if (this.sawHeld) return { kind: 'ended', record: rec };
      return null;
    }
    if (verdict === 'live' || verdict === 'expired') {
      this.sawHeld = true;
      if (rec && rec.term !== prevTerm) o.onHolder?.(rec);
    }
    if (verdict !== 'expired' || rec === null || this.obs.revision === null) return null;
    const sentAt = o.clock.monotonic();
    const takeover: TakeoverRecord = {
      at: new Date(o.clock.now()).toISOString(), from: rec.holder, to: o.identity.holder,
      lease_gap_ms: Math.round(now - this.obs.since), term: rec.term + 1,
    };
    const next = heldRecord(o, this.t.leaseMs, rec.term + 1, rec.run_id, [...rec.takeovers, takeover]);
    try {
      const revision = await o.kv.update(next, this.obs.revision);
      return { kind: 'took_over', holder: new LeaseHolder(o, revision, next, sentAt).start(), takeover, previous: rec };
    } catch (e) {
      // Another standby was first (conflict) or NATS did not answer: keep watching whoever holds it now.
      o.log?.debug({ err: (e as Error).message }, 'standby: takeover write failed; watching again');
      this.obs = null;
      return null;
    }
  }

  /** Polls every pollMs until it takes over, sees the job end, or is stopped. */
  async wait(): Promise<StandbyOutcome> {
    while (!this.stopped) {
      const r = await this.poll();
      if (r !== null) return r;
      if (this.stopped) break;
      await new Promise<void>((resolve) => {
        const timer = this.o.clock.setTimeout(() => { this.wake = null; resolve(); }, this.t.pollMs);
        this.wake = () => { timer.cancel(); this.wake = null; resolve(); };
      });
    }
    return { kind: 'stopped' };
  }

  stop(): void {
    this.stopped = true;
    this.wake?.();
  }
}

// ---------------------------------------------------------------- stores

/** The lease key in memory (one process: tests, and the same rules without NATS). */
export class MemoryLeaseKv implements LeaseKv {
  private entry: { revision: number; value: string | null } | null = null;
  private seq = 0;

  async get(): Promise<LeaseEntry | null> {
    if (this.entry === null) return null;
    return { revision: this.entry.revision, record: this.entry.value === null ? null : leaseRecordSchema.parse(JSON.parse(this.entry.value)) };
  }

  async create(record: LeaseRecord): Promise<number> {
    if (this.entry !== null && this.entry.value !== null) throw new LeaseConflictError(`lease key exists (revision ${this.entry.revision})`);
    return this.write(record);
  }

  async update(record: LeaseRecord, revision: number): Promise<number> {
    if (this.entry === null || this.entry.revision !== revision) {
      throw new LeaseConflictError(`wrong last revision: ${this.entry?.revision ?? 0}, expected ${revision}`);
    }
    return this.write(record);
  }

  /** Removes the value (as `nats kv del` would). */
  delete(): void {
    if (this.entry !== null) this.entry = { revision: ++this.seq, value: null };
  }

  private write(record: LeaseRecord): number {
    this.entry = { revision: ++this.seq, value: JSON.stringify(leaseRecordSchema.parse(record)) };
    return this.seq;
  }
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A compare-and-set that lost, as JetStream says it. */
function isCasConflict(e: unknown): boolean {
  return /wrong last sequence|key exists|10071/i.test(e instanceof Error ? e.message : String(e));
}

/** The lease key of a JetStream KV bucket (see `openLeaseBucket`). */
export function natsLeaseKv(kv: KV): LeaseKv {
  const write = async (f: () => Promise<number>): Promise<number> => {
    try {
      return await f();
    } catch (e) {
      if (isCasConflict(e)) throw new LeaseConflictError(`the scheduler lease changed: ${(e as Error).message}`, { cause: e });
      throw e;
    }
  };
  return {
    async get() {
      const e = await kv.get(LEASE_KEY);
      if (e === null) return null;
      if (e.operation !== 'PUT' || e.value.byteLength === 0) return { revision: e.revision, record: null };
      const r = leaseRecordSchema.safeParse((() => { try { return JSON.parse(decoder.decode(e.value)) as unknown; } catch { return null; } })());
      return { revision: e.revision, record: r.success ? r.data : null };
    },
    create: (record) => write(() => kv.create(LEASE_KEY, encoder.encode(JSON.stringify(leaseRecordSchema.parse(record))))),
    update: (record, revision) => write(() => kv.update(LEASE_KEY, encoder.encode(JSON.stringify(leaseRecordSchema.parse(record))), revision)),
  };
}

/**
 * Opens the job's lease bucket, or creates it with the replicas the cluster
 * can place (3 on a cluster of 3). Never emptied by a new run: a live
 * holder's lease is what tells a second driver to stay out.
 */
export async function openLeaseBucket(nc: NatsConnection, job: string, opts: ReplicaOptions = {}): Promise<{ kv: LeaseKv; replicas: number }> {
  const { kv, replicas } = await createKvBucket(nc, leaseBucketName(job), { ...opts, history: 1 });
  return { kv: natsLeaseKv(kv), replicas };
}
