/**
 * The in-process bus: same interface as NATS, for the embedded default (one
 * process, no nats-server) and for unit tests with many nodes in one process.
 * Delivery is asynchronous (a microtask), like a network, so code that works
 * here does not silently depend on synchronous delivery.
 */
import type { Bus, BusStatus, Headers, RawMsg, RawSubscription } from './bus.ts';

interface Sub { pattern: string[]; queue: string | null; handler: (m: RawMsg) => void; active: boolean }

function matches(pattern: string[], subject: string[]): boolean {
  for (let i = 0; i < pattern.length; i++) {
    const p = pattern[i];
    if (p === '>') return subject.length > i;
    if (i >= subject.length) return false;
    if (p !== '*' && p !== subject[i]) return false;
  }
  return pattern.length === subject.length;
}

/** One broker shared by every `InProcessBus` client created from it. */
export class InProcessBroker {
  private subs = new Set<Sub>();
  private rr = new Map<string, number>();
  constructor(readonly maxPayload = 1024 * 1024) {}

  client(): InProcessBus { return new InProcessBus(this); }

  /** @internal */
  add(s: Sub): void { this.subs.add(s); }
  /** @internal */
  remove(s: Sub): void { this.subs.delete(s); }

  /** @internal */
  route(msg: RawMsg): void {
    const tokens = msg.subject.split('.');
    const plain: Sub[] = [];
    const queues = new Map<string, Sub[]>();
    for (const s of this.subs) {
      if (!s.active || !matches(s.pattern, tokens)) continue;
      if (s.queue === null) plain.push(s);
      else {
        const q = queues.get(s.queue) ?? [];
        q.push(s);
        queues.set(s.queue, q);
      }
    }
    for (const [q, members] of queues) {
      const n = (this.rr.get(q) ?? 0) + 1;
      this.rr.set(q, n);
      plain.push(members[n % members.length]!);
    }
    if (plain.length === 0) {
      if (msg.reply) {
        const reply = msg.reply;
        queueMicrotask(() => this.route({ subject: reply, data: new Uint8Array(0), reply: null, headers: null, noResponders: true }));
      }
      return;
    }
    for (const s of plain) queueMicrotask(() => { if (s.active) s.handler(msg); });
  }
}

export class InProcessBus implements Bus {
  readonly kind = 'embedded' as const;
  readonly connectedServer = null;
  private mine = new Set<Sub>();
  private listeners = new Set<(s: BusStatus) => void>();
  private closed = false;

  constructor(private readonly broker: InProcessBroker) {}

  get maxPayload(): number { return this.broker.maxPayload; }

  publish(subject: string, data: Uint8Array, opts: { reply?: string | null; headers?: Headers | null } = {}): void {
    if (this.closed) throw new Error('in-process bus is closed');
    let size = data.byteLength;
    if (opts.headers) for (const k in opts.headers) size += k.length + opts.headers[k]!.length + 4;
    if (size > this.broker.maxPayload) {
      throw new Error(`message of ${size} bytes exceeds max_payload ${this.broker.maxPayload}`);
    }
    // Copy: the receiver must not see later writes to the sender's buffer.
    const copy = new Uint8Array(data.byteLength);
    copy.set(data);
    this.broker.route({ subject, data: copy, reply: opts.reply ?? null, headers: opts.headers ? { ...opts.headers } : null, noResponders: false });
  }

  subscribe(subject: string, handler: (msg: RawMsg) => void, opts: { queue?: string | null } = {}): RawSubscription {
    const s: Sub = { pattern: subject.split('.'), queue: opts.queue ?? null, handler, active: true };
    this.broker.add(s);
    this.mine.add(s);
    const off = () => { s.active = false; this.broker.remove(s); this.mine.delete(s); };
    return { subject, unsubscribe: off, drain: async () => { await Promise.resolve(); off(); } };
  }

  async flush(): Promise<void> { await new Promise((r) => setImmediate(r)); }

  onStatus(listener: (s: BusStatus) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const s of [...this.mine]) { s.active = false; this.broker.remove(s); }
    this.mine.clear();
    for (const l of this.listeners) l({ type: 'closed' });
  }
}
