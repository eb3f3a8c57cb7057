/**
 * The versioned shard plan where every process can read and watch it: a
 * JetStream KV bucket `HPS_<job>_plan` (one key, the plan as JSON so
 * `nats kv get` shows it) over NATS, or an in-memory store with the same
 * interface for the embedded mode.
 *
 * Versions only move forward: `put` of a plan older than the stored one is a
 * StalePlanError (re-read and decide), the same version with the same content
 * is a no-op, and concurrent writers are serialised by the KV's compare-and-set.
 * Watchers see the current plan first, then each newer one, never an older one.
 */
import { z } from 'zod';
import { Kvm, type KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { ConfigError, NatsBus, streamName, type Clock, type Timer, type Transport } from '../../runtime/mod.ts';
import { validateShardPlan, type ShardPlan } from '../../topology/mod.ts';
import { StalePlanError } from '../shard/shard.errors.ts';
import { createKvBucket, type ReplicaOptions } from './replicas.ts';

export interface PlanStore {
  /** Stores `plan` (validated) if it is newer than the stored one; StalePlanError if older, or the same version with other content. */
  put(plan: ShardPlan): Promise<void>;
  /** The stored plan (validated), or null when none was stored yet. */
  get(): Promise<ShardPlan | null>;
  /**
   * Calls `onPlan` with the stored plan (if any), then with every newer plan.
   * A stored value that is not a valid plan, or an `onPlan` that throws, goes
   * to `onError` (default: ignored) and the watch goes on. Returns `stop`.
   */
  watch(onPlan: (plan: ShardPlan) => void, onError?: (e: Error) => void): () => void;
}

/** The KV key holding the plan. */
export const PLAN_KEY = 'current';

/** The KV bucket of a job's plan (bucket names allow [A-Za-z0-9_-]). */
export function planBucketName(job: string): string {
  return streamName(job, 'plan');
}

/** The raw NATS connection under a transport, or null for the in-process bus. */
export function natsConnectionOf(transport: Transport): NatsConnection | null {
  return transport.bus instanceof NatsBus ? transport.bus.nc : null;
}

// ---------------------------------------------------------------- encoding

const planSchema = z.object({
  version: z.number().int().nonnegative(),
  shards: z.array(z.string().min(1)).min(1),
  denseParams: z.array(z.object({ name: z.string().min(1), size: z.number().int().positive() })),
  dense: z.array(z.object({
    id: z.number().int().nonnegative(),
    param: z.string().min(1),
    offset: z.number().int().nonnegative(),
    length: z.number().int().positive(),
    shard: z.string().min(1),
  })),
  sparseTables: z.array(z.object({ name: z.string().min(1), dim: z.number().int().positive() })),
  partitions: z.number().int().positive(),
  partitionOwner: z.array(z.string().min(1)),
  placement: z.object({
    servers: z.array(z.string().min(1)).min(1),
    replicas: z.record(z.string(), z.object({
      primary: z.string().min(1),
      backups: z.array(z.string().min(1)),
      seeding: z.array(z.string().min(1)).default([]),
    })),
    initial_version: z.number().int().nonnegative().optional(),
  }),
});

/** Checks shape and consistency; returns a fresh plan with exactly the plan's fields (in a fixed key order). */
export function parseShardPlan(value: unknown, where: string): ShardPlan {
  const r = planSchema.safeParse(value);
  if (!r.success) {
    const i = r.error.issues[0]!;
    throw new ConfigError(`${where}: not a shard plan: ${i.path.join('.') || '(root)'}: ${i.message}`);
  }
  const plan = r.data as ShardPlan;
  try {
    validateShardPlan(plan);
  } catch (e) {
    throw new ConfigError(`${where}: ${(e as Error).message}`, { cause: e });
  }
  return plan;
}

function encodePlan(plan: ShardPlan): string {
  return JSON.stringify(parseShardPlan(plan, `shard plan v${plan.version}`));
}

function decodePlan(text: string, where: string): ShardPlan {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new ConfigError(`${where}: not JSON: ${(e as Error).message}`, { cause: e });
  }
  return parseShardPlan(value, where);
}

