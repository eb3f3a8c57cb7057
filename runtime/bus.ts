/**
 * The raw byte bus under the actor runtime. Two implementations share it: NATS
 * (`nats-bus.ts`) and the in-process bus (`inproc-bus.ts`, the embedded default
 * and the unit-test transport). Chunking and request/reply live one level up in
 * `transport.ts`, written once for both.
 */
export type Headers = Record<string, string>;

export interface RawMsg {
  subject: string;
  data: Uint8Array;
  reply: string | null;
  headers: Headers | null;
  /** True for the status message a server sends to a reply subject when nobody listens on the request subject. */
  noResponders: boolean;
}

export interface RawSubscription {
  readonly subject: string;
  unsubscribe(): void;
  /** Delivers what is already buffered, then unsubscribes. */
  drain(): Promise<void>;
}

export type BusStatus =
  | { type: 'disconnect'; server: string | null }
  | { type: 'reconnect'; server: string | null }
  | { type: 'reconnecting' }
  | { type: 'error'; error: Error }
  | { type: 'closed' };

export interface Bus {
  readonly kind: 'nats' | 'embedded';
  /** Largest message (headers + data) the server accepts; bigger messages are chunked by the transport. */
  readonly maxPayload: number;
  /** The server this bus is connected to now, for logs (null when embedded). */
  readonly connectedServer: string | null;
  publish(subject: string, data: Uint8Array, opts?: { reply?: string | null; headers?: Headers | null }): void;
  subscribe(subject: string, handler: (msg: RawMsg) => void, opts?: { queue?: string | null }): RawSubscription;
  flush(): Promise<void>;
  onStatus(listener: (s: BusStatus) => void): () => void;
  close(): Promise<void>;
}
