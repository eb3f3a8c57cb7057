/**
 * The health verdicts as any actor reads them (a `HealthView`): listens on
 * `hps.<job>.tel.health.*` and, once at start, asks the health actor for the
 * verdicts it already made, so a node that joins late knows them too.
 */
import { decode, telemetryWildcard, type ActorSystem } from '../../runtime/mod.ts';
import { healthVerdictSchema, type HealthVerdicts } from './health.messages.ts';
import { HEALTH_ACTOR_ID, HEALTH_TELEMETRY_KIND } from './health.actor.ts';
import type { HealthState, HealthView } from './health.types.ts';

export class HealthWatcher implements HealthView {
  private readonly states = new Map<string, HealthState>();
  private readonly listeners = new Set<(node: string, state: HealthState) => void>();
  private readonly sub: { unsubscribe(): void };

  private constructor(private readonly system: ActorSystem) {
    this.sub = system.transport.subscribe(telemetryWildcard(system.job, HEALTH_TELEMETRY_KIND), (m) => {
      let v: unknown;
      try { v = decode(m.data); } catch { return; }
      const r = healthVerdictSchema.safeParse(v);
      if (r.success) this.set(r.data.node, r.data.state);
    });
  }

  /** Subscribes, then reads the verdicts so far (best effort: without a health actor yet, the telemetry fills in later). */
  static async start(system: ActorSystem, o: { timeoutMs?: number } = {}): Promise<HealthWatcher> {
    const w = new HealthWatcher(system);
    try {
      const r = await system.ref('health', HEALTH_ACTOR_ID).request<HealthVerdicts & Record<string, unknown>>('verdicts', {}, { timeoutMs: o.timeoutMs ?? 2_000 });
      for (const n of r.nodes) if (!w.states.has(n.node)) w.set(n.node, n.state);
    } catch {
      // No health actor answered yet: verdicts arrive as telemetry when it starts.
    }
    return w;
  }

  stateOf(node: string): HealthState | null { return this.states.get(node) ?? null; }

  onChange(listener: (node: string, state: HealthState) => void): () => void {
    this.listeners.add(listener);
    return () => { this.listeners.delete(listener); };
  }

  dispose(): void {
    this.sub.unsubscribe();
    this.listeners.clear();
  }

  private set(node: string, state: HealthState): void {
    if (this.states.get(node) === state) return;
    this.states.set(node, state);
    for (const l of this.listeners) l(node, state);
  }
}
