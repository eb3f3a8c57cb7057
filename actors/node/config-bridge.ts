/**
 * The job YAML (topology) turned into native-bridge objects: optimizers, the
 * data source, the model, the sparse tables and the shard plan of a fresh
 * job, and the batch descriptors of every epoch. Shared by `train-local`, the
 * parameter-server nodes, the driver and the API, so a distributed run and
 * its single-process reference read a config the same way.
 */
import { ConfigError, MissingDependencyError } from '../../runtime/mod.ts';
import {
  buildShardPlan, imbalanceOf, partitionCount, relativeLoads, serverCapacities, partitionLoadsOf, shardLoadsOf, shardNames, type HetpsConfig, type OptimizerSettings, type ScheduleConfig as YamlSchedule, type ShardPlan, type SparseTableSpec,
} from '../../topology/mod.ts';
import {
  bucketCtrIds, createOptimizer, createSpamAssassinSource, ctrBagIndex, createSyntheticCtrSource, createSyntheticMlpSource, ctrModel, mlpModel, SPAM_ASSASSIN_PACKAGE,
  streamOptions, type CtrModel, type DataSource, type MlpModel, type Optimizer, type OptimizerConfigInput, type ScheduleConfig,
} from '../../native-bridge/mod.ts';
import type { BatchDescriptor } from '../store/batch-queue.ts';
import type { CheckpointModel } from '../store/checkpoint.ts';

/**
 * Embedding rows start uniform in ±0.05: small next to the He-initialised
 * tower, so early steps are driven by the wide part and the dense features
 * while the rows grow, and sum pooling over a few hundred tokens stays O(1).
 */
export const EMBEDDING_INIT_SCALE = 0.05;

/** Names of the ctr model's sparse tables on the shards. */
export const EMB_TABLE = 'emb';
export const WIDE_TABLE = 'wide';

function scheduleInput(s: YamlSchedule): ScheduleConfig {
  switch (s.type) {
    case 'constant': return { type: 'constant' };
    case 'step': return { type: 'step', stepSize: s.step_size, gamma: s.gamma };
    case 'exponential': return { type: 'exponential', gamma: s.gamma, decaySteps: s.decay_steps };
    case 'warmup_cosine': return { type: 'warmup-cosine', warmupSteps: s.warmup_steps, totalSteps: s.total_steps, minMultiplier: s.min_multiplier };
  }
}

/** The YAML's snake_case optimizer settings as an `OptimizerConfigInput`. */
export function optimizerInput(s: OptimizerSettings): OptimizerConfigInput {
  const base = { learningRate: s.learning_rate, weightDecay: s.weight_decay, schedule: scheduleInput(s.schedule) };
  switch (s.type) {
    case 'sgd': return { type: 'sgd', ...base };
    case 'momentum': return { type: 'momentum', ...base, momentum: s.momentum, nesterov: s.nesterov };
    case 'adam': return { type: 'adam', ...base, beta1: s.beta1, beta2: s.beta2, epsilon: s.epsilon, decoupledWeightDecay: s.decoupled_weight_decay };
    case 'adagrad': return { type: 'adagrad', ...base, epsilon: s.epsilon, initialAccumulator: s.initial_accumulator };
  }
}

/** The dense optimizer and (ctr only) the one for embedding and wide rows. */
export function optimizersFromConfig(config: HetpsConfig, model: CtrModel | MlpModel): { dense: Optimizer; sparse: Optimizer | null } {
  return {
    dense: createOptimizer(optimizerInput(config.optimizer)),
    sparse: model.family === 'ctr' ? createOptimizer(optimizerInput(config.optimizer.sparse)) : null,
  };
}

/**
 * The data source a config names. Spam Assassin: `vocab_size` is the hashed
 * id space, `max_tokens` the body words kept per mail, `test_fraction` the
 * held-out share; the split itself does not depend on `seed`, which only
 * shuffles. Synthetic sources generate `samples` / `test_samples`.
 * `spamPackage` exists for tests of the missing-package path.
 */
