/**
 * The driver's view of every hps worker's window cadence, from the `batch`
 * telemetry (a worker reports its window's batches right after the window's
 * update is out, then starts stepping its next one), so a checkpoint's cut
 * can wait for a moment when every worker is stepping (topology/cut-moment.ts):
 * the pause then drops a step instead of waiting for a group exchange to end.
 */
import { Wakeup, type Clock, type Transport } from '../../runtime/mod.ts';
import { DEFAULT_CUT_MOMENT, cutMomentWaitMs, msUntilNextIdle, nextCadence, workersExchanging, type CutMomentPolicy, type WorkerCadence } from '../../topology/mod.ts';
import { subscribeTelemetry } from '../monitor/telemetry.ts';

export interface CutMomentWait {
  /** Ms waited before the cut. */
  waited_ms: number;
  /** Every active worker was stepping (false: the wait ran out, or no worker has a cadence yet). */
  aligned: boolean;
  /** The workers still exchanging when the wait ran out. */
  exchanging: string[];
}

export class CutMoment {
  private readonly cadences = new Map<string, WorkerCadence>();
  private readonly windows = new Map<string, string>();
  private readonly unsubscribe: () => void;
  private readonly wakeup = new Wakeup();

  constructor(private readonly o: { transport: Transport; job: string; clock: Clock; policy?: CutMomentPolicy }) {
    this.unsubscribe = subscribeTelemetry(o.transport, o.job, {
      batch: (t) => {
        if (t.window === null) return; // asp / bsp: paused between steps anyway
        const key = `${t.group ?? ''}/${t.window}`;
        if (this.windows.get(t.node) === key) return; // the window's other batches
        this.windows.set(t.node, key);
        this.cadences.set(t.node, nextCadence(this.cadences.get(t.node), o.clock.monotonic()));
        this.wakeup.wake();
      },
    });
  }

  /** The workers' cadences as last seen (for reports and tests). */
  get known(): ReadonlyMap<string, WorkerCadence> { return this.cadences; }

  /**
   * Resolves at the next moment every active worker is stepping: at once
   * when that holds now, else at a boundary or when a worker's stepping part
   * begins to cover the others', and after at most `capMs` (the actual bound
   * is two of the longest period, see `cutMomentWaitMs`).
   */
  async wait(capMs: number): Promise<CutMomentWait> {
    const { clock } = this.o;
    const policy = this.o.policy ?? DEFAULT_CUT_MOMENT;
    const t0 = clock.monotonic();
    const limit = cutMomentWaitMs(t0, this.cadences, capMs, policy);
    for (;;) {
      const now = clock.monotonic();
      const exchanging = workersExchanging(now, this.cadences, policy);
      if (exchanging.length === 0) return { waited_ms: Math.round(now - t0), aligned: this.cadences.size > 0 && limit > 0, exchanging };
      const left = limit - (now - t0);
      if (left <= 0) return { waited_ms: Math.round(now - t0), aligned: false, exchanging };
      // Nothing changes between boundaries but time: the next check is at a boundary, or when a worker goes idle.
      await this.wakeup.changed(clock, Math.min(left, msUntilNextIdle(now, this.cadences, policy)));
    }
  }

  dispose(): void {
    this.unsubscribe();
    this.wakeup.wake();
  }
}
