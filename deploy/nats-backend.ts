/**
 * The NATS backend: the job on a NATS cluster (the local one `runJob`
 * started, or `nats.servers`), one `hetps launch` process per node of the
 * YAML. The driver connects, takes the job's scheduler lease (refused while
 * another driver of the job renews it), creates the batch work queue and the
 * KV buckets (each a named set-up step: a failure says which, on which
 * servers, and what to check), and supervises the node processes.
 *
 * `natsStandbyBackend` is the same job as a standby driver that took the
 * lease over sees it: the stores as they are, no node processes of its own.
 */
import { readFile, writeFile } from 'node:fs/promises';
import type { NatsConnection } from '@nats-io/nats-core';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { ActorRef, ActorSystem, ConfigError, SeededRandom, connectTransport, controlAddress, systemClock, type Logger, type Transport } from '../runtime/mod.ts';
import { allWorkerNodes, natsConnectionAs, standbyWorkerNodes, tcLinkedNodes, type HetpsConfig } from '../topology/mod.ts';
import type { ExecutionProvider } from '../native-bridge/mod.ts';
import { batchStreamName, createBatchStream, natsBatchQueue, type BatchQueue } from '../actors/store/batch-queue.ts';
import { createJobInfoBucket, jobInfoBucket, natsJobInfoStore, resetNatsJobInfo, type JobInfoStore } from '../actors/store/job-info.ts';
import { createPlanBucket, natsConnectionOf, natsPlanStore, planBucketName, type PlanStore } from '../actors/store/plan-store.ts';
import { measureHostProfile } from '../actors/node/profile-reporter.ts';
import { createProfileBucket, natsProfileStore, profileBucket, resetNatsProfiles } from '../actors/store/profile-store.ts';
import { defaultReplicas } from '../actors/store/replicas.ts';
import { acquireLease, leaseBucketName, openLeaseBucket, type LeaseHolder, type LeaseKv } from '../actors/scheduler/lease.ts';
import type { LocalCluster } from './local-cluster.ts';

import { NodeProcesses, type NodeProcess, type NodeProcessSpec } from './node-processes.ts';
import { NetLab } from './netlab.ts';
import type { CpuProcess } from './process-cpu.ts';
import type { JobBackend, JobContext } from './job-backend.ts';
import { connectCheck, jetStreamCheck, setupStep, type SetupStep } from './setup-step.ts';

export interface NatsBackendOptions {
  servers: string[];
  /** The cluster this run started; null for `nats.servers`. */
  cluster: LocalCluster | null;
  /** false: start no node processes (`--no-launch`). */
  launch: boolean;
  /** Nodes not to start. */
  skip: ReadonlySet<string>;
}

/** Where a set-up step's servers keep their logs: the run's own cluster, or null for one given in nats.servers. */
function natsLogDir(cluster: LocalCluster | null, runDir: string): string | null {
  return cluster ? join(runDir, 'nats') : null;
}

export interface JobStoreSetup {
  servers: readonly string[];
  /** The run's own cluster's log dir; null for nats.servers. */
  natsDir: string | null;
  ackWaitMs: number;
  /** JetStream API timeout in ms; null: the client's default. */
  timeoutMs?: number | null;
  /** Told when a stream or bucket gets fewer replicas than asked for. */
  notice: (line: string) => void;
}

/**
 * Creates the job's batch work queue and its KV buckets (plan, job info,
 * profiles), each with 3 replicas on a cluster of 3 or more servers, fewer
 * when a server is down. Empties an earlier run's job info and profiles first.
 */
export async function createJobStores(nc: NatsConnection, job: string, s: JobStoreSetup): Promise<{ replicas: Record<string, number> }> {
  const wanted = defaultReplicas(nc, s.servers.length);
  const check = jetStreamCheck(s.natsDir);
  const replicaOpts = { replicas: wanted, servers: s.servers.length, timeoutMs: s.timeoutMs ?? null, notice: s.notice };
  const step = (what: string): SetupStep => ({ what, servers: s.servers, check });
  // A run of the same job name before this one (on a long-running NATS) must not feed this one.
  await resetNatsJobInfo(nc, job);
  await resetNatsProfiles(nc, job);
  const stream = batchStreamName(job);
  const replicas: Record<string, number> = {};
  replicas[stream] = (await setupStep(step(`creating the batch work queue (JetStream stream ${stream}, replicas ${wanted})`),
    () => againOnTimeout(() => createBatchStream(nc, job, { ackWaitMs: s.ackWaitMs, reset: true, ...replicaOpts })))).replicas;
  const buckets: [string, () => Promise<{ replicas: number }>][] = [
    [planBucketName(job), () => createPlanBucket(nc, job, replicaOpts)],
    [jobInfoBucket(job), () => createJobInfoBucket(nc, job, replicaOpts)],
    [profileBucket(job), () => createProfileBucket(nc, job, replicaOpts)],
  ];
  for (const [name, create] of buckets) {
    replicas[name] = (await setupStep(step(`creating the KV bucket ${name} (replicas ${wanted})`), () => againOnTimeout(create))).replicas;
  }
  return { replicas };
}

