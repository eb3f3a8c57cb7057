/**
 * The job's Prometheus metrics (prom-client), served by the monitor at
 * `/metrics`. Fed from the same telemetry as the monitor's figures — the
 * workers' `batch` and `progress` messages, the job's events, the health
 * verdicts — and, at each scrape, from the scheduler's `status` (shards,
 * groups, the job's state), so a scrape costs the job one status request.
 *
 * Names follow Prometheus' conventions: `_total` counters, base units
 * (seconds, bytes), labels for node, shard, group and op.
 */
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { Transport } from '../../runtime/mod.ts';
import type { HealthVerdictMessage } from '../health/health.messages.ts';
import { requestControl, type JobStatus } from '../scheduler/scheduler.messages.ts';
import type { JobEvent } from './monitor.messages.ts';
import type { BatchTelemetry, ProgressTelemetry } from './telemetry.ts';

const HEALTH_CODE: Record<string, number> = { alive: 0, suspect: 1, dead: 2 };
/** Staleness buckets (updates a push lagged). */
export const STALENESS_BUCKETS = [0, 1, 2, 4, 8, 16, 32, 64];
const JOB_STATES = ['starting', 'training', 'pausing', 'paused', 'regrouping', 'stopping', 'done'];

export class JobMetrics {
  readonly registry = new Registry();
  private readonly samples: Counter;
  private readonly batches: Counter;
  private readonly workerSamples: Counter<'node'>;
  private readonly stepSeconds: Histogram<'node'>;
  private readonly computeSeconds: Histogram<'node'>;
  private readonly staleness: Histogram;
  private readonly redelivered: Counter;
  private readonly droppedStale: Counter;
  private readonly partDropped: Counter;
  private readonly loss: Gauge;
  private readonly workerRate: Gauge<'node'>;
  private readonly workerHeld: Gauge<'node'>;
  private readonly wireBytes: Gauge<'node' | 'direction'>;
  private readonly events: Counter<'kind'>;
  private readonly failovers: Counter;
  private readonly checkpoints: Counter;
  private readonly health: Gauge<'node' | 'role'>;
  private readonly testLoss: Gauge;
  private readonly testAuc: Gauge;
  private readonly shardRequests: Counter<'shard' | 'op'>;
  private readonly shardRows: Gauge<'shard'>;
  private readonly shardBytes: Gauge<'shard'>;
  private readonly shardVersion: Gauge<'shard'>;
  private readonly groupGap: Gauge<'group'>;
  private readonly groupSteps: Gauge<'group'>;
  private readonly batchesTotal: Gauge;
  private readonly jobState: Gauge<'state'>;
  private readonly rate: Gauge;
  private readonly serverLoad: Gauge<'node'>;
  private readonly serverImbalance: Gauge;
  /** Shard counters as last read from status, per shard and op: the counters grow by the difference (a new primary starts from 0). */
  private readonly lastShard = new Map<string, number>();
  /** Staleness counts per bucket, for the dashboard's histogram. */
  readonly stalenessCounts = new Map<number, number>();

