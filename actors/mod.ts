/** The actors layer's public entry: what cli (and other processes' actors) import. */
export * from './shard/shard.messages.ts';
export * from './shard/shard.errors.ts';
export * from './shard/shard.actor.ts';
export * from './plan-store.ts';
export * from './config-bridge.ts';
export * from './batch-queue.ts';
export * from './job-info.ts';
export * from './telemetry.ts';
export * from './nodes.ts';
export * from './driver.ts';
export * from './evaluate.ts';
export * from './api.ts';
export * from './worker/worker.actor.ts';
export * from './worker/worker.messages.ts';
export * from './worker/shard-client.ts';