/** Throws unless `next` may replace `current`; returns false when it is the same plan (nothing to write). */
function mayReplace(current: { plan: ShardPlan; text: string } | null, next: ShardPlan, nextText: string): boolean {
  if (current === null) return true;
  const v = current.plan.version;
  if (next.version > v) return true;
  if (next.version === v && nextText === current.text) return false;
  throw new StalePlanError(
    next.version === v
      ? `shard plan v${v} is already stored with different content; a changed plan needs a higher version`
      : `shard plan v${next.version} is older than the stored v${v}; re-read the plan`,
    { data: { stored_version: v, put_version: next.version } },
  );
}

// ---------------------------------------------------------------- in memory

/** The embedded-mode store: one per process (share it between every actor of the job). */
export function memoryPlanStore(initial: ShardPlan | null = null): PlanStore {
  return new MemoryPlanStore(initial);
}

interface MemoryWatcher { onPlan: (plan: ShardPlan) => void; onError: (e: Error) => void; last: number; active: boolean }

class MemoryPlanStore implements PlanStore {
  private current: { plan: ShardPlan; text: string } | null = null;
  private watchers = new Set<MemoryWatcher>();

  constructor(initial: ShardPlan | null) {
    if (initial !== null) {
      const text = encodePlan(initial);
      this.current = { plan: decodePlan(text, 'memory plan store'), text };
    }
  }

  async put(plan: ShardPlan): Promise<void> {
    const text = encodePlan(plan);
    if (!mayReplace(this.current, plan, text)) return;
    this.current = { plan: decodePlan(text, 'memory plan store'), text };
    for (const w of this.watchers) this.deliver(w, text);
  }

  async get(): Promise<ShardPlan | null> {
    return this.current === null ? null : decodePlan(this.current.text, 'memory plan store');
  }

  watch(onPlan: (plan: ShardPlan) => void, onError: (e: Error) => void = ignore): () => void {
    const w: MemoryWatcher = { onPlan, onError, last: -1, active: true };
    this.watchers.add(w);
    if (this.current !== null) this.deliver(w, this.current.text);
    return () => { w.active = false; this.watchers.delete(w); };
  }

  /** Asynchronously, like a NATS watch; each watcher gets its own copy. */
  private deliver(w: MemoryWatcher, text: string): void {
    queueMicrotask(() => {
      if (!w.active) return;
      const plan = decodePlan(text, 'memory plan store');
      if (plan.version <= w.last) return;
      w.last = plan.version;
      try { w.onPlan(plan); } catch (e) { w.onError(e as Error); }
    });
  }
}

function ignore(): void {}

// ---------------------------------------------------------------- NATS KV

export interface NatsPlanStoreOptions extends ReplicaOptions {
  /** Replicas of the bucket; null = 3 when the server reports a cluster of 3 or more, else 1 (fewer when a server is down). */
  replicas?: number | null;
  /** Old plans kept per key (for inspection). Default 8. */
  history?: number;
}

/** Creates (or opens) the plan bucket with the replicas the cluster can place; the driver's set-up step. */
export async function createPlanBucket(nc: NatsConnection, job: string, opts: NatsPlanStoreOptions = {}): Promise<{ kv: KV; replicas: number }> {
  const name = planBucketName(job);
  const { kv, replicas } = await createKvBucket(nc, name, { ...opts, history: opts.history ?? 8 });
  return { kv, replicas };
}

/** The plan in the JetStream KV bucket `planBucketName(job)`, created on first use. */
export function natsPlanStore(nc: NatsConnection, job: string, opts: NatsPlanStoreOptions = {}): PlanStore {
  return new NatsPlanStore(nc, job, opts);
}

