/**
 * The job's YAML config: one zod schema that declares every key, its check
 * and its default; the types are inferred from it. Validation reports every
 * problem at once, each with the file, the path inside it, what is wrong and
 * the line and column.
 *
 * Keys are snake_case, as in the file and as the HPS article users come from
 * writes them (`cluster.worker_groups[].sync_steps`). The parsed `HetpsConfig`
 * keeps those names, so an error message, the docs and the code all say the
 * same path; only the helpers at the bottom return camelCase API objects.
 *
 * A YAML syntax error stops there: the parser's first error, with its code
 * frame. A file that parses is checked in two passes over the same raw tree,
 * and both always run so one ConfigError lists everything: zod checks the
 * shape (types, ranges, unknown keys) and fills the defaults, then
 * `crossChecks` checks what spans fields (duplicates, settings that only apply
 * to some mode, unknown node names, auth methods). Once the file is valid,
 * `resolve` fills the few defaults that depend on another section.
 */
import { readFile } from 'node:fs/promises';
import { isAlias, isMap, isScalar, isSeq, LineCounter, parseDocument, type Document, type YAMLError } from 'yaml';
import { z } from 'zod';
import { ConfigError } from '../runtime/errors.ts';
import type { NatsAuth, NatsTls } from '../runtime/nats-bus.ts';
import { token } from '../runtime/subjects.ts';
import { DEFAULT_MAX_MESSAGE_BYTES } from '../runtime/transport.ts';
import { GROUP_LR_SCALINGS, GROUP_UPDATES } from './group-lr.ts';
import { DEFAULT_COMPRESSION_THRESHOLD } from './compression.ts';

// ---------------------------------------------------------------- choices

/**
 * How a worker group synchronises inside itself (the article's three strategies plus async):
 * - `sync`: all-reduce every `sync_steps` steps.
 * - `adaptive`: all-reduce when the fastest member leads the slowest by `adaptive_threshold` steps.
 * - `accumulation`: each member accumulates `accumulation_steps` gradients locally, then all-reduce.
 * - `async`: no barrier; every member pushes to the servers on its own.
 */
export const SYNC_MODES = ['sync', 'async', 'adaptive', 'accumulation'] as const;
export type SyncMode = (typeof SYNC_MODES)[number];

/** `hps`: each group as configured, async between groups; `bsp`: one global barrier; `asp`: every worker async. */
export const TRAINING_MODES = ['bsp', 'asp', 'hps'] as const;
export type TrainingMode = (typeof TRAINING_MODES)[number];

const MODEL_TYPES = ['mlp', 'ctr'] as const;
export type ModelType = (typeof MODEL_TYPES)[number];
const DATA_SOURCES = ['spam', 'ctr-synthetic', 'mlp-synthetic'] as const;
export type DataSource = (typeof DATA_SOURCES)[number];
const OPTIMIZER_TYPES = ['sgd', 'momentum', 'adam', 'adagrad'] as const;
export type OptimizerType = (typeof OPTIMIZER_TYPES)[number];
/** `nodes.<name>.emulate.link`: how an emulated bandwidth is applied (see emulateSchema). */
export const LINK_EMULATIONS = ['hold', 'tc'] as const;
const SCHEDULE_TYPES = ['constant', 'step', 'exponential', 'warmup_cosine'] as const;
export type ScheduleType = (typeof SCHEDULE_TYPES)[number];
const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];
const COMMUNICATION_BACKENDS = ['auto', 'nats', 'nccl', 'gloo'] as const;
export type CommunicationBackend = (typeof COMMUNICATION_BACKENDS)[number];
const COMPRESSIONS = ['none', 'fp16', 'adaptive'] as const;
export type Compression = (typeof COMPRESSIONS)[number];
const PROVIDERS = ['cpu', 'cuda'] as const;
export type Provider = (typeof PROVIDERS)[number];

// ---------------------------------------------------------------- defaults that are not a single key's

const DEFAULT_LR: Record<OptimizerType, number> = { sgd: 0.01, momentum: 0.01, adam: 0.001, adagrad: 0.01 };
const DEFAULT_SYNC_STEPS = 4; // the article: 4–8 works for most groups
const DEFAULT_ACCUMULATION_STEPS = 4;
const DEFAULT_ADAPTIVE_THRESHOLD = 4;
/** Above the real step of the example models here (a few ms to a few tens), so emulated nodes keep their pace. */
export const DEFAULT_EMULATION_REFERENCE_STEP_MS = 100;
/**
 * training.max_staleness when the file does not set it. Staleness counts
 * updates, and a sync group's window of N steps is N updates, so with a
 * few groups a slow group's push is typically 10–20 updates stale; 32
 * refuses only what is far behind.
 */
export const DEFAULT_MAX_STALENESS = 32;

/** Per source; null marks a field that does not apply to that source. */
const DATA_DEFAULTS = {
  spam: { batch_size: 64, test_fraction: 0.2, samples: null, test_samples: null, test_offset: null, vocab_size: 20_000, zipf_exponent: null, slots: null, dense_features: null, max_tokens: 256 },
  'ctr-synthetic': { batch_size: 256, test_fraction: null, samples: 50_000, test_samples: 5_000, test_offset: 0, vocab_size: 10_000, zipf_exponent: 1.1, slots: 8, dense_features: 4, max_tokens: null },
  'mlp-synthetic': { batch_size: 256, test_fraction: null, samples: 20_000, test_samples: 2_000, test_offset: 0, vocab_size: null, zipf_exponent: null, slots: null, dense_features: null, max_tokens: null },
} satisfies Record<DataSource, Record<string, number | null>>;

/** Which data fields each source reads (`samples` is read by all). */
const DATA_FIELDS_BY_SOURCE: Record<string, readonly DataSource[]> = {
  test_fraction: ['spam'],
  test_samples: ['ctr-synthetic', 'mlp-synthetic'],
  test_offset: ['ctr-synthetic', 'mlp-synthetic'],
  vocab_size: ['spam', 'ctr-synthetic'],
  zipf_exponent: ['ctr-synthetic'],
  slots: ['ctr-synthetic'],
  dense_features: ['ctr-synthetic'],
  max_tokens: ['spam'],
};

const MODELS_BY_SOURCE: Record<DataSource, readonly ModelType[]> = {
  spam: ['ctr', 'mlp'],
  'ctr-synthetic': ['ctr'],
  'mlp-synthetic': ['mlp'],
};

const OPTIMIZER_FIELDS: Record<OptimizerType, readonly string[]> = {
  sgd: [],
  momentum: ['momentum', 'nesterov'],
  adam: ['beta1', 'beta2', 'epsilon', 'decoupled_weight_decay'],
  adagrad: ['epsilon', 'initial_accumulator'],
};
const ALL_OPTIMIZER_SPECIFIC = ['momentum', 'nesterov', 'beta1', 'beta2', 'epsilon', 'decoupled_weight_decay', 'initial_accumulator'];

const SCHEDULE_FIELDS: Record<ScheduleType, { allowed: readonly string[]; required: readonly string[] }> = {
  constant: { allowed: [], required: [] },
  step: { allowed: ['step_size', 'gamma'], required: ['step_size'] },
  exponential: { allowed: ['gamma', 'decay_steps'], required: [] },
  warmup_cosine: { allowed: ['warmup_steps', 'total_steps', 'min_multiplier'], required: ['total_steps'] },
};
const ALL_SCHEDULE_SPECIFIC = ['step_size', 'gamma', 'decay_steps', 'warmup_steps', 'total_steps', 'min_multiplier'];

// ---------------------------------------------------------------- field checks

type Path = (string | number)[];

function describe(v: unknown): string {
  if (v === undefined) return 'nothing';
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'object') return 'a mapping';
  if (typeof v === 'string') return `"${v}" (a string)`;
  return String(v);
}

/** A field's message for every check on it: "is required" or "must be <what>, got <value>". */
function mustBe(what: string) {
  return (iss: { input?: unknown }) => (iss.input === undefined ? 'is required' : `must be ${what}, got ${describe(iss.input)}`);
}

/** training.staleness_tolerance: one tolerance, or one for dense blocks and one for embedding rows. */
export type StalenessToleranceValue = number | 'auto';
export type StalenessToleranceSetting = StalenessToleranceValue | { dense?: StalenessToleranceValue; sparse?: StalenessToleranceValue };
function isStalenessToleranceValue(v: unknown): v is StalenessToleranceValue {
  return v === 'auto' || (typeof v === 'number' && Number.isInteger(v) && v >= 0);
}
/** A setting that is one value, or a map { dense, sparse } of values (at least one key). */
function perKind<T>(isValue: (v: unknown) => v is T) {
  return (v: unknown): v is T | { dense?: T; sparse?: T } => {
    if (isValue(v)) return true;
    if (typeof v !== 'object' || v === null || Array.isArray(v)) return false;
    const keys = Object.keys(v);
    return keys.length > 0 && keys.every((k) => (k === 'dense' || k === 'sparse') && isValue((v as Record<string, unknown>)[k]));
  };
}
const isStalenessToleranceSetting = perKind(isStalenessToleranceValue);

/** training.max_staleness: one bound, or one for dense blocks and one for embedding rows. */
export type MaxStalenessSetting = number | { dense?: number; sparse?: number };
const isMaxStalenessSetting = perKind((v: unknown): v is number => typeof v === 'number' && Number.isInteger(v) && v >= 0);

/** cluster.shards_per_server at most. */
export const MAX_SHARDS_PER_SERVER = 64;

/** communication.max_message_bytes' range (a Node Buffer holds at most 4 GiB); its default is the transport's. */
const MIN_MESSAGE_BYTES = 1024 * 1024;
const MAX_MESSAGE_BYTES = 4 * 1024 * 1024 * 1024;
const posInt = () => z.number({ error: mustBe('a positive integer') }).int().positive();
const nonNegInt = () => z.number({ error: mustBe('an integer ≥ 0') }).int().nonnegative();
const posNum = () => z.number({ error: mustBe('a number > 0') }).positive();
const nonNegNum = () => z.number({ error: mustBe('a number ≥ 0') }).nonnegative();
const seed32 = () => z.number({ error: mustBe('an integer from 0 to 4294967295') }).int().min(0).max(0xffff_ffff);
const openUnit = () => z.number({ error: mustBe('a number between 0 and 1 (both excluded)') }).gt(0).lt(1);
const unitHalfOpen = () => z.number({ error: mustBe('a number in [0, 1)') }).gte(0).lt(1);
const closedUnit = () => z.number({ error: mustBe('a number in [0, 1]') }).gte(0).lte(1);
const upToOne = () => z.number({ error: mustBe('a number in (0, 1]') }).gt(0).lte(1);
const bool = () => z.boolean({ error: mustBe('true or false') });
const text = () => z.string({ error: mustBe('a string') }).min(1, { error: 'must not be empty' });
const oneOf = <const T extends readonly [string, ...string[]]>(values: T) =>
  z.enum(values, { error: (iss) => (iss.input === undefined ? 'is required' : `must be one of ${values.join(', ')}, got ${typeof iss.input === 'string' ? JSON.stringify(iss.input) : describe(iss.input)}${suggestion(String(iss.input), values)}`) });

