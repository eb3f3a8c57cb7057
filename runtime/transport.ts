/**
 * Transport = a Bus plus the two things every actor needs and neither NATS nor
 * the in-process bus gives: messages larger than `max_payload` (split into
 * chunks and reassembled), and request/reply over one multiplexed inbox.
 * Written once here, so NATS and the embedded bus behave the same.
 */
import type { Bus, Headers, RawMsg, RawSubscription } from './bus.ts';
import { systemClock, type Clock, type Timer } from './clock.ts';
import { NoRespondersError, PayloadTooLargeError, ReassemblyTimeoutError, TimeoutError, ConnectionError } from './errors.ts';
import { inboxPrefix, inboxSubject, inboxWildcard } from './subjects.ts';
import { isPooledBigEnvelope, recycleBigEnvelope } from './codec.ts';

export interface TransportMsg {
  subject: string;
  data: Uint8Array;
  reply: string | null;
  headers: Headers | null;
}

/** `id/index/total`, on every chunk of a split message. */
export const CHUNK_HEADER = 'Hps-Chunk';
export const CHUNK_HEADER_NAME = CHUNK_HEADER;
/** Total byte length of a split message, on its first chunk. */
export const CHUNK_SIZE_HEADER = 'Hps-Chunk-Bytes';
/** The largest message a transport sends or takes unless told otherwise (config: communication.max_message_bytes). */
export const DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024 * 1024;
/** Where a user raises the limit, for the errors that hit it. */
const LIMIT_SETTING = 'communication.max_message_bytes';
/** Room left in each chunk for NATS and our headers. */
const HEADER_RESERVE = 1024;

export interface TransportOptions {
  clientId: string;
  clock: Clock;
  /** A split message whose chunks stop arriving for this long is dropped and reported. */
  reassemblyTimeoutMs: number;
  /** Upper bound on one (reassembled) message; protects receivers from absurd declared sizes. */
  maxMessageBytes: number;
  /** Called when a message is dropped (reassembly timeout, lost chunk, oversized). */
  onDrop: (reason: Error, subject: string) => void;
}

export interface TransportStats {
  published: number;
  chunkedSent: number;
  chunksSent: number;
  reassembled: number;
  reassemblyDropped: number;
  requests: number;
  requestTimeouts: number;
  noResponders: number;
  /** Payload bytes published (chunks included) and received by this client's subscriptions (replies included): its bytes on the wire, headers aside. */
  bytesOut: number;
  bytesIn: number;
}

interface PartialMessage {
  buf: Uint8Array;
  filled: number;
  nextIndex: number;
  total: number;
  headers: Headers | null;
  reply: string | null;
  timer: Timer;
  subject: string;
}

interface Pending {
  resolve: (m: TransportMsg) => void;
  reject: (e: Error) => void;
  timer: Timer;
  subject: string;
}

export class Transport {
  readonly stats: TransportStats = {
    published: 0, chunkedSent: 0, chunksSent: 0, reassembled: 0, reassemblyDropped: 0, requests: 0, requestTimeouts: 0, noResponders: 0, bytesOut: 0, bytesIn: 0,
  };
  private readonly opts: TransportOptions;
  private readonly inbox: string;
  private inboxSub: RawSubscription | null = null;
  private pending = new Map<string, Pending>();
  private nextToken = 0;
  private nextChunkId = 0;
  private closed = false;
  private toRelease: Uint8Array[] = [];
  private releasing = false;

  constructor(readonly bus: Bus, opts: Partial<TransportOptions> & { clientId: string }) {
    this.opts = {
      clock: systemClock,
      reassemblyTimeoutMs: 30_000,
      maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
      onDrop: () => {},
      ...opts,
    } as TransportOptions;
    this.inbox = inboxPrefix(this.opts.clientId);
  }

  get kind(): 'nats' | 'embedded' { return this.bus.kind; }
  get clientId(): string { return this.opts.clientId; }
  /** The largest message this transport sends or takes, reassembled (communication.max_message_bytes). */
  get maxMessageBytes(): number { return this.opts.maxMessageBytes; }
  /** Largest data that goes out as one message. */
  get chunkBytes(): number { return Math.max(1024, this.bus.maxPayload - HEADER_RESERVE); }

