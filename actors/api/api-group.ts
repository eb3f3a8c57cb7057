/**
 * An API worker (`HeterogeneousParameterServer`) in a group that reduces
 * together (`sync`, `adaptive`, `accumulation`): the training script's loop
 * drives a `GroupMember` like the worker actor does.
 *
 * The script calls `optimizer.step(batch)` one batch at a time and wants the
 * loss back; the member pulls batches for its windows (`WindowSource.next`).
 * `GroupWindows` joins the two: a step waits in a lane until the member's
 * window takes it, and resolves with its loss as soon as the member stepped
 * it; the window's batches are acknowledged once the group's update of them
 * is out (at the window's end), exactly as a launched worker does. When the
 * data loader finds no batch it tells the lane, so a window does not wait for
 * a batch that will not come; after the script's loop ends, `finish` keeps
 * taking part in (idle) windows until the whole group agrees the job is done.
 */
import { HetpsError, type Logger } from '../../runtime/mod.ts';
import type { Batch } from '../../native-bridge/mod.ts';
import type { QueuedBatch } from '../store/batch-queue.ts';
import type { GroupMember, WindowOutcome, WindowStep } from '../group/group-sync.ts';

interface PendingStep {
  batch: Batch;
  item: QueuedBatch;
  resolve: (step: WindowStep) => void;
  reject: (e: unknown) => void;
}

export interface GroupWindowsOptions {
  member: GroupMember;
  log: Logger;
  /** True when the job has no batch left anywhere (the queue's pending count is 0). */
  drained: () => Promise<boolean>;
  /** After each window: its batches (in step order) and outcome, to acknowledge and report. */
  onWindow: (held: readonly QueuedBatch[], outcome: WindowOutcome) => Promise<void>;
  shouldStop: () => boolean;
}

export class GroupWindows {
  private readonly lane: PendingStep[] = [];
  /** Steps the current window took, waiting for its end to be acknowledged. */
  private held: QueuedBatch[] = [];
  private current: PendingStep[] = [];
  private noBatch = false;
  private ended = false;
  private wake: (() => void) | null = null;
  private failure: unknown = null;
  private readonly loop: Promise<void>;

  constructor(private readonly o: GroupWindowsOptions) {
    this.loop = this.run().catch((e: unknown) => {
      this.failure = e;
      for (const p of [...this.current, ...this.lane.splice(0)]) p.reject(e);
    });
  }

  /** The script's `optimizer.step`: resolves with the step once the member's window trained it. */
  step(batch: Batch, item: QueuedBatch): Promise<WindowStep> {
    if (this.failure !== null) return Promise.reject(this.failure);
    if (this.ended) return Promise.reject(new HetpsError('step after the data loader ended'));
    return new Promise((resolve, reject) => {
      this.lane.push({ batch, item, resolve, reject });
      this.poke();
    });
  }

  /** The data loader found no batch right now: the window in progress closes with what it has. */
  noBatchNow(): void { this.noBatch = true; this.poke(); }

  /** The script's loop is over: take part in windows until the group agrees it is done. */
  async finish(): Promise<void> {
    this.ended = true;
    this.poke();
    await this.loop;
    if (this.failure !== null) throw this.failure;
  }

  private poke(): void { const w = this.wake; this.wake = null; w?.(); }

  private async next(): Promise<Batch | null> {
    for (;;) {
      const p = this.lane.shift();
      if (p !== undefined) {
        this.current.push(p);
        this.held.push(p.item);
        return p.batch;
      }
      if (this.ended || this.noBatch || this.o.shouldStop()) { this.noBatch = false; return null; }
      await new Promise<void>((r) => { this.wake = r; });
    }
  }

  private async run(): Promise<void> {
    for (;;) {
      this.held = [];
      this.current = [];
      let k = 0;
      const outcome = await this.o.member.runWindow({
        next: () => this.next(),
        drained: () => this.o.drained(),
        stepped: (s) => { this.current[k++]?.resolve(s); },
      });
      await this.o.onWindow(this.held, outcome);
      if (outcome.done || this.o.shouldStop()) return;
    }
  }
}
