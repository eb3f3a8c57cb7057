/**
 * One error class per condition. Every class sets `name`, keeps `cause`, says
 * whether a retry can help (`retryable`), and survives the wire through
 * `toWire` / `fromWire` so a remote failure arrives as the same class.
 */

export interface WireError {
  name: string;
  message: string;
  code: string;
  retryable: boolean;
  data: Record<string, unknown> | null;
  cause: WireError | null;
}

export class HetpsError extends Error {
  /** Stable machine-readable code, e.g. `ERR_TIMEOUT`. */
  readonly code: string = 'ERR_HETPS';
  /** True when the same call may succeed if tried again. */
  readonly retryable: boolean = false;
  readonly data: Record<string, unknown> | null;

  constructor(message: string, options: { cause?: unknown; data?: Record<string, unknown> | null } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.data = options.data ?? null;
  }
}

function defineError(name: string, code: string, retryable: boolean) {
  const cls = class extends HetpsError {
    override readonly code = code;
    override readonly retryable = retryable;
  };
  Object.defineProperty(cls, 'name', { value: name });
  return cls;
}

/** A request got no reply in time. The receiver may or may not have acted: retry with the same seq. */
export class TimeoutError extends defineError('TimeoutError', 'ERR_TIMEOUT', true) {}
/** Nobody is subscribed to the subject (yet): the actor is starting, moving or its node is reconnecting. */
export class NoRespondersError extends defineError('NoRespondersError', 'ERR_NO_RESPONDERS', true) {}
/** The connection to NATS is down or was closed. */
export class ConnectionError extends defineError('ConnectionError', 'ERR_CONNECTION', true) {}
/** Bytes that do not decode into a valid envelope. */
export class DecodeError extends defineError('DecodeError', 'ERR_DECODE', false) {}
/** A decoded message whose fields do not match the schema of its type. */
export class ValidationError extends defineError('ValidationError', 'ERR_VALIDATION', false) {}
/** A message of a `type` the receiving actor has no handler for. */
export class UnknownMessageTypeError extends defineError('UnknownMessageTypeError', 'ERR_UNKNOWN_TYPE', false) {}
/** The envelope's protocol version `v` is not one this build speaks. */
export class ProtocolVersionError extends defineError('ProtocolVersionError', 'ERR_PROTOCOL_VERSION', false) {}
/** A payload above what can be sent even in chunks, or a chunked message that never completed. */
export class PayloadTooLargeError extends defineError('PayloadTooLargeError', 'ERR_PAYLOAD_TOO_LARGE', false) {}
export class ReassemblyTimeoutError extends defineError('ReassemblyTimeoutError', 'ERR_REASSEMBLY_TIMEOUT', true) {}
/** A subject token that NATS would misread (empty, whitespace, `.`, `*`, `>`). */
export class InvalidSubjectError extends defineError('InvalidSubjectError', 'ERR_INVALID_SUBJECT', false) {}
/** A handler threw; carried back to the requester. */
export class HandlerError extends defineError('HandlerError', 'ERR_HANDLER', false) {}
/** The actor is stopping or stopped and takes no new work. */
export class ActorStoppedError extends defineError('ActorStoppedError', 'ERR_ACTOR_STOPPED', true) {}
/** Bad configuration (YAML, CLI flags, environment). */
export class ConfigError extends defineError('ConfigError', 'ERR_CONFIG', false) {}
/** A required external program (nats-server) or package is missing. */
export class MissingDependencyError extends defineError('MissingDependencyError', 'ERR_MISSING_DEPENDENCY', false) {}
/** A TCP port is already taken by another process. */
export class PortInUseError extends defineError('PortInUseError', 'ERR_PORT_IN_USE', false) {}
/** A tensor/gradient with NaN or Inf values, or a shape mismatch. */
export class InvalidTensorError extends defineError('InvalidTensorError', 'ERR_INVALID_TENSOR', false) {}

type ErrorClass = new (message: string, options?: { cause?: unknown; data?: Record<string, unknown> | null }) => HetpsError;

const registry = new Map<string, ErrorClass>();
for (const cls of [
  HetpsError, TimeoutError, NoRespondersError, ConnectionError, DecodeError, ValidationError,
  UnknownMessageTypeError, ProtocolVersionError, PayloadTooLargeError, ReassemblyTimeoutError,
  InvalidSubjectError, HandlerError, ActorStoppedError, ConfigError, MissingDependencyError,
  PortInUseError, InvalidTensorError,
] as ErrorClass[]) registry.set(cls.name, cls);

/** Lets a later module (e.g. topology) register its own error classes for `fromWire`. */
export function registerErrorClass(cls: ErrorClass): void {
  registry.set(cls.name, cls);
}

export function toWire(err: unknown, depth = 0): WireError {
  if (err instanceof HetpsError) {
    return {
      name: err.name, message: err.message, code: err.code, retryable: err.retryable, data: err.data,
      cause: err.cause !== undefined && depth < 4 ? toWire(err.cause, depth + 1) : null,
    };
  }
  if (err instanceof Error) {
    return {
      name: err.name, message: err.message, code: 'ERR_INTERNAL', retryable: false, data: null,
      cause: err.cause !== undefined && depth < 4 ? toWire(err.cause, depth + 1) : null,
    };
  }
  return { name: 'Error', message: String(err), code: 'ERR_INTERNAL', retryable: false, data: null, cause: null };
}

/** Turns wire text back into the matching class; unknown names become a `HetpsError` that keeps the name in `data`. */
export function fromWire(w: WireError): HetpsError {
  const cause = w.cause ? fromWire(w.cause) : undefined;
  const cls = registry.get(w.name);
  if (cls) return new cls(w.message, { cause, data: w.data });
  const e = new HetpsError(`${w.name}: ${w.message}`, { cause, data: { ...(w.data ?? {}), remoteName: w.name, remoteCode: w.code } });
  return e;
}

export function isRetryable(err: unknown): boolean {
  return err instanceof HetpsError && err.retryable;
}
