/**
 * The actor kernel. An actor is an address (a subject), a mailbox that handles
 * one message at a time in arrival order, and typed handlers. Requests carry
 * `(from, seq)`; an idempotent actor applies each pair once and answers a
 * retry with the reply it already sent. A throwing handler is logged, counted
 * and answered with an error; the actor keeps serving, and a crash loop backs
 * off instead of spinning.
 */
import type { z } from 'zod';
import type { Logger } from 'pino';
import type { Clock, Timer } from './clock.ts';
import type { Random } from './random.ts';
import type { Headers, RawSubscription } from './bus.ts';
import type { Transport, TransportMsg } from './transport.ts';
import { encode, decode } from './codec.ts';
import { PROTOCOL_VERSION, decodeEnvelope, encodeEnvelope, registryOf, type Envelope, type MessageSchemas, type MessageShapes } from './envelope.ts';
import {
  ActorStoppedError, DecodeError, HandlerError, HetpsError, PayloadTooLargeError, ProtocolVersionError, UnknownMessageTypeError,
  fromWire, isRetryable, toWire, type WireError,
} from './errors.ts';
import { actorAddress, actorMailboxWildcard, actorOpSubject, token, type ActorKind } from './subjects.ts';
import { silentLogger } from './logging.ts';


export interface ActorContext {
  readonly self: ActorRef;
  readonly system: ActorSystem;
  readonly log: Logger;
  readonly clock: Clock;
  readonly random: Random;
  /** The actor's own counters (e.g. duplicates), for actors that report them. */
  readonly stats: ActorStats;
}

type Handlers<M extends MessageShapes> = {
  [K in keyof M]: (msg: Envelope<z.infer<M[K]>>, ctx: ActorContext) => unknown;
};

export interface ActorDefinition<M extends MessageShapes> {
  kind: ActorKind;
  id: string;
  /**
   * The mailbox's base subject when it is not `hps.<job>.<kind>.<id>`: the
   * scheduler serves `hps.<job>.ctl.<command>` (`controlAddress`), so any NATS
   * client can drive a job by command name alone.
   */
  address?: string;
  messages: M;
  handlers: Handlers<M>;
  /** Apply each `(from, seq)` once; a retried request gets the reply already sent. */
  idempotent?: boolean;
  /**
   * With `idempotent`: only these message types are deduplicated (default: all).
   * Leave reads out: their replies can be large (every remembered reply is kept
   * for `dedupWindow` requests) and repeating a read does no harm.
   */
  idempotentTypes?: readonly (keyof M & string)[];
  /** How many recent `(from, seq)` replies are kept per sender for retries. */
  dedupWindow?: number;
  onStart?: (ctx: ActorContext) => void | Promise<void>;
  onStop?: (ctx: ActorContext) => void | Promise<void>;
}

export interface ActorStats {
  received: number;
  processed: number;
  rejected: number;
  rejectedByReason: Record<string, number>;
  handlerErrors: number;
  duplicates: number;
  maxMailboxDepth: number;
  crashLoopPauses: number;
}

export const JSON_CONTENT_TYPE = 'application/json';

/**
 * Returned by a handler whose answer depends on later messages (e.g. a shard
 * answering a pull once a synchronous round has completed). The mailbox moves
 * on at once; the reply goes out when `resolve` or `reject` is called.
 */
export class DeferredReply {
  private done = false;
  private sink: ((result: unknown, error: unknown) => void) | null = null;
  private early: { result: unknown; error: unknown } | null = null;
  get settled(): boolean { return this.done; }
  resolve(result: unknown = {}): void { this.settle(result, null); }
  reject(error: unknown): void { this.settle(null, error ?? new Error('rejected')); }
  /** @internal */
  bind(sink: (result: unknown, error: unknown) => void): void {
    this.sink = sink;
    if (this.early) sink(this.early.result, this.early.error);
  }
  private settle(result: unknown, error: unknown): void {
    if (this.done) return;
    this.done = true;
    if (this.sink) this.sink(result, error);
    else this.early = { result, error };
  }
}
const REPLY = 'reply';
const ERROR = 'error';

