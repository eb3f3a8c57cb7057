/**
 * `hetps launch --role server|worker`: one node of a job in this process, the
 * article's launch command. A server node serves its shard; a worker node
 * trains until the job has no batches left for it. Both connect to NATS
 * (`--nats` or `nats.servers`), wait for the driver (`hetps up`) to create the
 * job — start order does not matter — and exit when the driver says the job
 * is over, on SIGTERM / SIGINT, or when the process that started them dies.
 */
import type { Command } from 'commander';
import { readFile } from 'node:fs/promises';
import {
  ActorSystem, ConfigError, SeededRandom, connectTransport, controlSubject, createLogger, heartbeatWildcard, decode, hashString, systemClock, token,
  type Logger, type Transport,
} from '../runtime/mod.ts';
import { loadConfig, natsConnectionAs, type HetpsConfig } from '../topology/mod.ts';
import { natsBatchQueue } from '../actors/store/batch-queue.ts';
import { natsJobInfoStore } from '../actors/store/job-info.ts';
import { ThreadedHeartbeat } from '../actors/health/heartbeat.ts';
import { HealthWatcher } from '../actors/health/health-watcher.ts';
import { DEFAULT_NODE_WAIT_MS, startServerNode, startWorkerNode, workerNodeByName, workerNodeOf } from '../actors/node/nodes.ts';
import { natsConnectionOf, natsPlanStore } from '../actors/store/plan-store.ts';
import { hostProfileSchema, probeSettings, type HostProfile } from '../actors/node/profile-reporter.ts';
import { profileDevice } from '../native-bridge/mod.ts';
import { natsProfileStore } from '../actors/store/profile-store.ts';

export interface LaunchFlags {
  role: string;
  config: string;
  serverId?: string;
  group?: string;
  nodeRank?: string;
  node?: string;
  hostProfile?: string;
  nats?: string;
  authDir?: string;
  job?: string;
  runId?: string;
  wait?: string;
}

/** The config with `--job` applied (the job name is the subject and stream prefix). */
export function withJobName(config: HetpsConfig, job: string | undefined): HetpsConfig {
  if (job === undefined) return config;
  return { ...config, job: { ...config.job, name: token(job, '--job') } };
}

export function natsServersFrom(flag: string | undefined, config: HetpsConfig): string[] {
  const servers = flag !== undefined ? flag.split(',').map((s) => s.trim()).filter(Boolean) : config.nats.servers;
  if (!servers || servers.length === 0) {
    throw new ConfigError(`hetps launch needs NATS: give --nats URL[,URL…] or nats.servers in ${config.source.file} (\`hetps up\` prints the URLs of the cluster it starts)`, { data: { field: 'nats.servers' } });
  }
  return servers;
}

/** How long a node waits without any scheduler heartbeat (after it heard one) before it ends itself. */
const NO_SCHEDULER_EXIT_MS = 60_000;

/** Resolves when the driver broadcasts the end of the job (for `runId`, when given), on SIGTERM/SIGINT, or when no scheduler has been heard for a minute. */
function shutdownSignal(transport: Transport, job: string, runId: string | null, log: Logger): { promise: Promise<string>; dispose: () => void } {
  let resolve!: (why: string) => void;
  const promise = new Promise<string>((r) => { resolve = r; });
  const sub = transport.subscribe(controlSubject(job, 'shutdown'), (m) => {
    let body: { run_id?: unknown; reason?: unknown } = {};
    try { body = (decode(m.data) ?? {}) as typeof body; } catch { /* any shutdown message counts */ }
    if (runId !== null && typeof body.run_id === 'string' && body.run_id !== runId) return;
    resolve(`the driver ended the job${typeof body.reason === 'string' ? ` (${body.reason})` : ''}`);
  });
  const onSignal = (sig: NodeJS.Signals) => {
    resolve(`got ${sig}`);
    // A second signal while shutting down: exit now.
    process.once(sig, () => process.exit(1));
  };
  process.once('SIGTERM', onSignal);
  process.once('SIGINT', onSignal);
  // A node must not outlive its job: once it has heard a scheduler (the driver, or a standby that took
  // over), a scheduler silent for NO_SCHEDULER_EXIT_MS means the driver died and nobody took over.
  let lastScheduler: number | null = null;
  const beats = transport.subscribe(heartbeatWildcard(job), (m) => {
    try {
      const b = decode(m.data) as { role?: unknown } | null;
      if (b && b.role === 'scheduler') lastScheduler = Date.now();
    } catch { /* not a heartbeat of ours */ }
  });
  const watchdog = setInterval(() => {
    if (lastScheduler === null || Date.now() - lastScheduler < NO_SCHEDULER_EXIT_MS) return;
    log.warn(`no scheduler heartbeat for ${NO_SCHEDULER_EXIT_MS / 1000} s (the driver is gone and no standby took over); exiting`);
    resolve('no scheduler');
    setTimeout(() => process.exit(1), 5_000).unref();
  }, 1_000);
  watchdog.unref();
  return {
    promise,
    dispose: () => {
      sub.unsubscribe();
      process.removeListener('SIGTERM', onSignal);
      process.removeListener('SIGINT', onSignal);
      beats.unsubscribe();
      clearInterval(watchdog);
    },
  };
}

