/**
 * Pausing workers: the job-wide pause (the driver writes a newer
 * groups_version, then resume_version) in asp and bsp, and one worker's
 * mailbox `pause` / `resume`. Two shards and two workers on the in-process
 * bus, with the memory queue and stores, started the way `hetps up
 * --embedded` starts them.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { type ActorSystem, silentLogger, systemClock } from '../../runtime/mod.ts';
import { allWorkerNodes, parseConfig, type HetpsConfig } from '../../topology/mod.ts';
import { modelAndData, startServerNode, startWorkerNode, type StartedWorker } from '../../actors/node/nodes.ts';
import { memoryPlanStore } from '../../actors/store/plan-store.ts';
import { memoryJobInfoStore, type JobInfo, type JobInfoStore } from '../../actors/store/job-info.ts';
import { memoryBatchQueue, type BatchQueue, type QueuedBatch } from '../../actors/store/batch-queue.ts';
import { prepareJob } from '../../actors/scheduler/job.ts';
import { subscribeTelemetry, type RegroupTelemetry } from '../../actors/monitor/telemetry.ts';
import type { PauseReply, ResumeReply, WorkerStats } from '../../actors/worker/worker.messages.ts';
import { until } from '../support/until.ts';
import { inProcessBus } from '../support/in-process.ts';

const WORKERS = ['w1', 'w2'];

type Mode = 'asp' | 'bsp' | 'hps';

function configText(mode: Mode): string {
  // hps: one async group per worker, so a paused worker holds back no peer.
  const groups = mode === 'hps'
    ? '[{ name: g1, nodes: [w1], sync_mode: async }, { name: g2, nodes: [w2], sync_mode: async }]'
    : '[{ name: g, nodes: [w1, w2] }]';
  return `job: { name: pause${mode} }
cluster:
  worker_groups: ${groups}
  server_nodes: [s1, s2]
nodes:
  w1: { emulate: { speed: 1 } }
  w2: { emulate: { speed: 1 } }
model: { type: ctr, ctr: { embedding_dim: 4, hidden: [8], pooling: mean, wide: true, hash_buckets: 2000 } }
data: { source: ctr-synthetic, batch_size: 16, samples: 640, test_samples: 32, slots: 4, dense_features: 3, vocab_size: 1000 }
optimizer: { type: sgd, learning_rate: 0.1, sparse: { type: sgd, learning_rate: 0.1 } }
training: { mode: ${mode}, random_seed: 3, emulation_reference_step_ms: 20 }
`;
}

/** The queue as the workers use it, counting what they take and have not acknowledged or given back yet. */
function countingQueue(inner: BatchQueue): BatchQueue & { outstanding(): number; takes(): number } {
  let outstanding = 0;
  let takes = 0;
  const wrap = (b: QueuedBatch): QueuedBatch => {
    let open = true;
    const close = () => { if (open) { open = false; outstanding--; } };
    return {
      desc: b.desc, redelivered: b.redelivered, deliveries: b.deliveries,
      ack: async () => { const ok = await b.ack(); close(); return ok; },
      nak: (ms) => { close(); b.nak(ms); },
      working: () => b.working(),
    };
  };
  return {
    kind: inner.kind,
    publish: (d) => inner.publish(d),
    async next(ms) {
      takes++;
      const b = await inner.next(ms);
      if (b === null) return null;
      outstanding++;
      return wrap(b);
    },
    pending: () => inner.pending(),
    undelivered: () => inner.undelivered(),
    close: () => inner.close(),
    outstanding: () => outstanding,
    takes: () => takes,
  };
}

interface Job {
  config: HetpsConfig;
  total: number;
  queue: ReturnType<typeof countingQueue>;
  jobStore: JobInfoStore;
  driver: ActorSystem;
  workers: Map<string, StartedWorker>;
  /** Confirmed acknowledgements per batch id, and per node, from the batch telemetry. */
  acks: Map<string, number>;
  ackedBy: Map<string, number>;
  regroups: RegroupTelemetry[];
  close(): Promise<void>;
}