/** What a request resolves to, or what `tell` sends: the message fields without the envelope. */
export type Fields = Record<string, unknown>;

export interface RequestOptions {
  timeoutMs?: number;
  /** Retries on retryable errors (timeout, no responders, connection), with the same seq. */
  retries?: number;
  /** First back-off between retries; doubles each time, capped at 2 s. */
  backoffMs?: number;
  /** Reuse a seq (e.g. when the caller retries at a higher level). */
  seq?: number;
}

/**
 * How long one more attempt of a request waits after `unanswered` attempts
 * timed out: `baseMs` doubled per unanswered attempt, up to `capMs` (or
 * `baseMs` where that is longer). For requests re-sent until answered (a
 * worker's pulls and pushes to the shards): one whose bytes take
 * longer than `baseMs` on a slow link would otherwise time out on every
 * attempt, each re-send queued behind the one before, and never be answered.
 */
export function attemptTimeoutMs(baseMs: number, unanswered: number, capMs = 60_000): number {
  return Math.min(Math.max(capMs, baseMs), baseMs * 2 ** Math.min(Math.max(0, unanswered), 16));
}

/**
 * How long one attempt of a request waits when `bytes` are in flight on the
 * sender's link of `linkMbps`: `factor` times their transfer time, at least
 * `baseMs` (and at most `capMs`, or `baseMs` where that is longer); `baseMs`
 * where the link's rate is not known. For a group member's slices, which
 * keep fixed attempts otherwise: a slice slower than an attempt on its link
 * would be re-sent behind itself, each copy timing out behind the one
 * before, and never be answered.
 */
export function transferAttemptMs(baseMs: number, bytes: number, linkMbps: number | null, factor = 2, capMs = 600_000): number {
  if (linkMbps === null || !(linkMbps > 0) || !(bytes > 0)) return baseMs;
  const transferMs = (bytes * 8) / (linkMbps * 1_000);
  return Math.min(Math.max(capMs, baseMs), Math.max(baseMs, Math.ceil(factor * transferMs)));
}

/** A handle to any actor, local or remote, by address. */
export class ActorRef {
  // Subjects per op, built (and validated) once: tell() is on the hot path.
  private subjects = new Map<string, string>();
  constructor(readonly system: ActorSystem, readonly address: string) {}

  private subjectOf(type: string): string {
    let s = this.subjects.get(type);
    if (s === undefined) {
      s = actorOpSubject(this.address, type);
      this.subjects.set(type, s);
    }
    return s;
  }

  /** Fire-and-forget. Returns the seq used. */
  tell(type: string, fields: Fields = {}, seq = this.system.nextSeq()): number {
    const bytes = encodeEnvelope({ type, from: this.system.senderId, seq }, fields);
    this.system.transport.publish(this.subjectOf(type), bytes);
    this.system.transport.releaseWhenSent(bytes);
    return seq;
  }

  /** Request/reply with typed errors; the remote error class arrives intact. */
  async request<R extends Fields = Fields>(type: string, fields: Fields = {}, opts: RequestOptions = {}): Promise<R> {
    const seq = opts.seq ?? this.system.nextSeq();
    const timeoutMs = opts.timeoutMs ?? this.system.defaultRequestTimeoutMs;
    const retries = opts.retries ?? 0;
    let backoff = opts.backoffMs ?? 50;
    const bytes = encodeEnvelope({ type, from: this.system.senderId, seq }, fields);
    const subject = this.subjectOf(type);
    try {
      for (let attempt = 0; ; attempt++) {
        try {
          const m = await this.system.transport.request(subject, bytes, { timeoutMs });
          return unpackReply<R>(m.data, subject);
        } catch (e) {
          if (attempt >= retries || !isRetryable(e)) throw e;
          this.system.retries++;
          await this.system.clock.sleep(backoff);
          backoff = Math.min(2_000, backoff * 2);
        }
      }
    } finally {
      this.system.transport.releaseWhenSent(bytes);
    }
  }
}