/** `--host-profile FILE`: this machine's device and link as `hetps up` measured them for the processes it starts. */
async function readHostProfile(file: string): Promise<HostProfile> {
  let raw: unknown;
  try {
    raw = JSON.parse(await readFile(file, 'utf8'));
  } catch (e) {
    throw new ConfigError(`--host-profile ${file}: cannot read it as JSON (${(e as Error).message})`, { cause: e, data: { field: '--host-profile' } });
  }
  const r = hostProfileSchema.safeParse(raw);
  if (!r.success) throw new ConfigError(`--host-profile ${file}: ${r.error.issues.map((i) => `${i.path.join('.') || '(file)'}: ${i.message}`).join('; ')}`, { data: { field: '--host-profile' } });
  return r.data;
}

export async function runLaunch(flags: LaunchFlags): Promise<number> {
  if (flags.role !== 'server' && flags.role !== 'worker') throw new ConfigError(`--role must be server or worker, got ${JSON.stringify(flags.role)}`, { data: { field: '--role' } });
  const config = withJobName(await loadConfig(flags.config), flags.job);
  const job = config.job.name;
  let node: string;
  let workerNode: ReturnType<typeof workerNodeOf> | null = null;
  if (flags.role === 'server') {
    if (!flags.serverId) throw new ConfigError('--role server needs --server-id NAME (one of cluster.server_nodes)', { data: { field: '--server-id' } });
    node = flags.serverId;
    if (!config.cluster.server_nodes.includes(node)) throw new ConfigError(`--server-id ${node} is not in cluster.server_nodes (${config.cluster.server_nodes.join(', ')})`, { data: { field: '--server-id' } });
  } else {
    if (flags.node !== undefined && flags.group !== undefined) {
      throw new ConfigError('give --node NAME or --group NAME --node-rank N, not both', { data: { field: '--node' } });
    }
    if (flags.node !== undefined) {
      workerNode = workerNodeByName(config, flags.node);
    } else {
      if (!flags.group) throw new ConfigError('--role worker needs --node NAME (any worker), or --group NAME and --node-rank N (a worker in cluster.worker_groups)', { data: { field: '--group' } });
      const rank = Number(flags.nodeRank ?? '0');
      workerNode = workerNodeOf(config, flags.group, rank);
    }
    node = workerNode.name;
  }
  const servers = natsServersFrom(flags.nats, config);
  const host = flags.hostProfile !== undefined ? await readHostProfile(flags.hostProfile) : null;
  const waitMs = flags.wait !== undefined ? Number(flags.wait) * 1000 : DEFAULT_NODE_WAIT_MS;
  if (!(waitMs > 0)) throw new ConfigError(`--wait must be a positive number of seconds, got ${JSON.stringify(flags.wait)}`, { data: { field: '--wait' } });
  const log = createLogger({ level: process.env.HETPS_LOG_LEVEL ?? config.logging.level, name: node, stderr: true });
  // Secure (nats.secure): a server process logs in as the shard role, a worker as the worker role.
  const conn = natsConnectionAs(config, flags.role === 'server' ? 'shard' : 'worker', flags.authDir ?? null, flags.role === 'server' ? node : null);
  const transport = await connectTransport({
    servers, name: `hetps-${node}`, auth: conn.auth, tls: conn.tls, logger: log,
    pingIntervalMs: conn.pingIntervalMs, connectTimeoutMs: conn.connectTimeoutMs, maxMessageBytes: conn.maxMessageBytes,
  });
  const nc = natsConnectionOf(transport)!;
  const system = new ActorSystem({
    transport, job, node, clock: systemClock, random: new SeededRandom(hashString(node, config.training.random_seed)), logger: log,
  });
  const shutdown = shutdownSignal(transport, job, flags.runId ?? null, log);
  // From the moment the process is connected: the health actor knows it is there while it waits for the job.
  let nodeState: () => string = () => 'starting';
  const heartbeat = new ThreadedHeartbeat({
    servers, auth: conn.auth, tls: conn.tls, job, node, role: flags.role === 'server' ? 'shard' : 'worker', incarnation: system.senderId,
    periodMs: config.fault_tolerance.heartbeat_ms, clock: systemClock, state: () => nodeState(),
  });
  const planStore = natsPlanStore(nc, job);
  let health: HealthWatcher | null = null;
  let code = 0;
  try {
    if (flags.role === 'server') {
      log.info({ job, servers }, `server ${node}: waiting for the shard plan`);
      const started = await Promise.race([startServerNode({
        config, server: node, system, planStore, log, waitMs,
        profiling: { store: natsProfileStore(nc, job), device: host ? async () => host.device : null, network: host?.network ?? null },
      }), shutdown.promise]);
      if (typeof started === 'string') { log.info(`${started} before the shard started`); return 0; }
      nodeState = () => 'serving';
      log.info(`shard ${node} stopped: ${await shutdown.promise}`);
    } else {
      const queue = natsBatchQueue(nc, job, { log: (m) => log.debug(m) });
      const jobStore = natsJobInfoStore(nc, job);
      log.info({ job, servers, group: workerNode!.group ?? '(measured at start)' }, `worker ${node}: connected; loading data and model`);
      health = await HealthWatcher.start(system);
      const started = await Promise.race([
        startWorkerNode({
          config, node: workerNode!, system, planStore, jobStore, queue, log, runId: flags.runId ?? null, waitMs, health,
          onStandby: () => { nodeState = () => 'standby'; },
          profiling: {
            store: natsProfileStore(nc, job),
            // A host profile for another provider than this node's does not describe it: the node measures itself then.
            device: host ? async (provider) => (provider === host.provider ? host.device : profileDevice({ ...probeSettings(config.cluster.profiling.probe_seconds, provider).device, node })) : null,
            network: host?.network ?? null,
          },
        }),
        shutdown.promise,
      ]);
      if (typeof started === 'string') { log.info(`${started} before training started`); return 0; }
      nodeState = () => started.def.stats().state;
      const end = await Promise.race([started.def.done, shutdown.promise]);
      if (typeof end === 'string') log.info(`worker ${node} stopping: ${end}`);
      await queue.close();
      const final = started.def.stats();
      if (final.state === 'failed') code = 1;
    }
  } catch (e) {
    log.error({ err: e }, `${flags.role} ${node} failed`);
    code = e instanceof ConfigError ? 2 : 1;
  } finally {
    await heartbeat.stop(true);
    health?.dispose();
    shutdown.dispose();
    // Bounded: with NATS gone (a driver that stopped its cluster) a drain would wait for a reconnect forever.
    const cleanup = (async () => {
      await system.stop({ timeoutMs: 10_000 }).catch(() => undefined);
      await transport.close().catch(() => undefined);
    })();
    const gaveUp = await Promise.race([cleanup.then(() => false), new Promise<boolean>((r) => setTimeout(() => r(true), 12_000).unref())]);
    if (gaveUp) log.warn('clean shutdown took too long (NATS unreachable?); exiting anyway');
    log.flush?.();
  }
  return code;
}