/** A name that becomes a NATS subject token (job, group and node names). */
const subjectToken = (what: string) => z.string({ error: mustBe(`a ${what} (a string)`) }).superRefine((value, ctx) => {
  try {
    token(value, what);
  } catch (e) {
    ctx.addIssue({ code: 'custom', message: `${(e as Error).message} (${what}s become NATS subject tokens)` });
  }
});

const natsUrl = () => z.string({ error: mustBe('a NATS URL such as nats://host:4222') }).superRefine((value, ctx) => {
  const problem = natsUrlProblem(value);
  if (problem) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(value)} ${problem}` });
});

function natsUrlProblem(value: string): string | null {
  const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(value) ? value : `nats://${value}`;
  let url: URL;
  try {
    url = new URL(withScheme);
  } catch {
    return 'is not a URL (expected nats://host:port, tls://…, ws://…, wss://… or host:port)';
  }
  if (!['nats:', 'tls:', 'ws:', 'wss:'].includes(url.protocol)) return `has scheme ${url.protocol.slice(0, -1)}; use nats, tls, ws or wss`;
  if (!url.hostname) return 'has no host';
  return null;
}

const list = <T extends z.ZodType>(item: T, what: string) => z.array(item, { error: mustBe(what) });

/** A mapping whose unknown keys are errors. */
const section = <T extends z.core.$ZodLooseShape>(shape: T) => z.strictObject(shape, { error: mustBe('a mapping (key: value lines)') });

// ---------------------------------------------------------------- schema
//
// YAML `key:` with nothing after it means "not set" (stripNulls), so a
// `.nullable().default(null)` field is null exactly when the file leaves it
// out. Sections use `.prefault({})`: a missing section is parsed as an empty
// one, so its fields' defaults are filled too.

/**
 * A worker group: `cluster.worker_groups[]` of the YAML, and a group as the
 * job runs it (the job info, a regrouping). The setting of another sync_mode
 * is null; a group's own setting defaults to 4 steps.
 */
export const workerGroupSchema = section({
  name: subjectToken('group name'),
  /** Members in rank order. */
  nodes: list(subjectToken('node name'), 'a list of node names').min(1, { error: 'must list at least one node (a group with no nodes)' }),
  sync_mode: oneOf(SYNC_MODES).default('sync'),
  /** Set for `sync` groups only. */
  sync_steps: posInt().nullable().default(null),
  /** Set for `accumulation` groups only. */
  accumulation_steps: posInt().nullable().default(null),
  /** Set for `adaptive` groups only: the progress gap, in steps, that triggers a sync. */
  adaptive_threshold: posInt().nullable().default(null),
}).transform((g) => ({
  ...g,
  sync_steps: g.sync_mode === 'sync' ? g.sync_steps ?? DEFAULT_SYNC_STEPS : null,
  accumulation_steps: g.sync_mode === 'accumulation' ? g.accumulation_steps ?? DEFAULT_ACCUMULATION_STEPS : null,
  adaptive_threshold: g.sync_mode === 'adaptive' ? g.adaptive_threshold ?? DEFAULT_ADAPTIVE_THRESHOLD : null,
}));
export type WorkerGroupConfig = z.output<typeof workerGroupSchema>;

/**
 * How `hps` groups the workers of `cluster.worker_nodes` from their measured
 * profiles at start (topology/grouping.ts: `groupNodes`, `syncSettingsForGroups`).
 * Defaults: k by silhouette in the article's 3–5, its sync_steps 4 for the fastest group.
 */
const groupingSchema = section({
  /** A fixed number of groups (at most the number of workers); null: chosen by silhouette within `k_range`. */
  k: posInt().nullable().default(null),
  /** Inclusive range searched when `k` is null (clamped to the number of workers). */
  k_range: list(posInt(), 'two positive integers [low, high], e.g. [3, 5]')
    .length(2, { error: 'must be two positive integers [low, high], e.g. [3, 5]' })
    .transform((r): [number, number] => [r[0]!, r[1]!])
    .default((): [number, number] => [3, 5]),
  /** k-means++ seed: the same profiles and seed give the same groups. */
  seed: seed32().default(0),
  /** sync_steps of the fastest group; slower sync groups get proportionally fewer, so every group's window takes about the same wall time (see syncSettingsForGroups). */
  sync_steps: posInt().default(4),
  /** The slowest group trains async when its speed is below this share of the fastest group's; 0: never. */
  async_below: unitHalfOpen().default(0.25),
});

/** The profile every worker measures and publishes when it joins (actors/node/profile-reporter.ts). */
const profilingSchema = section({
  /** Seconds a worker spends measuring itself (device, then network) when it joins; half a second: tests start many nodes on a 2-core machine. */
  probe_seconds: z.number({ error: mustBe('a number of seconds in (0, 30]') }).gt(0).lte(30).default(0.5),
  /** While training, a worker re-publishes its profile with the variation of its step times this often; 0: only at join. */
  republish_seconds: nonNegNum().default(30),
});

const emulateSchema = section({
  /**
   * Emulated speed in (0, 1]: every training step of the node takes
   * `training.emulation_reference_step_ms / speed` (the real compute runs
   * inside that time), so 0.5 is half as fast as a speed-1 node, whatever
   * else shares the machine.
   */
  speed: upToOne().default(1),
  /** Emulated link bandwidth: each pull, push and intra-group transfer takes bytes·8 / bandwidth longer; null: not limited. */
  bandwidth_mbps: posNum().nullable().default(null),
  /**
   * How `bandwidth_mbps` is applied. `hold`: the node holds each of its
   * transfers for bytes·8 / bandwidth (works anywhere, embedded too).
   * `tc`: a real limit — `hetps up` starts the node in a Linux network
   * namespace whose veth link to the host is held to `bandwidth_mbps` by
   * `tc tbf` both ways (deploy/netlab.ts; root and iproute2, a local cluster
   * started by `hetps up`), and the node holds nothing itself: every byte it
   * sends or receives, NATS protocol included, crosses the limited link.
   */
  link: oneOf(LINK_EMULATIONS).default('hold'),
});

const nodeOverrideSchema = section({
  emulate: emulateSchema.nullable().default(null),
  /**
   * A server node's relative capacity (default 1): the plan gives the shards
   * it holds a share of the parameter traffic in proportion, and load
   * balancing compares servers' loads divided by it (the reference article:
   * a stronger server takes more shards and more traffic).
   */
  capacity: posNum().nullable().default(null),
  provider: oneOf(PROVIDERS).nullable().default(null),
  threads: posInt().nullable().default(null),
});

const scheduleSchema = z.strictObject({
  type: oneOf(SCHEDULE_TYPES),
  step_size: posInt().optional(),
  gamma: upToOne().optional(),
  decay_steps: posNum().optional(),
  warmup_steps: nonNegInt().optional(),
  total_steps: posInt().optional(),
  min_multiplier: closedUnit().optional(),
}, { error: mustBe('a mapping with a `type`') });

// No defaults here: they depend on the type, and optimizer.sparse takes the dense values (resolveOptimizer).
const optimizerSettingsSchema = section({
  type: oneOf(OPTIMIZER_TYPES).optional(),
  learning_rate: posNum().optional(),
  weight_decay: nonNegNum().optional(),
  momentum: unitHalfOpen().optional(),
  nesterov: bool().optional(),
  beta1: unitHalfOpen().optional(),
  beta2: unitHalfOpen().optional(),
  epsilon: posNum().optional(),
  decoupled_weight_decay: bool().optional(),
  initial_accumulator: nonNegNum().optional(),
  schedule: scheduleSchema.optional(),
});

/** Fields that do not apply to the source are null. */
const dataSchema = section({
  source: oneOf(DATA_SOURCES),
  batch_size: posInt().optional(),
  epochs: posInt().default(1),
  /** spam: share of the e-mails held out for evaluation. */
  test_fraction: openUnit().optional(),
  /** Defaults to training.random_seed. */
  seed: seed32().optional(),
  /** Training samples: synthetic sources generate this many; spam uses at most this many (null: all). */
  samples: posInt().optional(),
  /** Synthetic sources: held-out samples. */
  test_samples: posInt().optional(),
  /**
   * Synthetic sources: the held-out samples start this many after the
   * training ones (default 0). A run with test_offset ≥ the test_samples of
   * another scores a set disjoint from that run's test split: a validation
   * set for tuning that never touches the test split.
   */
  test_offset: nonNegInt().optional(),
  /** spam: tokens kept (most frequent); ctr-synthetic: distinct ids per slot. */
  vocab_size: posInt().optional(),
  /** ctr-synthetic: skew of the id distribution. */
  zipf_exponent: posNum().optional(),
  /** ctr-synthetic: sparse slots per sample. */
  slots: posInt().optional(),
  /** ctr-synthetic: dense features per sample. */
  dense_features: nonNegInt().optional(),
  /** spam: tokens kept per e-mail. */
  max_tokens: posInt().optional(),
}).transform((d) => {
  const s = DATA_DEFAULTS[d.source];
  // A field of another source stays null (crossChecks reports it when given).
  const onlyFor = (sourceDefault: number | null, given: number | undefined) => (sourceDefault === null ? null : given ?? sourceDefault);
  return {
    ...d,
    batch_size: d.batch_size ?? s.batch_size,
    test_fraction: onlyFor(s.test_fraction, d.test_fraction),
    // spam reads at most `samples` e-mails when given; its default is all of them
    samples: d.samples ?? s.samples,
    test_samples: onlyFor(s.test_samples, d.test_samples),
    test_offset: onlyFor(s.test_offset, d.test_offset),
    vocab_size: onlyFor(s.vocab_size, d.vocab_size),
    zipf_exponent: onlyFor(s.zipf_exponent, d.zipf_exponent),
    slots: onlyFor(s.slots, d.slots),
    dense_features: onlyFor(s.dense_features, d.dense_features),
    max_tokens: onlyFor(s.max_tokens, d.max_tokens),
  };
});

