/**
 * A small builder over onnx-proto: inputs, outputs, initializers and nodes,
 * serialized to ModelProto bytes for `InferenceSession.create(bytes)`.
 */
import onnxProto from 'onnx-proto';
import type { onnx as Onnx } from 'onnx-proto';
import type { Dim, ExternalData, ExternalDataOptions, TensorDType, TensorSpec } from './native.ts';

const { onnx } = onnxProto;

/** Default-domain opset: 18 takes `axes` as an input for every Reduce* op. */
export const OPSET = 18;
const IR_VERSION = 8;

const ELEM_TYPE: Record<TensorDType | 'bool', number> = {
  float32: onnx.TensorProto.DataType.FLOAT,
  int32: onnx.TensorProto.DataType.INT32,
  int64: onnx.TensorProto.DataType.INT64,
  bool: onnx.TensorProto.DataType.BOOL,
};

/** A float attribute; a plain number is an INT attribute. */
export interface FloatAttr { readonly float: number }
export const float = (value: number): FloatAttr => ({ float: value });
/** A one-element tensor attribute, e.g. ConstantOfShape's `value`. */
export interface ScalarTensorAttr { readonly dtype: TensorDType; readonly scalar: number }
export const scalarTensor = (dtype: TensorDType, scalar: number): ScalarTensorAttr => ({ dtype, scalar });
export type AttrValue = number | FloatAttr | ScalarTensorAttr | string | readonly number[];
export type Attrs = Readonly<Record<string, AttrValue>>;

function attribute(name: string, value: AttrValue): Onnx.IAttributeProto {
  const T = onnx.AttributeProto.AttributeType;
  if (typeof value === 'number') {
    if (!Number.isInteger(value)) throw new TypeError(`attribute ${name}: ${value} is not an integer; use float(${value})`);
    return { name, type: T.INT, i: value };
  }
  if (typeof value === 'string') return { name, type: T.STRING, s: new TextEncoder().encode(value) };
  if (Array.isArray(value)) return { name, type: T.INTS, ints: [...value] };
  if ('scalar' in value) {
    const v = value as ScalarTensorAttr;
    const data = v.dtype === 'float32' ? Float32Array.of(v.scalar) : v.dtype === 'int32' ? Int32Array.of(v.scalar) : BigInt64Array.of(BigInt(v.scalar));
    return { name, type: T.TENSOR, t: { dataType: ELEM_TYPE[v.dtype], dims: [1], rawData: rawBytes(data) } };
  }
  return { name, type: T.FLOAT, f: (value as FloatAttr).float };
}

function valueInfo(name: string, dtype: TensorDType, dims: readonly Dim[]): Onnx.IValueInfoProto {
  return {
    name,
    type: {
      tensorType: {
        elemType: ELEM_TYPE[dtype],
        shape: { dim: dims.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) },
      },
    },
  };
}

function rawBytes(data: Float32Array | Int32Array | BigInt64Array): Uint8Array {
  // TensorProto raw_data is little-endian; so are x86 and arm64 hosts.
  return new Uint8Array(data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength));
}

const EXTERNAL_ALIGN = 4096;

export class GraphBuilder {
  private readonly inputs: Onnx.IValueInfoProto[] = [];
  private readonly outputs: Onnx.IValueInfoProto[] = [];
  private readonly initializers: Onnx.ITensorProto[] = [];
  private readonly nodes: Onnx.INodeProto[] = [];
  private readonly names = new Set<string>();
  private readonly constCache = new Map<string, string>();
  private counter = 0;
  /** Operator domains besides the default one, with their opset (`ai.onnx.ml` for LabelEncoder). */
  private readonly domains = new Map<string, number>();
  private readonly metadata: { key: string; value: string }[] = [];
  readonly inputSpecs: TensorSpec[] = [];
  readonly outputSpecs: TensorSpec[] = [];

  private readonly externalChunks: Uint8Array[] = [];
  private externalBytes = 0;

  constructor(readonly name: string, private readonly externalOptions: ExternalDataOptions | null = null) {
    if (externalOptions !== null && (!externalOptions.location || /[\\/]/.test(externalOptions.location))) {
      throw new Error(`graph ${name}: external data location must be a file name next to the model, got ${JSON.stringify(externalOptions.location)}`);
    }
  }

  /** What goes to the external data file; null when no initializer went there. */
  get externalData(): ExternalData | null {
    const o = this.externalOptions;
    return o === null || this.externalBytes === 0 ? null : { location: o.location, chunks: this.externalChunks, bytes: this.externalBytes };
  }

  private claim(name: string): string {
    if (this.names.has(name)) throw new Error(`graph ${this.name}: value ${name} defined twice`);
    this.names.add(name);
    return name;
  }

  /** A fresh value name with a readable prefix. */
  fresh(prefix: string): string {
    let n: string;
    do n = `${prefix}__${this.counter++}`; while (this.names.has(n));
    return n;
  }

  input(name: string, dtype: TensorDType, dims: readonly Dim[], doc: string | null = null): string {
    this.inputs.push(valueInfo(this.claim(name), dtype, dims));
    this.inputSpecs.push({ name, dtype, dims, doc });
    return name;
  }

