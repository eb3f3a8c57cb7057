/**
 * One ONNX Runtime session per model graph, created once and reused for every
 * step. Feeds are checked against the graph's specs before each call, so a
 * wrong shape fails here with a message naming the input, not deep inside ORT.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { dirname, join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { ConfigError, InvalidTensorError } from '../runtime/errors.ts';
import type { Model } from './models/model.ts';
import type {
  ExecutionProvider, HostTensor, ModelGraph, SessionOptions, StepFeeds, TensorSpec,
} from './native.ts';

export const DEFAULT_SESSION_OPTIONS: SessionOptions = {
  provider: 'cpu',
  graph: 'step',
  intraOpNumThreads: null,
  graphOptimizationLevel: 'all',
};

const CUDA_UNAVAILABLE = 'execution provider cuda requested but not available in this onnxruntime-node build; use provider: cpu';

/** Outputs of one run, by name. */
export class StepOutputs {
  constructor(private readonly tensors: ReadonlyMap<string, HostTensor>) {}

  get names(): string[] { return [...this.tensors.keys()]; }

  has(name: string): boolean { return this.tensors.has(name); }

  tensor(name: string): HostTensor {
    const t = this.tensors.get(name);
    if (t === undefined) throw new InvalidTensorError(`output ${name} was not fetched; fetched: ${this.names.join(', ')}`, { data: { output: name } });
    return t;
  }

  /** A float32 output's data (every output of the hetps graphs is float32). */
  f32(name: string): Float32Array {
    const t = this.tensor(name);
    if (t.dtype !== 'float32') throw new InvalidTensorError(`output ${name} is ${t.dtype}, not float32`, { data: { output: name } });
    return t.data as Float32Array;
  }

  /** A scalar float32 output, e.g. `loss`. */
  scalar(name: string): number { return this.f32(name)[0]!; }
}

function isModel(m: Model | ModelGraph): m is Model {
  return typeof (m as Model).graph === 'function';
}

/** Where onnxruntime-node keeps its native libraries, or null if the layout is not the one we know. */
function ortBinaryDir(): string | null {
  try {
    const entry = createRequire(import.meta.url).resolve('onnxruntime-node');
    const dir = join(dirname(entry), '..', 'bin', 'napi-v6', process.platform, process.arch);
    return existsSync(dir) ? dir : null;
  } catch {
    return null;
  }
}

function cudaLibraryPresent(): boolean | null {
  const dir = ortBinaryDir();
  if (dir === null) return null;
  const lib = process.platform === 'win32' ? 'onnxruntime_providers_cuda.dll' : 'libonnxruntime_providers_cuda.so';
  return existsSync(join(dir, lib));
}

/**
 * True when this onnxruntime-node build can run the provider. For `cuda` it
 * checks the backend list and the provider library; whether a GPU and its
 * driver are usable is only known when a session is created.
 */
export function providerListed(provider: ExecutionProvider): boolean {
  if (provider === 'cpu') return true;
  const listed = ort.listSupportedBackends().find((b) => b.name === provider);
  if (listed === undefined) return false;
  return listed.bundled || cudaLibraryPresent() !== false;
}