const faultToleranceSchema = section({
  /** Seconds an hps group waits for a member that went silent but is not dead by the health actor's verdict (a partition, a stall) before it goes on without it. */
  worker_recovery_timeout: posNum().default(30),
  /**
   * Milliseconds a taken batch may go unacknowledged before the queue hands
   * it out again (JetStream ack_wait). A worker renews it with in-progress
   * acks every third of it while it trains, so only a dead worker's batch
   * comes back, this fast.
   */
  ack_wait_ms: posInt().min(1000).default(10_000),
  /**
   * Seconds a shard may have no live replica (its primary and every backup
   * dead by the health verdicts) before `hetps up` ends the job with that
   * reason; a replica back in time (a healed partition) serves it again.
   */
  server_recovery_timeout: posNum().default(60),
  /** Backups per shard; default: 1 when there are two or more servers, else 0 (resolve). */
  backup_factor: nonNegInt().optional(),
  /**
   * The article's preheat_backup: the standby workers start with the job
   * (model and data loaded, node profiled) so one can take a dead member's
   * place at once. Standbys are always started warm; true only asks for
   * that explicitly, and needs standby_workers.
   */
  preheat_backup: bool().default(false),
  /**
   * hps: worker nodes that start with the job and train nothing until a
   * member of a worker group is dead by the health verdicts; then the first
   * live standby takes its place in that group (a regroup), and the dead
   * node, should it come back, waits as a standby in turn.
   */
  standby_workers: list(subjectToken('node name'), 'a list of node names').default(() => []),
  /**
   * How a backup follows its primary: `sync` (the primary answers a push only
   * once every live backup applied it: nothing acknowledged is lost) or
   * `async` (it answers at once; backups lag by at most `replication_lag`
   * updates, which a failover could lose).
   */
  replication: oneOf(['sync', 'async']).default('sync'),
  /** async replication: the most updates a backup may lag before the primary waits for it. */
  replication_lag: posInt().default(64),
  /** How often every node process publishes a heartbeat, in milliseconds. */
  heartbeat_ms: posInt().default(250),
  /** Milliseconds without a heartbeat after which a node is dead; more than heartbeat_ms. */
  dead_after_ms: posInt().default(1000),
});
const FAULT_TOLERANCE_DEFAULTS = faultToleranceSchema.parse({});

const configSchema = section({
  job: section({
    /** Becomes the `<job>` subject token. */
    name: subjectToken('job name').default('hetps'),
    /** Where runs write logs, metrics and checkpoints (relative to the working directory). */
    run_dir: text().default('.hetps/runs'),
  }).prefault({}),
  nats: section({
    /** null: start a local cluster (or the in-process bus when no nats-server binary exists). */
    servers: list(natsUrl(), 'a list of NATS URLs').min(1, { error: 'must list at least one URL (leave nats.servers out to start a local cluster)' }).nullable().default(null),
    user: text().nullable().default(null),
    pass: text().nullable().default(null),
    token: text().nullable().default(null),
    nkey_seed: text().nullable().default(null),
    creds_file: text().nullable().default(null),
    /**
     * Access control: every process logs in as its role (scheduler, worker, shard; operator for `hetps ctl`)
     * with the subject permissions of deploy/auth.ts. Without nats.servers the local cluster is started so
     * (credentials under <run dir>/auth); with nats.servers, nats.auth_dir says where `hetps nats up --secure` wrote them.
     */
    secure: bool().default(false),
    /** The `auth` directory of `hetps nats up --secure --dir DIR` (DIR/auth), holding <role>.json. */
    auth_dir: text().nullable().default(null),
    tls: section({
      ca_file: text().nullable().default(null),
      cert_file: text().nullable().default(null),
      key_file: text().nullable().default(null),
      handshake_first: bool().default(false),
    }).nullable().default(null),
    /** Bytes, for the local cluster only; null: the NATS default (1 MiB). */
    max_payload: z.number({ error: mustBe('a whole number of bytes from 1 to 67108864 (64 MiB)') }).int().min(1).max(64 * 1024 * 1024).nullable().default(null),
    connect_timeout_ms: posInt().default(20_000),
    ping_interval_ms: posInt().default(2_000),
  }).prefault({}),
  cluster: section({
    /** The YAML's groups; empty when the workers are listed in `worker_nodes` only. */
    worker_groups: list(workerGroupSchema, 'a list of groups').min(1, { error: 'must list at least one worker group' }).default(() => []),
    /**
     * Workers listed without a group; hps groups them by measurement at start.
     * Required unless worker_groups is given: crossChecks says so.
     */
    worker_nodes: list(subjectToken('node name'), 'a list of node names')
      .min(1, { error: 'must list at least one node (or leave it out and list the workers in cluster.worker_groups)' }).default(() => []),
    /** Filled even when unused (the YAML lists its groups, or the mode is not hps). */
    grouping: groupingSchema.prefault({}),
    profiling: profilingSchema.prefault({}),
    server_nodes: list(subjectToken('node name'), 'a list of node names').min(1, { error: 'must list at least one server node' }),
    /**
     * Shards each server node holds (topology/shard-plan.ts shardNames): more
     * shards than servers spread an hps group's reduce-scatter (shard i is
     * reduced and pushed by member i mod M) over more of its members.
     */
    shards_per_server: posInt().max(MAX_SHARDS_PER_SERVER, { error: `must be at most ${MAX_SHARDS_PER_SERVER}` }).default(1),
    /**
     * The start barrier (ps-lite's: every node registers before training
     * starts): `hetps up` puts the job info — the workers' signal to start;
     * the plan is out before it — once every worker of the config has
     * joined (put its profile), waiting
     * at most this many seconds; a worker that joins later trains from when
     * it joins. So a sync group's members start together rather than the
     * first waiting for the last in its first window, and nobody trains while
     * the others still load and measure themselves. 0: create the job at once.
     * (hps with measured groups always waits for every profile.)
     */
    start_barrier_seconds: nonNegNum().max(3_600, { error: 'must be at most 3600' }).default(30),
  }),
  /** Per-node overrides, keyed by node name; nodes without an entry are absent. */
  nodes: z.record(z.string(), nodeOverrideSchema, { error: mustBe('a mapping from node name to its overrides') }).default(() => ({})),
  model: section({
    type: oneOf(MODEL_TYPES),
    // Both are filled; resolve keeps the one of model.type.
    mlp: section({
      input_dim: posInt().default(1024),
      hidden: list(posInt(), 'a list of positive integers').default(() => [512, 256]),
      /** Default: 2 for data.source spam (ham or spam), else 10 (resolve). */
      classes: z.number({ error: mustBe('an integer ≥ 2') }).int().min(2).optional(),
    }).prefault({}),
    ctr: section({
      embedding_dim: posInt().default(16),
      hidden: list(posInt(), 'a list of positive integers').default(() => [256, 128]),
      pooling: oneOf(['sum', 'mean']).default('sum'),
      wide: bool().default(true),
      /** Rows per embedding table: one number for every slot, or one per slot. */
      hash_buckets: z.union([posInt(), list(posInt(), '').min(1)], { error: mustBe('a positive integer, or a list of them (one per slot)') }).default(131_072),
    }).prefault({}),
  }),
  data: dataSchema,
  optimizer: optimizerSettingsSchema.extend({
    /** Embedding rows; unset fields follow the dense optimizer. */
    sparse: optimizerSettingsSchema.optional(),
  }).prefault({}),
  training: section({
    mode: oneOf(TRAINING_MODES).default('hps'),
    random_seed: seed32().default(42),
    sync_initial_params: bool().default(true),
    /**
     * Most versions a pushed gradient may lag the server (hps; the shard refuses
     * a push staler than this and scales the rest by 1/(1 + staleness)).
     * `{ dense, sparse }`: a bound for the dense blocks and one for the
     * embedding rows (an absent one is the default): a push beyond one bound
     * but within the other has only the other kind applied
     * (topology/staleness.ts).
     */
    max_staleness: z.custom<MaxStalenessSetting>(isMaxStalenessSetting, { error: mustBe('an integer ≥ 0, or a map { dense, sparse } of those') }).default(DEFAULT_MAX_STALENESS),
    /**
     * hps: staleness applied at the full learning rate. A push s updates
     * stale is applied at lr·(1 + t)/(1 + s) when s > t. `auto`: t is the
     * median staleness of the shard's recent pushes — the staleness the
     * groups' concurrency makes normal — so only pushes staler than usual
     * (a slow group's) are scaled down. `{ dense, sparse }`: a tolerance for
     * the dense blocks and one for the embedding rows (an absent one is
     * `auto`); topology/staleness.ts says why they may differ.
     */
    staleness_tolerance: z.custom<StalenessToleranceSetting>(isStalenessToleranceSetting, { error: mustBe('auto or an integer ≥ 0, or a map { dense, sparse } of those') }).default('auto'),
    /**
     * hps: the learning-rate rule for a group's update, which averages its
     * members' batches (topology/group-lr.ts): `sqrt` lr·√members (Adam,
     * Adagrad), `linear` lr·members (SGD), `none` as configured.
     */
    group_lr_scaling: oneOf(GROUP_LR_SCALINGS).default('none'),
    /** hps: the group's first windows over which the group_lr_scaling multiplier ramps up from 1. */
    group_lr_warmup_windows: nonNegInt().default(20),
    /**
     * hps, groups in `sync` and `adaptive`: between the steps of a window each
     * member applies its own gradient to its copy of the dense parameters and
     * of the rows it trained, with the job's optimizers (local SGD;
     * actors/worker/local-updates.ts), so each step's gradient is computed
     * where the member's training has got to, not at the window's start. What
     * is pushed is unchanged; false: every step of a window computes from the
     * parameters pulled at its start.
     */
    local_updates: z.boolean().default(true),
    /**
     * hps, groups in `sync` and `adaptive`: each step's part of a member's
     * gradient slices goes to the member that reduces it as soon as the step
     * is done, while the next step runs, instead of all of them when the
     * window closes (actors/group/group-sync.ts). The group's update is the
     * same; only when it is on the wire changes. false: a member sends its
     * slices when its window closes.
     */
    stream_slices: z.boolean().default(true),
    /**
     * hps, groups in `sync` and `adaptive`: how a window's gradients reach
     * the shards. `reduce`: the members exchange gradient slices, each sums
     * the group's slices of the shards it reduces and pushes that one update
     * (at the group_lr_scaling rate). `direct`: each member pushes its own
     * window to the shards, each of its steps an update of its own at the
     * job's rate (no group learning-rate rule: nothing is averaged), and
     * the members exchange only the round's bookkeeping, so every member
     * still starts its next window from parameters holding the whole
     * group's window; no slices cross the members' links (no
     * stream_slices). Accumulation groups always reduce.
     */
    group_update: oneOf(GROUP_UPDATES).default('reduce'),
    /**
     * asp and hps: near the end of the job a worker leaves the last batches
     * to workers that would take all of them before it finished one of its own
     * (topology/tail-dispatch.ts), so the job does not wait for a slow node's
     * last batch. false: every worker takes batches until the queue is empty.
     */
    tail_dispatch: z.boolean().default(true),
    /** Evaluate every this many steps (not active yet: NOT_ACTIVE_YET says what happens instead). */
    eval_every: posInt().default(100),
    /**
     * Step time of an emulated node at `emulate.speed` 1, in milliseconds; a
     * node at speed s takes this / s per step. Should exceed the real step
     * time, or emulation cannot keep up (the node says so once).
     */
    emulation_reference_step_ms: posNum().default(DEFAULT_EMULATION_REFERENCE_STEP_MS),
  }).prefault({}),
  communication: section({
    backend: oneOf(COMMUNICATION_BACKENDS).default('auto'),
    compression: oneOf(COMPRESSIONS).default('adaptive'),
    /**
     * Link utilisation in [0, 1] above which adaptive compression sends
     * gradients as fp16 (float32 again below 0.8 × it; topology/compression.ts).
     */
    compression_threshold: closedUnit().default(DEFAULT_COMPRESSION_THRESHOLD),
    /**
     * Also the parameters a worker pulls for training (dense blocks and
     * embedding rows) as scaled halves while its gradients go as fp16 (with
     * `fp16` always, with `adaptive` while the link is busy): half the bytes
     * of the largest transfers on a slow link. The shards keep float32; a
     * worker computes from values rounded to 11 significant bits.
     */
    compress_pulls: bool().default(false),
    /**
     * The largest message a hetps process sends or takes, in bytes (one larger
     * than NATS' max_payload goes as chunks and is reassembled). A shard's
     * whole state crosses as one message — its frozen copy to the driver in a
     * checkpoint, the driver's copy to it on a resume, a primary's to a
     * replica it seeds — so this bounds one shard's state: raise it for
     * bigger shards (up to 4 GiB, a Node Buffer) or shard more finely. Every
     * process of the job reads it from the config, so senders and receivers
     * agree.
     */
    max_message_bytes: z.number({ error: mustBe(`a whole number of bytes from 1 MiB (${MIN_MESSAGE_BYTES}) to 4 GiB (${MAX_MESSAGE_BYTES})`) })
      .int().min(MIN_MESSAGE_BYTES).max(MAX_MESSAGE_BYTES).default(DEFAULT_MAX_MESSAGE_BYTES),
  }).prefault({}),
  fault_tolerance: faultToleranceSchema.prefault({}),
  sharding: section({
    /**
     * Hotness sharding (the reference article's warm-up statistics): before
     * the plan is written, the driver reads `warmup_batches` training batches
     * and counts the floats each sparse partition moves per batch; the
     * partitions then go hottest first to the shard with the least load, so
     * hot ids sit on different shards. false: partitions dealt round-robin.
     */
    hotness: bool().default(true),
    /** Training batches (from the first of epoch 0) the warm-up counts. */
    warmup_batches: posInt().default(64),
  }).prefault({}),
  load_balancing: section({
    enabled: bool().default(true),
    /** Relative load difference between servers that counts as imbalance; the article: 30%. */
    imbalance_threshold: upToOne().default(0.3),
    /** Seconds an imbalance must last before shards move; the article: a minute. */
    sustain_seconds: posNum().default(60),
    /**
     * How servers of unequal capacity are compared. `declared`: each load divided by
     * nodes.<server>.capacity (1 where none is given). `measured`: by the capacity each
     * server shows, its traffic per second its event loop is busy, so the loads compared
     * are how busy the servers are (the article's balancer watches CPU utilisation).
     */
    capacity: oneOf(['declared', 'measured']).default('declared'),
  }).prefault({}),
  checkpoint: section({
    /** Root of the job's checkpoints, one directory per checkpoint; null: <job.run_dir>/checkpoints/<job.name>. */
    dir: text().nullable().default(null),
    /** A coordinated checkpoint every this many seconds of training; 0: only on ctl.checkpoint, the API and the end of the job. */
    every_s: nonNegNum().default(0),
    /** Checkpoints kept under dir; older ones are removed once a newer one is written. */
    keep: posInt().default(3),
    /** One at the end of the job. */
    at_end: bool().default(true),
    /** A full checkpoint every N; between them deltas: dense blocks and only the sparse rows updated since the previous checkpoint. */
    full_every: posInt().default(1),
    /**
     * Who writes the shards' files. `driver`: it fetches each shard's state over NATS, one
     * shard at a time, and writes it. `shards`: each shard's primary writes its own files,
     * all at once, into the checkpoint's directory — which must then be on storage every
     * server node reaches at the same path (a shared file system); deltas as with the driver.
     */
    written_by: oneOf(['driver', 'shards']).default('driver'),
  }).prefault({}),
  monitoring: section({
    enabled: bool().default(true),
    /** The dashboard's and `/metrics`' port; 0: off. */
    port: z.number({ error: mustBe('a port number from 0 to 65535') }).int().min(0).max(65535).default(8888),
    /** The address they listen on: this machine only by default (the dashboard's buttons steer the job). */
    host: z.string({ error: mustBe('an address, e.g. 127.0.0.1 or 0.0.0.0') }).min(1).default('127.0.0.1'),
    /**
     * `token`: the dashboard, its API and /metrics answer only a request with the job's
     * token (the URL printed at start, a cookie it sets, or `Authorization: Bearer`).
     * `none`: whoever reaches host:port may watch and steer the job.
     */
    auth: oneOf(['none', 'token']).default('none'),
    /** The token, as the first line of this file (the same for every driver of the job); null: a new one each run, written to <run dir>/dashboard-token. */
    token_file: text().nullable().default(null),
  }).prefault({}),
  server: section({
    use_gpu: bool().default(false),
    gpu_id: nonNegInt().default(0),
  }).prefault({}),
  logging: section({
    // The article writes WARNING; pino says warn.
    level: z.preprocess(
      (v) => (typeof v === 'string' ? (v.toLowerCase() === 'warning' ? 'warn' : v.toLowerCase()) : v),
      oneOf(LOG_LEVELS),
    ).default('info'),
  }).prefault({}),
});