function unpackReply<R>(data: Uint8Array, subject: string): R {
  const v = decode(data) as Record<string, unknown> | null;
  if (!v || typeof v !== 'object') throw new DecodeError(`reply from ${subject} is not a map`);
  if (v.v !== PROTOCOL_VERSION) throw new ProtocolVersionError(`reply from ${subject} speaks protocol ${String(v.v)}, this build speaks ${PROTOCOL_VERSION}`);
  if (v.type === REPLY) return (v.result ?? {}) as R;
  if (v.type === ERROR && v.error && typeof v.error === 'object') throw fromWire(v.error as WireError);
  throw new DecodeError(`reply from ${subject} has type ${JSON.stringify(v.type)}, expected "reply" or "error"`);
}

interface MailboxItem {
  env: Envelope;
  reply: string | null;
  json: boolean;
}

/** A FIFO with O(1) push/shift that does not hold on to shifted items. */
class Queue<T> {
  private items: (T | undefined)[] = [];
  private head = 0;
  get length(): number { return this.items.length - this.head; }
  push(x: T): void { this.items.push(x); }
  shift(): T | undefined {
    if (this.head >= this.items.length) return undefined;
    const x = this.items[this.head];
    this.items[this.head++] = undefined;
    if (this.head > 1024 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    return x;
  }
}

interface SenderWindow { replies: Map<number, Uint8Array | null>; evictedUpTo: number }

export class Actor<M extends MessageShapes = MessageShapes> {
  readonly address: string;
  readonly stats: ActorStats = {
    received: 0, processed: 0, rejected: 0, rejectedByReason: {}, handlerErrors: 0, duplicates: 0, maxMailboxDepth: 0, crashLoopPauses: 0,
  };
  readonly ctx: ActorContext;
  private sub: RawSubscription | null = null;
  private queue = new Queue<MailboxItem>();
  private running = false;
  private state: 'new' | 'running' | 'stopping' | 'stopped' = 'new';
  private idle: (() => void)[] = [];
  private pausedUntil: Timer | null = null;
  private recentErrors: number[] = [];
  private backoffMs = 0;
  private senders = new Map<string, SenderWindow>();
  /** Built at the first message, as decodeEnvelope would; kept to skip its per-message WeakMap lookup. */
  private schemas: MessageSchemas<M> | null = null;
  /** Message types deduplicated by `(from, seq)`; null when the actor is not idempotent. */
  private readonly dedupTypes: Set<string> | null;
  private readonly log: Logger;

  constructor(readonly system: ActorSystem, readonly def: ActorDefinition<M>) {
    this.address = def.address ?? actorAddress(system.job, def.kind, def.id);
    this.log = system.log.child({ actor: `${def.kind}/${def.id}` });
    for (const type of Object.keys(def.messages)) token(type, `message type of ${def.kind}/${def.id}`);
    this.ctx = { self: new ActorRef(system, this.address), system, log: this.log, clock: system.clock, random: system.random.fork(this.address), stats: this.stats };
    this.dedupTypes = def.idempotent ? new Set(def.idempotentTypes ?? Object.keys(def.messages)) : null;
  }

  get mailboxDepth(): number { return this.queue.length; }

  async start(): Promise<void> {
    if (this.state !== 'new') throw new HetpsError(`actor ${this.address} already started`);
    await this.def.onStart?.(this.ctx);
    this.state = 'running';
    this.sub = this.system.transport.subscribe(actorMailboxWildcard(this.address), (m) => this.receive(m));
    await this.system.transport.flush();
  }

  /** Stops taking new messages, finishes what is queued and in flight, then calls onStop. */
  async stop(opts: { timeoutMs?: number } = {}): Promise<void> {
    if (this.state === 'stopped' || this.state === 'stopping') return;
    this.state = 'stopping';
    const sub = this.sub;
    this.sub = null;
    if (sub) await sub.drain().catch(() => sub.unsubscribe());
    const timeoutMs = opts.timeoutMs ?? 10_000;
    if (this.running || this.queue.length) {
      await new Promise<void>((resolve) => {
        const t = this.system.clock.setTimeout(() => {
          this.log.warn({ queued: this.queue.length }, 'stop timed out with messages still queued');
          resolve();
        }, timeoutMs);
        this.idle.push(() => { t.cancel(); resolve(); });
      });
    }
    this.pausedUntil?.cancel();
    this.state = 'stopped';
    await this.def.onStop?.(this.ctx);
  }