/**
 * Creating a stream or bucket is idempotent (the same config again is
 * accepted), and on a busy cluster the first JetStream answer for a new
 * replicated asset can take longer than one API timeout: try up to three
 * times before the set-up step fails.
 */
async function againOnTimeout<T>(create: () => Promise<T>, attempts = 3): Promise<T> {
  for (let k = 1; ; k++) {
    try {
      return await create();
    } catch (e) {
      const timedOut = (e as Error).name === 'TimeoutError' || /timeout/i.test((e as Error).message);
      if (!timedOut || k >= attempts) throw e;
    }
  }
}

/** `target` with its method `method` run as a set-up step (other members as they are, whatever else the interface grows). */
function asSetupStep<T extends object>(target: T, method: keyof T & string, step: (args: unknown[]) => SetupStep): T {
  return new Proxy(target, {
    get(t, prop) {
      const v: unknown = Reflect.get(t, prop, t);
      if (typeof v !== 'function') return v;
      if (prop !== method) return v.bind(t);
      return (...args: unknown[]) => setupStep(step(args), () => (v as (...a: unknown[]) => Promise<unknown>).apply(t, args));
    },
  });
}

/** The driver's stores, each write a named set-up step. */
function stepStores(job: string, servers: readonly string[], check: string, planStore: PlanStore, jobStore: JobInfoStore, queue: BatchQueue) {
  const step = (what: string): SetupStep => ({ what, servers, check });
  return {
    plan: asSetupStep(planStore, 'put', ([p]) => step(`storing shard plan v${(p as { version: number }).version} (KV bucket ${planBucketName(job)})`)),
    info: asSetupStep(jobStore, 'put', () => step(`writing the job info (KV bucket ${jobInfoBucket(job)})`)),
    batches: asSetupStep(queue, 'publish', ([d]) => step(`queueing ${(d as unknown[]).length} batches (JetStream stream ${batchStreamName(job)})`)),
  };
}

/** A driver's connection to the job's cluster: the transport, its actor system (node `driver`) and the job's lease key. */
export interface DriverConnection {
  transport: Transport;
  nc: NatsConnection;
  system: ActorSystem;
  leaseKv: LeaseKv;
  /** `driver@<host>:<pid>`, as the lease names its holder. */
  holder: string;
  close(): Promise<void>;
}

/** Connects (a named set-up step) and opens (or creates) the job's lease bucket. */
export async function connectDriver(o: { config: HetpsConfig; job: string; log: Logger; servers: string[]; natsDir: string | null; name: string; authDir: string | null }): Promise<DriverConnection> {
  const { config, job, log, servers } = o;
  // Secure: the driver is the job's scheduler.
  const conn = natsConnectionAs(config, 'scheduler', o.authDir);
  const transport: Transport = await setupStep({ what: 'connecting to NATS', servers, check: connectCheck(o.natsDir) }, () => connectTransport({
    servers, name: o.name, auth: conn.auth, tls: conn.tls, logger: log, pingIntervalMs: conn.pingIntervalMs, connectTimeoutMs: conn.connectTimeoutMs,
    maxMessageBytes: conn.maxMessageBytes,
  }));
  const nc = natsConnectionOf(transport)!;
  // Every driver of the job, active or standby, is node `driver`; its incarnation tells them apart.
  const system = new ActorSystem({ transport, job, node: 'driver', clock: systemClock, random: new SeededRandom(config.training.random_seed), logger: log });
  const close = async () => {
    await system.stop().catch(() => undefined);
    await transport.close().catch(() => undefined);
  };
  try {
    const wanted = defaultReplicas(nc, servers.length);
    const { kv } = await setupStep({ what: `opening the KV bucket ${leaseBucketName(job)} (replicas ${wanted})`, servers, check: jetStreamCheck(o.natsDir) },
      () => openLeaseBucket(nc, job, { replicas: wanted, servers: servers.length, notice: (l) => log.warn(l) }));
    return { transport, nc, system, leaseKv: kv, holder: `driver@${hostname()}:${process.pid}`, close };
  } catch (e) {
    await close();
    throw e;
  }
}

