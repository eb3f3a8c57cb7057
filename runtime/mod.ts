/** The runtime's public entry: what topology, native-bridge, actors and cli import. */
export * from './errors.ts';
export * from './clock.ts';
export * from './random.ts';
export * from './subjects.ts';
export * from './logging.ts';
export * from './codec.ts';
export * from './envelope.ts';
export type { Bus, BusStatus, Headers, RawMsg, RawSubscription } from './bus.ts';
export { Transport, CHUNK_HEADER_NAME, type TransportMsg, type TransportOptions, type TransportStats } from './transport.ts';
export { NatsBus, type NatsAuth, type NatsTls, type NatsBusOptions } from './nats-bus.ts';
export { InProcessBroker, InProcessBus } from './inproc-bus.ts';
export { Actor, ActorRef, ActorSystem, attemptTimeoutMs, DeferredReply, transferAttemptMs, JSON_CONTENT_TYPE, type ActorContext, type ActorDefinition, type ActorStats, type RequestOptions } from './actor.ts';
export { connectTransport, type ConnectOptions } from './connect.ts';