type Parsed = z.output<typeof configSchema>;
type OptimizerInput = z.output<typeof optimizerSettingsSchema>;

// ---------------------------------------------------------------- types

export interface ConfigSource {
  /** The file as given to parseConfig / loadConfig. */
  file: string;
  /** Every leaf path the file set, e.g. `cluster.worker_groups[0].sync_steps`; the rest are defaults. */
  given: string[];
}

/** A valid config with every default filled. */
export type HetpsConfig = ReturnType<typeof resolve>;
export type JobConfig = HetpsConfig['job'];
export type NatsConfig = HetpsConfig['nats'];
export type NatsTlsConfig = NonNullable<NatsConfig['tls']>;
export type ClusterConfig = HetpsConfig['cluster'];
export type GroupingConfig = z.output<typeof groupingSchema>;
export type ProfilingConfig = z.output<typeof profilingSchema>;
export type EmulateConfig = z.output<typeof emulateSchema>;

/**
 * The bandwidth a node emulates by holding its own transfers: `bandwidth_mbps`
 * with `link: hold`; null without one, and with `link: tc` (the kernel limits
 * that link, the node holds nothing).
 */
export function heldBandwidthMbps(emulate: EmulateConfig | null | undefined): number | null {
  if (emulate == null || emulate.link === 'tc') return null;
  return emulate.bandwidth_mbps;
}

/** The nodes whose links `hetps up` limits with tc (`nodes.<name>.emulate.link: tc`), with their rates. */
export function tcLinkedNodes(config: { nodes: Record<string, { emulate: EmulateConfig | null } | undefined> }): { node: string; mbps: number }[] {
  const out: { node: string; mbps: number }[] = [];
  for (const [node, o] of Object.entries(config.nodes)) {
    const e = o?.emulate ?? null;
    if (e !== null && e.link === 'tc' && e.bandwidth_mbps !== null) out.push({ node, mbps: e.bandwidth_mbps });
  }
  return out;
}
export type NodeOverride = z.output<typeof nodeOverrideSchema>;
export type ModelConfig = HetpsConfig['model'];
export type MlpModelConfig = NonNullable<ModelConfig['mlp']>;
export type CtrModelConfig = NonNullable<ModelConfig['ctr']>;
export type DataConfig = HetpsConfig['data'];
export type ScheduleConfig = ReturnType<typeof resolveSchedule>;
/** Type-specific fields are filled for their type and null otherwise. */
export type OptimizerSettings = ReturnType<typeof resolveOptimizer>;
/** The top level is the dense optimizer; `sparse` (embedding rows) is fully resolved, never null. */
export type OptimizerConfig = HetpsConfig['optimizer'];
export type TrainingConfig = HetpsConfig['training'];
export type CommunicationConfig = HetpsConfig['communication'];
export type FaultToleranceConfig = HetpsConfig['fault_tolerance'];
export type LoadBalancingConfig = HetpsConfig['load_balancing'];
export type MonitoringConfig = HetpsConfig['monitoring'];
export type ServerConfig = HetpsConfig['server'];
export type LoggingConfig = HetpsConfig['logging'];

/** `cluster.grouping` when the file leaves it out. */
export const DEFAULT_GROUPING_CONFIG: Readonly<GroupingConfig> = Object.freeze(groupingSchema.parse({}));
/** `cluster.profiling` when the file leaves it out. */
export const DEFAULT_PROFILING_CONFIG: Readonly<ProfilingConfig> = Object.freeze(profilingSchema.parse({}));

/** One problem in a config file; line and column are 1-based, null where the file has no place for it. */
export interface ConfigIssue {
  path: string;
  message: string;
  line: number | null;
  column: number | null;
}

// ---------------------------------------------------------------- settings accepted but not active yet