export async function natsBackend(ctx: JobContext, o: NatsBackendOptions): Promise<JobBackend> {
  const { config, job, log, out: con, ackWaitMs, runId, runDir } = ctx;
  const { servers, cluster, skip } = o;
  const natsDir = natsLogDir(cluster, runDir);
  const driver = await connectDriver({ config, job, log, servers, natsDir, name: 'hetps-driver', authDir: ctx.authDir });
  const { transport, nc, system } = driver;
  let lease: LeaseHolder | null = null;
  try {
    // Before anything of the job is written: a second driver of a running job must not reset its stores.
    lease = await setupStep({ what: `taking the scheduler lease (KV bucket ${leaseBucketName(job)})`, servers, check: jetStreamCheck(natsDir) },
      () => acquireLease({ kv: driver.leaseKv, clock: systemClock, identity: { holder: driver.holder, incarnation: system.senderId }, runId, job, log }));
    con.line(`scheduler lease: ${driver.holder} holds it (term ${lease.term}, KV bucket ${leaseBucketName(job)}); `
      + `a standby (hetps up --standby) takes the job over after ${lease.leaseMs} ms without renewal`);
    const { replicas } = await createJobStores(nc, job, { servers, natsDir, ackWaitMs, notice: (l) => log.warn(l) });
    log.debug({ replicas }, 'batch stream and KV buckets created');
  } catch (e) {
    await lease?.release(`set-up failed: ${(e as Error).message}`).catch(() => undefined);
    await driver.close();
    throw e;
  }
  const stores = stepStores(job, servers, jetStreamCheck(natsDir), natsPlanStore(nc, job), natsJobInfoStore(nc, job), natsBatchQueue(nc, job));
  const queue = stores.batches;
  const allNodes = [...config.cluster.server_nodes, ...allWorkerNodes(config).map((w) => w.name), ...config.fault_tolerance.standby_workers];
  for (const s of skip) if (!allNodes.includes(s)) throw new ConfigError(`--skip ${s}: no such node in ${config.source.file} (${allNodes.join(', ')})`, { data: { field: '--skip' } });
  const procs = new NodeProcesses(join(runDir, 'logs'), (l) => con.line(l), { HETPS_LOG_LEVEL: ctx.level });
  const reported = new Set<string>();
  const exitListeners: ((node: string, how: string) => void)[] = [];
  const started = (n: NodeProcess) => {
    void n.exited.then(() => { for (const l of exitListeners) l(n.spec.name, n.exit === null ? 'exited' : describeExit(n.exit)); });
  };
  /** The arguments every launched node gets; `nodeServers`: the cluster's URLs as the node reaches them. */
  const commonArgs = (nodeServers: readonly string[]) => ['--config', ctx.configPath, '--nats', nodeServers.join(','), '--job', job, '--run-id', runId, ...(ctx.authDir !== null ? ['--auth-dir', ctx.authDir] : [])];
  const describeExit = (e: { code: number | null; signal: NodeJS.Signals | null }) => (e.signal ? `signal ${e.signal}` : `code ${e.code}`);
  let lab: NetLab | null = null;
  /**
   * nodes.<name>.emulate.link tc: each such node (not skipped) gets a network
   * namespace on a veth link held to its bandwidth by tc tbf both ways, and
   * starts in it, reaching the cluster through the link's host address. Its
   * host profile keeps the device and leaves the network out, so the node
   * measures its own link. checkTcLinks (run-job.ts) has made sure the lab can run.
   */
  const tcLinks = async (hostFiles: ReadonlyMap<ExecutionProvider, string>) => {
    const out = new Map<string, { servers: string[]; hostProfile: string | undefined; spawn: NonNullable<NodeProcessSpec['spawn']> }>();
    const tc = tcLinkedNodes(config).filter((t) => !skip.has(t.node));
    if (tc.length === 0) return out;
    if (cluster === null) throw new ConfigError(`nodes.${tc[0]!.node}.emulate.link: tc needs the local NATS cluster hetps up starts`);
    lab = await NetLab.create({ name: `hetps-up-${job}` });
    const deviceOnly = new Map<string, string>();
    const namespaces = new Map<string, string>();
    for (const [i, t] of tc.entries()) {
      // Lab names allow fewer characters than node names ('v100-node-1:8080'): the index keeps them apart.
      const n = await lab.addNode(`${i}-${t.node.replace(/[^A-Za-z0-9_-]/g, '_')}`.slice(0, 32));
      await lab.rateLimit(n.name, t.mbps);
      namespaces.set(t.node, n.netns);
      const provider = config.nodes[t.node]?.provider ?? 'cpu';
      let hostProfile = deviceOnly.get(provider);
      const full = hostFiles.get(provider);
      if (hostProfile === undefined && full !== undefined) {
        hostProfile = full.replace(/\.json$/, '-device.json');
        await writeFile(hostProfile, `${JSON.stringify({ ...JSON.parse(await readFile(full, 'utf8')) as object, network: null }, null, 2)}\n`);
        deviceOnly.set(provider, hostProfile);
      }
      const l = lab;
      out.set(t.node, {
        servers: cluster.urlsFor(n.hostIp),
        hostProfile,
        spawn: (command, args, options) => l.spawn(n.name, command, args, options),
      });
    }
    con.line(`tc links: ${tc.map((t) => `${t.node} ${t.mbps} Mbit/s (netns ${namespaces.get(t.node)})`).join(', ')}: each node in its own network namespace on a veth link `
      + 'held to its rate by tc tbf both ways; the NATS cluster listens on every interface for them');
    return out;
  };
  const disposeLab = async () => {
    await (lab as NetLab | null)?.dispose().catch((e: unknown) => con.line(`WARNING: removing the tc links' network lab: ${(e as Error).message}`));
  };

  return {
    transport, system, queue, planStore: stores.plan, jobStore: stores.info, profileStore: natsProfileStore(nc, job), lease,
    onNodeExit(listener) {
      exitListeners.push(listener);
    },
    async startNodes() {
      if (!o.launch) {
        con.line(`--no-launch: start the nodes yourself, e.g. hetps launch --role server --config ${ctx.configArg} --server-id ${config.cluster.server_nodes[0]} --nats ${servers.join(',')} --job ${job}`);
        return;
      }
      // Every worker process runs on this machine: measured once here, before they start, instead of each
      // timing the same cores while the others load (they still apply their own emulation).
      const launched = [...allWorkerNodes(config), ...standbyWorkerNodes(config)].filter((w) => !skip.has(w.name));
      const hostFiles = new Map<ExecutionProvider, string>();
      for (const provider of new Set(launched.map((w) => config.nodes[w.name]?.provider ?? 'cpu'))) {
        const host = await measureHostProfile({ probeSeconds: config.cluster.profiling.probe_seconds, provider, transport, node: hostname() });
        const file = join(runDir, `host-profile-${provider}.json`);
        await writeFile(file, `${JSON.stringify(host, null, 2)}\n`);
        hostFiles.set(provider, file);
        con.line(`profiled this machine once for its ${launched.length} worker process(es): ${host.device.matmul_gflops} GFLOP/s matmul, `
          + `${host.device.gather_rows_per_s} rows/s gather (${provider})`
          + (host.network ? `, rtt ${host.network.rtt_ms} ms, ${host.network.bandwidth_mbps} Mbit/s to NATS` : ''));
      }
      const links = await tcLinks(hostFiles);
      // A node on a tc link starts in its namespace, with the cluster's URLs as seen from there and a device-only host profile.
      const launch = (name: string, role: 'server' | 'worker', roleArgs: string[]) => {
        const link = links.get(name);
        // Servers take the CPU profile; a worker its provider's.
        const host = link?.hostProfile ?? hostFiles.get(role === 'server' ? 'cpu' : config.nodes[name]?.provider ?? 'cpu');
        const args = ['--role', role, ...roleArgs, ...(host ? ['--host-profile', host] : []), ...commonArgs(link?.servers ?? servers)];
        started(procs.start({ name, role, args, ...(link ? { spawn: link.spawn } : {}) }));
      };
      for (const s of config.cluster.server_nodes) if (!skip.has(s)) launch(s, 'server', ['--server-id', s]);
      // A worker_nodes entry has no group yet: it is named, and takes its group from the job info.
      for (const w of launched) launch(w.name, 'worker', w.group === null ? ['--node', w.name] : ['--group', w.group, '--node-rank', String(w.rank)]);
      if (skip.size) con.line(`--skip: not starting ${[...skip].join(', ')}; start them yourself (hetps launch … --nats ${servers.join(',')} --job ${job})`);
    },
    cpuProcesses() {
      const out: CpuProcess[] = [{ name: 'driver', pid: null }];
      for (const n of procs.nodes) if (n.child.pid !== undefined) out.push({ name: n.spec.name, pid: n.child.pid });
      // The nats-servers this run started (a cluster given in nats.servers is not the job's own).
      for (const n of cluster?.nodes ?? []) out.push({ name: `nats:${n.name}`, pid: n.pid });
      return out;
    },
    check() {
      for (const n of procs.nodes) {
        if (n.exit === null || reported.has(n.spec.name)) continue;
        const abnormal = n.exit.signal !== null || n.exit.code !== 0;
        if (n.spec.role === 'server') {
          if (config.fault_tolerance.backup_factor === 0) {
            return `server ${n.spec.name} exited (${describeExit(n.exit)}) and its shard has no backup (fault_tolerance.backup_factor is 0): its parameters are gone`;
          }
          reported.add(n.spec.name);
          con.line(`server ${n.spec.name} exited (${describeExit(n.exit)}): its shards fail over to their backups`);
          continue;
        }
        if (abnormal) {
          reported.add(n.spec.name);
          con.line(`worker ${n.spec.name} exited (${describeExit(n.exit)}): the batch it held goes back to the queue after ack_wait (${ackWaitMs / 1000} s)${config.training.mode === 'bsp' ? '; bsp rounds go on without it' : ''}`);
        }
      }
      const launchedWorkers = procs.nodes.filter((n) => n.spec.role === 'worker');
      if (launchedWorkers.length > 0 && launchedWorkers.length === allWorkerNodes(config).length + config.fault_tolerance.standby_workers.length
        && launchedWorkers.every((n) => n.exit !== null) && launchedWorkers.some((n) => n.exit!.signal !== null || n.exit!.code !== 0)) {
        return 'every worker process has exited';
      }
      return null;
    },
    async stopNodes() {
      // The scheduler's command, as any client would send it; every node listens on it.
      new ActorRef(system, controlAddress(job)).tell('shutdown', { run_id: runId, reason: 'the job is done' });
      await transport.flush().catch(() => undefined);
      await procs.stop(15_000);
    },
    async kill() {
      procs.killAll('SIGTERM');
      await Promise.race([Promise.all(procs.nodes.map((n) => n.exited)), new Promise((r) => setTimeout(r, 3_000).unref())]);
      procs.killAll('SIGKILL');
      await disposeLab();
    },
    async close() {
      procs.close();
      // The nodes on tc links have stopped (stopNodes) or are left to a scheduler that took over; their links go with this driver.
      await disposeLab();
      await queue.close();
      await system.stop();
      await transport.close();
    },
  };
}