  private receive(m: TransportMsg): void {
    this.stats.received++;
    const json = m.headers?.['Content-Type'] === JSON_CONTENT_TYPE;
    let env: Envelope;
    try {
      env = json ? this.decodeJson(m) : decodeEnvelope(m.data, this.schemas ??= registryOf(this.def.messages));
    } catch (e) {
      this.reject(e, m, json);
      return;
    }
    if (this.state !== 'running') {
      this.reject(new ActorStoppedError(`actor ${this.address} is stopping`), m, json);
      return;
    }
    this.queue.push({ env, reply: m.reply, json });
    if (this.queue.length > this.stats.maxMailboxDepth) this.stats.maxMailboxDepth = this.queue.length;
    if (!this.running && !this.pausedUntil) this.drain();
  }

  /** JSON callers (any NATS client) may omit the envelope: `type` defaults to the subject's op. */
  private decodeJson(m: TransportMsg): Envelope {
    let body: unknown;
    try {
      body = m.data.byteLength ? JSON.parse(new TextDecoder().decode(m.data)) : {};
    } catch (e) {
      throw new DecodeError(`JSON body on ${m.subject} does not parse: ${(e as Error).message}`, { cause: e });
    }
    if (!body || typeof body !== 'object' || Array.isArray(body)) throw new DecodeError(`JSON body on ${m.subject} must be an object`);
    const op = m.subject.slice(this.address.length + 1);
    const b = body as Record<string, unknown>;
    const full = { v: PROTOCOL_VERSION, type: op, from: 'json-client', seq: 0, ...b };
    return decodeEnvelope(encode(full), this.def.messages);
  }

  private reject(e: unknown, m: TransportMsg, json: boolean): void {
    this.stats.rejected++;
    const reason = e instanceof HetpsError ? e.name : 'Error';
    this.stats.rejectedByReason[reason] = (this.stats.rejectedByReason[reason] ?? 0) + 1;
    const data = e instanceof HetpsError ? e.data : null;
    this.log.warn({ err: (e as Error).message, reason, subject: m.subject, sender: data?.from ?? null, type: data?.type ?? null }, 'rejected message');
    if (m.reply) this.sendReply(m.reply, json, null, e, 0);
  }

  private drain(): void {
    this.running = true;
    for (;;) {
      const item = this.queue.shift();
      if (!item) break;
      const r = this.handle(item);
      if (r) {
        r.then(() => this.drainAfterAsync(), () => this.drainAfterAsync());
        return;
      }
      if (this.pausedUntil) { this.running = false; return; }
    }
    this.running = false;
    this.notifyIdle();
  }

  private drainAfterAsync(): void {
    if (this.pausedUntil) { this.running = false; return; }
    this.drain();
  }

  private notifyIdle(): void {
    if (this.queue.length === 0 && this.idle.length) {
      const w = this.idle;
      this.idle = [];
      for (const f of w) f();
    }
  }

  /** Handles one item; returns a promise only when the handler is async, so sync handlers stay allocation-free. */
  private handle(item: MailboxItem): Promise<void> | null {
    const { env } = item;
    let window: SenderWindow | null = null;
    // JSON callers that send no seq (seq 0) opt out of deduplication.
    if (this.dedupTypes !== null && this.dedupTypes.has(env.type) && !(item.json && env.seq === 0)) {
      window = this.windowOf(env.from);
      if (env.seq <= window.evictedUpTo || window.replies.has(env.seq)) {
        this.stats.duplicates++;
        const cached = window.replies.get(env.seq);
        if (item.reply) {
          if (cached) this.system.transport.publish(item.reply, cached);
          else this.sendReply(item.reply, item.json, null,
            new HetpsError(`request ${env.from}#${env.seq} was already applied; its reply is no longer kept`), env.seq);
        }
        return null;
      }
    }
    const handler = this.def.handlers[env.type as keyof M];
    if (!handler) {
      // decodeEnvelope already rejects unknown types; this guards handler maps that miss one.
      this.sendReply(item.reply, item.json, null, new UnknownMessageTypeError(`${this.address} has no handler for ${env.type}`), env.seq);
      return null;
    }
    let result: unknown;
    try {
      result = handler(env as never, this.ctx);
    } catch (e) {
      this.onHandlerError(e, item);
      return null;
    }
    if (result instanceof Promise) {
      return result.then(
        (r) => this.onHandled(r, item, window),
        (e) => this.onHandlerError(e, item),
      );
    }
    this.onHandled(result, item, window);
    return null;
  }

