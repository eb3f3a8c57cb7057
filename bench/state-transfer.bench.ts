/**
 * A shard's whole state across NATS: the checkpoint fetch (`take_frozen`)
 * and the resume's restore, as one message against in segments
 * (`take_frozen_part`, `restore_begin` / `restore_part`;
 * actors/shard/snapshot-segments.ts), side by side on one local 3-node
 * cluster: the shard on node 1, the driver's client on node 2, so every
 * message crosses a route (chunked at NATS' 1 MiB max_payload).
 *
 *   whole       one message each way (what hetps did before segments; it
 *               needs communication.max_message_bytes ≥ the state)
 *   segmented   the same state in segments of at most 64 MiB (the default
 *               limit, 1 GiB, is not what bounds them)
 *   segmented_4mib  segments of ~4 MiB (a 4 MiB communication.max_message_bytes)
 *
 * The state: 4 MiB of dense parameters with Adam's two slots, and an
 * Adagrad table of dim 16 (SIZES rows: ~18 MB and ~81 MB of state). Whole and
 * segmented alternate in back-to-back rounds; `ratio` is the median over
 * rounds of whole time / segmented time (above 1: segments are faster).
 *
 * Goal, set before the first run: each segmented path ≥ 0.8 × the whole
 * message's speed (a price for states over the limit, not a slowdown of
 * every checkpoint).
 *
 * Writes bench/results/state-transfer.json; `--quick` runs fewer rounds and
 * does not write it.
 */
import type { ShardSnapshot } from '../actors/mod.ts';
import { alternateRounds } from './chaos.ts';
import { median } from './stats.ts';
import { SIZES, STATE, shardLab, writeBenchResult } from './shard-lab.ts';

const quick = process.argv.includes('--quick');
const ROUNDS = quick ? 2 : 6;
const GOAL = 0.8;

function stateBytes(s: ShardSnapshot): number {
  let n = 0;
  for (const d of s.dense) n += d.values.byteLength + d.state.reduce((a, x) => a + x.byteLength, 0);
  for (const t of s.sparse) n += t.ids.byteLength + t.values.byteLength + t.state.byteLength + t.steps.byteLength;
  return n;
}

async function main(): Promise<void> {
  const lab = await shardLab('hetps-bench-state-', [{ name: 'driver' }, { name: 'driver4', maxMessageBytes: 4 * 1024 * 1024 }]);
  const results: Record<string, unknown> = {};
  try {
    const segmented = lab.clients.get('driver')!;
    const segmented4 = lab.clients.get('driver4')!;
    const { ref } = lab;
    let token = 0;
    for (const size of SIZES) {
      await lab.grow(size.rows);
      const time = async (fn: () => Promise<unknown>) => { const t0 = performance.now(); await fn(); return (performance.now() - t0) / 1000; };
      const fetchWhole = () => time(async () => { const t = `t${token++}`; await ref.request('freeze', { token: t }); await ref.request('take_frozen', { token: t }); });
      const fetchWith = (c: typeof segmented) => () => time(async () => { const t = `t${token++}`; await c.freeze('s0', t); await c.takeFrozen('s0', t); });
      const snap = await segmented.snapshot('s0');
      const bytes = stateBytes(snap);
      const restoreWhole = () => time(() => ref.request('restore', { state: snap as unknown as Record<string, unknown> }));
      const restoreWith = (c: typeof segmented) => () => time(() => c.restore('s0', snap));
      const row: Record<string, unknown> = { rows: size.rows, state_bytes: bytes };
      for (const [name, whole, seg] of [
        ['fetch_segmented', fetchWhole, fetchWith(segmented)], ['fetch_segmented_4mib', fetchWhole, fetchWith(segmented4)],
        ['restore_segmented', restoreWhole, restoreWith(segmented)], ['restore_segmented_4mib', restoreWhole, restoreWith(segmented4)],
      ] as const) {
        await whole(); await seg(); // warm-up
        const { rawSeconds, oursSeconds, paired } = await alternateRounds(ROUNDS, whole, seg);
        const ratio = +median(paired)!.toFixed(3);
        row[name] = {
          whole_mb_per_s: +((bytes * ROUNDS) / rawSeconds / 1e6).toFixed(1), segmented_mb_per_s: +((bytes * ROUNDS) / oursSeconds / 1e6).toFixed(1),
          ratio, met: ratio >= GOAL,
        };
        process.stderr.write(`${size.name} ${name}: ${JSON.stringify(row[name])}\n`);
      }
      results[size.name] = row;
    }
  } finally {
    await lab.close();
  }
  writeBenchResult('state-transfer', {
    goals: { ratio: GOAL, note: 'each segmented path (fetch and restore, segments of ≤ 64 MiB and of ~4 MiB) ≥ 0.8 × one whole message, the same state; ratio = median over rounds of whole time / segmented time' },
    ...results,
    setup: {
      cluster: { nodes: 3, max_payload: 'nats default (1 MiB)', note: 'shard on node 1, the client on node 2' },
      rounds: ROUNDS, state: STATE,
      fetch: 'freeze + take_frozen (whole) or freeze + take_frozen / take_frozen_part (segmented), the copy rebuilt in the client',
      restore: 'restore { state } (whole) or restore_begin / restore_part / restore { transfer } (segmented)',
    },
  }, quick);
}

await main();
