/**
 * What the job's KV stores share: watching a key (or `>`) for values that
 * parse, and removing an earlier run's bucket.
 */
import type { NatsConnection } from '@nats-io/nats-core';
import { Kvm, type KV, type KvEntry } from '@nats-io/kv';
import { decode } from '../../runtime/mod.ts';

/**
 * Calls `listener` with every PUT under `key` that `parse` accepts (null:
 * not a value of this store; skipped), the current value first (the watch's
 * default: last value, then updates), so nothing written before is missed.
 * A listener that throws does not end the watch. A watch whose consumer
 * ends (a connection lost long enough, a stream leader gone) is opened again
 * a second later, delivering the current value again: a watcher is never
 * left deaf, and listeners take repeats. The first open's failure rejects.
 * Returns the stop function.
 */
export async function watchValues<T>(kv: KV, key: string, parse: (value: unknown, e: KvEntry) => T | null, listener: (v: T) => void): Promise<() => void> {
  let stopped = false;
  let iter = await kv.watch({ key });
  let retry: ReturnType<typeof setTimeout> | null = null;
  const consume = async (): Promise<void> => {
    for await (const e of iter) {
      if (stopped) break;
      if (e.operation !== 'PUT' || e.value.byteLength === 0) continue;
      let v: T | null;
      try { v = parse(decode(e.value), e); } catch { continue; }
      if (v === null) continue;
      try { listener(v); } catch { /* the listener's own failure; the watch goes on */ }
    }
  };
  const follow = (): void => {
    void consume().catch(() => undefined).finally(() => {
      if (stopped) return;
      const reopen = (): void => {
        retry = null;
        if (stopped) return;
        kv.watch({ key }).then((next) => {
          if (stopped) { next.stop(); return; }
          iter = next;
          follow();
        }, () => { if (!stopped) retry = setTimeout(reopen, 1_000); });
      };
      retry = setTimeout(reopen, 1_000);
    });
  };
  follow();
  return () => {
    stopped = true;
    if (retry !== null) clearTimeout(retry);
    iter.stop();
  };
}

/** Removes the bucket of an earlier run of this job name, if there is one. */
export async function destroyBucket(nc: NatsConnection, bucket: string): Promise<void> {
  try {
    const kv = await new Kvm(nc).open(bucket);
    await kv.destroy();
  } catch { /* not there */ }
}

/**
 * The in-memory stores' watchers, delivering as a KV watch does: the
 * current values first, then each put, asynchronously (a writer never runs
 * a reader's code), each listener its own copy (`copy`).
 */
export class MemoryWatchers<T> {
  private readonly watchers = new Set<{ listener: (v: T) => void; active: boolean }>();
  constructor(private readonly copy: (v: T) => T) {}

  add(listener: (v: T) => void, current: Iterable<T>): () => void {
    const w = { listener, active: true };
    this.watchers.add(w);
    for (const v of current) this.deliver(w, v);
    return () => { w.active = false; this.watchers.delete(w); };
  }

  publish(v: T): void {
    for (const w of this.watchers) this.deliver(w, v);
  }

  private deliver(w: { listener: (v: T) => void; active: boolean }, v: T): void {
    queueMicrotask(() => {
      if (!w.active) return;
      try { w.listener(this.copy(v)); } catch { /* the listener's own failure; the watch goes on */ }
    });
  }
}