interface InactiveSetting {
  /** Dotted path; listed when the file sets it (or something below it) and `when` holds. */
  path: string;
  when: (c: HetpsConfig) => boolean;
  /** What happens instead, for now. */
  instead: string;
}

/**
 * Why the scheduler's load balancer (actors/scheduler/load-balancer.ts) moves
 * no primary for this config, or null when it acts.
 */
export function balancerIdleReason(c: HetpsConfig): string | null {
  if (!c.load_balancing.enabled) return 'load_balancing.enabled is false';
  if (c.cluster.server_nodes.length < 2) return 'one server node: nowhere to move a shard';
  if (c.fault_tolerance.replication !== 'sync') return 'fault_tolerance.replication is async: a handover could lose updates the old primary acknowledged but its backup had not applied';
  return null;
}

const balancerActs = (c: HetpsConfig) => balancerIdleReason(c) === null;

const BALANCER_IDLE = 'primaries stay where the plan put them: they move only with load_balancing.enabled, two or more server nodes '
  + 'and fault_tolerance.replication sync (under async replication a handover could lose updates the old primary acknowledged)';

/**
 * Settings the schema accepts (the article documents them) but no code acts on
 * yet. Start-up prints these instead of silently ignoring them. Remove an entry
 * in the change that makes its setting work.
 */
const NOT_ACTIVE_YET: readonly InactiveSetting[] = [
  // Workers pull the shards' one copy before every step, so they always start alike.
  { path: 'training.sync_initial_params', when: (c) => !c.training.sync_initial_params, instead: 'every worker pulls the same initial parameters from the shards' },
  { path: 'training.eval_every', when: () => true, instead: 'the test split is scored at the end of the run, and every N seconds with `hetps up --eval-every N`' },
  // hps: the shards scale stale pushes by 1/(1 + staleness) and refuse those beyond max_staleness; asp only measures.
  { path: 'training.staleness_tolerance', when: (c) => c.training.mode === 'asp', instead: 'in asp stale gradients are applied at the full learning rate' },
  { path: 'training.group_lr_scaling', when: (c) => c.training.mode !== 'hps' && c.training.group_lr_scaling !== 'none', instead: 'only hps groups average their members\' batches into one update; every update is at the configured learning rate' },
  { path: 'training.local_updates', when: (c) => c.training.mode !== 'hps' && c.training.local_updates, instead: 'only hps windows take several steps between pulls; asp and bsp pull before every step' },
  { path: 'training.stream_slices', when: (c) => c.training.mode !== 'hps' && c.training.stream_slices, instead: 'only hps groups exchange gradient slices; asp and bsp workers push their own gradients' },
  { path: 'training.group_update', when: (c) => c.training.mode !== 'hps' && c.training.group_update !== 'reduce', instead: 'only hps groups exchange their updates; asp and bsp workers push their own gradients' },
  { path: 'training.tail_dispatch', when: (c) => c.training.mode === 'bsp' && c.training.tail_dispatch, instead: 'in bsp every worker takes part in every round, so there is no tail to dispatch' },
  { path: 'training.max_staleness', when: (c) => c.training.mode === 'asp', instead: 'in asp stale gradients are applied as they come; staleness is only measured (training.mode hps enforces it)' },
  { path: 'communication.backend', when: (c) => c.communication.backend === 'nccl' || c.communication.backend === 'gloo', instead: 'every tensor goes over NATS' },
  // communication.compression is built (fp16; adaptive switches to fp16 by link utilisation: topology/compression.ts); only adaptive reads the threshold.
  { path: 'communication.compression_threshold', when: (c) => c.communication.compression !== 'adaptive', instead: 'only compression: adaptive reads it; fp16 compresses every gradient, none no gradient' },
  { path: 'communication.compress_pulls', when: (c) => c.communication.compression === 'none' && c.communication.compress_pulls, instead: 'with compression: none nothing is sent as fp16, pulls included' },
  { path: 'fault_tolerance.worker_recovery_timeout', when: (c) => c.training.mode !== 'hps', instead: 'only hps groups wait for a silent member; a dead worker\'s batch comes back after fault_tolerance.ack_wait_ms' },
  // Load balancing moves primaries between two or more server nodes, and only under sync replication.
  { path: 'load_balancing.enabled', when: (c) => c.load_balancing.enabled && !balancerActs(c), instead: BALANCER_IDLE },
  { path: 'load_balancing.imbalance_threshold', when: (c) => !balancerActs(c), instead: BALANCER_IDLE },
  { path: 'load_balancing.sustain_seconds', when: (c) => !balancerActs(c), instead: BALANCER_IDLE },
  { path: 'load_balancing.capacity', when: (c) => !balancerActs(c), instead: BALANCER_IDLE },
  // The warm-up runs only for hotness sharding.
  { path: 'sharding.warmup_batches', when: (c) => !c.sharding.hotness, instead: 'sharding.hotness is false: no warm-up is read, and the partitions are dealt round-robin (by count in proportion to nodes.<server>.capacity where servers differ)' },
  { path: 'monitoring.token_file', when: (c) => c.monitoring.auth !== 'token', instead: 'monitoring.auth is none: the dashboard asks for no token' },
  { path: 'server.use_gpu', when: (c) => c.server.use_gpu, instead: 'server-side optimizers run on the CPU' },
  { path: 'server.gpu_id', when: () => true, instead: 'server-side optimizers run on the CPU' },
];

/**
 * Settings the file sets that no code acts on yet, one line each, e.g.
 * `load_balancing.enabled=true (not active yet: shards stay where the initial plan put them)`.
 */
export function inactiveSettings(config: HetpsConfig): string[] {
  const given = config.source.given;
  const isGiven = (path: string) => given.some((g) => g === path || g.startsWith(`${path}.`) || g.startsWith(`${path}[`));
  return NOT_ACTIVE_YET
    .filter((s) => isGiven(s.path) && s.when(config))
    .map((s) => `${s.path}=${showValue(valueAtDotted(config, s.path))} (not active yet: ${s.instead})`);
}

function valueAtDotted(obj: unknown, dotted: string): unknown {
  let v = obj;
  for (const key of dotted.split('.')) v = isObject(v) ? v[key] : undefined;
  return v;
}

function showValue(v: unknown): string {
  return typeof v === 'string' ? v : JSON.stringify(v);
}

// ---------------------------------------------------------------- entry points

/** Reads and validates a config file; a missing or unreadable file is a ConfigError too. */
export async function loadConfig(path: string): Promise<HetpsConfig> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    const why = code === 'ENOENT' ? 'does not exist' : code === 'EISDIR' ? 'is a directory, not a YAML file' : code === 'EACCES' ? 'is not readable (permission denied)' : `cannot be read (${(e as Error).message})`;
    throw new ConfigError(`config file ${path} ${why}`, { cause: e, data: { file: path } });
  }
  return parseConfig(text, path);
}

/**
 * Parses and validates config text; `file` names it in messages. Throws one
 * ConfigError listing every problem (`data.issues`: ConfigIssue[]); for a
 * YAML syntax error, only the first one.
 */
export function parseConfig(text: string, file: string): HetpsConfig {
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { lineCounter, keepSourceTokens: true, merge: true, prettyErrors: true });
  if (doc.errors.length > 0) throw configError(file, [syntaxIssue(doc.errors)]);
  const raw = stripNulls(doc.toJS({ maxAliasCount: 1000 }));
  const where = (path: Path) => {
    const pos = locate(doc, lineCounter, path, 'value');
    return `${formatPath(path)}${pos ? ` (line ${pos.line})` : ''}`;
  };

  const found: RawIssue[] = [];
  if (raw === undefined) {
    found.push({ path: [], message: 'the file is empty; it needs at least `cluster`, `model` and `data`', at: 'value' });
  } else {
    const result = configSchema.safeParse(raw);
    if (!result.success) found.push(...fromZod(result.error.issues));
    if (isObject(raw)) found.push(...crossChecks(raw, where));
    if (found.length === 0 && result.success) return resolve(result.data, file, givenPaths(raw));
  }
  const seen = new Set<string>();
  const issues: ConfigIssue[] = [];
  for (const f of found) {
    const path = formatPath(f.path);
    if (seen.has(`${path}\0${f.message}`)) continue;
    seen.add(`${path}\0${f.message}`);
    const pos = locate(doc, lineCounter, f.path, f.at);
    issues.push({ path, message: f.message, line: pos?.line ?? null, column: pos?.column ?? null });
  }
  issues.sort((a, b) => (a.line ?? Infinity) - (b.line ?? Infinity) || (a.column ?? 0) - (b.column ?? 0));
  throw configError(file, issues);
}

/**
 * The earliest of the parser's errors, with its code frame. One mistake
 * (an unclosed bracket, a bad indent) makes the parser report many more
 * after it, which only bury the first; their count is kept.
 */
function syntaxIssue(errors: readonly YAMLError[]): ConfigIssue {
  const first = errors.reduce((a, b) => (b.pos[0] < a.pos[0] ? b : a));
  const [head = '', ...frame] = first.message.split('\n');
  while (frame.length > 0 && frame[0]!.trim() === '') frame.shift();
  while (frame.length > 0 && frame.at(-1)!.trim() === '') frame.pop();
  const more = errors.length - 1;
  const after = more === 0 ? '' : ` (and ${more} more parse error${more === 1 ? '' : 's'} after it)`;
  return {
    path: '',
    message: [`YAML syntax: ${head.replace(/ at line \d+, column \d+:?$/, '')}${after}`, ...frame.map((l) => `    ${l}`)].join('\n'),
    line: first.linePos?.[0].line ?? null,
    column: first.linePos?.[0].col ?? null,
  };
}

function configError(file: string, issues: ConfigIssue[]): ConfigError {
  const lines = issues.map((i) => {
    const pos = i.line === null ? '' : i.column === null ? `:${i.line}` : `:${i.line}:${i.column}`;
    return `  ${file}${pos}: ${i.path ? `${i.path}: ` : ''}${i.message}`;
  });
  const head = `invalid config ${file} (${issues.length} problem${issues.length === 1 ? '' : 's'}):`;
  return new ConfigError([head, ...lines].join('\n'), { data: { file, issues } });
}

// ---------------------------------------------------------------- issues and positions

interface RawIssue {
  path: Path;
  message: string;
  /** Point at the key (unknown or misplaced keys) or at the value (wrong values). */
  at: 'key' | 'value';
}

