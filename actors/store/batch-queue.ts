/**
 * The batch work queue. A batch travels as a small descriptor — which epoch,
 * which batch of that epoch's stream — and every worker regenerates the
 * batch itself from the deterministic data source: a few dozen bytes on the
 * wire instead of the samples, and a redelivered descriptor yields the very
 * same batch.
 *
 * A worker takes a descriptor when it is ready (so a fast worker takes more)
 * and acknowledges it only once every shard has accepted its push; a
 * descriptor that is not acknowledged within `ack_wait` goes back to the
 * queue, so a dead worker loses no samples.
 *
 * Two implementations with the same semantics: JetStream (a work-queue
 * stream with one durable pull consumer `workers`) and an in-memory queue for
 * the embedded single-process mode and unit tests.
 */
import { z } from 'zod';
import { jetstream, jetstreamManager, AckPolicy, DeliverPolicy, RetentionPolicy, StorageType, type Consumer, type JetStreamClient, type JetStreamManager, type JsMsg } from '@nats-io/jetstream';
import { nanos, type NatsConnection } from '@nats-io/nats-core';
import { ConnectionError, HetpsError, ValidationError, batchSubject, decode, encode, streamName, type Clock, type Timer } from '../../runtime/mod.ts';
import { createWithReplicaFallback } from './replicas.ts';

/** One training batch, by position: batch `index` of epoch `epoch`'s stream of `split`, cut to `samples`. */
export interface BatchDescriptor {
  /** `<source>/<split>/e<epoch>/b<index>`, the id the data source gives the batch. */
  batch_id: string;
  epoch: number;
  index: number;
  split: 'train' | 'test';
  /** The stream's batch size (which samples make batch `index`). */
  batch_size: number;
  /** Samples of the batch to use: `batch_size`, or fewer for the last batch of a capped epoch. */
  samples: number;
}

export const batchDescriptorSchema = z.object({
  batch_id: z.string().min(1),
  epoch: z.number().int().nonnegative(),
  index: z.number().int().nonnegative(),
  split: z.enum(['train', 'test']),
  batch_size: z.number().int().positive(),
  samples: z.number().int().positive(),
});

export function encodeDescriptor(d: BatchDescriptor): Uint8Array {
  return encode(batchDescriptorSchema.parse(d));
}

export function decodeDescriptor(bytes: Uint8Array): BatchDescriptor {
  const r = batchDescriptorSchema.safeParse(decode(bytes));
  if (!r.success) throw new ValidationError(`batch descriptor does not validate: ${r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`);
  return r.data;
}

/** A descriptor taken from the queue, in flight until acknowledged. */
export interface QueuedBatch {
  readonly desc: BatchDescriptor;
  /** Delivered before (to this or another worker) and not acknowledged then. */
  readonly redelivered: boolean;
  /** 1 on first delivery. */
  readonly deliveries: number;
  /** Acknowledges and waits for the queue to confirm; false when the delivery had already expired (the batch went back to the queue). */
  ack(): Promise<boolean>;
  /** Gives the batch back now (or after `delayMs`). */
  nak(delayMs?: number): void;
  /** Restarts the ack_wait clock (a slow step that is still working). */
  working(): void;
}

export interface BatchQueue {
  readonly kind: 'nats' | 'memory';
  publish(descs: readonly BatchDescriptor[]): Promise<void>;
  /** The next descriptor, or null when none arrived within `timeoutMs`. */
  next(timeoutMs: number): Promise<QueuedBatch | null>;
  /** Descriptors not yet acknowledged (waiting or in flight). */
  pending(): Promise<number>;
  /** Descriptors waiting to be handed to a worker (not in flight): the tail dispatch's view of the queue. */
  undelivered(): Promise<number>;
  close(): Promise<void>;
}

export interface BatchQueueOptions {
  /** How long a taken descriptor may stay unacknowledged before it is delivered again. */
  ackWaitMs: number;
}

/** ack_wait of a job: fault_tolerance.ack_wait_ms (at least 1 s). */
export function ackWaitFromConfig(faultTolerance: { ack_wait_ms: number }): number {
  return Math.max(1_000, Math.round(faultTolerance.ack_wait_ms));
}

// ---------------------------------------------------------------- memory

interface MemoryItem {
  desc: BatchDescriptor;
  deliveries: number;
  /** Bumped per delivery, so an ack from an expired delivery is recognised. */
  token: number;
  inFlight: boolean;
  timer: Timer | null;
}

