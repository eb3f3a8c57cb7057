/**
 * Coordinated checkpoints (the driver's): a consistent cut of every shard.
 *
 * 1. The job is paused through the control plane's pause (the same as
 *    ctl.pause): every worker stops at its window (hps) or step boundary, its
 *    last pushes applied and its batches acknowledged.
 * 2. Every shard's primary is asked for a snapshot (dense blocks and sparse
 *    rows with their optimizer state, version and round, the dedup table and
 *    the applied-batch log), and the acknowledged batch ids are read.
 * 3. Training resumes; the snapshots are fetched in segments that each fit
 *    the message limit, encoded and written after it, as one checkpoint
 *    directory (actors/store/checkpoint.ts: fsynced, a manifest of sizes and
 *    SHA-256, renamed into place; a shard's state over 256 MiB of arrays in
 *    part files), and checkpoints beyond `keep` are removed.
 *
 * Before step 1, with `moment`, the cut waits (a few seconds at most) for a
 * moment when every hps worker is stepping rather than exchanging a window
 * (actors/scheduler/cut-moment.ts): a worker that is stepping pauses at once,
 * one whose group is exchanging must finish the exchange first.
 *
 * One checkpoint at a time: a request while one is being taken waits for it.
 * A pause already in force (ctl.pause) is used as it is and not lifted.
 */
import { HetpsError } from '../../runtime/mod.ts';
import type { Clock, Logger } from '../../runtime/mod.ts';
import type { ShardPlan } from '../../topology/mod.ts';
import type { ShardSnapshot } from '../shard/shard.messages.ts';
import type { JobInfo } from '../store/job-info.ts';
import { pruneCheckpoints, refuseExisting, shardFiles, writeCheckpoint, writeCheckpointAt, type CheckpointContent, type CheckpointFileContent, type CheckpointManifest, type CheckpointModel, type WrittenFile } from '../store/checkpoint.ts';
import type { WrittenShard } from '../shard/shard.actor.ts';
import { deltaOf, rowSteps, type RowSteps } from '../store/checkpoint-delta.ts';
import type { CutMomentWait } from './cut-moment.ts';

export type CheckpointTrigger = CheckpointManifest['trigger'];

export interface CheckpointTaken {
  path: string;
  name: string;
  trigger: CheckpointTrigger;
  bytes: number;
  /** Files written: a file per shard, and the part files of a shard whose state is large. */
  files: number;
  /** `full`, or `delta` (only the sparse rows updated since the previous checkpoint of its chain). */
  kind: CheckpointManifest['kind'];
  /** Who wrote the shards' files: the driver (fetched over NATS), or each shard itself (checkpoint.written_by). */
  written_by: 'driver' | 'shards';
  /** Sparse rows written, of the rows the shards hold. */
  rows: number;
  rows_held: number;
  /** Batches acknowledged at the cut. */
  batches_done: number;
  /** Training stood still this long for the cut (0 when a ctl.pause was in force already). */
  pause_ms: number;
  /** Of it: until every worker had paused at its boundary, then the shards' in-memory copies (the rest: resuming). */
  pausing_ms: number;
  snapshot_ms: number;
  /** Fetching the frozen copies, encoding and writing the files: after training resumed. */
  write_ms: number;
  /** Checkpoints removed to keep `keep`. */
  pruned: number;
  /** Training went on this long before the cut, waiting for every worker to be stepping (0 without `moment`). */
  moment_wait_ms: number;
  /** The cut came when every worker was stepping (false: the wait ran out, or no cadence was known yet). */
  aligned: boolean;
}