  constructor(private readonly o: { status: () => Promise<JobStatus | null> }) {
    const r = [this.registry];
    this.samples = new Counter({ name: 'hetps_samples_total', help: 'Training samples of acknowledged batches.', registers: r });
    this.batches = new Counter({ name: 'hetps_batches_acked_total', help: 'Batches acknowledged (each counted once).', registers: r });
    this.workerSamples = new Counter({ name: 'hetps_worker_samples_total', help: 'Samples trained per worker.', labelNames: ['node'], registers: r });
    this.stepSeconds = new Histogram({
      name: 'hetps_step_seconds', help: 'A training step as the (emulated) device took it.', labelNames: ['node'], registers: r,
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    });
    this.computeSeconds = new Histogram({
      name: 'hetps_step_compute_seconds', help: 'Real compute of a training step\'s graph.', labelNames: ['node'], registers: r,
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
    });
    this.staleness = new Histogram({ name: 'hetps_push_staleness', help: 'Updates a batch\'s push lagged the shard (versions).', buckets: STALENESS_BUCKETS, registers: r });
    this.redelivered = new Counter({ name: 'hetps_batches_redelivered_total', help: 'Batches trained again after their worker died or was too slow.', registers: r });
    this.droppedStale = new Counter({ name: 'hetps_batches_dropped_stale_total', help: 'hps: batches whose update a shard refused as too stale.', registers: r });
    this.partDropped = new Counter({
      name: 'hetps_batches_part_dropped_total', help: 'hps: batches whose update a shard applied without its dense blocks or its rows (past that kind\'s max_staleness).', registers: r,
    });
    this.loss = new Gauge({ name: 'hetps_train_loss', help: 'Training loss of the latest acknowledged batch.', registers: r });
    this.workerRate = new Gauge({ name: 'hetps_worker_samples_per_second', help: 'Each worker\'s samples per second over its last progress interval.', labelNames: ['node'], registers: r });
    this.workerHeld = new Gauge({
      name: 'hetps_worker_held_batches', help: 'Batches a worker holds: taken from the queue, not yet acknowledged or given back (from its progress telemetry).', labelNames: ['node'], registers: r,
    });
    this.wireBytes = new Gauge({ name: 'hetps_wire_bytes', help: 'Payload bytes a worker process sent (out) and received (in) so far.', labelNames: ['node', 'direction'], registers: r });
    this.events = new Counter({ name: 'hetps_events_total', help: 'Job events: pauses, resumes, regroups, checkpoints, failovers, health verdicts.', labelNames: ['kind'], registers: r });
    this.failovers = new Counter({ name: 'hetps_failovers_total', help: 'Shard failovers (a backup promoted).', registers: r });
    this.checkpoints = new Counter({ name: 'hetps_checkpoints_total', help: 'Checkpoints taken.', registers: r });
    this.health = new Gauge({ name: 'hetps_health_state', help: 'Each node\'s health verdict: 0 alive, 1 suspect, 2 dead.', labelNames: ['node', 'role'], registers: r });
    this.testLoss = new Gauge({ name: 'hetps_test_loss', help: 'Test loss of the latest periodic evaluation (hetps up --eval-every).', registers: r });
    this.testAuc = new Gauge({ name: 'hetps_test_auc', help: 'Test AUC of the latest periodic evaluation (ctr models).', registers: r });
    this.shardRequests = new Counter({ name: 'hetps_shard_requests_total', help: 'Requests a shard\'s primary served, by op (pull, push).', labelNames: ['shard', 'op'], registers: r });
    this.shardRows = new Gauge({ name: 'hetps_shard_rows', help: 'Embedding rows a shard holds.', labelNames: ['shard'], registers: r });
    this.shardBytes = new Gauge({ name: 'hetps_shard_bytes', help: 'Bytes of a shard\'s state (parameters and optimizer state).', labelNames: ['shard'], registers: r });
    this.shardVersion = new Gauge({ name: 'hetps_shard_version', help: 'A shard\'s version clock (updates applied).', labelNames: ['shard'], registers: r });
    this.groupGap = new Gauge({ name: 'hetps_group_gap_steps', help: 'hps: how many steps (mean per member) a group is behind the group furthest ahead.', labelNames: ['group'], registers: r });
    this.groupSteps = new Gauge({ name: 'hetps_group_steps', help: 'hps: steps per member of a group (mean).', labelNames: ['group'], registers: r });
    this.batchesTotal = new Gauge({ name: 'hetps_batches', help: 'Batches of the job.', registers: r });
    this.jobState = new Gauge({ name: 'hetps_job_state', help: 'The job\'s state: 1 for the state it is in.', labelNames: ['state'], registers: r });
    this.rate = new Gauge({ name: 'hetps_samples_per_second', help: 'Job samples per second since training began.', registers: r });
    this.serverLoad = new Gauge({
      name: 'hetps_server_load', help: 'Parameter floats per second a server node\'s replicas carry (pulls, pushes, replication), as load balancing measures it.', labelNames: ['node'], registers: r,
    });
    this.serverImbalance = new Gauge({ name: 'hetps_server_load_imbalance', help: '(max − min) / max of the server nodes\' loads; load balancing moves a primary past load_balancing.imbalance_threshold.', registers: r });
  }

  batch(t: BatchTelemetry): void {
    if (!t.ack_confirmed) return;
    this.samples.inc(t.samples);
    this.batches.inc();
    this.workerSamples.inc({ node: t.node }, t.samples);
    const step = t.emulated_step_ms ?? t.busy_ms;
    if (step !== null) this.stepSeconds.observe({ node: t.node }, step / 1000);
    if (t.busy_ms !== null) this.computeSeconds.observe({ node: t.node }, t.busy_ms / 1000);
    this.staleness.observe(t.staleness);
    const bucket = STALENESS_BUCKETS.find((b) => t.staleness <= b) ?? Number.POSITIVE_INFINITY;
    this.stalenessCounts.set(bucket, (this.stalenessCounts.get(bucket) ?? 0) + 1);
    if (t.redelivered) this.redelivered.inc();
    if (t.dropped_stale) this.droppedStale.inc();
    if (t.part_dropped) this.partDropped.inc();
    if (Number.isFinite(t.loss)) this.loss.set(t.loss);
  }