export function register(program: Command): void {
  program
    .command('launch')
    .description('run one node of a job (a server\'s shard or a worker) in this process; the driver is `hetps up`')
    .requiredOption('--role <role>', 'server or worker')
    .requiredOption('--config <file>', 'job YAML')
    .option('--server-id <name>', 'server node to run (role server), e.g. server-1')
    .option('--node <name>', 'worker to run, by name (role worker): any worker, and the only way to name one of cluster.worker_nodes or a standby (fault_tolerance.standby_workers)')
    .option('--group <name>', 'worker group (role worker; instead of --node)')
    .option('--node-rank <n>', 'position of the node in its group, from 0 (role worker, with --group)', '0')
    .option('--host-profile <file>', 'role worker: this machine\'s device and network profile as `hetps up` measured it once for the processes it starts (default: the worker measures itself)')
    .option('--nats <urls>', 'NATS URLs, comma-separated (default: nats.servers of the config)')
    .option('--auth-dir <dir>', 'nats.secure: where the roles\' credentials are (<role>.json; default nats.auth_dir of the config)')
    .option('--job <name>', 'job name (default: job.name of the config)')
    .option('--run-id <id>', 'take part in this run of the job only (set by hetps up)')
    .option('--wait <seconds>', 'how long to wait for the driver and the shards', String(DEFAULT_NODE_WAIT_MS / 1000))
    .action(async (flags: LaunchFlags) => {
      const code = await runLaunch(flags);
      // Open handles (onnxruntime's thread pool) must not keep a finished node alive.
      process.exit(code);
    });
}