  publish(subject: string, data: Uint8Array, opts?: { reply?: string | null; headers?: Headers | null }): void {
    if (this.closed) throw new ConnectionError('transport is closed');
    this.stats.published++;
    this.stats.bytesOut += data.byteLength;
    const limit = this.chunkBytes;
    if (data.byteLength <= limit) {
      this.bus.publish(subject, data, opts);
      return;
    }
    if (data.byteLength > this.opts.maxMessageBytes) {
      throw new PayloadTooLargeError(
        `message of ${data.byteLength} bytes to ${subject} exceeds the ${this.opts.maxMessageBytes}-byte limit (${LIMIT_SETTING}); `
          + `raise ${LIMIT_SETTING} in the job's config (every process reads it; at most 4 GiB) or send less at once (a shard's whole state is one message: shard more finely)`,
        { data: { bytes: data.byteLength, limit: this.opts.maxMessageBytes, setting: LIMIT_SETTING } },
      );
    }
    const total = Math.ceil(data.byteLength / limit);
    const id = `${this.opts.clientId}:${(this.nextChunkId++).toString(36)}`;
    this.stats.chunkedSent++;
    for (let i = 0; i < total; i++) {
      const h: Headers = i === 0 ? { ...(opts?.headers ?? {}), [CHUNK_SIZE_HEADER]: String(data.byteLength) } : {};
      h[CHUNK_HEADER] = `${id}/${i}/${total}`;
      this.bus.publish(subject, data.subarray(i * limit, Math.min(data.byteLength, (i + 1) * limit)), {
        reply: i === total - 1 ? opts?.reply ?? null : null,
        headers: h,
      });
      this.stats.chunksSent++;
    }
  }

  /** Subscribes; split messages are reassembled before `handler` sees them. */
  subscribe(subject: string, handler: (msg: TransportMsg) => void, opts: { queue?: string | null } = {}): RawSubscription {
    const partials = new Map<string, PartialMessage>();
    const sub = this.bus.subscribe(subject, (m) => {
      this.stats.bytesIn += m.data.byteLength;
      const chunk = m.headers?.[CHUNK_HEADER];
      if (chunk === undefined) {
        handler(m);
        return;
      }
      const whole = this.addChunk(partials, m, chunk);
      if (whole) handler(whole);
    }, opts);
    return {
      subject: sub.subject,
      unsubscribe: () => { sub.unsubscribe(); this.clearPartials(partials); },
      drain: async () => { await sub.drain(); this.clearPartials(partials); },
    };
  }

  /** Sends `data` and waits for one reply (itself possibly chunked). */
  async request(subject: string, data: Uint8Array, opts: { timeoutMs: number; headers?: Headers | null }): Promise<TransportMsg> {
    this.ensureInbox();
    const tok = (this.nextToken++).toString(36);
    const reply = inboxSubject(this.inbox, tok);
    this.stats.requests++;
    return new Promise<TransportMsg>((resolve, reject) => {
      const timer = this.opts.clock.setTimeout(() => {
        this.pending.delete(tok);
        this.stats.requestTimeouts++;
        reject(new TimeoutError(`no reply from ${subject} within ${opts.timeoutMs} ms`));
      }, opts.timeoutMs);
      this.pending.set(tok, { resolve, reject, timer, subject });
      try {
        this.publish(subject, data, { reply, headers: opts.headers ?? null });
      } catch (e) {
        timer.cancel();
        this.pending.delete(tok);
        reject(e as Error);
      }
    });
  }

  async flush(): Promise<void> { await this.bus.flush(); }

  /**
   * Hands a big envelope this transport has published (and that its caller no
   * longer needs) back to the codec's pool once the bus has provably sent it:
   * after a flush that started after its publish resolves, nats.js no longer
   * holds it (it copies what it sends when it flushes). While disconnected it
   * holds it until the next connection starts, then drops it and fails the
   * flushes pending (nats.js v3 starts each connection with an empty outbound
   * buffer): a flush that fails hands nothing back, and the buffer is left to
   * the collector. One flush at a time covers every buffer released before it
   * started. Anything the pool did not issue is ignored.
   */
  releaseWhenSent(bytes: Uint8Array): void {
    if (!isPooledBigEnvelope(bytes)) return;
    this.toRelease.push(bytes);
    if (!this.releasing) this.flushReleases();
  }

