/**
 * The test split evaluated against the parameters the shards hold: the dense
 * parameters are pulled, each test batch pulls the rows it needs, and the
 * eval graph scores it — the same metrics `LocalTrainer.evaluate` reports,
 * so a distributed run compares directly with `train-local`.
 *
 * `ShardEvaluator` keeps its session (and, for a fixed test subset, the
 * batches and their id indexes) between calls, so the driver can evaluate a
 * small subset every few seconds while training runs at the cost of the
 * pulls and one eval graph run per batch.
 */
import type { ShardPlan } from '../../topology/mod.ts';
import {
  BinaryTally, CtrModel, StepSession, buildCtrFeeds, buildMlpFeeds, bucketCtrIds, MulticlassTally, ctrBagIndex,
  hashedBagOfIds, headOfBatch, streamOptions, type Batch, type CtrBagIndex, type DataSource, type Evaluation, type MlpModel,
} from '../../native-bridge/mod.ts';
import { EMB_TABLE, WIDE_TABLE, type SparseLayout } from '../node/config-bridge.ts';
import { allocateDense, assemblePull, planExchange, pullRequest, type ShardExchange } from '../worker/param-exchange.ts';
import type { ShardClient } from '../worker/shard-client.ts';

/** Evaluation batches are larger than training ones: no gradients, fewer session calls. */
export const EVAL_BATCH_MIN = 512;

export interface EvaluateOptions {
  client: ShardClient;
  plan: ShardPlan;
  model: CtrModel | MlpModel;
  layout: SparseLayout;
  source: DataSource;
  batchSize: number;
  /** ONNX Runtime threads per operator; null = every CPU. */
  threads: number | null;
}

export interface ShardEvaluatorOptions extends EvaluateOptions {
  /** Evaluate on the first this many test samples (the same ones every call); null = the whole test split. */
  maxSamples: number | null;
}

/** A test batch with what its pulls need, computed once. */
interface PreparedBatch {
  batch: Batch;
  index: CtrBagIndex | null;
  exchanges: ShardExchange[];
}

export class ShardEvaluator {
  private cached: PreparedBatch[] | null = null;

  private constructor(private readonly o: ShardEvaluatorOptions, private readonly session: StepSession) {}

  static async create(o: ShardEvaluatorOptions): Promise<ShardEvaluator> {
    const session = await StepSession.create(o.model, { provider: 'cpu', intraOpNumThreads: o.threads, graph: 'eval' });
    return new ShardEvaluator(o, session);
  }

  private *batches(): Generator<PreparedBatch> {
    const { plan, layout, source, maxSamples } = this.o;
    let left = maxSamples ?? Number.POSITIVE_INFINITY;
    for (const raw of source.batchesSync(streamOptions('test', this.o.batchSize, { shuffle: false }))) {
      if (left <= 0) break;
      const batch = headOfBatch(raw, Math.min(raw.size, left));
      left -= batch.size;
      let index: CtrBagIndex | null = null;
      if (this.o.model instanceof CtrModel) {
        if (batch.kind !== 'ctr') throw new Error(`the ctr model cannot read ${batch.kind} batch ${batch.batchId}`);
        const ids = layout.hashBuckets === null ? batch.ids : bucketCtrIds(batch.offsets, batch.ids, batch.slots, layout.hashBuckets);
        index = ctrBagIndex(batch.offsets, ids);
      }
      yield { batch, index, exchanges: planExchange(plan, index?.uniqueIds ?? null, { dense: false, allShards: false }) };
    }
  }

  /** The prepared batches: kept for a fixed subset, regenerated per call for the whole split (it may be large). */
  private prepared(): Iterable<PreparedBatch> {
    if (this.o.maxSamples === null) return this.batches();
    this.cached ??= [...this.batches()];
    return this.cached;
  }

  async evaluate(): Promise<Evaluation> {
    const { client, plan, model, layout } = this.o;
    const tables = layout.tables;
    const dense = allocateDense(plan);
    const denseEx = planExchange(plan, null, { dense: true, allShards: false });
    const pullDense = Promise.all(denseEx.map((ex) => client.pull(ex.shard, pullRequest(plan, ex, [], null))));

    if (model instanceof CtrModel) {
      const tally = new BinaryTally();
      const score = async (p: PreparedBatch, replies: Awaited<ReturnType<ShardClient['pull']>>[]) => {
        const b = p.batch as Extract<Batch, { kind: 'ctr' }>;
        const U = p.index!.uniqueIds.length;
        const rows = assemblePull(p.exchanges, replies, tables, dense, U);
        const gathered = { index: p.index!, embRows: rows.get(EMB_TABLE)!, wideRows: rows.get(WIDE_TABLE) ?? new Float32Array(U) };
        tally.add(b.labels, (await this.session.run(buildCtrFeeds(model, b, gathered, dense, 'eval'))).f32('predictions'), b.size);
      };
      if (this.o.maxSamples !== null) {
        // A small subset: every pull at once, so the scores are of (nearly) one moment of training.
        const batches = [...this.prepared()];
        const replies = await Promise.all(batches.map((p) => Promise.all(p.exchanges.map((e) => client.pull(e.shard, pullRequest(plan, e, tables, null))))));
        assemblePull(denseEx, await pullDense, [], dense, 0);
        for (let k = 0; k < batches.length; k++) await score(batches[k]!, replies[k]!);
      } else {
        assemblePull(denseEx, await pullDense, [], dense, 0);
        for (const p of this.prepared()) {
          await score(p, await Promise.all(p.exchanges.map((e) => client.pull(e.shard, pullRequest(plan, e, tables, null)))));
        }
      }
      return tally.result();
    }
    assemblePull(denseEx, await pullDense, [], dense, 0);
    const tally = new MulticlassTally(model.classes);
    for (const { batch } of this.prepared()) {
      const mlpBatch = batch.kind === 'mlp' ? batch : hashedBagOfIds(batch, model.inputWidth);
      tally.add(mlpBatch.labels, (await this.session.run(buildMlpFeeds(model, mlpBatch, dense, 'eval'))).f32('predictions'), mlpBatch.size);
    }
    return tally.result();
  }

  async dispose(): Promise<void> {
    await this.session.dispose();
  }
}

/** The whole test split, once. */
export async function evaluateOnShards(o: EvaluateOptions): Promise<Evaluation> {
  const evaluator = await ShardEvaluator.create({ ...o, maxSamples: null });
  try {
    return await evaluator.evaluate();
  } finally {
    await evaluator.dispose();
  }
}
