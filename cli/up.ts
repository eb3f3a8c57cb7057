/**
 * `hetps up --config FILE`: the whole job on this machine (deploy/run-job.ts
 * runs it); `hetps up --standby`: a standby driver of a job running on
 * NATS, that takes the job over if its driver dies. This file parses and
 * checks the flags, loads the config, prints the run's lines and progress,
 * and prints the result.
 */
import type { Command } from 'commander';
import { ProgressLine } from './progress.ts';
import { z } from 'zod';
import { readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { ConfigError, HetpsError } from '../runtime/mod.ts';
import { loadConfig } from '../topology/mod.ts';
import type { JobPrinter } from '../deploy/job-backend.ts';
import { runJob, runStandby, type ControlCommand, type UpSummary } from '../deploy/run-job.ts';
import { natsServersFrom, withJobName } from './launch.ts';
import { checkpointRoot, loadResumePoint, type ResumePoint } from '../actors/store/checkpoint.ts';

export { notActiveReport, type UpSummary } from '../deploy/run-job.ts';

export interface UpFlags {
  config: string;
  summary?: string;
  embedded: boolean;
  /** commander's `--no-launch` */
  launch: boolean;
  skip?: string;
  job?: string;
  json: boolean;
  /** Seconds between evaluations on a test subset while training runs (commander passes a string); unset or 0: off. */
  evalEvery?: string;
  /** Test samples of those evaluations. */
  evalSamples?: string;
  /**
   * A JSON file of control commands the driver sends itself during training,
   * as any NATS client would (JSON request with the Content-Type header on
   * `hps.<job>.ctl.<command>`): `[{ "after_batches": n, "command": "regroup", "body": {…} }]`.
   * For tests and demos, embedded runs included; the replies go to the summary's `control_replies`.
   */
  ctlScript?: string;
  /** A standby driver: waits on the job's scheduler lease and takes the job over when its driver dies (deploy/run-job.ts `runStandby`). */
  standby: boolean;
  /** NATS URLs, comma-separated, instead of nats.servers (a standby needs one or the other). */
  nats?: string;
  /** `latest` (the newest checkpoint under checkpoint.dir that verifies) or a checkpoint directory. */
  resume?: string;
  /** The dashboard's and `/metrics`' port (monitoring.port); 0: off. */
  monitorPort?: string;
  /** The address they listen on (monitoring.host). */
  monitorHost?: string;
}

const ctlScriptSchema = z.array(z.object({
  after_batches: z.number().int().nonnegative(),
  command: z.string().min(1),
  body: z.record(z.string(), z.unknown()).default({}),
}));

/** Test samples of the periodic evaluation unless --eval-samples says otherwise. */
export const DEFAULT_EVAL_SAMPLES = 4096;

/** Progress on stderr (cli/progress.ts): a bar on a terminal, plain lines otherwise; other lines print above it. */
class Console implements JobPrinter {
  private readonly bar = new ProgressLine(process.stderr);
  line(s: string): void { this.bar.line(s); }
  progress(s: string, fraction: number | null = null): void { this.bar.update(s, fraction); }
  end(): void { this.bar.end(); }
}

async function readCtlScript(file: string): Promise<ControlCommand[]> {
  const r = ctlScriptSchema.safeParse(JSON.parse(await readFile(resolve(file), 'utf8')));
  if (!r.success) throw new ConfigError(`--ctl-script ${file}: ${r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`, { data: { field: '--ctl-script' } });
  return r.data;
}

/** The summary, or null when a standby had nothing to take over. */
export async function runUp(flags: UpFlags): Promise<UpSummary | null> {
  const configPath = resolve(flags.config);
  let config = withJobName(await loadConfig(configPath), flags.job);
  if (flags.nats !== undefined) config = { ...config, nats: { ...config.nats, servers: natsServersFrom(flags.nats, config) } };
  if (flags.monitorPort !== undefined) {
    const port = Number(flags.monitorPort);
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new ConfigError(`--monitor-port must be a port number from 0 (off) to 65535, got ${flags.monitorPort}`, { data: { field: '--monitor-port' } });
    config = { ...config, monitoring: { ...config.monitoring, port } };
  }
  if (flags.monitorHost !== undefined) config = { ...config, monitoring: { ...config.monitoring, host: flags.monitorHost } };
  const evalEveryS = flags.evalEvery === undefined ? 0 : Number(flags.evalEvery);
  if (!(evalEveryS >= 0)) throw new ConfigError(`--eval-every must be a number of seconds ≥ 0, got ${flags.evalEvery}`, { data: { field: '--eval-every' } });
  const evalSamples = flags.evalSamples === undefined ? DEFAULT_EVAL_SAMPLES : Number(flags.evalSamples);
  if (!Number.isInteger(evalSamples) || evalSamples <= 0) throw new ConfigError(`--eval-samples must be a positive integer, got ${flags.evalSamples}`, { data: { field: '--eval-samples' } });
  if (flags.standby) {
    if (flags.embedded) throw new ConfigError('--standby and --embedded do not go together: an embedded job lives in one process, with nothing to take over', { data: { field: '--standby' } });
    if (flags.ctlScript !== undefined) throw new ConfigError('--ctl-script is for the driver that starts the job, not a standby', { data: { field: '--ctl-script' } });
    if (flags.resume !== undefined) throw new ConfigError('--resume is for the driver that starts the job, not a standby (it takes the running job over as it is)', { data: { field: '--resume' } });
    return runStandby({ config, configPath, configArg: flags.config, summaryPath: flags.summary ?? null, evalEveryS, evalSamples }, new Console());
  }
  const ctlScript = flags.ctlScript === undefined ? null : await readCtlScript(flags.ctlScript);
  let resume: ResumePoint | null = null;
  if (flags.resume !== undefined) {
    resume = await loadResumePoint(flags.resume, checkpointRoot(config), config.job.name);
    for (const r of resume.refused) process.stderr.write(`resume: refused checkpoint ${r.path}: ${r.reason}; trying the one before it\n`);
    process.stderr.write(`resume: from ${resume.path} (${resume.manifest.trigger}, ${resume.manifest.created_at}): ${resume.done.size}/${resume.manifest.data?.total_batches ?? '?'} batches done\n`);
  }
  return runJob({
    resume,
    config, configPath, configArg: flags.config, summaryPath: flags.summary ?? null, embedded: flags.embedded, launch: flags.launch,
    skip: new Set((flags.skip ?? '').split(',').map((s) => s.trim()).filter(Boolean)), evalEveryS, evalSamples, ctlScript,
  }, new Console());
}

// ---------------------------------------------------------------- command

export function register(program: Command): void {
  program
    .command('up')
    .description('run a whole job on this machine: a local NATS cluster (or the embedded bus), one process per node, training, evaluation, summary')
    .requiredOption('--config <file>', 'job YAML')
    .option('--summary <file>', 'also write the summary JSON here (it always goes to <job.run_dir>/<run>/summary.json)')
    .option('--embedded', 'run every node in this process on the in-process bus, even when nats-server is installed', false)
    .option('--no-launch', 'start no node processes (start them with hetps launch; start order does not matter)')
    .option('--skip <nodes>', 'comma-separated nodes not to start (e.g. one you run through the API example)')
    .option('--job <name>', 'job name (default: job.name of the config)')
    .option('--json', 'print the summary as one JSON line on stdout', false)
    .option('--eval-every <seconds>', 'evaluate a test subset every this many seconds while training runs (the summary\'s curve); 0: off', '0')
    .option('--eval-samples <n>', 'test samples of each of those evaluations', String(DEFAULT_EVAL_SAMPLES))
    .option('--ctl-script <file>', 'JSON [{ after_batches, command, body }]: control commands the driver sends as a JSON NATS client during training (tests, demos); replies in the summary')
    .option('--standby', 'a standby driver: start no cluster and no nodes, wait on the job\'s scheduler lease and take the job over if its driver dies (needs --nats or nats.servers)', false)
    .option('--nats <urls>', 'NATS URLs, comma-separated, instead of nats.servers')
    .option('--monitor-port <port>', 'serve the dashboard and /metrics on this port (default monitoring.port, 8888); 0: off')
    .option('--monitor-host <address>', 'the address they listen on (default monitoring.host, 127.0.0.1: the page\'s buttons steer the job; 0.0.0.0 for every interface)')
    .option('--resume <latest|dir>', 'start from a checkpoint: latest (the newest under checkpoint.dir that verifies; newer ones that do not are refused by name) or a checkpoint directory; the shards are restored and only the batches not done are queued')
    .action(async (flags: UpFlags) => {
      let s: UpSummary | null;
      try {
        s = await runUp(flags);
      } catch (e) {
        if (e instanceof HetpsError) throw e;
        throw new HetpsError(`hetps up failed: ${(e as Error).message}`, { cause: e });
      }
      if (s === null) process.exit(0);
      if (flags.json) process.stdout.write(`${JSON.stringify(s)}\n`);
      else {
        const metric = s.test_auc !== null ? `test AUC ${s.test_auc.toFixed(4)}` : `test accuracy ${((s.test_accuracy ?? NaN) * 100).toFixed(2)}%`;
        process.stdout.write(`done (${s.mode} over ${s.transport}): ${metric}, test logloss ${s.test_logloss.toFixed(4)}; ${s.samples} samples, `
          + `${Math.round(s.samples_per_s)} samples/s, ${s.batches_acked}/${s.batches} batches acknowledged (${s.duplicate_acks} duplicates), ${s.wall_s.toFixed(1)} s in all\n`
          + `summary: ${join(s.run_dir, 'summary.json')}\n`);
      }
      // onnxruntime's thread pool must not keep a finished job alive.
      process.exit(0);
    });
}
