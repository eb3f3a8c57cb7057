/**
 * One way to get a Transport: NATS when servers are given, otherwise the
 * in-process bus (the embedded default, for a single-process job).
 */
import type { Logger } from 'pino';
import { randomUUID } from 'node:crypto';
import { systemClock, type Clock } from './clock.ts';
import { InProcessBroker } from './inproc-bus.ts';
import { NatsBus, type NatsAuth, type NatsTls } from './nats-bus.ts';
import { Transport } from './transport.ts';
import { token } from './subjects.ts';

export interface ConnectOptions {
  /** NATS URLs; null = embedded in-process bus. */
  servers: string[] | null;
  /** Shared broker for embedded mode (all actors of the process must use the same one). */
  broker: InProcessBroker | null;
  name: string;
  auth: NatsAuth | null;
  tls: NatsTls | null;
  clock: Clock;
  logger: Logger | null;
  reassemblyTimeoutMs: number | null;
  maxMessageBytes: number | null;
  pingIntervalMs: number | null;
  connectTimeoutMs: number | null;
}

let clientCounter = 0;

export async function connectTransport(opts: Partial<ConnectOptions> & { name: string }): Promise<Transport> {
  const clock = opts.clock ?? systemClock;
  const clientId = token(`${opts.name.replace(/[^A-Za-z0-9_-]/g, '_')}-${process.pid.toString(36)}-${(clientCounter++).toString(36)}-${randomUUID().slice(0, 8)}`, 'client id');
  const bus = opts.servers && opts.servers.length
    ? await NatsBus.connect({
      servers: opts.servers, name: opts.name, auth: opts.auth ?? null, tls: opts.tls ?? null,
      ...(opts.pingIntervalMs ? { pingIntervalMs: opts.pingIntervalMs } : {}),
      ...(opts.connectTimeoutMs ? { connectTimeoutMs: opts.connectTimeoutMs } : {}),
    })
    : (opts.broker ?? new InProcessBroker()).client();
  const log = opts.logger;
  if (log) {
    bus.onStatus((s) => {
      if (s.type === 'disconnect') log.warn({ server: s.server }, 'disconnected from NATS; reconnecting');
      else if (s.type === 'reconnect') log.info({ server: s.server }, 'reconnected to NATS');
    });
  }
  return new Transport(bus, {
    clientId,
    clock,
    ...(opts.reassemblyTimeoutMs ? { reassemblyTimeoutMs: opts.reassemblyTimeoutMs } : {}),
    ...(opts.maxMessageBytes ? { maxMessageBytes: opts.maxMessageBytes } : {}),
    onDrop: (reason, subject) => log?.warn({ subject, err: reason.message }, 'dropped an incomplete chunked message'),
  });
}