export function dataSourceFromConfig(config: HetpsConfig, spamPackage = SPAM_ASSASSIN_PACKAGE): DataSource {
  const d = config.data;
  switch (d.source) {
    case 'spam':
      try {
        return createSpamAssassinSource({ seed: d.seed, testFraction: d.test_fraction!, vocabularySize: d.vocab_size!, maxBodyTokens: d.max_tokens! }, spamPackage);
      } catch (e) {
        if (e instanceof MissingDependencyError) throw new MissingDependencyError(`data.source spam: ${e.message}`, { cause: e, data: { field: 'data.source', ...e.data } });
        throw e;
      }
    case 'ctr-synthetic':
      return createSyntheticCtrSource({
        seed: d.seed, slots: d.slots!, vocabularyPerSlot: d.vocab_size!, zipfExponent: d.zipf_exponent!, denseDim: d.dense_features!,
        trainSize: d.samples!, testSize: d.test_samples!, testOffset: d.test_offset!,
      });
    case 'mlp-synthetic': {
      const m = config.model.mlp;
      if (m === null) throw new ConfigError('data.source mlp-synthetic needs model.type mlp', { data: { field: 'model.type' } });
      return createSyntheticMlpSource({ seed: d.seed, featureDim: m.input_dim, latentDim: Math.min(16, m.input_dim), numClasses: m.classes, trainSize: d.samples!, testSize: d.test_samples!, testOffset: d.test_offset! });
    }
  }
}

/** The model a config names; a ctr model takes its slots and dense width from the data. */
export function modelFromConfig(config: HetpsConfig, source: DataSource): CtrModel | MlpModel {
  const desc = source.describe();
  if (config.model.type === 'ctr') {
    const c = config.model.ctr!;
    if (desc.kind !== 'ctr') throw new ConfigError(`model.type ctr needs a ctr data source, data.source ${config.data.source} is ${desc.kind}`, { data: { field: 'model.type' } });
    return ctrModel({ slots: desc.slots, embeddingDim: c.embedding_dim, denseFeatures: desc.denseDim, hidden: c.hidden, pooling: c.pooling });
  }
  const m = config.model.mlp!;
  if (desc.kind === 'mlp' && desc.featureDim !== m.input_dim) {
    throw new ConfigError(`model.mlp.input_dim is ${m.input_dim} but the data has ${desc.featureDim} features`, { data: { field: 'model.mlp.input_dim' } });
  }
  return mlpModel({ layers: [m.input_dim, ...m.hidden, m.classes] });
}

/** How the shards' rows are keyed and which tables exist: what a worker and the evaluator need besides the model. */
export interface SparseLayout {
  /** `bucketCtrIds` buckets (ctr); null = the data's ids as they are. */
  hashBuckets: number | readonly number[] | null;
  /** The wide table exists on the shards (ctr with `model.ctr.wide`). */
  wide: boolean;
  /** Tables on the shards: `emb` (dim = embedding dim) and, with wide, `wide` (dim 1); none for mlp. */
  tables: SparseTableSpec[];
}

export function sparseLayoutFromConfig(config: HetpsConfig, model: CtrModel | MlpModel): SparseLayout {
  const ctr = config.model.ctr;
  if (model.family !== 'ctr' || ctr === null) return { hashBuckets: null, wide: false, tables: [] };
  const tables: SparseTableSpec[] = [{ name: EMB_TABLE, dim: (model as CtrModel).config.embeddingDim }];
  if (ctr.wide) tables.push({ name: WIDE_TABLE, dim: 1 });
  return { hashBuckets: ctr.hash_buckets, wide: ctr.wide, tables };
}