function fromZod(zodIssues: readonly z.core.$ZodIssue[]): RawIssue[] {
  const out: RawIssue[] = [];
  for (const iss of zodIssues) {
    const path = iss.path.filter((p): p is string | number => typeof p !== 'symbol');
    if (iss.code === 'unrecognized_keys') {
      const allowed = allowedKeysAt(configSchema, path);
      for (const key of iss.keys) {
        out.push({ path: [...path, key], message: `unknown key \`${formatPath([...path, key])}\`${suggestion(key, allowed, 'known keys')}`, at: 'key' });
      }
    } else {
      out.push({ path, message: iss.message, at: 'value' });
    }
  }
  return out;
}

/** The keys the schema allows at `path` (an object), for "did you mean". */
function allowedKeysAt(schema: z.ZodType, path: Path): string[] {
  let s: z.ZodType | undefined = schema;
  for (const seg of [...path, null]) {
    for (;;) {
      if (s instanceof z.ZodOptional || s instanceof z.ZodNullable || s instanceof z.ZodDefault || s instanceof z.ZodPrefault) s = s.unwrap() as z.ZodType;
      else if (s instanceof z.ZodPipe) s = s.in as z.ZodType;
      else break;
    }
    if (seg === null) return s instanceof z.ZodObject ? Object.keys(s.shape) : [];
    if (s instanceof z.ZodObject) s = (s.shape as Record<string, z.ZodType>)[String(seg)];
    else if (s instanceof z.ZodArray) s = s.element as z.ZodType;
    else if (s instanceof z.ZodRecord) s = s.valueType as z.ZodType;
    else return [];
    if (s === undefined) return [];
  }
  return [];
}

/** `cluster.worker_groups[1].sync_steps`; keys that are not plain words are quoted: `nodes["a:8080"]`. */
export function formatPath(path: readonly (string | number)[]): string {
  let out = '';
  for (const seg of path) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else if (/^[A-Za-z_][A-Za-z0-9_-]*$/.test(seg)) out += out ? `.${seg}` : seg;
    else out += `[${JSON.stringify(seg)}]`;
  }
  return out;
}

/**
 * Where `path` is in the document. A path the file does not contain (a missing
 * required key) points at the nearest entry that holds it; null at top level.
 */
function locate(doc: Document, lineCounter: LineCounter, path: Path, at: 'key' | 'value'): { line: number; column: number } | null {
  const pos = (n: unknown) => {
    const range = (n as { range?: [number, number, number] } | null)?.range;
    if (!range) return null;
    const { line, col } = lineCounter.linePos(range[0]);
    return { line, column: col };
  };
  let node: unknown = doc.contents;
  let keyNode: unknown = null;
  for (const seg of path) {
    if (isAlias(node)) node = node.resolve(doc);
    if (isMap(node)) {
      const pair = node.items.find((p) => (isScalar(p.key) ? String(p.key.value) : String(p.key)) === String(seg));
      if (!pair) return keyNode ? pos(keyNode) : null;
      keyNode = pair.key;
      node = pair.value;
    } else if (isSeq(node) && typeof seg === 'number' && node.items[seg] !== undefined) {
      node = node.items[seg];
      keyNode = node;
    } else {
      return keyNode ? pos(keyNode) : null;
    }
  }
  if (path.length === 0) return pos(node);
  // `key:` with nothing after it: the key is the place to point at
  if (at === 'key' || (isScalar(node) && node.value === null)) return pos(keyNode);
  return pos(node) ?? pos(keyNode);
}

// ---------------------------------------------------------------- suggestions

/** Optimal string alignment distance: edits plus adjacent swaps, so `hsp` is one step from `hps`. */
function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)));
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let v = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) v = Math.min(v, d[i - 2]![j - 2]! + 1);
      d[i]![j] = v;
    }
  }
  return d[a.length]![b.length]!;
}

function commonPrefix(a: string, b: string): number {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n++;
  return n;
}

/** " (did you mean `x`?)" for a close candidate; otherwise the list of candidates when `listAs` is given. */
function suggestion(input: string, candidates: readonly string[], listAs: string | null = null): string {
  const squash = (s: string) => s.toLowerCase().replace(/[_-]/g, '');
  let best: string | null = null;
  let bestDistance = Infinity;
  let bestPrefix = -1;
  for (const c of candidates) {
    const d = squash(c) === squash(input) ? 0 : editDistance(input.toLowerCase(), c.toLowerCase());
    const prefix = commonPrefix(input.toLowerCase(), c.toLowerCase());
    // ties go to the candidate that starts like the input
    if (d < bestDistance || (d === bestDistance && prefix > bestPrefix)) { best = c; bestDistance = d; bestPrefix = prefix; }
  }
  if (best !== null && bestDistance <= Math.max(2, Math.floor(input.length / 3))) return ` (did you mean \`${best}\`?)`;
  return listAs && candidates.length ? ` (${listAs}: ${candidates.join(', ')})` : '';
}

// ---------------------------------------------------------------- cross-field checks

type Obj = Record<string, unknown>;