const decoder = new TextDecoder();

class NatsPlanStore implements PlanStore {
  private readonly bucketName: string;
  private kv: Promise<KV> | null = null;

  constructor(private readonly nc: NatsConnection, private readonly job: string, private readonly opts: NatsPlanStoreOptions) {
    this.bucketName = planBucketName(job);
  }

  private bucket(): Promise<KV> {
    if (this.kv === null) {
      // An existing bucket is opened as it is; a new one gets the replicas the cluster can place.
      this.kv = createPlanBucket(this.nc, this.job, this.opts).then((b) => b.kv);
      // A failed create (JetStream not enabled, a node down) is retried by the next call.
      this.kv.catch(() => { this.kv = null; });
    }
    return this.kv;
  }

  /** The stored entry: its revision (null: no live value) and the plan, or the error that makes it not one. */
  private async read(kv: KV): Promise<{ revision: number | null; current: { plan: ShardPlan; text: string } | null; invalid: ConfigError | null }> {
    const e = await kv.get(PLAN_KEY);
    if (e === null || e.operation !== 'PUT') return { revision: null, current: null, invalid: null };
    const text = decoder.decode(e.value);
    try {
      return { revision: e.revision, current: { plan: decodePlan(text, `KV ${this.bucketName}/${PLAN_KEY} revision ${e.revision}`), text }, invalid: null };
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      return { revision: e.revision, current: null, invalid: err };
    }
  }

  async put(plan: ShardPlan): Promise<void> {
    const text = encodePlan(plan);
    const kv = await this.bucket();
    let lastError: unknown = null;
    for (let attempt = 0; attempt < 5; attempt++) {
      // A stored value that is not a valid plan is overwritten (still by compare-and-set).
      const { revision, current } = await this.read(kv);
      if (!mayReplace(current, plan, text)) return;
      try {
        if (revision === null) await kv.create(PLAN_KEY, text);
        else await kv.update(PLAN_KEY, text, revision);
        return;
      } catch (e) {
        // Another writer got in between (wrong last sequence / key exists): read again and re-decide.
        lastError = e;
      }
    }
    throw lastError;
  }

  async get(): Promise<ShardPlan | null> {
    const r = await this.read(await this.bucket());
    if (r.invalid !== null) throw r.invalid;
    return r.current?.plan ?? null;
  }

  watch(onPlan: (plan: ShardPlan) => void, onError: (e: Error) => void = ignore): () => void {
    let stopped = false;
    let stopIter: (() => void) | null = null;
    let retry: ReturnType<typeof setTimeout> | null = null;
    let last = -1;
    const run = async (): Promise<void> => {
      const kv = await this.bucket();
      if (stopped) return;
      const iter = await kv.watch({ key: PLAN_KEY });
      stopIter = () => iter.stop();
      if (stopped) { iter.stop(); return; }
      for await (const e of iter) {
        if (e.operation !== 'PUT') continue;
        let plan: ShardPlan;
        try {
          plan = decodePlan(decoder.decode(e.value), `KV ${this.bucketName}/${PLAN_KEY} revision ${e.revision}`);
        } catch (err) {
          onError(err as Error);
          continue;
        }
        if (plan.version <= last) continue;
        last = plan.version;
        try { onPlan(plan); } catch (err) { onError(err as Error); }
      }
    };
    const start = (): void => {
      retry = null;
      void run()
        .catch((e: unknown) => { if (!stopped) onError(e as Error); })
        // A watch that could not be set up (JetStream not ready) or whose consumer gave up starts again, so a watcher is never left deaf.
        .finally(() => { if (!stopped) retry = setTimeout(start, 1_000); });
    };
    start();
    return () => {
      stopped = true;
      if (retry !== null) clearTimeout(retry);
      stopIter?.();
    };
  }
}

