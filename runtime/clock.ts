/** Time is injected so timeouts can be tested without sleeping (`SimulatedClock.increment`). */
export interface Timer { cancel(): void }

export interface Clock {
  /** Milliseconds since the epoch (wall time). */
  now(): number;
  /** Monotonic milliseconds, for measuring durations. */
  monotonic(): number;
  setTimeout(fn: () => void, ms: number): Timer;
  setInterval(fn: () => void, ms: number): Timer;
  sleep(ms: number): Promise<void>;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  monotonic: () => performance.now(),
  setTimeout(fn, ms) {
    const h = setTimeout(fn, ms);
    return { cancel: () => clearTimeout(h) };
  },
  setInterval(fn, ms) {
    const h = setInterval(fn, ms);
    return { cancel: () => clearInterval(h) };
  },
  sleep: (ms) => new Promise((r) => setTimeout(r, ms)),
};

interface Scheduled { at: number; fn: () => void; every: number | null; id: number }

/** A clock that only moves when told to. Timers fire in time order during `increment`. */
export class SimulatedClock implements Clock {
  private t: number;
  private timers: Scheduled[] = [];
  private nextId = 0;
  constructor(start = 0) { this.t = start; }
  now(): number { return this.t; }
  monotonic(): number { return this.t; }
  setTimeout(fn: () => void, ms: number): Timer { return this.add(fn, ms, null); }
  setInterval(fn: () => void, ms: number): Timer { return this.add(fn, ms, Math.max(1, ms)); }
  sleep(ms: number): Promise<void> { return new Promise((r) => this.setTimeout(r, ms)); }
  /** Moves time forward by `ms`, firing every timer that falls due on the way. */
  increment(ms: number): void {
    const end = this.t + ms;
    for (;;) {
      this.timers.sort((a, b) => a.at - b.at || a.id - b.id);
      const next = this.timers[0];
      if (!next || next.at > end) break;
      this.t = next.at;
      if (next.every !== null) next.at += next.every;
      else this.timers.shift();
      next.fn();
    }
    this.t = end;
  }
  get pendingTimers(): number { return this.timers.length; }
  private add(fn: () => void, ms: number, every: number | null): Timer {
    const s: Scheduled = { at: this.t + Math.max(0, ms), fn, every, id: this.nextId++ };
    this.timers.push(s);
    return { cancel: () => { this.timers = this.timers.filter((x) => x !== s); } };
  }
}

/**
 * Waiters for "something changed": `changed` resolves on the next `wake`, or
 * after `ms` on `clock` (a waiter that timed out is forgotten at once).
 */
export class Wakeup {
  private wakers: (() => void)[] = [];

  changed(clock: Clock, ms: number): Promise<void> {
    return new Promise((resolve) => {
      const t = clock.setTimeout(() => { this.wakers = this.wakers.filter((f) => f !== done); resolve(); }, ms);
      const done = () => { t.cancel(); resolve(); };
      this.wakers.push(done);
    });
  }

  /** Wakes every waiter. */
  wake(): void {
    const w = this.wakers;
    this.wakers = [];
    for (const f of w) f();
  }
}