/**
 * The work queue in one process (embedded mode, tests). Same semantics as
 * the JetStream queue: a descriptor taken and not acknowledged within
 * `ackWaitMs` is delivered again; time comes from the injected clock.
 */
export function memoryBatchQueue(opts: BatchQueueOptions & { clock: Clock }): BatchQueue {
  const { clock, ackWaitMs } = opts;
  const items = new Map<string, MemoryItem>();
  const ready: MemoryItem[] = [];
  const waiters: { resolve: (b: QueuedBatch | null) => void; timer: Timer }[] = [];
  let nextToken = 0;
  let closed = false;

  const deliver = (item: MemoryItem): QueuedBatch => {
    item.deliveries++;
    item.inFlight = true;
    const token = ++nextToken;
    item.token = token;
    const arm = () => {
      item.timer?.cancel();
      item.timer = clock.setTimeout(() => {
        item.timer = null;
        if (item.token !== token || !item.inFlight) return;
        item.inFlight = false;
        makeReady(item);
      }, ackWaitMs);
    };
    arm();
    const current = () => item.token === token && item.inFlight && items.get(item.desc.batch_id) === item;
    return {
      desc: item.desc,
      redelivered: item.deliveries > 1,
      deliveries: item.deliveries,
      ack: async () => {
        if (!current()) return false;
        item.timer?.cancel();
        item.inFlight = false;
        items.delete(item.desc.batch_id);
        return true;
      },
      nak: (delayMs = 0) => {
        if (!current()) return;
        item.timer?.cancel();
        item.inFlight = false;
        if (delayMs > 0) item.timer = clock.setTimeout(() => { item.timer = null; makeReady(item); }, delayMs);
        else makeReady(item);
      },
      working: () => { if (current()) arm(); },
    };
  };

  const makeReady = (item: MemoryItem) => {
    if (closed || !items.has(item.desc.batch_id)) return;
    const w = waiters.shift();
    if (w) { w.timer.cancel(); w.resolve(deliver(item)); return; }
    ready.push(item);
  };

  return {
    kind: 'memory',
    async publish(descs) {
      if (closed) throw new ConnectionError('batch queue is closed');
      for (const d of descs) {
        const desc = batchDescriptorSchema.parse(d);
        // Like JetStream's msgID de-duplication: publishing a batch id twice queues it once.
        if (items.has(desc.batch_id)) continue;
        const item: MemoryItem = { desc, deliveries: 0, token: 0, inFlight: false, timer: null };
        items.set(desc.batch_id, item);
        makeReady(item);
      }
    },
    next(timeoutMs) {
      if (closed) return Promise.resolve(null);
      const item = ready.shift();
      if (item) return Promise.resolve(deliver(item));
      return new Promise((resolve) => {
        const w = {
          resolve,
          timer: clock.setTimeout(() => {
            const i = waiters.indexOf(w);
            if (i >= 0) waiters.splice(i, 1);
            resolve(null);
          }, Math.max(0, timeoutMs)),
        };
        waiters.push(w);
      });
    },
    async pending() { return items.size; },
    async undelivered() { return ready.length; },
    async close() {
      closed = true;
      for (const item of items.values()) item.timer?.cancel();
      for (const w of waiters.splice(0)) { w.timer.cancel(); w.resolve(null); }
      ready.length = 0;
    },
  };
}

// ---------------------------------------------------------------- JetStream

export const WORKERS_CONSUMER = 'workers';

export function batchStreamName(job: string): string { return streamName(job, 'batches'); }

export interface CreateBatchStreamOptions extends BatchQueueOptions {
  /** Stream replicas (3 on a 3-node cluster survives a dead server); fewer where the cluster cannot place them (see replicas.ts). */
  replicas: number;
  /** Delete a stream of the same name first (descriptors of an earlier run). */
  reset: boolean;
  /** Servers of the cluster as the caller knows them, for the fallback notice. */
  servers?: number | null;
  /** JetStream API timeout in ms (default: the client's 5 s). */
  timeoutMs?: number | null;
  /** Told when fewer replicas than asked for were placed. */
  notice?: ((line: string) => void) | null;
}

/**
 * Creates the job's work-queue stream and its durable pull consumer `workers`
 * (explicit acks, `ack_wait`, unlimited deliveries). Run once, by the driver.
 */
