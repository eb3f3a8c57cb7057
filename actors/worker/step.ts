/**
 * One training step of a parameter-server worker: the batch's unique ids,
 * pulls from the shards that own them (and every dense block), the step
 * graph, and one push per shard — all shards in parallel. Used by the worker
 * actor's loop and by the API's wrapped optimizer.
 */
import {
  InvalidTensorError, ValidationError, type Clock, type Logger,
} from '../../runtime/mod.ts';
import type { ShardPlan } from '../../topology/mod.ts';
import {
  CtrModel, buildCtrFeeds, buildMlpFeeds, bucketCtrIds, ctrBagIndex, hashedBagOfIds, headOfBatch, runTrainingStep, streamOptions,
  type Batch, type CtrBagIndex, type DataSource, type MlpModel, type StepSession,
} from '../../native-bridge/mod.ts';
import type { BatchDescriptor } from '../batch-queue.ts';
import { EMB_TABLE, WIDE_TABLE, type SparseLayout } from '../config-bridge.ts';
import { allocateDense, assemblePull, planExchange, pullRequest, pushRequest } from './param-exchange.ts';
import type { ShardClient } from './shard-client.ts';

/** The batch a descriptor names, regenerated from the (deterministic) data source. */
export function batchFromDescriptor(source: DataSource, desc: BatchDescriptor): Batch {
  const it = source.batchesSync(streamOptions(desc.split, desc.batch_size, { epoch: desc.epoch, skipBatches: desc.index }));
  const first = it.next();
  it.return?.();
  if (first.done) throw new ValidationError(`batch ${desc.batch_id} does not exist: the ${desc.split} split of epoch ${desc.epoch} has fewer than ${desc.index + 1} batches of ${desc.batch_size}`);
  const batch = first.value;
  if (batch.batchId !== desc.batch_id) {
    throw new ValidationError(`descriptor ${desc.batch_id} regenerates as ${batch.batchId}: this node's data settings differ from the driver's (same config file?)`);
  }
  return headOfBatch(batch, desc.samples);
}

export interface SyncRound {
  round: number;
  /** Contributions the round needs (one per worker). */
  expected: number;
}

export interface StepOutcome {
  /** null for an empty contribution. */
  loss: number | null;
  samples: number;
  /** Largest staleness the shards reported for this step's pushes. */
  staleness: number;
  computeMs: number;
}

export interface WorkerStepperOptions {
  client: ShardClient;
  plan: ShardPlan;
  model: CtrModel | MlpModel;
  layout: SparseLayout;
  session: StepSession;
  clock: Clock;
  log: Logger;
  /** nodes.<name>.emulate.speed: compute time is stretched by 1 / speed; null = not emulated. */
  emulateSpeed: number | null;
}

export class WorkerStepper {
  private readonly dense: Map<string, Float32Array>;
  private steps = 0;

  constructor(private readonly o: WorkerStepperOptions) {
    this.dense = allocateDense(o.plan);
  }

  /**
   * One step on `batch` (null: an empty contribution to a bsp round). With
   * `sync`, pulls wait until the round's predecessor is applied and pushes
   * are contributions to the round; without, both are immediate (asp).
   */
  async run(batch: Batch | null, sync: SyncRound | null): Promise<StepOutcome> {
    const { plan, model, layout, client } = this.o;
    const tables = layout.tables;
    let index: CtrBagIndex | null = null;
    if (batch !== null && model instanceof CtrModel) {
      if (batch.kind !== 'ctr') throw new InvalidTensorError(`the ctr model cannot train on ${batch.kind} batch ${batch.batchId}`);
      const ids = layout.hashBuckets === null ? batch.ids : bucketCtrIds(batch.offsets, batch.ids, batch.slots, layout.hashBuckets);
      index = ctrBagIndex(batch.offsets, ids);
    }
    const exchanges = planExchange(plan, index?.uniqueIds ?? null, { dense: batch !== null, allShards: sync !== null });
    const minRound = sync?.round ?? null;
    const replies = await Promise.all(exchanges.map((ex) => client.pull(ex.shard, pullRequest(plan, ex, tables, minRound), sync?.expected ?? null)));
    const versions = new Map(exchanges.map((ex, s) => [ex.shard, replies[s]!.version]));

    if (batch === null) {
      const pushes = await Promise.all(exchanges.map((ex) => client.push(ex.shard, pushRequest(plan, ex, tables, null, null, {
        round: sync?.round ?? null, expected: sync?.expected ?? null, weight: 0, baseVersion: versions.get(ex.shard)!,
      }))));
      return { loss: null, samples: 0, staleness: Math.max(0, ...pushes.map((p) => p.staleness)), computeMs: 0 };
    }

    const U = index?.uniqueIds.length ?? 0;
    const rows = assemblePull(exchanges, replies, tables, this.dense, U);
    const step = ++this.steps;
    const t0 = this.o.clock.monotonic();
    let result;
    if (model instanceof CtrModel) {
      const b = batch as Extract<Batch, { kind: 'ctr' }>;
      const gathered = { index: index!, embRows: rows.get(EMB_TABLE)!, wideRows: rows.get(WIDE_TABLE) ?? new Float32Array(U) };
      result = await runTrainingStep(this.o.session, model, buildCtrFeeds(model, b, gathered, this.dense, 'step'), step);
    } else {
      const mlpBatch = batch.kind === 'mlp' ? batch : hashedBagOfIds(batch, model.inputWidth);
      result = await runTrainingStep(this.o.session, model, buildMlpFeeds(model, mlpBatch, this.dense, 'step'), step);
    }
    const computeMs = this.o.clock.monotonic() - t0;
    const speed = this.o.emulateSpeed;
    // Emulated heterogeneity: a node at speed s takes 1/s times as long per step.
    if (speed !== null && speed < 1) await this.o.clock.sleep(computeMs * (1 / speed - 1));

    const rowGrads = result.rowGrads === null ? null : new Map([[EMB_TABLE, result.rowGrads.emb], [WIDE_TABLE, result.rowGrads.wide]]);
    const pushes = await Promise.all(exchanges.map((ex) => client.push(ex.shard, pushRequest(plan, ex, tables, result.denseGrads, rowGrads, {
      round: sync?.round ?? null, expected: sync?.expected ?? null, weight: batch.size, baseVersion: versions.get(ex.shard)!,
    }))));
    return { loss: result.loss, samples: batch.size, staleness: Math.max(0, ...pushes.map((p) => p.staleness)), computeMs };
  }
}