  private flushReleases(): void {
    if (this.closed || this.toRelease.length === 0) { this.toRelease = []; return; }
    const batch = this.toRelease;
    this.toRelease = [];
    this.releasing = true;
    this.bus.flush().then(
      () => { for (const b of batch) recycleBigEnvelope(b); },
      () => { /* not provably sent: left to the collector */ },
    ).finally(() => {
      this.releasing = false;
      this.flushReleases();
    });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const [, p] of this.pending) {
      p.timer.cancel();
      p.reject(new ConnectionError(`transport closed while waiting for a reply from ${p.subject}`));
    }
    this.pending.clear();
    this.inboxSub?.unsubscribe();
    await this.bus.close();
  }

  private ensureInbox(): void {
    if (this.inboxSub) return;
    this.inboxSub = this.subscribe(inboxWildcard(this.inbox), (m) => {
      const tok = m.subject.slice(this.inbox.length + 1);
      const p = this.pending.get(tok);
      if (!p) return; // late reply after a timeout: the caller has already retried or given up
      this.pending.delete(tok);
      p.timer.cancel();
      if ((m as RawMsg).noResponders) {
        this.stats.noResponders++;
        p.reject(new NoRespondersError(`no actor is listening on ${p.subject} (yet): it may be starting, moving or reconnecting`));
      } else {
        p.resolve(m);
      }
    });
  }

  private addChunk(partials: Map<string, PartialMessage>, m: RawMsg, header: string): TransportMsg | null {
    const parts = header.split('/');
    const id = parts[0] ?? '';
    const index = Number(parts[1]);
    const total = Number(parts[2]);
    if (parts.length !== 3 || !Number.isInteger(index) || !Number.isInteger(total) || index < 0 || index >= total) {
      this.drop(new ReassemblyTimeoutError(`malformed ${CHUNK_HEADER} header ${JSON.stringify(header)} on ${m.subject}`), m.subject);
      return null;
    }
    let p: PartialMessage | undefined = partials.get(id);
    if (index === 0) {
      if (p) { p.timer.cancel(); partials.delete(id); }
      const size = Number(m.headers?.[CHUNK_SIZE_HEADER]);
      if (!Number.isSafeInteger(size) || size <= 0 || size > this.opts.maxMessageBytes) {
        this.drop(new PayloadTooLargeError(`chunked message ${id} on ${m.subject} declares ${m.headers?.[CHUNK_SIZE_HEADER]} bytes (limit ${this.opts.maxMessageBytes}, ${LIMIT_SETTING}: does the sender read another config?)`), m.subject);
        return null;
      }
      const headers = { ...m.headers };
      delete headers[CHUNK_HEADER];
      delete headers[CHUNK_SIZE_HEADER];
      p = {
        // Its own ArrayBuffer, so 8-byte aligned: typed arrays inside decode without copying.
        // Not zero-filled (that was ~0.5 ms of an 8 MiB message): every byte is written
        // before the message is delivered, and an incomplete one is dropped.
        buf: Buffer.allocUnsafeSlow(size), filled: 0, nextIndex: 0, total,
        headers: Object.keys(headers).length ? headers : null, reply: null, subject: m.subject,
        timer: this.opts.clock.setTimeout(() => {
          partials.delete(id);
          this.drop(new ReassemblyTimeoutError(`chunked message ${id} on ${m.subject} stalled at chunk ${p!.nextIndex}/${total}; dropped after ${this.opts.reassemblyTimeoutMs} ms`), m.subject);
        }, this.opts.reassemblyTimeoutMs),
      };
      partials.set(id, p);
    }
    if (!p) return null; // middle of a message whose start we never saw (subscribed late): ignore
    if (index !== p.nextIndex || total !== p.total || p.filled + m.data.byteLength > p.buf.byteLength) {
      p.timer.cancel();
      partials.delete(id);
      this.drop(new ReassemblyTimeoutError(`chunked message ${id} on ${m.subject} lost chunk ${p.nextIndex} (got ${index}/${total}); dropped`), m.subject);
      return null;
    }
    p.buf.set(m.data, p.filled);
    p.filled += m.data.byteLength;
    p.nextIndex++;
    if (p.nextIndex < p.total) return null;
    p.timer.cancel();
    partials.delete(id);
    if (p.filled !== p.buf.byteLength) {
      this.drop(new ReassemblyTimeoutError(`chunked message ${id} on ${m.subject} has ${p.filled} of ${p.buf.byteLength} bytes`), m.subject);
      return null;
    }
    this.stats.reassembled++;
    return { subject: p.subject, data: p.buf, reply: m.reply, headers: p.headers };
  }

  private clearPartials(partials: Map<string, PartialMessage>): void {
    for (const p of partials.values()) p.timer.cancel();
    partials.clear();
  }

  private drop(reason: Error, subject: string): void {
    this.stats.reassemblyDropped++;
    this.opts.onDrop(reason, subject);
  }
}
