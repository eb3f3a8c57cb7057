/**
 * Actor systems of one job on an in-process bus, each on its own transport
 * (what `hetps up --embedded` starts), for tests that run nodes side by side.
 */
import { ActorSystem, InProcessBroker, SeededRandom, connectTransport, silentLogger, systemClock, type Transport } from '../../runtime/mod.ts';

export interface InProcessBus {
  /** A new system `name` of the job on the bus. */
  system(name: string): Promise<ActorSystem>;
  /**
   * Stops every system, the first one last (a driver made first outlives its
   * nodes); `beforeFirst` runs between (e.g. closing a queue the nodes used);
   * then closes every transport.
   */
  close(o?: { stop?: { timeoutMs?: number }; beforeFirst?: () => Promise<void> }): Promise<void>;
}

export function inProcessBus(job: string): InProcessBus {
  const broker = new InProcessBroker();
  const transports: Transport[] = [];
  const systems: ActorSystem[] = [];
  return {
    async system(name) {
      const t = await connectTransport({ servers: null, broker, name });
      transports.push(t);
      const s = new ActorSystem({ transport: t, job, node: name, clock: systemClock, random: new SeededRandom(1), logger: silentLogger() });
      systems.push(s);
      return s;
    },
    async close(o = {}) {
      for (const s of systems.slice(1).reverse()) await s.stop(o.stop);
      await o.beforeFirst?.();
      await systems[0]?.stop(o.stop);
      for (const t of transports) await t.close();
    },
  };
}