  /** Marks an existing value as a graph output (under its own name). */
  output(name: string, dtype: TensorDType, dims: readonly Dim[], doc: string | null = null): string {
    if (!this.names.has(name)) throw new Error(`graph ${this.name}: output ${name} is never produced`);
    this.outputs.push(valueInfo(name, dtype, dims));
    this.outputSpecs.push({ name, dtype, dims, doc });
    return name;
  }

  initializer(name: string, dtype: TensorDType, dims: readonly number[], data: Float32Array | Int32Array | BigInt64Array): string {
    const ext = this.externalOptions;
    if (ext !== null && data.byteLength >= ext.minBytes) {
      const pad = (EXTERNAL_ALIGN - (this.externalBytes % EXTERNAL_ALIGN)) % EXTERNAL_ALIGN;
      if (pad > 0) { this.externalChunks.push(new Uint8Array(pad)); this.externalBytes += pad; }
      const offset = this.externalBytes;
      // A view, not a copy: the data stays as the caller made it until the file is written.
      this.externalChunks.push(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
      this.externalBytes += data.byteLength;
      this.initializers.push({
        name: this.claim(name), dataType: ELEM_TYPE[dtype], dims: [...dims], dataLocation: onnx.TensorProto.DataLocation.EXTERNAL,
        externalData: [{ key: 'location', value: ext.location }, { key: 'offset', value: String(offset) }, { key: 'length', value: String(data.byteLength) }],
      });
      return name;
    }
    this.initializers.push({ name: this.claim(name), dataType: ELEM_TYPE[dtype], dims: [...dims], rawData: rawBytes(data) });
    return name;
  }

  /** A deduplicated float32 constant. */
  constF32(values: readonly number[], dims: readonly number[] = [values.length]): string {
    const key = `f32:${dims.join('x')}:${values.join(',')}`;
    let name = this.constCache.get(key);
    if (name === undefined) {
      name = this.initializer(this.fresh('const_f32'), 'float32', dims, Float32Array.from(values));
      this.constCache.set(key, name);
    }
    return name;
  }

  /** A deduplicated int64 constant (shapes, axes, indices). */
  constI64(values: readonly number[], dims: readonly number[] = [values.length]): string {
    const key = `i64:${dims.join('x')}:${values.join(',')}`;
    let name = this.constCache.get(key);
    if (name === undefined) {
      name = this.initializer(this.fresh('const_i64'), 'int64', dims, BigInt64Array.from(values, (v) => BigInt(v)));
      this.constCache.set(key, name);
    }
    return name;
  }

  /**
   * Adds a node. `outputs` are names to define, or a count of fresh names.
   * An empty input string marks an omitted optional input.
   */
  node(opType: string, inputs: readonly string[], outputs: readonly string[] | number = 1, attrs: Attrs = {}, domain = ''): string[] {
    for (const i of inputs) {
      if (i !== '' && !this.names.has(i)) throw new Error(`graph ${this.name}: ${opType} reads undefined value ${i}`);
    }
    const outs = typeof outputs === 'number'
      ? Array.from({ length: outputs }, () => this.claim(this.fresh(opType.toLowerCase())))
      : outputs.map((o) => this.claim(o));
    this.nodes.push({
      opType,
      ...(domain === '' ? {} : { domain }),
      name: `${opType}_${this.nodes.length}`,
      input: [...inputs],
      output: outs,
      attribute: Object.entries(attrs).map(([k, v]) => attribute(k, v)),
    });
    return outs;
  }

  /** Adds a single-output node and returns its output name (`as` names it). */
  op(opType: string, inputs: readonly string[], attrs: Attrs = {}, as: string | null = null): string {
    return this.node(opType, inputs, as === null ? 1 : [as], attrs)[0]!;
  }

  /** A single-output node of another operator domain (e.g. `ai.onnx.ml`), importing that domain at `version`. */
  domainOp(domain: string, version: number, opType: string, inputs: readonly string[], attrs: Attrs = {}): string {
    const had = this.domains.get(domain);
    if (had !== undefined && had !== version) throw new Error(`graph ${this.name}: domain ${domain} imported at opset ${had} and ${version}`);
    this.domains.set(domain, version);
    return this.node(opType, inputs, 1, attrs, domain)[0]!;
  }

  /** A `metadata_props` entry of the model (what ONNX tools show as the model's metadata). */
  meta(key: string, value: string): void {
    this.metadata.push({ key, value });
  }

  toModel(): Onnx.ModelProto {
    return onnx.ModelProto.create({
      irVersion: IR_VERSION,
      producerName: 'hetps',
      opsetImport: [{ domain: '', version: OPSET }, ...[...this.domains].map(([domain, version]) => ({ domain, version }))],
      metadataProps: this.metadata,
      graph: {
        name: this.name,
        input: this.inputs,
        output: this.outputs,
        initializer: this.initializers,
        node: this.nodes,
      },
    });
  }

  serialize(): Uint8Array {
    return onnx.ModelProto.encode(this.toModel()).finish();
  }
}