/**
 * The job as a standby driver that took its lease over runs it: the stores
 * as the job's first driver made them, no node processes of its own (they
 * were started by that driver or by hand, and keep running), `stopNodes`
 * the shutdown message every node of the run listens for.
 */
export function natsStandbyBackend(driver: DriverConnection, o: { job: string; runId: string; lease: LeaseHolder }): JobBackend {
  const { transport, nc, system } = driver;
  const queue = natsBatchQueue(nc, o.job);
  // The scheduler's command, as any client would send it; every node of the run listens on it.
  const shutdown = async (reason: string) => {
    new ActorRef(system, controlAddress(o.job)).tell('shutdown', { run_id: o.runId, reason });
    await transport.flush().catch(() => undefined);
  };
  return {
    transport, system, queue, planStore: natsPlanStore(nc, o.job), jobStore: natsJobInfoStore(nc, o.job), profileStore: natsProfileStore(nc, o.job), lease: o.lease,
    onNodeExit() { /* not our children: the health actor's verdicts say when they go */ },
    async startNodes() { /* already running */ },
    check: () => null,
    cpuProcesses: () => [{ name: 'driver', pid: null }],
    async stopNodes() { await shutdown('the job is done'); },
    // Ctrl-C of the job's scheduler ends the job, as it does for the driver that started it.
    async kill() { await shutdown('the scheduler was interrupted'); },
    async close() {
      await queue.close();
      await driver.close();
    },
  };
}