function sameDims(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

const fmt = (dims: readonly (number | string)[]) => `[${dims.join(', ')}]`;

/**
 * Checks feeds against the graph's input specs: every input present, nothing
 * extra, dtypes, ranks, fixed dims, symbolic dims consistent across inputs,
 * and data length = product of dims. Returns the symbolic dim bindings.
 */
export function checkFeedShapes(graph: ModelGraph, feeds: StepFeeds): Map<string, number> {
  const where = `${graph.model} ${graph.kind} graph`;
  const bound = new Map<string, { size: number; from: string }>();
  const expected = new Set(graph.inputs.map((s) => s.name));
  for (const name of Object.keys(feeds)) {
    if (!expected.has(name)) {
      throw new InvalidTensorError(`${where}: unexpected input ${name}; inputs are ${[...expected].join(', ')}`, { data: { input: name } });
    }
  }
  for (const spec of graph.inputs) {
    const t = feeds[spec.name];
    const want = `${fmt(spec.dims)} ${spec.dtype}`;
    if (t === undefined) throw new InvalidTensorError(`${where}: input ${spec.name} is missing; expected ${want}`, { data: { input: spec.name } });
    const got = `${fmt(t.dims)} ${t.dtype}`;
    const fail = (why: string) => new InvalidTensorError(`${where}: input ${spec.name}: expected ${want}, got ${got}${why}`,
      { data: { input: spec.name, expected: spec.dims, actual: t.dims, expectedDtype: spec.dtype, actualDtype: t.dtype } });
    if (t.dtype !== spec.dtype) throw fail('');
    if (!dataMatchesDtype(t)) throw fail(` (data is a ${t.data.constructor.name})`);
    if (t.dims.length !== spec.dims.length) throw fail(' (rank differs)');
    spec.dims.forEach((d, i) => {
      const actual = t.dims[i]!;
      if (!Number.isInteger(actual) || actual < 0) throw fail(` (dimension ${i} is not a size)`);
      if (typeof d === 'number') {
        if (actual !== d) throw fail(` (dimension ${i})`);
      } else {
        const prev = bound.get(d);
        if (prev === undefined) bound.set(d, { size: actual, from: spec.name });
        else if (prev.size !== actual) throw fail(` (dimension ${i} '${d}' = ${actual}, but ${prev.from} set '${d}' = ${prev.size})`);
      }
    });
    const size = t.dims.reduce((a, b) => a * b, 1);
    if (t.data.length !== size) throw fail(` (data holds ${t.data.length} elements, shape needs ${size})`);
  }
  return new Map([...bound].map(([k, v]) => [k, v.size]));
}

function dataMatchesDtype(t: HostTensor): boolean {
  switch (t.dtype) {
    case 'float32': return t.data instanceof Float32Array;
    case 'int32': return t.data instanceof Int32Array;
    case 'int64': return t.data instanceof BigInt64Array;
  }
}

function toHost(t: ort.Tensor): HostTensor {
  const dims = [...t.dims];
  switch (t.type) {
    case 'float32': return { dtype: 'float32', dims, data: t.data as Float32Array };
    case 'int32': return { dtype: 'int32', dims, data: t.data as Int32Array };
    case 'int64': return { dtype: 'int64', dims, data: t.data as BigInt64Array };
    default: throw new InvalidTensorError(`output of type ${t.type} is not one hetps reads`);
  }
}

/** A reusable session over one model graph (the step graph unless `graph: 'eval'`). */
export class StepSession {
  private constructor(
    private readonly session: ort.InferenceSession,
    readonly graph: ModelGraph,
    readonly options: SessionOptions,
    private readonly model: Model | null,
  ) {}

  /**
   * Creates the session. `provider: 'cuda'` throws ConfigError when this
   * onnxruntime-node build has no CUDA provider (the npm default).
   */
  static async create(model: Model | ModelGraph, options: Partial<SessionOptions> = {}): Promise<StepSession> {
    const opts: SessionOptions = { ...DEFAULT_SESSION_OPTIONS, ...options };
    if (opts.provider !== 'cpu' && opts.provider !== 'cuda') throw new ConfigError(`unknown execution provider ${String(opts.provider)}; use cpu or cuda`);
    if (opts.intraOpNumThreads !== null && (!Number.isInteger(opts.intraOpNumThreads) || opts.intraOpNumThreads < 1)) {
      throw new ConfigError(`intraOpNumThreads must be a positive integer or null, got ${opts.intraOpNumThreads}`);
    }
    const graph = isModel(model) ? model.graph(opts.graph) : model;
    if (opts.provider === 'cuda' && !providerListed('cuda')) throw new ConfigError(CUDA_UNAVAILABLE);
    const ortOptions: ort.InferenceSession.SessionOptions = {
      executionProviders: [opts.provider],
      graphOptimizationLevel: opts.graphOptimizationLevel,
      intraOpNumThreads: opts.intraOpNumThreads ?? availableParallelism(),
      executionMode: 'sequential',
      enableCpuMemArena: true,
      enableMemPattern: true,
    };
    let session: ort.InferenceSession;
    try {
      session = await ort.InferenceSession.create(graph.bytes, ortOptions);
    } catch (err) {
      if (opts.provider === 'cuda') throw new ConfigError(CUDA_UNAVAILABLE, { cause: err });
      throw err;
    }
    return new StepSession(session, graph, opts, isModel(model) ? model : null);
  }

  get inputs(): readonly TensorSpec[] { return this.graph.inputs; }
  get outputs(): readonly TensorSpec[] { return this.graph.outputs; }

  /** Shape checks plus the model's own checks (index ranges); throws InvalidTensorError. */
  check(feeds: StepFeeds): Map<string, number> {
    const dims = checkFeedShapes(this.graph, feeds);
    this.model?.checkFeeds(feeds, this.graph.kind);
    return dims;
  }

  /**
   * Runs the graph. `fetch` limits the outputs read back (e.g. `['loss']`);
   * null fetches all of them.
   */
  async run(feeds: StepFeeds, fetch: readonly string[] | null = null): Promise<StepOutputs> {
    this.check(feeds);
    const ortFeeds: Record<string, ort.Tensor> = {};
    for (const [name, t] of Object.entries(feeds)) ortFeeds[name] = new ort.Tensor(t.dtype, t.data, t.dims);
    const result = fetch === null
      ? await this.session.run(ortFeeds)
      : await this.session.run(ortFeeds, [...fetch]);
    const out = new Map<string, HostTensor>();
    for (const [name, value] of Object.entries(result)) out.set(name, toHost(value as ort.Tensor));
    return new StepOutputs(out);
  }

  async dispose(): Promise<void> {
    await this.session.release();
  }
}