export interface CheckpointerOptions {
  /** The checkpoint root (checkpoint.dir). */
  root: string;
  keep: number;
  /** A full checkpoint every this many (checkpoint.full_every); deltas between. Default 1: all full. */
  fullEvery?: number;
  job: string;
  /** The model, recorded in every manifest (what `hetps export` rebuilds the graph from). */
  model: CheckpointModel | null;
  controller: {
    pauseUntilPaused(reason: string, timeoutMs: number): Promise<{ already: boolean }>;
    resume(): Promise<unknown>;
    readonly jobInfo: JobInfo;
  };
  plan: () => ShardPlan;
  /**
   * The cut only freezes each shard's state in memory (`freeze`); the copies
   * are fetched (`take`) after training resumed, so the pause does not wait
   * for the snapshots to cross the network.
   */
  frozen: {
    freeze: (shard: string, token: string) => Promise<unknown>;
    take: (shard: string, token: string) => Promise<ShardSnapshot>;
    /**
     * `checkpoint.written_by: shards`: each shard writes its own files into the
     * checkpoint's temporary directory (`write_frozen`), all at once, and
     * nothing of the state crosses the network; `name` is the checkpoint's,
     * `base` the chain's checkpoint a delta builds on (null: a full one; a
     * shard that did not write `base` writes full). Absent: the driver
     * fetches (`take`) and writes them.
     */
    write?: (shard: string, token: string, dir: string, chain: { name?: string; base: string | null }) => Promise<WrittenShard>;
  };
  /** Batch ids acknowledged so far (a resumed job: with those done before it). */
  acked: () => Iterable<string>;
  /** Every batch of the job (a resumed job: with those done before it). */
  totalBatches: number;
  clock: Clock;
  log: Logger;
  /** How long the workers may take to pause. Default 60 s. */
  pauseTimeoutMs?: number;
  /** Waits for a moment when every worker is stepping (`CutMoment.wait`), at most the given ms. */
  moment?: (capMs: number) => Promise<CutMomentWait>;
  /** The most a cut waits for its moment. Default 5 s. */
  momentCapMs?: number;
  /** A shard file's arrays beyond this go into part files (default SHARD_FILE_PART_BYTES, 256 MiB). */
  filePartBytes?: number;
}

export class Checkpointer {
  readonly taken: CheckpointTaken[] = [];
  private queue: Promise<unknown> = Promise.resolve();
  /** The trigger of the checkpoint being taken, if one is. */
  private running: CheckpointTrigger | null = null;
  /** The chain the next delta builds on: names from its full checkpoint on, and the row update counts as of the last; null: the next is full. */
  private chain: { names: string[]; steps: Map<string, RowSteps> } | null = null;

  constructor(private readonly o: CheckpointerOptions) {}

  /**
   * Takes one checkpoint (after any in progress). `at`: written at exactly
   * that directory (it must not exist; the API's `saveCheckpoint({ path })`):
   * always full, outside the root's chain, never pruned.
   *
   * `pauseWithinMs` (default `pauseTimeoutMs`) bounds everything before the
   * workers are paused, from this call on: a checkpoint still being taken
   * before it, the cut's moment, a regroup in progress and the pause itself.
   * Past it the promise rejects saying what it waited for, and nothing is
   * paused for it (ctl.checkpoint passes less than its callers' 60 s, so
   * they get that answer rather than a timeout).
   */
  take(trigger: CheckpointTrigger, at?: string, o: { pauseWithinMs?: number } = {}): Promise<CheckpointTaken> {
    const { clock } = this.o;
    const within = o.pauseWithinMs ?? this.o.pauseTimeoutMs ?? 60_000;
    const deadline = clock.monotonic() + within;
    let started = false;
    let gaveUp = false;
    const run = this.queue.catch(() => undefined).then(async () => {
      if (gaveUp) return null;
      started = true;
      this.running = trigger;
      try {
        return await this.cut(trigger, at, deadline);
      } finally {
        this.running = null;
      }
    });
    this.queue = run;
    return new Promise<CheckpointTaken>((resolve, reject) => {
      // Still behind another checkpoint at the deadline: this one gives up (once started, the cut keeps its own deadline).
      const t = clock.setTimeout(() => {
        if (started) return;
        gaveUp = true;
        reject(new HetpsError(`checkpoint (${trigger}): the ${this.running ?? 'previous'} checkpoint before it was still being taken after ${Math.round(within / 1000)} s; `
          + 'nothing was paused for this one; try again (the driver\'s log says what that checkpoint waits for)'));
      }, Math.max(1, within));
      run.then((r) => { t.cancel(); if (r !== null) resolve(r); }, (e: unknown) => { t.cancel(); reject(e); });
    });
  }