/** The model as a checkpoint's manifest records it (what `hetps export` rebuilds the graph from). */
export function checkpointModelOf(config: HetpsConfig, model: CtrModel | MlpModel): CheckpointModel {
  if (model.family === 'mlp') return { type: 'mlp', layers: [...(model as MlpModel).config.layers] };
  const c = (model as CtrModel).config;
  const layout = sparseLayoutFromConfig(config, model);
  return {
    type: 'ctr', slots: c.slots, embedding_dim: c.embeddingDim, dense_features: c.denseFeatures, hidden: [...c.hidden], pooling: c.pooling,
    wide: layout.wide, hash_buckets: layout.hashBuckets === null ? null : typeof layout.hashBuckets === 'number' ? layout.hashBuckets : [...layout.hashBuckets],
  };
}

/** Room in a message for everything but a dense block's floats (envelope, other fields, NATS headers). */
const BLOCK_HEADROOM_BYTES = 16 * 1024;

/**
 * The plan of a fresh job: the model's dense parameters cut into blocks that
 * fit one message under `maxPayload`, and the sparse tables, over the
 * config's server nodes.
 */
export function shardPlanFromConfig(config: HetpsConfig, model: CtrModel | MlpModel, maxPayload: number, version = 1, partitionLoads: ArrayLike<number> | null = null): ShardPlan {
  const layout = sparseLayoutFromConfig(config, model);
  return buildShardPlan({
    version,
    shards: shardNames(config.cluster.server_nodes, config.cluster.shards_per_server),
    denseParams: model.denseParams.map((p) => ({ name: p.name, size: p.dims.reduce((a, b) => a * b, 1) })),
    sparseTables: layout.tables,
    partitions: null,
    partitionLoads,
    serverCapacity: serverCapacities(config),
    maxBlockBytes: Math.max(4096, Math.min(maxPayload, 8 << 20) - BLOCK_HEADROOM_BYTES),
    servers: [...config.cluster.server_nodes],
    backupFactor: config.fault_tolerance.backup_factor,
  });
}

/** What the warm-up measured and the plan it gave (the summary's and `hetps up`'s report). */
export interface ShardingReport {
  hotness: boolean;
  /** Batches the warm-up read (0 without sparse tables or with hotness off). */
  warmup_batches: number;
  partitions: number;
  /** Floats one batch moves to and from each shard (dense blocks and partitions), as the warm-up measured them; null when nothing was measured. */
  expected_loads: Record<string, number> | null;
  /**
   * (max − min) / max of `expected_loads` (each divided by its server's
   * `capacity` where servers differ), and of the plan without hotness —
   * partitions dealt round-robin, or by count in proportion to capacity —
   * under the same statistics.
   */
  expected_imbalance: number | null;
  round_robin_imbalance: number | null;
  /** Why hotness did not place the partitions, when it did not. */
  skipped: string | null;
}

/**
 * The warm-up statistics of hotness sharding: the floats each sparse
 * partition moves per batch, over the first `sharding.warmup_batches`
 * training batches of epoch 0 (the ids each batch's pull asks for, after
 * hashing); `{ skipped }`, saying why, where there is nothing to measure.
 */
export function partitionHotness(config: HetpsConfig, md: { model: CtrModel | MlpModel; source: DataSource }): { loads: Float64Array; batches: number } | { skipped: string } {
  if (!config.sharding.hotness) return { skipped: 'sharding.hotness is false' };
  const layout = sparseLayoutFromConfig(config, md.model);
  if (layout.tables.length === 0) return { skipped: 'the model has no sparse tables' };
  const partitions = partitionCount(shardNames(config.cluster.server_nodes, config.cluster.shards_per_server).length, null);
  const floatsPerId = layout.tables.reduce((n, t) => n + t.dim, 0);
  const limit = Math.min(config.sharding.warmup_batches, epochShape(config, md.source).batches);
  const r = partitionLoadsOf(trainingBatchIds(config, md, limit), partitions, floatsPerId);
  return r.batches === 0 ? { skipped: 'no training batches to sample' } : r;
}