  private onHandled(result: unknown, item: MailboxItem, window: SenderWindow | null): void {
    if (result instanceof DeferredReply) {
      // The mailbox continues now; the reply (and the dedup record) follows when the handler settles it.
      result.bind((r, e) => {
        if (e) this.onHandlerError(e, item);
        else this.onHandled(r, item, window);
      });
      return;
    }
    this.stats.processed++;
    if (item.reply === null && window === null) return; // a tell: nothing to answer or remember
    const bytes = this.sendReply(item.reply, item.json, result ?? {}, null, item.env.seq);
    if (window) this.remember(window, item.env.seq, bytes);
  }

  private onHandlerError(e: unknown, item: MailboxItem): void {
    this.stats.processed++;
    this.stats.handlerErrors++;
    this.log.error({ err: e, type: item.env.type, sender: item.env.from, seq: item.env.seq }, 'handler failed; actor keeps serving');
    const err = e instanceof HetpsError ? e : new HandlerError(`${this.address} ${item.env.type} failed: ${(e as Error)?.message ?? String(e)}`, { cause: e });
    // Not remembered in the dedup window: a handler that threw did not apply the request, so a retry may run it.
    this.sendReply(item.reply, item.json, null, err, item.env.seq);
    // A HetpsError is a deliberate refusal (bad input, stale plan), not a crash:
    // a caller sending bad messages must not pause the mailbox for everyone else.
    if (!(e instanceof HetpsError) || e instanceof HandlerError) this.noteCrash();
  }

  private noteCrash(): void {
    const now = this.system.clock.monotonic();
    const sup = this.system.supervision;
    this.recentErrors.push(now);
    while (this.recentErrors.length && now - this.recentErrors[0]! > sup.crashLoopWindowMs) this.recentErrors.shift();
    if (this.recentErrors.length < sup.crashLoopThreshold) {
      if (this.recentErrors.length <= 1) this.backoffMs = 0;
      return;
    }
    this.backoffMs = this.backoffMs ? Math.min(sup.maxBackoffMs, this.backoffMs * 2) : sup.initialBackoffMs;
    this.stats.crashLoopPauses++;
    this.recentErrors = [];
    this.log.warn({ backoffMs: this.backoffMs }, 'crash loop: pausing the mailbox before the next message');
    this.pausedUntil = this.system.clock.setTimeout(() => {
      this.pausedUntil = null;
      if (!this.running) this.drain();
    }, this.backoffMs);
  }

  private sendReply(reply: string | null, json: boolean, result: unknown, error: unknown, seq: number): Uint8Array | null {
    if (!reply) return null;
    let bytes: Uint8Array;
    let headers: Headers | null = null;
    const body = error
      ? { v: PROTOCOL_VERSION, type: ERROR, from: this.address, seq, error: toWire(error) }
      : { v: PROTOCOL_VERSION, type: REPLY, from: this.address, seq, result };
    if (json) {
      bytes = new TextEncoder().encode(JSON.stringify(body, (_k, v) => (ArrayBuffer.isView(v) ? Array.from(v as unknown as ArrayLike<number>) : typeof v === 'bigint' ? v.toString() : v)));
      headers = { 'Content-Type': JSON_CONTENT_TYPE };
    } else {
      bytes = encode(body);
    }
    try {
      this.system.transport.publish(reply, bytes, { headers });
    } catch (e) {
      this.log.warn({ err: (e as Error).message }, 'could not send reply');
      // The requester hears why at once (an error reply is small) rather than waiting out its timeout; a retry of the
      // same seq gets the same answer from the reply cache.
      if (!error) {
        const why = `${this.address}: its reply could not be sent: ${(e as Error).message}`;
        const err = e instanceof PayloadTooLargeError ? new PayloadTooLargeError(why, { data: e.data }) : new HandlerError(why, { cause: e });
        return this.sendReply(reply, json, null, err, seq);
      }
    }
    return bytes;
  }

