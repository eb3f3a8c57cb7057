/**
 * A node's heartbeat: `{ node, role, incarnation, state, seq }` on
 * `hps.<job>.hb.<node>` every `fault_tolerance.heartbeat_ms`.
 *
 * It runs on its own timer, apart from the work: a step waiting on a stalled
 * shard or a group round never delays it (those are awaited promises, the
 * event loop stays free), so a node that is alive but blocked keeps saying so.
 * On a normal exit the last heartbeat says `stopped`, so the health actor
 * does not wait dead_after_ms to know.
 */
import { encode, heartbeatSubject, type Clock, type Timer, type Transport } from '../../runtime/mod.ts';
import { LEAVING_STATE } from '../../topology/mod.ts';
import type { HeartbeatMessage } from './health.messages.ts';
import type { NodeRole } from './health.types.ts';

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
