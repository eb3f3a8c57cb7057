/**
 * The shard plan as a client follows it: the newest plan seen (from a watch
 * on the plan store), and a `refresh` that reads the store now, for a client
 * whose request was refused with StalePlanError or not answered (its primary
 * may have failed over). Only the placement may change under a view: a plan
 * that cuts the parameters differently is refused by name.
 */
import { ConfigError } from '../../runtime/mod.ts';
import { sameLayout, type ShardPlan } from '../../topology/mod.ts';
import type { PlanStore } from './plan-store.ts';

export class PlanView {
  private plan: ShardPlan;
  private stopWatch: (() => void) | null = null;
  private readonly listeners = new Set<(plan: ShardPlan) => void>();

  constructor(initial: ShardPlan, private readonly store: PlanStore | null) {
    this.plan = initial;
  }

  /** A view that follows `store` from `initial` on. */
  static follow(initial: ShardPlan, store: PlanStore): PlanView {
    const v = new PlanView(initial, store);
    v.stopWatch = store.watch((p) => v.offer(p), () => undefined);
    return v;
  }

  /** A view of one fixed plan (tests, a single in-process shard). */
  static fixed(plan: ShardPlan): PlanView { return new PlanView(plan, null); }

  get current(): ShardPlan { return this.plan; }

  /** Reads the store now (no store: the current plan). */
  async refresh(): Promise<ShardPlan> {
    if (this.store === null) return this.plan;
    const p = await this.store.get().catch(() => null);
    if (p !== null) this.offer(p);
    return this.plan;
  }

  onChange(l: (plan: ShardPlan) => void): () => void {
    this.listeners.add(l);
    return () => { this.listeners.delete(l); };
  }

  private offer(p: ShardPlan): void {
    if (p.version <= this.plan.version) return;
    if (!sameLayout(this.plan, p)) {
      throw new ConfigError(`shard plan v${p.version} cuts the parameters differently from v${this.plan.version}; a running client cannot follow it yet`);
    }
    this.plan = p;
    for (const l of this.listeners) l(p);
  }

  dispose(): void {
    this.stopWatch?.();
    this.stopWatch = null;
    this.listeners.clear();
  }
}