  private windowOf(from: string): SenderWindow {
    let w = this.senders.get(from);
    if (!w) { w = { replies: new Map(), evictedUpTo: -1 }; this.senders.set(from, w); }
    return w;
  }

  private remember(w: SenderWindow, seq: number, bytes: Uint8Array | null): void {
    w.replies.set(seq, bytes);
    const limit = this.def.dedupWindow ?? 10_000;
    // Evict in insertion order (O(1)): a sender's seqs arrive nearly in order, and
    // anything at or below evictedUpTo counts as already applied.
    while (w.replies.size > limit) {
      const oldest = w.replies.keys().next().value as number;
      w.replies.delete(oldest);
      if (oldest > w.evictedUpTo) w.evictedUpTo = oldest;
    }
  }

}

export interface SupervisionOptions {
  /** This many handler errors within the window is a crash loop. */
  crashLoopThreshold: number;
  crashLoopWindowMs: number;
  initialBackoffMs: number;
  maxBackoffMs: number;
}

export interface ActorSystemOptions {
  transport: Transport;
  job: string;
  node: string;
  clock: Clock;
  random: Random;
  logger?: Logger;
  /** Distinguishes this process from an earlier one of the same node, so its seqs never collide with old ones. */
  incarnation?: string;
  defaultRequestTimeoutMs?: number;
  supervision?: Partial<SupervisionOptions>;
}

/** All actors of one process on one transport. */
export class ActorSystem {
  readonly transport: Transport;
  readonly job: string;
  readonly node: string;
  readonly clock: Clock;
  readonly random: Random;
  readonly log: Logger;
  readonly senderId: string;
  readonly defaultRequestTimeoutMs: number;
  readonly supervision: SupervisionOptions;
  retries = 0;
  private seq = 0;
  private actors = new Map<string, Actor<MessageShapes>>();

  constructor(opts: ActorSystemOptions) {
    this.transport = opts.transport;
    this.job = token(opts.job, 'job name');
    this.node = token(opts.node, 'node name');
    this.clock = opts.clock;
    this.random = opts.random;
    this.log = opts.logger ?? silentLogger();
    const incarnation = opts.incarnation ?? `${process.pid.toString(36)}${Date.now().toString(36)}`;
    this.senderId = `${this.node}#${incarnation}`;
    this.defaultRequestTimeoutMs = opts.defaultRequestTimeoutMs ?? 5_000;
    this.supervision = { crashLoopThreshold: 10, crashLoopWindowMs: 1_000, initialBackoffMs: 100, maxBackoffMs: 10_000, ...opts.supervision };
  }

  nextSeq(): number { return ++this.seq; }

  async spawn<M extends MessageShapes>(def: ActorDefinition<M>): Promise<Actor<M>> {
    const actor = new Actor(this, def);
    if (this.actors.has(actor.address)) throw new HetpsError(`an actor already lives at ${actor.address}`);
    this.actors.set(actor.address, actor as unknown as Actor<MessageShapes>);
    await actor.start();
    return actor;
  }

  /** Stops one actor and frees its address (it may be spawned again). */
  async despawn(actor: { readonly address: string; stop(opts?: { timeoutMs?: number }): Promise<void> }, opts: { timeoutMs?: number } = {}): Promise<void> {
    if (this.actors.get(actor.address) !== (actor as unknown)) return;
    await actor.stop(opts);
    this.actors.delete(actor.address);
  }

  ref(kind: ActorKind, id: string): ActorRef { return new ActorRef(this, actorAddress(this.job, kind, id)); }

  /** Stops every actor (draining their mailboxes); the transport stays open for the caller to close. */
  async stop(opts: { timeoutMs?: number } = {}): Promise<void> {
    await Promise.all([...this.actors.values()].map((a) => a.stop(opts)));
    this.actors.clear();
  }
}

