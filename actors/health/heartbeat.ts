/**
 * A node's heartbeat: `{ node, role, incarnation, state, seq }` on
 * `hps.<job>.hb.<node>` every `fault_tolerance.heartbeat_ms`.
 *
 * It runs on its own timer, apart from the work: a step waiting on a stalled
 * shard or a group round never delays it, so a node that is alive but
 * blocked keeps saying so. A node process beats from a thread of its own
 * (ThreadedHeartbeat), so synchronous work cannot delay it either.
 * On a normal exit the last heartbeat says `stopped`, so the health actor
 * does not wait dead_after_ms to know.
 */
import { Worker } from 'node:worker_threads';
import { encode, heartbeatSubject, type Clock, type NatsAuth, type NatsTls, type Timer, type Transport } from '../../runtime/mod.ts';
import { LEAVING_STATE } from '../../topology/mod.ts';
import type { HeartbeatMessage } from './health.messages.ts';
import type { NodeRole } from './health.types.ts';
import type { HeartbeatThreadData } from './heartbeat-thread.ts';

export interface HeartbeatOptions {
  transport: Transport;
  job: string;
  node: string;
  role: NodeRole;
  incarnation: string;
  periodMs: number;
  clock: Clock;
  /** The node's own state for each heartbeat (a worker's loop state). */
  state?: () => string;
}

export class HeartbeatPublisher {
  private seq = 0;
  private timer: Timer | null = null;
  private readonly subject: string;

  constructor(private readonly o: HeartbeatOptions) {
    this.subject = heartbeatSubject(o.job, o.node);
  }

  start(): this {
    if (this.timer !== null) return this;
    this.beat(this.o.state?.() ?? 'running');
    this.timer = this.o.clock.setInterval(() => this.beat(this.o.state?.() ?? 'running'), this.o.periodMs);
    return this;
  }

  /** Stops the timer; `leaving`: one last heartbeat saying the node stopped (a normal exit). */
  stop(leaving = true): void {
    this.timer?.cancel();
    this.timer = null;
    if (leaving) this.beat(LEAVING_STATE);
  }

  private beat(state: string): void {
    const body: HeartbeatMessage = { node: this.o.node, role: this.o.role, incarnation: this.o.incarnation, state, seq: ++this.seq };
    try {
      this.o.transport.publish(this.subject, encode(body));
    } catch {
      // A closed or reconnecting connection: the next beat tries again; silence is what the health actor judges.
    }
  }
}

/**
 * A process's heartbeat from a thread of its own, with its own NATS
 * connection (heartbeat-thread.ts): a long synchronous stretch on the main
 * thread (the device probe at join takes seconds of CPU on a busy machine)
 * cannot starve it. The main thread only tells it the node's state when it
 * changes. For nodes on the in-process bus use HeartbeatPublisher directly.
 */
export class ThreadedHeartbeat {
  private readonly thread: Worker;
  private last: string;
  private readonly poll: Timer;
  private stopped = false;

  constructor(o: {
    servers: string[]; auth: NatsAuth | null; tls: NatsTls | null; job: string; node: string; role: NodeRole; incarnation: string;
    periodMs: number; clock: Clock; state: () => string;
  }) {
    this.last = o.state();
    const data: HeartbeatThreadData = {
      servers: o.servers, auth: o.auth, tls: o.tls, job: o.job, node: o.node, role: o.role, incarnation: o.incarnation, periodMs: o.periodMs, state: this.last,
    };
    this.thread = new Worker(new URL('./heartbeat-thread.mjs', import.meta.url), { workerData: data });
    // The thread must never keep a finished process alive, nor take it down.
    this.thread.unref();
    this.thread.on('error', () => undefined);
    this.poll = o.clock.setInterval(() => {
      const s = o.state();
      if (s !== this.last) { this.last = s; this.thread.postMessage({ type: 'state', state: s }); }
    }, o.periodMs);
  }

  /** Stops beating; `leaving`: one last heartbeat saying the node stopped. Resolves once it is sent (at most `timeoutMs`). */
  async stop(leaving = true, timeoutMs = 2_000): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    this.poll.cancel();
    const done = new Promise<void>((resolve) => {
      this.thread.on('message', (m: { type: string }) => { if (m.type === 'stopped') resolve(); });
      this.thread.once('exit', () => resolve());
    });
    this.thread.postMessage({ type: 'stop', leaving });
    await Promise.race([done, new Promise<void>((r) => setTimeout(r, timeoutMs).unref())]);
    await this.thread.terminate().catch(() => undefined);
  }
}
