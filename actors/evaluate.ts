/**
 * The test split evaluated against the parameters the shards hold: the dense
 * parameters are pulled once, each test batch pulls the rows it needs, and
 * the eval graph scores it — the same metrics `LocalTrainer.evaluate`
 * reports, so a distributed run compares directly with `train-local`.
 */
import type { ShardPlan } from '../topology/mod.ts';
import {
  CtrModel, StepSession, auc, binaryLogLoss, buildCtrFeeds, buildMlpFeeds, bucketCtrIds, crossEntropyFromProbabilities, ctrBagIndex,
  hashedBagOfIds, multiclassAccuracy, streamOptions, type DataSource, type Evaluation, type MlpModel,
} from '../native-bridge/mod.ts';
import { EMB_TABLE, WIDE_TABLE, type SparseLayout } from './config-bridge.ts';
import { allocateDense, assemblePull, planExchange, pullRequest } from './worker/param-exchange.ts';
import type { ShardClient } from './worker/shard-client.ts';

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

export async function evaluateOnShards(o: EvaluateOptions): Promise<Evaluation> {
  const { client, plan, model, layout } = o;
  const session = await StepSession.create(model, { provider: 'cpu', intraOpNumThreads: o.threads, graph: 'eval' });
  try {
    const dense = allocateDense(plan);
    const denseEx = planExchange(plan, null, { dense: true, allShards: false });
    const denseReplies = await Promise.all(denseEx.map((ex) => client.pull(ex.shard, pullRequest(plan, ex, [], null))));
    assemblePull(denseEx, denseReplies, [], dense, 0);
    const stream = streamOptions('test', o.batchSize, { shuffle: false });

    if (model instanceof CtrModel) {
      const labels: number[] = []; const scores: number[] = [];
      for (const batch of o.source.batchesSync(stream)) {
        if (batch.kind !== 'ctr') throw new Error(`the ctr model cannot read ${batch.kind} batch ${batch.batchId}`);
        const ids = layout.hashBuckets === null ? batch.ids : bucketCtrIds(batch.offsets, batch.ids, batch.slots, layout.hashBuckets);
        const index = ctrBagIndex(batch.offsets, ids);
        const ex = planExchange(plan, index.uniqueIds, { dense: false, allShards: false });
        const replies = await Promise.all(ex.map((e) => client.pull(e.shard, pullRequest(plan, e, layout.tables, null))));
        const U = index.uniqueIds.length;
        const rows = assemblePull(ex, replies, layout.tables, dense, U);
        const gathered = { index, embRows: rows.get(EMB_TABLE)!, wideRows: rows.get(WIDE_TABLE) ?? new Float32Array(U) };
        const p = (await session.run(buildCtrFeeds(model, batch, gathered, dense, 'eval'))).f32('predictions');
        for (let i = 0; i < batch.size; i++) { labels.push(batch.labels[i]!); scores.push(p[i]!); }
      }
      return { kind: 'ctr', auc: auc(labels, scores), logloss: binaryLogLoss(labels, scores), samples: labels.length };
    }
    const C = model.classes;
    let correct = 0; let ceSum = 0; let n = 0;
    for (const batch of o.source.batchesSync(stream)) {
      const mlpBatch = batch.kind === 'mlp' ? batch : hashedBagOfIds(batch, model.inputWidth);
      const p = (await session.run(buildMlpFeeds(model, mlpBatch, dense, 'eval'))).f32('predictions');
      correct += multiclassAccuracy(mlpBatch.labels, p, C) * mlpBatch.size;
      ceSum += crossEntropyFromProbabilities(p, mlpBatch.labels, C) * mlpBatch.size;
      n += mlpBatch.size;
    }
    return { kind: 'mlp', accuracy: correct / n, logloss: ceSum / n, samples: n };
  } finally {
    await session.dispose();
  }
}