export async function createBatchStream(nc: NatsConnection, job: string, opts: CreateBatchStreamOptions): Promise<{ replicas: number }> {
  const jsm = await jetstreamManager(nc, opts.timeoutMs ? { timeout: opts.timeoutMs } : {});
  const stream = batchStreamName(job);
  const remove = async () => { try { await jsm.streams.delete(stream); } catch { /* not there */ } };
  if (opts.reset) await remove();
  const config = {
    name: stream,
    subjects: [batchSubject(job, 'train')],
    retention: RetentionPolicy.Workqueue,
    storage: StorageType.File,
    // Two minutes of msgID de-duplication: a driver that republishes after a reconnect queues nothing twice.
    duplicate_window: nanos(120_000),
  };
  let replicas: number;
  try {
    ({ replicas } = await createWithReplicaFallback(nc, stream, {
      replicas: Math.max(1, opts.replicas), servers: opts.servers ?? null, notice: opts.notice ?? null,
    }, (r) => jsm.streams.add({ ...config, num_replicas: r }), remove));
  } catch (e) {
    throw new HetpsError(`cannot create the batch stream ${stream}: ${(e as Error).message}`, { cause: e });
  }
  await jsm.consumers.add(stream, {
    durable_name: WORKERS_CONSUMER,
    ack_policy: AckPolicy.Explicit,
    ack_wait: nanos(opts.ackWaitMs),
    max_deliver: -1,
    deliver_policy: DeliverPolicy.All,
    max_ack_pending: -1,
  });
  return { replicas };
}

class NatsQueuedBatch implements QueuedBatch {
  constructor(readonly desc: BatchDescriptor, private readonly m: JsMsg) {}
  get redelivered(): boolean { return this.m.redelivered; }
  get deliveries(): number { return this.m.info.deliveryCount; }
  async ack(): Promise<boolean> {
    // Double ack: resolves once the server has recorded it, so "acknowledged" means it.
    try {
      return await this.m.ackAck({ timeout: 5_000 });
    } catch {
      return false;
    }
  }
  nak(delayMs?: number): void { this.m.nak(delayMs); }
  working(): void { this.m.working(); }
}

/**
 * The queue over JetStream. Workers and the driver each open one on their
 * own connection; the stream and consumer must exist (`createBatchStream`)
 * before `next` finds anything — until then it answers null.
 */
export function natsBatchQueue(nc: NatsConnection, job: string, opts: { log?: (msg: string) => void } = {}): BatchQueue {
  const stream = batchStreamName(job);
  const subject = batchSubject(job, 'train');
  let js: JetStreamClient | null = null;
  let jsm: JetStreamManager | null = null;
  let consumer: Consumer | null = null;
  let closed = false;
  const client = () => (js ??= jetstream(nc));
  const manager = async () => (jsm ??= await jetstreamManager(nc));

  return {
    kind: 'nats',
    async publish(descs) {
      const c = client();
      // Pipelined in slices: one PubAck round trip per slice, not per descriptor.
      for (let i = 0; i < descs.length; i += 256) {
        await Promise.all(descs.slice(i, i + 256).map((d) => c.publish(subject, encodeDescriptor(d), { msgID: d.batch_id })));
      }
    },
    async next(timeoutMs) {
      if (closed) return null;
      if (consumer === null) {
        try {
          consumer = await client().consumers.get(stream, WORKERS_CONSUMER);
        } catch (e) {
          opts.log?.(`batch queue ${stream}/${WORKERS_CONSUMER} not there yet: ${(e as Error).message}`);
          await new Promise((r) => setTimeout(r, Math.min(timeoutMs, 500)));
          return null;
        }
      }
      let m: JsMsg | null;
      try {
        m = await consumer.next({ expires: Math.max(1_000, timeoutMs) });
      } catch (e) {
        if (closed) return null;
        // Consumer deleted / stream recreated / connection blip: look it up again next time.
        consumer = null;
        opts.log?.(`batch queue pull failed: ${(e as Error).message}`);
        return null;
      }
      if (m === null) return null;
      let desc: BatchDescriptor;
      try {
        desc = decodeDescriptor(m.data);
      } catch (e) {
        m.term(`bad descriptor: ${(e as Error).message}`);
        opts.log?.(`dropped a malformed batch descriptor (stream seq ${m.seq}): ${(e as Error).message}`);
        return null;
      }
      return new NatsQueuedBatch(desc, m);
    },
    async pending() {
      const info = await (await manager()).streams.info(stream);
      return info.state.messages;
    },
    async undelivered() {
      // The consumer's num_pending: messages it has not delivered yet (redeliveries due count as pending acks, not here).
      const info = await (await manager()).consumers.info(stream, WORKERS_CONSUMER);
      return info.num_pending;
    },
    async close() { closed = true; },
  };
}