/**
 * The distinct sparse ids of the first `limit` training batches of epoch 0,
 * hashed as the config says: what each batch's pull asks the shards for
 * (the worker's own indexing, `ctrBagIndex`).
 */
export function* trainingBatchIds(config: HetpsConfig, md: { model: CtrModel | MlpModel; source: DataSource }, limit: number): Generator<Int32Array> {
  const layout = sparseLayoutFromConfig(config, md.model);
  let n = 0;
  for (const b of md.source.batchesSync(streamOptions('train', config.data.batch_size, { epoch: 0 }))) {
    if (n++ >= limit) return;
    if (b.kind !== 'ctr') throw new ConfigError(`sparse ids: the ${md.model.family} model has no sparse tables to read ${b.kind} batch ${b.batchId} for`);
    const hashed = layout.hashBuckets === null ? b.ids : bucketCtrIds(b.offsets, b.ids, b.slots, layout.hashBuckets);
    yield ctrBagIndex(b.offsets, hashed).uniqueIds;
  }
}

/** The report of how `plan` placed its partitions, from the warm-up's result (`partitionHotness`). */
export function shardingReport(config: HetpsConfig, model: CtrModel | MlpModel, maxPayload: number, plan: ShardPlan, hot: ReturnType<typeof partitionHotness>): ShardingReport {
  if ('skipped' in hot) {
    return { hotness: false, warmup_batches: 0, partitions: plan.partitions, expected_loads: null, expected_imbalance: null, round_robin_imbalance: null, skipped: hot.skipped };
  }
  // Compared per unit of capacity where servers differ (each shard counts its primary's), as load balancing compares servers.
  const caps = serverCapacities(config);
  const shardCaps = caps === null ? null : new Map(plan.shards.map((s) => [s, caps[plan.placement.replicas[s]!.primary] ?? 1]));
  const spread = (l: Record<string, number>) => Number(imbalanceOf(relativeLoads(new Map(Object.entries(l)), shardCaps)).imbalance.toFixed(4));
  const expected = shardLoadsOf(plan, hot.loads);
  const roundRobin = shardPlanFromConfig(config, model, maxPayload, plan.version);
  return {
    hotness: true, warmup_batches: hot.batches, partitions: plan.partitions,
    expected_loads: Object.fromEntries(Object.entries(expected).map(([k, v]) => [k, Math.round(v)])),
    expected_imbalance: spread(expected), round_robin_imbalance: spread(shardLoadsOf(roundRobin, hot.loads)), skipped: null,
  };
}

/**
 * Training samples per epoch and the batches they make: spam's `data.samples`
 * caps the mails read per epoch (the last batch may be cut short), synthetic
 * sources were generated at that size — exactly what `train-local` trains on.
 */
export function epochShape(config: HetpsConfig, source: DataSource): { samples: number; batches: number } {
  const batchSize = config.data.batch_size;
  const available = source.describe().trainSize;
  const cap = config.data.source === 'spam' ? config.data.samples : null;
  const samples = cap === null ? available : Math.min(available, cap);
  const batches = Math.min(source.countBatches(streamOptions('train', batchSize, { epoch: 0 })), Math.ceil(samples / batchSize));
  return { samples, batches };
}

/** The descriptors of every training batch of the job, epoch by epoch, in stream order. */
export function batchDescriptors(config: HetpsConfig, source: DataSource): BatchDescriptor[] {
  const { samples, batches } = epochShape(config, source);
  const batchSize = config.data.batch_size;
  const name = source.describe().name;
  const out: BatchDescriptor[] = [];
  for (let epoch = 0; epoch < config.data.epochs; epoch++) {
    for (let index = 0; index < batches; index++) {
      out.push({
        batch_id: `${name}/train/e${epoch}/b${index}`,
        epoch, index, split: 'train', batch_size: batchSize,
        samples: Math.min(batchSize, samples - index * batchSize),
      });
    }
  }
  return out;
}
