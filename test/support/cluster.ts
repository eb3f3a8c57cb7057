/**
 * Integration-test harness: a real N-node nats-server cluster on random ports
 * in a fresh temp dir, torn down (processes and dir) on dispose — and the
 * processes also killed if the test process exits without disposing.
 *
 * With `NATS_URL` set (comma-separated), tests reuse that server instead and
 * `cluster` is null: a test that needs to kill or restart nodes, or a server
 * setting such as a small max_payload, checks `cluster` and skips itself.
 *
 *   await using nats = await startTestCluster({ nodes: 3 });
 *   const nc = await connect({ servers: nats.urls });
 */
import { rmSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startLocalCluster, type LocalCluster } from '../../deploy/local-cluster.ts';
import { ConfigError } from '../../runtime/errors.ts';

export interface TestClusterOptions {
  nodes?: number;
  /** Server max_payload in bytes; omitted: NATS default (1 MiB). Not applied to a reused NATS_URL server. */
  maxPayload?: number;
  jetstream?: boolean;
  /** Generous by default: CI machines are small and shared. */
  readyTimeoutMs?: number;
  /** Progress lines (e.g. `t.diagnostic`); quiet by default. */
  logger?: (line: string) => void;
}

export interface TestCluster extends AsyncDisposable {
  /** Client URLs, one per node (or the NATS_URL entries). */
  urls: string[];
  /** The cluster this harness started; null when reusing NATS_URL. */
  cluster: LocalCluster | null;
  /** SIGKILL one node (`n1`..`nN`) and wait until it is gone; throws when reusing NATS_URL. */
  kill(name: string): Promise<void>;
}

// Temp dirs of clusters not yet disposed, removed if the test process exits first.
const liveDirs = new Set<string>();
let exitHookInstalled = false;
function removeOnExit(dir: string): void {
  liveDirs.add(dir);
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on('exit', () => {
    for (const d of liveDirs) {
      try { rmSync(d, { recursive: true, force: true }); } catch { /* best effort */ }
    }
  });
}

export async function startTestCluster(opts: TestClusterOptions = {}): Promise<TestCluster> {
  const external = process.env.NATS_URL?.trim();
  if (external) {
    return {
      urls: external.split(',').map((u) => u.trim()).filter(Boolean),
      cluster: null,
      kill: (name: string) => Promise.reject(new ConfigError(
        `cannot kill ${name}: tests are reusing the server at NATS_URL=${external}. ` +
        'Check `cluster !== null` and skip, or unset NATS_URL so the harness starts its own cluster.',
      )),
      [Symbol.asyncDispose]: async () => undefined,
    };
  }

  const dir = await mkdtemp(join(tmpdir(), 'hetps-test-nats-'));
  removeOnExit(dir);
  let cluster: LocalCluster;
  try {
    cluster = await startLocalCluster({
      nodes: opts.nodes ?? 3,
      dir,
      clientPort: null,
      clusterPort: null,
      httpPort: null,
      maxPayload: opts.maxPayload ?? null,
      jetstream: opts.jetstream ?? true,
      readyTimeoutMs: opts.readyTimeoutMs ?? 60_000,
      ...(opts.logger ? { logger: opts.logger } : {}),
    });
  } catch (e) {
    await rm(dir, { recursive: true, force: true }).catch(() => undefined);
    liveDirs.delete(dir);
    throw e;
  }
  // startLocalCluster (non-detached) already SIGKILLs its servers on process exit.
  let disposed: Promise<void> | null = null;
  return {
    urls: cluster.urls,
    cluster,
    kill: (name: string) => cluster.kill(name, 'SIGKILL'),
    [Symbol.asyncDispose]: () => {
      disposed ??= (async () => {
        await cluster.stop();
        await rm(dir, { recursive: true, force: true });
        liveDirs.delete(dir);
      })();
      return disposed;
    },
  };
}

/** Runs `fn` with a cluster and always tears it down, pass or fail. */
export async function withCluster<T>(fn: (c: TestCluster) => Promise<T>): Promise<T>;
export async function withCluster<T>(opts: TestClusterOptions, fn: (c: TestCluster) => Promise<T>): Promise<T>;
export async function withCluster<T>(
  a: TestClusterOptions | ((c: TestCluster) => Promise<T>),
  b?: (c: TestCluster) => Promise<T>,
): Promise<T> {
  const [opts, fn] = typeof a === 'function' ? [{}, a] : [a, b!];
  await using c = await startTestCluster(opts);
  return await fn(c);
}