/** `pausedBeforeWorkers`: the driver pauses the job after writing it and before any worker starts (a worker that starts late). */
async function startJob(mode: Mode, opts: { pausedBeforeWorkers?: boolean } = {}): Promise<Job> {
  const config = parseConfig(configText(mode), `pause-${mode}.yaml`);
  const md = modelAndData(config);
  const bus = inProcessBus(config.job.name);
  const mk = (name: string) => bus.system(name);
  const driver = await mk('driver');
  const queue = countingQueue(memoryBatchQueue({ clock: systemClock, ackWaitMs: 30_000 }));
  const planStore = memoryPlanStore();
  const jobStore = memoryJobInfoStore();
  const acks = new Map<string, number>();
  const ackedBy = new Map<string, number>();
  const regroups: RegroupTelemetry[] = [];
  const unsubscribe = subscribeTelemetry(driver.transport, config.job.name, {
    batch: (t) => {
      if (!t.ack_confirmed) return;
      acks.set(t.batch_id, (acks.get(t.batch_id) ?? 0) + 1);
      ackedBy.set(t.node, (ackedBy.get(t.node) ?? 0) + 1);
    },
    regroup: (t) => { regroups.push(t); },
  });
  const prepared = await prepareJob({ config, runId: `run-${mode}`, maxPayload: 1024 * 1024, md, planStore, jobStore, queue, ackWaitMs: 30_000 });
  for (const s of config.cluster.server_nodes) await startServerNode({ config, server: s, system: await mk(s), planStore, log: silentLogger(), md });
  if (opts.pausedBeforeWorkers) await jobStore.put({ ...prepared.info, groups_version: prepared.info.groups_version + 1, paused: true });
  const workers = new Map<string, StartedWorker>();
  for (const w of allWorkerNodes(config)) {
    // A short regroup resume limit: an operator's pause (paused: true) must outlast it.
    workers.set(w.name, await startWorkerNode({
      config, node: w, system: await mk(w.name), planStore, jobStore, queue, log: silentLogger(), md, runId: `run-${mode}`, regroupResumeTimeoutMs: 100,
    }));
  }
  return {
    config, total: prepared.info.total_batches, queue, jobStore, driver, workers, acks, ackedBy, regroups,
    async close() {
      unsubscribe();
      await bus.close({ stop: { timeoutMs: 15_000 }, beforeFirst: () => queue.close() });
    },
  };
}

/** Waits for a condition the workers bring about (never for time to pass as such). */

const totalAcks = (j: Job) => [...j.acks.values()].reduce((a, b) => a + b, 0);
const statsOf = (j: Job, w: string): WorkerStats => j.workers.get(w)!.def.stats();

/** Until every worker reported `ready` for groups v`v`; then each shows paused. */
async function everyWorkerPaused(j: Job, v: number): Promise<void> {
  await until(() => WORKERS.every((w) => j.regroups.some((r) => r.node === w && r.state === 'ready' && r.groups_version === v)), 'every worker to report ready', 60_000);
  for (const w of WORKERS) assert.equal(statsOf(j, w).state, 'paused', `${w} shows paused`);
}

/** Resumes groups v`v` and waits for the end: every worker done, every batch acknowledged exactly once; the workers' final stats. */
async function resumeToEnd(j: Job, info: JobInfo, v: number): Promise<WorkerStats[]> {
  await j.jobStore.put({ ...info, groups_version: v, resume_version: v, paused: false });
  const ends = await Promise.all(WORKERS.map((w) => j.workers.get(w)!.def.done));
  for (const s of ends) assert.equal(s.state, 'done', `${s.node}: ${s.error}`);
  assert.equal(j.acks.size, j.total, 'every batch acknowledged');
  assert.ok([...j.acks.values()].every((n) => n === 1), 'and each once');
  return ends;
}

async function jobWidePause(mode: 'asp' | 'bsp'): Promise<void> {
  const j = await startJob(mode);
  try {
    await until(() => totalAcks(j) >= 6, 'some training', 60_000);
    const info = (await j.jobStore.get())!;
    await j.jobStore.put({ ...info, groups_version: info.groups_version + 1, paused: true });
    const v = info.groups_version + 1;
    await everyWorkerPaused(j, v);
    assert.equal(j.queue.outstanding(), 0, 'a paused worker holds no batch');
    const acked = totalAcks(j);
    assert.ok(acked < j.total, `paused mid-training (${acked} of ${j.total} acknowledged)`);
    const takes = j.queue.takes();
    const rounds = WORKERS.map((w) => statsOf(j, w).round);
    // Ten emulated steps' time (and twice the regroup resume limit): a worker that went on would have taken
    // and acknowledged batches in it; one that treated the pause as an overdue regroup would have failed.
    await new Promise((r) => setTimeout(r, 200));
    for (const w of WORKERS) assert.equal(statsOf(j, w).state, 'paused', `${w} still paused after the regroup resume limit`);
    assert.equal(totalAcks(j), acked, 'nothing is acknowledged while the job is paused');
    assert.equal(j.queue.takes(), takes, 'nothing is taken from the queue while the job is paused');
    assert.deepEqual(WORKERS.map((w) => statsOf(j, w).round), rounds);

    const ends = await resumeToEnd(j, info, v);
    assert.equal(ends.reduce((n, s) => n + s.batches_acked, 0), j.total);
    for (const w of WORKERS) {
      assert.ok(j.regroups.some((r) => r.node === w && r.state === 'resumed' && r.groups_version === v && r.group === 'g'), `${w} reported resumed in its group`);
    }
    if (mode === 'bsp') for (const s of ends) assert.equal(s.round, info.rounds - 1, `${s.node} took part in every round`);
  } finally {
    await j.close();
  }
}