  progress(t: ProgressTelemetry): void {
    this.workerRate.set({ node: t.node }, t.samples_per_s);
    if (t.held_count !== null) this.workerHeld.set({ node: t.node }, t.held_count);
    this.wireBytes.set({ node: t.node, direction: 'out' }, t.bytes_out);
    this.wireBytes.set({ node: t.node, direction: 'in' }, t.bytes_in);
  }

  event(e: JobEvent): void {
    this.events.inc({ kind: e.kind });
    if (e.kind === 'failover') this.failovers.inc();
    if (e.kind === 'checkpoint') this.checkpoints.inc();
  }

  verdict(v: HealthVerdictMessage): void {
    this.health.set({ node: v.node, role: v.role }, HEALTH_CODE[v.state] ?? 2);
  }

  evaluation(e: { logloss: number; auc: number | null }): void {
    this.testLoss.set(e.logloss);
    if (e.auc !== null) this.testAuc.set(e.auc);
  }

  /** Scrape-time figures from the scheduler's status. */
  applyStatus(s: JobStatus): void {
    for (const sh of s.shards) {
      for (const [op, v] of [['pull', sh.pulls], ['push', sh.pushes]] as const) {
        if (v === null) continue;
        const key = `${sh.shard}/${op}/${sh.primary}`;
        const last = this.lastShard.get(key) ?? 0;
        // A promoted backup counts from its own start: the counter grows by what it served since.
        this.shardRequests.inc({ shard: sh.shard, op }, v >= last ? v - last : v);
        this.lastShard.set(key, v);
      }
      if (sh.rows !== null) this.shardRows.set({ shard: sh.shard }, sh.rows);
      if (sh.bytes !== null) this.shardBytes.set({ shard: sh.shard }, sh.bytes);
      if (sh.version !== null) this.shardVersion.set({ shard: sh.shard }, sh.version);
    }
    for (const [g, v] of Object.entries(groupProgress(s))) {
      this.groupSteps.set({ group: g }, v.steps);
      this.groupGap.set({ group: g }, v.gap);
    }
    if (s.progress.batches_total !== null) this.batchesTotal.set(s.progress.batches_total);
    this.rate.set(s.progress.samples_per_s);
    const lb = s.load_balancing;
    if (lb?.loads) for (const [node, l] of Object.entries(lb.loads)) this.serverLoad.set({ node }, l);
    if (lb && lb.imbalance !== null) this.serverImbalance.set(lb.imbalance);
    for (const st of JOB_STATES) this.jobState.set({ state: st }, s.state === st ? 1 : 0);
  }

  /** The Prometheus text exposition, after refreshing the scrape-time figures (a job that does not answer leaves them as they were). */
  async text(): Promise<string> {
    const s = await this.o.status().catch(() => null);
    if (s !== null) this.applyStatus(s);
    return this.registry.metrics();
  }

  get contentType(): string { return this.registry.contentType; }
}

/** Per hps group: mean steps per member, and how far (steps) it is behind the group furthest ahead. */
export function groupProgress(s: Pick<JobStatus, 'groups' | 'workers'>): Record<string, { steps: number; gap: number }> {
  const steps = new Map(s.workers.map((w) => [w.node, w.steps]));
  const mean: Record<string, number> = {};
  for (const g of s.groups) {
    const xs = g.members.map((m) => steps.get(m.node) ?? 0);
    mean[g.name] = xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length;
  }
  const ahead = Math.max(0, ...Object.values(mean));
  return Object.fromEntries(Object.entries(mean).map(([g, m]) => [g, { steps: m, gap: ahead - m }]));
}

/** The monitor's status request, as any NATS client sends it (JSON over `hps.<job>.ctl.status`). */
export function statusOverControl(transport: Transport, job: string, timeoutMs = 2_000): () => Promise<JobStatus | null> {
  return async () => {
    const reply = await requestControl(transport, job, 'status', { events: 30 }, timeoutMs);
    return reply.type === 'reply' && reply.result !== undefined ? reply.result as JobStatus : null;
  };
}
