/**
 * Where a job's nodes run: `natsBackend` (a NATS cluster, one `hetps launch`
 * process per node) or `embeddedBackend` (every node in this process on the
 * in-process bus). `runJob` drives either through this one interface.
 */
import type { ActorSystem, Logger, Transport } from '../runtime/mod.ts';
import type { HetpsConfig } from '../topology/mod.ts';
import type { BatchQueue } from '../actors/store/batch-queue.ts';
import type { ModelAndData } from '../actors/node/nodes.ts';
import type { JobInfoStore } from '../actors/store/job-info.ts';
import type { PlanStore } from '../actors/store/plan-store.ts';
import type { ProfileStore } from '../actors/store/profile-store.ts';
import type { LeaseHolder } from '../actors/scheduler/lease.ts';
import type { CpuProcess } from './process-cpu.ts';

/** Where a job run prints: the command line implements it (a progress line that other lines print above). */
export interface JobPrinter {
  line(s: string): void;
  /** The progress line, redrawn; `fraction` of the work done in [0, 1] (null: unknown). */
  progress(s: string, fraction?: number | null): void;
  /** Ends the progress line, if one is showing. */
  end(): void;
}

/** What every step of a run shares. */
export interface JobContext {
  config: HetpsConfig;
  job: string;
  /** The config file, absolute (passed to the node processes). */
  configPath: string;
  /** The config file as the user wrote it (for the hints printed). */
  configArg: string;
  runId: string;
  runDir: string;
  /** Log level of the driver and the node processes. */
  level: string;
  log: Logger;
  out: JobPrinter;
  md: ModelAndData;
  ackWaitMs: number;
  /**
   * nats.secure: the directory of the roles' credentials (nats.auth_dir, or the
   * one this run wrote for its own secure cluster); null when not secure.
   */
  authDir: string | null;
}

export interface JobBackend {
  transport: Transport;
  system: ActorSystem;
  queue: BatchQueue;
  planStore: PlanStore;
  jobStore: JobInfoStore;
  /** The workers' profiles (each puts its own when it joins). */
  profileStore: ProfileStore;
  /** The job's scheduler lease, held by this driver; absent or null embedded (one process, nothing to take over). */
  lease?: LeaseHolder | null;
  /** Starts the nodes (processes or in-process actors); may be called before the job exists. */
  startNodes(): Promise<void>;
  /** Calls `listener` when a node process it started exits (the health actor makes it dead at once); embedded: never. */
  onNodeExit(listener: (node: string, how: string) => void): void;
  /** A reason to give up, checked while training runs. */
  check(): string | null;
  /** The processes whose CPU time counts as the job's (this one included). */
  cpuProcesses(): CpuProcess[];
  /** Ends the nodes after training and evaluation. */
  stopNodes(): Promise<void>;
  /** On Ctrl-C: ends the nodes at once (a few seconds' grace for processes). */
  kill(): Promise<void>;
  close(): Promise<void>;
}