test('asp: a job-wide pause stops every worker between batches (nothing held, nothing acknowledged); the resume trains every batch exactly once', { timeout: 120_000 }, async () => {
  await jobWidePause('asp');
});

test('bsp: a job-wide pause stops every worker between rounds (nothing held, nothing acknowledged); the resume completes every round and batch exactly once', { timeout: 120_000 }, async () => {
  await jobWidePause('bsp');
});

async function startedWhilePaused(mode: 'asp' | 'bsp'): Promise<void> {
  const j = await startJob(mode, { pausedBeforeWorkers: true });
  try {
    const info = (await j.jobStore.get())!;
    const v = info.groups_version;
    // Started after the pause was written: each pauses at its first boundary, before it takes a batch.
    await everyWorkerPaused(j, v);
    assert.equal(j.queue.takes(), 0, 'no batch taken while the job is paused');
    assert.equal(totalAcks(j), 0, 'nothing trained while the job is paused');
    await resumeToEnd(j, info, v);
  } finally {
    await j.close();
  }
}

test('asp: a worker that starts while the job is paused pauses before its first batch, and trains once the driver resumes', { timeout: 120_000 }, async () => {
  await startedWhilePaused('asp');
});

test('bsp: a worker that starts while the job is paused pauses before its first round, and trains once the driver resumes', { timeout: 120_000 }, async () => {
  await startedWhilePaused('bsp');
});

async function mailboxPause(mode: Mode): Promise<void> {
  const j = await startJob(mode);
  try {
    await until(() => (j.ackedBy.get('w1') ?? 0) >= 2, 'w1 to train', 60_000);
    const w1 = j.driver.ref('worker', 'w1');
    const paused = await w1.request<PauseReply & Record<string, unknown>>('pause', { reason: 'test' });
    assert.equal(paused.pausing, true);
    assert.ok(paused.state === 'pausing' || paused.state === 'paused', paused.state);
    await until(() => statsOf(j, 'w1').state === 'paused', 'w1 to pause', 60_000);
    const stats = await w1.request<WorkerStats & Record<string, unknown>>('stats', {});
    assert.equal(stats.state, 'paused', 'the mailbox stats show the pause');
    const w1Acked = j.ackedBy.get('w1') ?? 0;
    const w2Acked = j.ackedBy.get('w2') ?? 0;
    // Progress of the other worker is the clock here: w1 stays where it is while w2 trains five more batches.
    await until(() => (j.ackedBy.get('w2') ?? 0) >= Math.min(w2Acked + 5, j.total - w1Acked), 'w2 to train on', 60_000);
    assert.equal(j.ackedBy.get('w1') ?? 0, w1Acked, 'the paused worker acknowledged nothing');
    assert.equal(statsOf(j, 'w1').state, 'paused');
    assert.notEqual(statsOf(j, 'w2').state, 'paused', 'the other worker is not paused');

    const resumed = await w1.request<ResumeReply & Record<string, unknown>>('resume', { reason: 'test' });
    assert.equal(resumed.resumed, true);
    assert.equal(resumed.state, 'training');
    const again = await w1.request<ResumeReply & Record<string, unknown>>('resume', {});
    assert.equal(again.resumed, false, 'nothing left to resume');

    const ends = await Promise.all(WORKERS.map((w) => j.workers.get(w)!.def.done));
    for (const s of ends) assert.equal(s.state, 'done', `${s.node}: ${s.error}`);
    assert.equal(j.acks.size, j.total, 'every batch acknowledged');
    assert.ok([...j.acks.values()].every((n) => n === 1), 'and each once');
    assert.equal(j.regroups.length, 0, 'a mailbox pause is not a job-wide pause');
    const late = await w1.request<PauseReply & Record<string, unknown>>('pause', {});
    assert.deepEqual(late, { pausing: false, state: 'done' }, 'an ended loop does not pause');
  } finally {
    await j.close();
  }
}

test('asp: a mailbox pause holds one worker between batches while the other trains on; resume lets it go on', { timeout: 120_000 }, async () => {
  await mailboxPause('asp');
});

test('hps: a mailbox pause holds one worker between windows (its prefetched batch given back) while the other trains on; resume lets it go on', { timeout: 120_000 }, async () => {
  await mailboxPause('hps');
});