function isObject(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** YAML `key:` with nothing after it means "not set"; inside lists null stays and is reported. */
function stripNulls(v: unknown): unknown {
  if (v === null) return undefined;
  if (Array.isArray(v)) return v.map((x) => (x === null ? null : stripNulls(x)));
  if (isObject(v)) {
    const out: Obj = {};
    for (const [k, x] of Object.entries(v)) if (x !== null && x !== undefined) out[k] = stripNulls(x);
    return out;
  }
  return v;
}

function givenPaths(raw: unknown, path: Path = [], out: string[] = []): string[] {
  if (isObject(raw)) for (const [k, v] of Object.entries(raw)) givenPaths(v, [...path, k], out);
  else if (Array.isArray(raw) && raw.some((x) => isObject(x))) raw.forEach((v, i) => givenPaths(v, [...path, i], out));
  else out.push(formatPath(path));
  return out;
}

function oneOfValues<T extends string>(v: unknown, values: readonly T[]): T | null {
  return typeof v === 'string' && (values as readonly string[]).includes(v) ? (v as T) : null;
}

/**
 * Rules that span fields. Runs on the raw tree even when the shape is wrong, so
 * it reads every value defensively and skips what it cannot judge.
 * `where(path)` renders another place in the file for "already listed at …".
 */
function crossChecks(raw: Obj, where: (p: Path) => string): RawIssue[] {
  const issues: RawIssue[] = [];
  const add = (path: Path, message: string, at: 'key' | 'value' = 'value') => issues.push({ path, message, at });

  // cluster: unique names, mode-specific settings
  const cluster = isObject(raw.cluster) ? raw.cluster : {};
  const nodeSeen = new Map<string, Path>();
  const groupSeen = new Map<string, Path>();
  const claimNode = (name: unknown, path: Path) => {
    if (typeof name !== 'string') return;
    const first = nodeSeen.get(name);
    if (first) add(path, `duplicate node name "${name}": already listed at ${where(first)}`);
    else nodeSeen.set(name, path);
  };
  const groups = Array.isArray(cluster.worker_groups) ? cluster.worker_groups : [];
  groups.forEach((g, gi) => {
    if (!isObject(g)) return;
    const gPath: Path = ['cluster', 'worker_groups', gi];
    if (typeof g.name === 'string') {
      const first = groupSeen.get(g.name);
      if (first) add([...gPath, 'name'], `duplicate group name "${g.name}": already used at ${where(first)}`);
      else groupSeen.set(g.name, [...gPath, 'name']);
    }
    const mode = g.sync_mode === undefined ? 'sync' : oneOfValues(g.sync_mode, SYNC_MODES);
    if (mode !== null) {
      for (const [key, needs] of [['sync_steps', 'sync'], ['accumulation_steps', 'accumulation'], ['adaptive_threshold', 'adaptive']] as const) {
        if (g[key] !== undefined && mode !== needs) add([...gPath, key], `${key} only applies to sync_mode: ${needs} (this group's sync_mode is ${mode})`, 'key');
      }
    }
    if (Array.isArray(g.nodes)) g.nodes.forEach((n, ni) => claimNode(n, [...gPath, 'nodes', ni]));
  });
  checkWorkerNodes(raw, cluster, nodeSeen, claimNode, where, add);
  if (Array.isArray(cluster.server_nodes)) cluster.server_nodes.forEach((n, i) => claimNode(n, ['cluster', 'server_nodes', i]));
  const ftRaw = isObject(raw.fault_tolerance) ? raw.fault_tolerance : {};
  if (Array.isArray(ftRaw.standby_workers)) ftRaw.standby_workers.forEach((n, i) => claimNode(n, ['fault_tolerance', 'standby_workers', i]));

  // nodes: overrides only for nodes the cluster has
  if (isObject(raw.nodes) && isObject(raw.cluster)) {
    const known = [...nodeSeen.keys()];
    for (const name of Object.keys(raw.nodes)) {
      if (!nodeSeen.has(name)) {
        add(['nodes', name], `unknown node "${name}": not in cluster.worker_groups, cluster.worker_nodes, cluster.server_nodes or fault_tolerance.standby_workers${suggestion(name, known, 'nodes')}`, 'key');
      }
    }
  }

  // nodes.<name>.capacity weighs a server's share of the parameter traffic: a worker has none
  if (isObject(raw.nodes) && isObject(raw.cluster)) {
    const servers = Array.isArray(cluster.server_nodes) ? cluster.server_nodes : [];
    for (const [name, o] of Object.entries(raw.nodes)) {
      if (isObject(o) && o.capacity !== undefined && o.capacity !== null && nodeSeen.has(name) && !servers.includes(name)) {
        add(['nodes', name, 'capacity'], `capacity weighs a server node's share of the parameter traffic; "${name}" is not in cluster.server_nodes (a worker's speed is emulate.speed, or measured)`, 'key');
      }
    }
  }

  // nodes.<name>.emulate.link tc is a limit at bandwidth_mbps: without one there is nothing to limit
  if (isObject(raw.nodes)) {
    for (const [name, o] of Object.entries(raw.nodes)) {
      const e = isObject(o) && isObject(o.emulate) ? o.emulate : null;
      if (e !== null && e.link === 'tc' && (e.bandwidth_mbps === undefined || e.bandwidth_mbps === null)) {
        add(['nodes', name, 'emulate', 'link'], 'link: tc limits the node\'s link to emulate.bandwidth_mbps, which is not set: give bandwidth_mbps, or drop link');
      }
    }
  }

  // nats: one auth method, complete pairs, local-only settings
  if (isObject(raw.nats)) {
    const nats = raw.nats;
    const methods = ([['user/pass', ['user', 'pass']], ['token', ['token']], ['nkey_seed', ['nkey_seed']], ['creds_file', ['creds_file']]] as const)
      .filter(([, keys]) => keys.some((k) => nats[k] !== undefined));
    if (methods.length > 1) {
      const [, keys] = methods[1]!;
      const key = keys.find((k) => nats[k] !== undefined)!;
      add(['nats', key], `several authentication methods given (${methods.map(([m]) => m).join(', ')}); use only one`, 'key');
    }
    if (nats.user !== undefined && nats.pass === undefined) add(['nats', 'user'], 'nats.user needs nats.pass', 'key');
    if (nats.pass !== undefined && nats.user === undefined) add(['nats', 'pass'], 'nats.pass needs nats.user', 'key');
    if (isObject(nats.tls)) {
      if (nats.tls.cert_file !== undefined && nats.tls.key_file === undefined) add(['nats', 'tls', 'cert_file'], 'nats.tls.cert_file needs nats.tls.key_file (a client certificate needs its key)', 'key');
      if (nats.tls.key_file !== undefined && nats.tls.cert_file === undefined) add(['nats', 'tls', 'key_file'], 'nats.tls.key_file needs nats.tls.cert_file', 'key');
    }
    if (nats.secure === true) {
      const own = methods.map(([m]) => m);
      if (own.length) add(['nats', 'secure'], `nats.secure logs every process in with its role's credentials; remove ${own.join(', ')} (one login for every process is what secure mode replaces)`, 'key');
      if (nats.servers !== undefined && nats.auth_dir === undefined) {
        add(['nats', 'auth_dir'], 'nats.secure with nats.servers needs nats.auth_dir: the DIR/auth directory that `hetps nats up --secure --dir DIR` wrote (each role\'s <role>.json)', 'key');
      }
    }
    if (nats.auth_dir !== undefined && nats.secure !== true) add(['nats', 'auth_dir'], 'nats.auth_dir only applies with nats.secure: true', 'key');
    if (nats.max_payload !== undefined && nats.servers !== undefined) {
      add(['nats', 'max_payload'], 'max_payload only applies to the local cluster (nats.servers is set; the servers\' own max_payload is used)', 'key');
    }
  }

  // model: the section for the other type is a mistake
  const model = isObject(raw.model) ? raw.model : {};
  const modelType = oneOfValues<ModelType>(model.type, ['mlp', 'ctr']);
  if (modelType) {
    for (const other of ['mlp', 'ctr'] as const) {
      if (other !== modelType && model[other] !== undefined) add(['model', other], `model.${other} only applies to model.type: ${other} (model.type is ${modelType})`, 'key');
    }
  }

  // data: fields of other sources, model fit
  const data = isObject(raw.data) ? raw.data : {};
  const source = oneOfValues<DataSource>(data.source, ['spam', 'ctr-synthetic', 'mlp-synthetic']);
  if (source) {
    for (const [key, sources] of Object.entries(DATA_FIELDS_BY_SOURCE)) {
      if (data[key] !== undefined && !sources.includes(source)) add(['data', key], `${key} only applies to data.source: ${sources.join(' or ')} (data.source is ${source})`, 'key');
    }
    if (modelType && !MODELS_BY_SOURCE[source].includes(modelType)) {
      add(['data', 'source'], `data.source ${source} needs model.type ${MODELS_BY_SOURCE[source].join(' or ')}, but model.type is ${modelType}`);
    }
    const mlp = isObject(model.mlp) ? model.mlp : {};
    if (source === 'spam' && modelType === 'mlp' && mlp.classes !== undefined && mlp.classes !== 2) {
      add(['model', 'mlp', 'classes'], `must be 2 for data.source spam (ham or spam), got ${describe(mlp.classes)}`);
    }
    const ctr = isObject(model.ctr) ? model.ctr : {};
    const slots = typeof data.slots === 'number' ? data.slots : DATA_DEFAULTS[source].slots;
    if (modelType === 'ctr' && Array.isArray(ctr.hash_buckets) && slots !== null && ctr.hash_buckets.length !== slots) {
      add(['model', 'ctr', 'hash_buckets'], `has ${ctr.hash_buckets.length} entries but there are ${slots} slots (data.slots${data.slots === undefined ? ', default' : ''}); give one per slot or a single number`);
    }
  }

  // optimizer: type-specific fields, schedule fields
  if (isObject(raw.optimizer)) {
    const dense = raw.optimizer;
    const denseType = dense.type === undefined ? 'adam' : oneOfValues<OptimizerType>(dense.type, ['sgd', 'momentum', 'adam', 'adagrad']);
    checkOptimizer(dense, ['optimizer'], denseType, add);
    if (isObject(dense.sparse)) {
      const sparseType = dense.sparse.type === undefined ? denseType : oneOfValues<OptimizerType>(dense.sparse.type, ['sgd', 'momentum', 'adam', 'adagrad']);
      checkOptimizer(dense.sparse, ['optimizer', 'sparse'], sparseType, add);
    }
  }

  // training
  const training = isObject(raw.training) ? raw.training : {};
  if (training.mode === 'bsp' && training.max_staleness !== undefined) {
    add(['training', 'max_staleness'], 'max_staleness only applies to training.mode asp or hps (training.mode is bsp: every step waits for every worker)', 'key');
  }
  if (training.mode === 'bsp' && training.staleness_tolerance !== undefined) {
    add(['training', 'staleness_tolerance'], 'staleness_tolerance only applies to training.mode hps (training.mode is bsp: every step waits for every worker)', 'key');
  }

  // fault tolerance: a backup must live on another server
  const ft = isObject(raw.fault_tolerance) ? raw.fault_tolerance : {};
  if (typeof ft.backup_factor === 'number' && Array.isArray(cluster.server_nodes) && cluster.server_nodes.length > 0 && ft.backup_factor >= cluster.server_nodes.length) {
    add(['fault_tolerance', 'backup_factor'], `backup_factor ${ft.backup_factor} needs at least ${ft.backup_factor + 1} server nodes (each copy of a shard lives on a different server), cluster.server_nodes has ${cluster.server_nodes.length}`);
  }
  // standbys take a place in an hps worker group; preheating is about them
  const standbys = Array.isArray(ft.standby_workers) ? ft.standby_workers : [];
  if (standbys.length > 0) {
    const training = isObject(raw.training) ? raw.training : {};
    const mode = training.mode === undefined ? 'hps' : oneOfValues(training.mode, TRAINING_MODES);
    if (mode !== null && mode !== 'hps') {
      add(['fault_tolerance', 'standby_workers'], `a standby takes a dead member's place in its worker group, and training.mode ${mode} has no groups (there the other workers take the dead one's batches); use training.mode hps, or leave standby_workers out`, 'key');
    }
  }
  if (ft.preheat_backup === true && standbys.length === 0) {
    add(['fault_tolerance', 'preheat_backup'], 'preheat_backup: true warms the standby workers, and fault_tolerance.standby_workers lists none: name the standbys (e.g. standby_workers: [w9]), or leave preheat_backup out');
  }
  // a node is dead only after it has missed heartbeats: at least one whole period
  if (ft.heartbeat_ms !== undefined || ft.dead_after_ms !== undefined) {
    const setting = (key: 'heartbeat_ms' | 'dead_after_ms') =>
      `fault_tolerance.${key} (${ft[key] === undefined ? `${FAULT_TOLERANCE_DEFAULTS[key]}, the default` : String(ft[key])})`;
    const heartbeat = ft.heartbeat_ms ?? FAULT_TOLERANCE_DEFAULTS.heartbeat_ms;
    const deadAfter = ft.dead_after_ms ?? FAULT_TOLERANCE_DEFAULTS.dead_after_ms;
    if (typeof heartbeat === 'number' && typeof deadAfter === 'number' && deadAfter <= heartbeat) {
      add(['fault_tolerance', ft.dead_after_ms !== undefined ? 'dead_after_ms' : 'heartbeat_ms'],
        `${setting('dead_after_ms')} must be greater than ${setting('heartbeat_ms')}: a node is dead only after it has missed heartbeats`);
    }
  }
  return issues;
}

/**
 * `cluster.worker_nodes` and `cluster.grouping`. Workers are listed in
 * `worker_groups` (groups as written), in `worker_nodes` (grouped by
 * measurement when hps starts), or in both when every `worker_nodes` entry
 * is also in a group: the YAML's groups override measurement, so a worker
 * left out of them would have no group. `grouping` only applies when hps
 * groups by measurement, and k can never exceed the number of workers.
 */
function checkWorkerNodes(
  raw: Obj, cluster: Obj, nodeSeen: Map<string, Path>, claimNode: (name: unknown, path: Path) => void,
  where: (p: Path) => string, add: (p: Path, m: string, at?: 'key' | 'value') => void,
): void {
  if (!isObject(raw.cluster)) return;
  const hasGroups = cluster.worker_groups !== undefined;
  const hasNodes = cluster.worker_nodes !== undefined;
  if (!hasGroups && !hasNodes) {
    add(['cluster', 'worker_groups'], 'is required: list the workers in cluster.worker_groups (groups as written) or in cluster.worker_nodes (hps groups them by their measured profiles)');
  }
  const listed = Array.isArray(cluster.worker_nodes) ? cluster.worker_nodes : [];
  const inGroups = new Set(nodeSeen.keys());
  const seen = new Map<string, Path>();
  listed.forEach((n, i) => {
    if (typeof n !== 'string') return;
    const path: Path = ['cluster', 'worker_nodes', i];
    const first = seen.get(n);
    if (first) { add(path, `duplicate node name "${n}": already listed at ${where(first)}`); return; }
    seen.set(n, path);
    if (inGroups.has(n)) return; // listed in a group as well: the group says where it trains
    if (hasGroups) {
      add(path, `"${n}" is in no group of cluster.worker_groups; with both cluster.worker_groups and cluster.worker_nodes given the groups are used as written, `
        + `so every worker needs one: add "${n}" to a group, or leave out cluster.worker_groups to group the workers by measurement`);
    }
    claimNode(n, path);
  });

  const grouping = cluster.grouping;
  if (!isObject(grouping)) return;
  const training = isObject(raw.training) ? raw.training : {};
  const mode = training.mode === undefined ? 'hps' : oneOfValues(training.mode, TRAINING_MODES);
  if (hasGroups) {
    add(['cluster', 'grouping'], 'grouping only applies to workers grouped by measurement (cluster.worker_nodes without cluster.worker_groups); cluster.worker_groups are used as written', 'key');
  } else if (mode !== null && mode !== 'hps') {
    add(['cluster', 'grouping'], `grouping only applies to training.mode hps (training.mode is ${mode}, which has no worker groups)`, 'key');
  }
  if (grouping.k !== undefined && grouping.k_range !== undefined) {
    add(['cluster', 'grouping', 'k_range'], `k_range only applies when k is left out (k is ${describe(grouping.k)}: the number of groups is fixed)`, 'key');
  }
  const range = grouping.k_range;
  if (Array.isArray(range) && range.length === 2 && typeof range[0] === 'number' && typeof range[1] === 'number' && range[0] > range[1]) {
    add(['cluster', 'grouping', 'k_range'], `must be [low, high] with low ≤ high, got [${range[0]}, ${range[1]}]`);
  }
  const workers = hasGroups ? 0 : seen.size;
  if (typeof grouping.k === 'number' && Number.isInteger(grouping.k) && workers > 0 && grouping.k > workers) {
    add(['cluster', 'grouping', 'k'], `k ${grouping.k} is more groups than the ${workers} worker${workers === 1 ? '' : 's'} in cluster.worker_nodes; k may be at most ${workers}`);
  }
}

function checkOptimizer(opt: Obj, path: Path, type: OptimizerType | null, add: (p: Path, m: string, at?: 'key' | 'value') => void): void {
  if (type) {
    for (const key of ALL_OPTIMIZER_SPECIFIC) {
      if (opt[key] !== undefined && !OPTIMIZER_FIELDS[type].includes(key)) {
        const owners = (Object.keys(OPTIMIZER_FIELDS) as OptimizerType[]).filter((t) => OPTIMIZER_FIELDS[t].includes(key));
        add([...path, key], `${key} only applies to type ${owners.join(' or ')} (this optimizer is ${type})`, 'key');
      }
    }
  }
  if (!isObject(opt.schedule)) return;
  const schedule = opt.schedule;
  const sType = oneOfValues<ScheduleType>(schedule.type, ['constant', 'step', 'exponential', 'warmup_cosine']);
  if (!sType) return;
  const sPath = [...path, 'schedule'];
  for (const key of ALL_SCHEDULE_SPECIFIC) {
    if (schedule[key] !== undefined && !SCHEDULE_FIELDS[sType].allowed.includes(key)) {
      add([...sPath, key], `${key} does not apply to schedule type ${sType}${SCHEDULE_FIELDS[sType].allowed.length ? ` (it takes ${SCHEDULE_FIELDS[sType].allowed.join(', ')})` : ''}`, 'key');
    }
  }
  for (const key of SCHEDULE_FIELDS[sType].required) {
    if (schedule[key] === undefined) add([...sPath, key], `is required for schedule type ${sType}`);
  }
  if (sType === 'warmup_cosine' && typeof schedule.total_steps === 'number') {
    const warmup = typeof schedule.warmup_steps === 'number' ? schedule.warmup_steps : 0;
    if (schedule.total_steps <= warmup) add([...sPath, 'total_steps'], `must be greater than warmup_steps (${warmup}), got ${schedule.total_steps}`);
  }
}

// ---------------------------------------------------------------- defaults that depend on another section

function resolve(p: Parsed, file: string, given: string[]) {
  const { sparse = {}, ...dense } = p.optimizer;
  const denseType = dense.type ?? 'adam';
  const sparseType = sparse.type ?? denseType;
  const source: ConfigSource = { file, given };
  return {
    ...p,
    model: {
      type: p.model.type,
      mlp: p.model.type === 'mlp' ? { ...p.model.mlp, classes: p.model.mlp.classes ?? (p.data.source === 'spam' ? 2 : 10) } : null,
      ctr: p.model.type === 'ctr' ? p.model.ctr : null,
    },
    data: { ...p.data, seed: p.data.seed ?? p.training.random_seed },
    optimizer: {
      ...resolveOptimizer(dense),
      // Unset sparse fields take the dense values; with another type only weight_decay and
      // schedule carry over (a learning rate tuned for Adam is no default for Adagrad).
      sparse: resolveOptimizer(sparseType === denseType
        ? { ...dense, ...sparse }
        : { weight_decay: dense.weight_decay, schedule: dense.schedule, ...sparse }),
    },
    fault_tolerance: {
      ...p.fault_tolerance,
      // a backup lives on another server than its primary
      backup_factor: p.fault_tolerance.backup_factor ?? Math.min(1, p.cluster.server_nodes.length - 1),
    },
    source,
  };
}

/** An optimizer's defaults, which depend on its type. */
function resolveOptimizer(o: OptimizerInput) {
  const type = o.type ?? 'adam';
  const has = (key: string) => OPTIMIZER_FIELDS[type].includes(key);
  return {
    type,
    learning_rate: o.learning_rate ?? DEFAULT_LR[type],
    weight_decay: o.weight_decay ?? 0,
    /** momentum */
    momentum: has('momentum') ? o.momentum ?? 0.9 : null,
    /** momentum */
    nesterov: has('nesterov') ? o.nesterov ?? false : null,
    /** adam */
    beta1: has('beta1') ? o.beta1 ?? 0.9 : null,
    /** adam */
    beta2: has('beta2') ? o.beta2 ?? 0.999 : null,
    /** adam, adagrad */
    epsilon: has('epsilon') ? o.epsilon ?? (type === 'adagrad' ? 1e-10 : 1e-8) : null,
    /** adam (AdamW) */
    decoupled_weight_decay: has('decoupled_weight_decay') ? o.decoupled_weight_decay ?? false : null,
    /** adagrad */
    initial_accumulator: has('initial_accumulator') ? o.initial_accumulator ?? 0 : null,
    schedule: resolveSchedule(o.schedule ?? { type: 'constant' }),
  };
}

/** A schedule's defaults, which depend on its type; required fields are checked by crossChecks. */
function resolveSchedule(s: NonNullable<OptimizerInput['schedule']>) {
  switch (s.type) {
    case 'constant': return { type: 'constant' as const };
    case 'step': return { type: 'step' as const, step_size: s.step_size!, gamma: s.gamma ?? 0.1 };
    case 'exponential': return { type: 'exponential' as const, gamma: s.gamma ?? 0.99, decay_steps: s.decay_steps ?? 1 };
    case 'warmup_cosine': return { type: 'warmup_cosine' as const, warmup_steps: s.warmup_steps ?? 0, total_steps: s.total_steps!, min_multiplier: s.min_multiplier ?? 0 };
  }
}

// ---------------------------------------------------------------- helpers for the layers above

/** A worker of the YAML. The group fields are null for a `cluster.worker_nodes` entry in no group: its group is measured at start (the job info's `groups`). */
export interface WorkerNode {
  name: string;
  group: string | null;
  /** Position in the group's `nodes` list, from 0. */
  rank: number | null;
  groupSize: number | null;
  syncMode: SyncMode | null;
}

export interface ServerNode {
  name: string;
  /** Position in `cluster.server_nodes`, from 0. */
  rank: number;
}

/** Every worker node in file order, with its group and rank within the group; then the `worker_nodes` in no group. */
export function allWorkerNodes(config: HetpsConfig): WorkerNode[] {
  const grouped: WorkerNode[] = config.cluster.worker_groups.flatMap((g) =>
    g.nodes.map((name, rank) => ({ name, group: g.name, rank, groupSize: g.nodes.length, syncMode: g.sync_mode })));
  const inGroups = new Set(grouped.map((n) => n.name));
  const ungrouped = config.cluster.worker_nodes.filter((name) => !inGroups.has(name))
    .map((name): WorkerNode => ({ name, group: null, rank: null, groupSize: null, syncMode: null }));
  return [...grouped, ...ungrouped];
}

/** The standby workers (fault_tolerance.standby_workers), in no group until one takes a dead member's place. */
export function standbyWorkerNodes(config: HetpsConfig): WorkerNode[] {
  return config.fault_tolerance.standby_workers.map((name): WorkerNode => ({ name, group: null, rank: null, groupSize: null, syncMode: null }));
}

export function serverNodes(config: HetpsConfig): ServerNode[] {
  return config.cluster.server_nodes.map((name, rank) => ({ name, rank }));
}

/** `nodes.<server>.capacity` of the server nodes that set one (the others count 1); null when none does. */
export function serverCapacities(config: HetpsConfig): Record<string, number> | null {
  const out: Record<string, number> = {};
  for (const s of config.cluster.server_nodes) {
    const c = config.nodes[s]?.capacity ?? null;
    if (c !== null) out[s] = c;
  }
  return Object.keys(out).length > 0 ? out : null;
}

const NO_OVERRIDE: Readonly<NodeOverride> = Object.freeze(nodeOverrideSchema.parse({}));

/** A node's overrides (all null when the file has none for it); a name the cluster lacks is a ConfigError. */
export function nodeOverrides(config: HetpsConfig, name: string): NodeOverride {
  const isNode = config.cluster.server_nodes.includes(name) || config.cluster.worker_nodes.includes(name) || config.cluster.worker_groups.some((g) => g.nodes.includes(name))
    || config.fault_tolerance.standby_workers.includes(name);
  if (!isNode) {
    throw new ConfigError(`node "${name}" is not in ${config.source.file} (not in cluster.worker_groups, cluster.worker_nodes, cluster.server_nodes or fault_tolerance.standby_workers)`, { data: { file: config.source.file, node: name } });
  }
  return config.nodes[name] ?? NO_OVERRIDE;
}

/** The `nats` section as the runtime's connect options take it; auth and tls are null when not set. */
export function natsConnection(config: HetpsConfig): { servers: string[] | null; auth: NatsAuth | null; tls: NatsTls | null; connectTimeoutMs: number; pingIntervalMs: number; maxMessageBytes: number } {
  const n = config.nats;
  const hasAuth = n.user !== null || n.token !== null || n.nkey_seed !== null || n.creds_file !== null;
  return {
    servers: n.servers,
    auth: hasAuth ? { user: n.user, pass: n.pass, token: n.token, nkeySeed: n.nkey_seed, credsFile: n.creds_file } : null,
    tls: n.tls ? { caFile: n.tls.ca_file, certFile: n.tls.cert_file, keyFile: n.tls.key_file, handshakeFirst: n.tls.handshake_first } : null,
    connectTimeoutMs: n.connect_timeout_ms,
    pingIntervalMs: n.ping_interval_ms,
    maxMessageBytes: config.communication.max_message_bytes,
  };
}