/** Stores `plan` in the job's KV bucket (see PlanStore.put). */
export function putPlan(nc: NatsConnection, job: string, plan: ShardPlan): Promise<void> {
  return natsPlanStore(nc, job).put(plan);
}

/** The job's plan from its KV bucket, validated; null when absent. */
export function getPlan(nc: NatsConnection, job: string): Promise<ShardPlan | null> {
  return natsPlanStore(nc, job).get();
}

/** Watches the job's plan (see PlanStore.watch); returns `stop`. */
export function watchPlan(nc: NatsConnection, job: string, onPlan: (plan: ShardPlan) => void, onError?: (e: Error) => void): () => void {
  return natsPlanStore(nc, job).watch(onPlan, onError);
}

// ---------------------------------------------------------------- waiting on a watch

/** Ends a `waitOnWatch`: with the value waited for, or with an error. */
export interface WatchWaitSettle<T> {
  done(value: T): void;
  fail(error: Error): void;
}

/**
 * Waits until the events of a store's watch settle the wait, or `timeoutMs`
 * after `start` (`clock.monotonic()`) with `timeout()`. Nodes and driver may
 * start in any order, hence:
 * - `open` starts a watch whose listener calls `settle` and resolves with its
 *   stop once the watch is in place; while it rejects (a bucket not created
 *   yet) it is tried again every second, each failure told to `onOpenError`;
 * - every 5 s `onNote` hears how long the wait has lasted, and the watch is
 *   renewed: a KV watch does not survive its bucket being destroyed and made
 *   again (the driver does so to an earlier run's job info and profiles), and
 *   a new watch starts with the current values;
 * - `check`, every 500 ms, may end the wait with an error (a liveness check).
 * Every watch and timer is stopped however the wait ends.
 */
export function waitOnWatch<T>(o: {
  clock: Clock;
  start: number;
  timeoutMs: number;
  open: (settle: WatchWaitSettle<T>) => Promise<() => void>;
  timeout: () => Error;
  onNote?: ((waitedMs: number) => void) | null;
  onOpenError?: ((e: Error) => void) | null;
  check?: (() => Error | null) | null;
}): Promise<T> {
  const { clock } = o;
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    // Bumped by each (re)open and by the end: a watch that resolves after it was superseded is stopped at once.
    let generation = 0;
    let stopWatch: (() => void) | null = null;
    let retry: Timer | null = null;
    const timers: Timer[] = [];
    const end = (finish: () => void): void => {
      if (settled) return;
      settled = true;
      generation++;
      retry?.cancel();
      for (const t of timers) t.cancel();
      const stop = stopWatch;
      stopWatch = null;
      try { stop?.(); } catch { /* already ended */ }
      finish();
    };
    const settle: WatchWaitSettle<T> = { done: (v) => end(() => resolve(v)), fail: (e) => end(() => reject(e)) };
    const open = (): void => {
      if (settled) return;
      const g = ++generation;
      retry?.cancel();
      retry = null;
      const previous = stopWatch;
      stopWatch = null;
      try { previous?.(); } catch { /* already ended */ }
      let opening: Promise<() => void>;
      try { opening = o.open(settle); } catch (e) { opening = Promise.reject(e); }
      opening.then(
        (stop) => { if (g === generation) stopWatch = stop; else stop(); },
        (e: unknown) => {
          if (g !== generation) return;
          o.onOpenError?.(e as Error);
          retry = clock.setTimeout(open, 1_000);
        },
      );
    };
    timers.push(clock.setTimeout(() => settle.fail(o.timeout()), Math.max(0, o.start + o.timeoutMs - clock.monotonic())));
    timers.push(clock.setInterval(() => { o.onNote?.(clock.monotonic() - o.start); open(); }, 5_000));
    if (o.check) {
      const check = o.check;
      timers.push(clock.setInterval(() => { const e = check(); if (e !== null) settle.fail(e); }, 500));
    }
    open();
  });
}
