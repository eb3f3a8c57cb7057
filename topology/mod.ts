/** The topology layer's public entry: what actors and cli import. */
export * from './config.ts';
export * from './shard-plan.ts';
export * from './staleness.ts';
export * from './grouping.ts';
export * from './regroup.ts';
export * from './health.ts';
export * from './replication.ts';
export * from './group-lr.ts';
export * from './nats-roles.ts';
export * from './cut-moment.ts';
export * from './tail-dispatch.ts';
export * from './compression.ts';
export * from './load-balance.ts';
