/**
 * A training script that takes part in a job as one of its workers, through
 * the API that mirrors the reference article's `HeterogeneousParameterServer`.
 *
 * Start the job without this node, then this script (any order works):
 *
 *   npx hetps up --config examples/quickstart.yaml --skip fast-1
 *   # hetps up prints "NATS cluster up: nats://127.0.0.1:…"; with those URLs:
 *   HETPS_NATS=nats://127.0.0.1:… node --import tsx examples/api-worker.ts examples/quickstart.yaml fast 0
 *
 * Arguments: config file, group, node rank (default: quickstart, fast, 0).
 * `HETPS_JOB` overrides the job name. After `HETPS_CHECKPOINT_AT_STEP`
 * steps (default 20) the script saves a checkpoint of the whole job through
 * the driver's coordinated cut, at `HETPS_CHECKPOINT` (default:
 * <job.run_dir>/checkpoints/api-<time>); `hetps up --resume <that dir>` can
 * resume from it.
 */
import { join } from 'node:path';
import { HeterogeneousParameterServer } from '../actors/api/api.ts';

const [configFile = 'examples/quickstart.yaml', groupName = 'fast', rank = '0'] = process.argv.slice(2);

const hps = new HeterogeneousParameterServer({
  configFile,
  role: 'worker',
  groupName,
  nodeRank: Number(rank),
  ...(process.env.HETPS_JOB ? { job: process.env.HETPS_JOB } : {}),
});
await hps.init();

// The servers apply the config's optimizer; ask for the same one.
const { type, learning_rate: learningRate } = hps.config.optimizer;
const optimizer = hps.wrapOptimizer({ type, learningRate });

const checkpointAt = Number(process.env.HETPS_CHECKPOINT_AT_STEP ?? 20);
// A checkpoint directory must not exist yet: one per run.
const path = process.env.HETPS_CHECKPOINT ?? join(hps.config.job.run_dir, 'checkpoints', `api-${new Date().toISOString().replace(/[:.]/g, '-')}`);

let steps = 0;
for await (const batch of hps.shardDataloader({ dataset: hps.dataset, batchSize: hps.config.data.batch_size })) {
  const loss = await optimizer.step(batch);
  if (++steps % 20 === 0) console.log(`${hps.node}: step ${steps}, ${batch.desc.batch_id}, loss ${loss.toFixed(4)}`);
  if (steps === checkpointAt) {
    // Every worker pauses at its boundary for the cut (this one here), then training goes on.
    const manifest = await hps.saveCheckpoint({ path, sync: true });
    console.log(`${hps.node}: checkpoint of ${manifest!.plan.shards.length} shards in ${path} after step ${steps} `
      + `(${manifest!.data!.acked.length} of ${manifest!.data!.total_batches} batches done, ${manifest!.bytes} bytes, SHA-256 per file in its manifest.json)`);
  }
}
console.log(`${hps.node}: trained ${steps} batches`);
await hps.close();
process.exit(0);
