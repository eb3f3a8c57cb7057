/**
 * The heartbeat thread's body: its own NATS connection and a
 * HeartbeatPublisher on its own event loop, so nothing the node's main
 * thread does — a long synchronous probe at join, a big batch, a stalled
 * peer — can delay a beat. The main thread sends its state (`state`) and,
 * at exit, `stop`.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { connectTransport, systemClock, type NatsAuth, type NatsTls } from '../../runtime/mod.ts';
import { HeartbeatPublisher } from './heartbeat.ts';
import type { NodeRole } from './health.types.ts';

export interface HeartbeatThreadData {
  servers: string[];
  auth: NatsAuth | null;
  tls: NatsTls | null;
  job: string;
  node: string;
  role: NodeRole;
  incarnation: string;
  periodMs: number;
  state: string;
}

const d = workerData as HeartbeatThreadData;
let state = d.state;
const transport = await connectTransport({ servers: d.servers, name: `hetps-${d.node}-heartbeat`, auth: d.auth, tls: d.tls });
const beats = new HeartbeatPublisher({
  transport, job: d.job, node: d.node, role: d.role, incarnation: d.incarnation, periodMs: d.periodMs, clock: systemClock, state: () => state,
}).start();
parentPort!.on('message', (m: { type: 'state'; state: string } | { type: 'stop'; leaving: boolean }) => {
  if (m.type === 'state') { state = m.state; return; }
  beats.stop(m.leaving);
  void (async () => {
    await transport.flush().catch(() => undefined);
    await transport.close().catch(() => undefined);
    parentPort!.postMessage({ type: 'stopped' });
  })();
});
parentPort!.postMessage({ type: 'started' });
