/**
 * Replicas of the job's JetStream stream and KV buckets: 3 on a cluster of
 * 3 or more servers (a dead server loses nothing), else 1. When a server is
 * down JetStream cannot place 3 copies ("no suitable peers for placement",
 * "insufficient resources", or a timeout while it waits for a peer that is
 * gone): the job still starts, with the copies the cluster can place, and
 * says so.
 */
import type { NatsConnection } from '@nats-io/nats-core';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';

export interface ReplicaOptions {
  /** Replicas to ask for; null or absent: `defaultReplicas`. */
  replicas?: number | null;
  /** Servers of the cluster as the caller knows them (the URLs it was given); absent: from the server's INFO. */
  servers?: number | null;
  /** JetStream API timeout in ms (default: the client's 5 s). */
  timeoutMs?: number | null;
  /** Told, in one line, when fewer replicas than asked for were placed. */
  notice?: ((line: string) => void) | null;
}

/**
 * Options every hetps KV bucket is made with (`Kvm.open` never uses direct
 * gets, so opened buckets need nothing). `allow_direct:
 * false`: a get is answered by the stream's leader, not by whichever replica
 * answers a direct get first, so a get after an acknowledged put returns
 * that put (a follower that has not applied it yet — common right after a
 * leader change — would return the value before it). These buckets hold
 * control state (plans, leases, job info, profiles), read rarely.
 */
export const CONSISTENT_KV = { allow_direct: false } as const;

/** Servers the connection knows of (the server's INFO lists the cluster's client URLs, minus the unreachable ones). */
function reachableServers(nc: NatsConnection): number | null {
  const info = nc.info;
  if (!info?.cluster) return null;
  return Math.max(1, info.connect_urls?.length ?? 1);
}

/** 3 on a cluster of 3 or more servers, else 1. */
export function defaultReplicas(nc: NatsConnection, servers: number | null = null): number {
  const known = Math.max(servers ?? 0, reachableServers(nc) ?? 0);
  return nc.info?.cluster && known >= 3 ? 3 : 1;
}

/** Errors that mean "fewer copies might place": not enough live peers, or no answer while JetStream waits for one. */
export function isPlacementError(e: unknown): boolean {
  const msg = e instanceof Error ? e.message : String(e);
  const name = e instanceof Error ? e.name : '';
  return name === 'TimeoutError' || /insufficient resources|no suitable peers|peer offline|replicas > 1 not supported|timeout/i.test(msg);
}

/**
 * nats-server 2.9 can answer a stream create with "stream not found" (err_code
 * 10059) while its meta layer is still applying an earlier delete or create of
 * the same name (fixed upstream in 2.10.2, nats-server#4600). The same create
 * a moment later succeeds: it is not an error of the request.
 */
export function isTransientNotFound(e: unknown): boolean {
  const msg = e instanceof Error ? e.message : String(e);
  const code = (e as { api_error?: { err_code?: number } } | null)?.api_error?.err_code;
  return code === 10059 || /stream not found/i.test(msg);
}

/** Waits between tries of a create answered "stream not found": 100 ms doubling, about 6 s in all. */
export const NOT_FOUND_RETRY_MS: readonly number[] = [100, 200, 400, 800, 1600, 3000];

/** `run`, tried again after each wait in `waits` while it is answered "stream not found" (`isTransientNotFound`). */
async function againWhileNotFound<T>(run: () => Promise<T>, waits: readonly number[]): Promise<T> {
  for (let k = 0; ; k++) {
    try {
      return await run();
    } catch (e) {
      if (!isTransientNotFound(e) || k >= waits.length) throw e;
      await new Promise((r) => setTimeout(r, waits[k]));
    }
  }
}

function isTimeout(e: unknown): boolean {
  return (e instanceof Error && e.name === 'TimeoutError') || /timeout/i.test(e instanceof Error ? e.message : String(e));
}

/**
 * Runs `create(replicas)` with the wanted replicas, then one fewer each time
 * placement fails, down to 1. `discard` removes what a timed-out attempt may
 * have left half made before the next try (a refused placement made nothing). A create answered
 * "stream not found" (`isTransientNotFound`) is tried again with the same replicas after each wait
 * in `retryMs`. Returns what `create` returned and the replicas used; the last error when even 1
 * does not place.
 */
export async function createWithReplicaFallback<T>(
  nc: NatsConnection, name: string, opts: ReplicaOptions,
  create: (replicas: number) => Promise<T>, discard: () => Promise<void>,
  retryMs: readonly number[] = NOT_FOUND_RETRY_MS,
): Promise<{ value: T; replicas: number }> {
  const wanted = Math.max(1, opts.replicas ?? defaultReplicas(nc, opts.servers ?? null));
  let lastError: unknown = null;
  for (let replicas = wanted; replicas >= 1; replicas--) {
    try {
      const value = await againWhileNotFound(() => create(replicas), retryMs);
      if (replicas < wanted) opts.notice?.(fallbackNotice(nc, name, wanted, replicas, opts.servers ?? null));
      return { value, replicas };
    } catch (e) {
      lastError = e;
      if (!isPlacementError(e)) throw e;
      if (replicas > 1 && isTimeout(e)) await discard().catch(() => undefined);
    }
  }
  throw lastError;
}

function fallbackNotice(nc: NatsConnection, name: string, wanted: number, placed: number, servers: number | null): string {
  const reachable = reachableServers(nc);
  if (reachable === null) return `JetStream: the server is not clustered; creating ${name} with ${placed} replica(s) instead of ${wanted}`;
  const known = Math.max(servers ?? 0, reachable, wanted);
  return `JetStream: ${Math.min(reachable, known)} of ${known} servers reachable; creating ${name} with ${placed} replicas instead of ${wanted}`;
}

/**
 * Opens the KV bucket if it exists (as it is: another run or node made it),
 * else creates it with the replicas the cluster can place. Never removes a
 * bucket it did not create.
 */
export async function createKvBucket(nc: NatsConnection, bucket: string, opts: ReplicaOptions & { history: number }): Promise<{ kv: KV; replicas: number }> {
  const jsOpts = opts.timeoutMs ? { timeout: opts.timeoutMs } : {};
  const kvm = new Kvm(jetstream(nc, jsOpts));
  const jsm = await jetstreamManager(nc, jsOpts);
  const stream = `KV_${bucket}`;
  try {
    const info = await jsm.streams.info(stream);
    return { kv: await kvm.create(bucket, { ...CONSISTENT_KV, history: opts.history }), replicas: info.config.num_replicas };
  } catch (e) {
    if (!/stream not found/i.test((e as Error).message)) throw e;
  }
  try {
    const { value, replicas } = await createWithReplicaFallback(nc, `KV bucket ${bucket}`, opts,
      (r) => kvm.create(bucket, { ...CONSISTENT_KV, replicas: r, history: opts.history }),
      async () => { await jsm.streams.delete(stream); });
    return { kv: value, replicas };
  } catch (e) {
    // Another process (a node that started first) made it in the meantime: use theirs, as it is.
    if (!/already in use/i.test((e as Error).message)) throw e;
    const info = await jsm.streams.info(stream);
    return { kv: await kvm.open(bucket), replicas: info.config.num_replicas };
  }
}