  /**
   * Runs `fn` between checkpoints: none starts while it runs, and it waits
   * for the one being taken (a load-balancing handover must not move a
   * primary between a cut's freeze and the fetch of the frozen state).
   */
  exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.queue.catch(() => undefined).then(fn);
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async cut(trigger: CheckpointTrigger, at: string | undefined, deadline: number): Promise<CheckpointTaken> {
    const { clock, log, controller } = this.o;
    // Refused before the pause, not after it: the workers would stop for nothing.
    if (at !== undefined) await refuseExisting(at);
    // Training goes on meanwhile; a job paused already has no window in progress to wait for.
    const left = () => Math.max(0, deadline - clock.monotonic());
    const moment = this.o.moment && !controller.jobInfo.paused ? await this.o.moment(Math.min(this.o.momentCapMs ?? 5_000, left() / 4)) : null;
    const t0 = clock.monotonic();
    const paused = await controller.pauseUntilPaused(`checkpoint (${trigger})`, left());
    let acked: string[];
    let plan: ShardPlan;
    let info: JobInfo;
    let pauseMs: number;
    const tPaused = clock.monotonic();
    let snapshotMs = 0;
    const { frozen } = this.o;
    const token = `${this.o.job}/${trigger}/${t0}`;
    try {
      plan = this.o.plan();
      info = controller.jobInfo;
      await Promise.all(plan.shards.map((shard) => frozen.freeze(shard, token)));
      snapshotMs = clock.monotonic() - tPaused;
      acked = [...this.o.acked()].sort();
    } finally {
      if (!paused.already) await controller.resume();
      pauseMs = paused.already ? 0 : clock.monotonic() - t0;
    }
    const t1 = clock.monotonic();
    // A delta on the chain, unless a full one is due (or the chain is unknown: the first, or after a failed write).
    // One at a path of its own is full and leaves the chain as it was.
    const chain = this.chain;
    const byShards = frozen.write;
    // Written by the shards, each keeps its own row steps for the deltas.
    const full = at !== undefined || chain === null || chain.names.length >= (this.o.fullEvery ?? 1)
      || (byShards === undefined && !plan.shards.every((shard) => chain.steps.has(shard)));
    if (at === undefined) this.chain = null;
    let rows = 0;
    let held = 0;
    let optimizer: { dense: string; sparse: string } | null = null;
    const steps = new Map<string, RowSteps>();
    const partBytes = this.o.filePartBytes;
    // One shard at a time (the next one fetched while this one is written): the driver never holds the whole model.
    async function* files(): AsyncGenerator<CheckpointFileContent> {
      const take = (i: number) => {
        const p = i < plan.shards.length ? frozen.take(plan.shards[i]!, token) : null;
        p?.catch(() => undefined); // awaited below, unless an earlier write failed
        return p;
      };
      let next = take(0);
      for (let i = 0; i < plan.shards.length; i++) {
        const shard = plan.shards[i]!;
        const snap = await next!;
        next = take(i + 1);
        optimizer ??= { dense: snap.dense_optimizer, sparse: snap.sparse_optimizer };
        let out = snap;
        if (full) {
          for (const t of snap.sparse) { rows += t.ids.length; held += t.ids.length; }
          steps.set(shard, rowSteps(snap));
        } else {
          const d = deltaOf(snap, chain!.steps.get(shard)!);
          out = d.delta;
          rows += d.rows;
          held += d.of;
        }
        yield* shardFiles(shard, out, partBytes);
      }
    }
    // The shards write their files themselves, all at once, into the directory the checkpoint is made in.
    const fellBackToFull: string[] = [];
    async function* writtenByShards(dir: string, name: string): AsyncGenerator<WrittenFile> {
      const ask = { ...(at === undefined ? { name } : {}), base: full ? null : chain!.names.at(-1)! };
      const written = await Promise.all(plan.shards.map((shard) => byShards!(shard, token, dir, ask)));
      for (const [i, w] of written.entries()) {
        optimizer ??= { dense: w.dense_optimizer, sparse: w.sparse_optimizer };
        rows += w.rows;
        held += w.rows_held;
        if (!full && w.kind === 'full') fellBackToFull.push(plan.shards[i]!);
        for (const f of w.files) yield { written: f };
      }
    }
    const content: CheckpointContent = {
      files: byShards !== undefined ? writtenByShards : files(),
      manifest: () => ({
        kind: full ? 'full' : 'delta', chain: full ? [] : [...chain!.names],
        job: this.o.job, run_id: info.run_id, trigger,
        plan: { version: plan.version, shards: [...plan.shards], placement: plan.placement ?? null },
        groups: info.groups ?? null,
        optimizer,
        model: this.o.model,
        data: { total_batches: this.o.totalBatches, acked },
      }),
    };
    const { path, manifest } = at !== undefined ? await writeCheckpointAt(at, content) : await writeCheckpoint(this.o.root, content);
    // A shard that did not write the chain's last checkpoint (a primary moved) wrote its files full: still a valid link.
    if (fellBackToFull.length > 0) log.info({ shards: fellBackToFull }, `checkpoint ${manifest.name}: shard(s) ${fellBackToFull.join(', ')} wrote full files in this delta (their primary did not write the checkpoint before it)`);
    if (at === undefined) this.chain = full
      ? { names: [manifest.name], steps }
      : { names: [...chain!.names, manifest.name], steps: chain!.steps };
    const pruned = at !== undefined ? [] : await pruneCheckpoints(this.o.root, this.o.keep);
    const taken: CheckpointTaken = {
      path, name: manifest.name, trigger, bytes: manifest.bytes, files: manifest.files.length, kind: manifest.kind, written_by: byShards !== undefined ? 'shards' : 'driver', rows, rows_held: held, batches_done: acked.length,
      pause_ms: Math.round(pauseMs), pausing_ms: paused.already ? 0 : Math.round(tPaused - t0), snapshot_ms: Math.round(snapshotMs), write_ms: Math.round(clock.monotonic() - t1), pruned: pruned.length,
      moment_wait_ms: moment?.waited_ms ?? 0, aligned: moment?.aligned ?? false,
    };
    this.taken.push(taken);
    log.info(taken, `checkpoint ${manifest.name} (${trigger}, ${manifest.kind}${full ? '' : ` on ${chain!.names.at(-1)}`}): ${manifest.files.length} files, `
      + `${rows}/${held} sparse rows, ${(manifest.bytes / 2 ** 20).toFixed(2)} MiB, `
      + `${acked.length}/${this.o.totalBatches} batches done; training paused ${Math.round(pauseMs)} ms for the cut (${taken.pausing_ms} ms until every worker paused, ${taken.snapshot_ms} ms of snapshots)`
      + `${describeMoment(moment)}, written${byShards !== undefined ? ' by the shards' : ''} in ${taken.write_ms} ms`);
    return taken;
  }
}

/** How the cut's moment came, for the log line ('' when there was nothing to wait for). */
function describeMoment(m: CutMomentWait | null): string {
  if (m === null) return '';
  if (m.aligned) return ` taken ${m.waited_ms} ms after it was due, with every worker stepping`;
  return m.exchanging.length ? ` taken after ${m.waited_ms} ms with ${m.exchanging.join(', ')} still exchanging` : '';
}
