/**
 * The embedded backend: every node of the job in this process on the
 * in-process bus, with an in-memory work queue, plan, job info and profile
 * store. Used without a `nats-server` binary, or with `--embedded`.
 */
import { HeartbeatPublisher } from '../actors/health/heartbeat.ts';
import { HealthWatcher } from '../actors/health/health-watcher.ts';
import { ActorSystem, InProcessBroker, SeededRandom, connectTransport, hashString, systemClock, type Transport } from '../runtime/mod.ts';
import { allWorkerNodes } from '../topology/mod.ts';
import { profileDevice, type DeviceProfile, type ExecutionProvider } from '../native-bridge/mod.ts';
import { memoryBatchQueue } from '../actors/store/batch-queue.ts';
import { memoryJobInfoStore } from '../actors/store/job-info.ts';
import { startServerNode, startWorkerNode } from '../actors/node/nodes.ts';
import { memoryPlanStore } from '../actors/store/plan-store.ts';
import { probeSettings } from '../actors/node/profile-reporter.ts';
import { memoryProfileStore } from '../actors/store/profile-store.ts';
import type { JobBackend, JobContext } from './job-backend.ts';

export async function embeddedBackend(ctx: JobContext): Promise<JobBackend> {
  const { config, md, log, ackWaitMs, runId, job } = ctx;
  const broker = new InProcessBroker(1 << 20);
  const transports: Transport[] = [];
  const systems: ActorSystem[] = [];
  const mk = async (name: string): Promise<ActorSystem> => {
    const t = await connectTransport({ servers: null, broker, name: `hetps-${name}`, maxMessageBytes: config.communication.max_message_bytes });
    transports.push(t);
    const s = new ActorSystem({
      transport: t, job, node: name, clock: systemClock, random: new SeededRandom(hashString(name, config.training.random_seed)), logger: log.child({ node: name }),
    });
    systems.push(s);
    return s;
  };
  const system = await mk('driver');
  const queue = memoryBatchQueue({ clock: systemClock, ackWaitMs });
  const planStore = memoryPlanStore();
  const jobStore = memoryJobInfoStore();
  const profileStore = memoryProfileStore();
  // One process is one device: measured once, shared by every worker (each applies its own emulation).
  const devices = new Map<ExecutionProvider, Promise<DeviceProfile>>();
  const sharedDevice = (provider: ExecutionProvider) => {
    let d = devices.get(provider);
    if (!d) { d = profileDevice({ ...probeSettings(config.cluster.profiling.probe_seconds, provider).device, node: 'embedded' }); devices.set(provider, d); }
    return d;
  };
  const failures: string[] = [];
  const starts: Promise<unknown>[] = [];
  // Every embedded node heartbeats on the in-process bus like a process would; workers read the verdicts.
  const heartbeats: HeartbeatPublisher[] = [];
  const watchers: HealthWatcher[] = [];
  const beat = (sys: ActorSystem, role: 'shard' | 'worker', state: () => string) => {
    heartbeats.push(new HeartbeatPublisher({
      transport: sys.transport, job, node: sys.node, role, incarnation: sys.senderId, periodMs: config.fault_tolerance.heartbeat_ms, clock: systemClock, state,
    }).start());
  };
  const track = (what: string, p: Promise<unknown>) => {
    starts.push(p.catch((e: unknown) => { failures.push(`${what}: ${(e as Error).message}`); }));
  };
  return {
    transport: system.transport, system, queue, planStore, jobStore, profileStore,
    async startNodes() {
      for (const s of config.cluster.server_nodes) {
        track(`server ${s}`, mk(s).then((sys) => {
          beat(sys, 'shard', () => 'serving');
          return startServerNode({ config, server: s, system: sys, planStore, log: sys.log, md, profiling: { store: profileStore, device: sharedDevice } });
        }));
      }
      for (const w of allWorkerNodes(config)) {
        track(`worker ${w.name}`, mk(w.name).then(async (sys) => {
          let state: () => string = () => 'starting';
          beat(sys, 'worker', () => state());
          const health = await HealthWatcher.start(sys);
          watchers.push(health);
          const started = await startWorkerNode({
            config, node: w, system: sys, planStore, jobStore, queue, log: sys.log, md, runId, profiling: { store: profileStore, device: sharedDevice }, health,
          });
          state = () => started.def.stats().state;
          const end = await started.def.done;
          if (end.state === 'failed') failures.push(`worker ${w.name} failed: ${end.error}`);
        }));
      }
    },
    onNodeExit() { /* one process: a node cannot exit on its own */ },
    check() { return failures.length ? failures.join('; ') : null; },
    // Every node runs in this process.
    cpuProcesses() { return [{ name: 'driver', pid: null }]; },
    async stopNodes() {
      // Workers first (their loops end), then shards, then the driver.
      await Promise.all(systems.slice(1).map((s) => s.stop({ timeoutMs: 15_000 })));
      for (const h of heartbeats) h.stop(true);
      for (const w of watchers) w.dispose();
    },
    async kill() { await queue.close(); },
    async close() {
      await queue.close();
      await system.stop();
      await Promise.all(transports.map((t) => t.close()));
      void starts;
    },
  };
}
