/**
 * The set-up steps of a job run (connect, create the stream and buckets, put
 * the plan, queue the batches, write the job info, wait for the nodes). A
 * failure names the step, the servers it talked to and what to check, instead
 * of a bare "timeout" from the client library.
 */
import { ConnectionError, HetpsError, TimeoutError } from '../runtime/mod.ts';

export interface SetupStep {
  /** What was being done, e.g. `creating the batch work queue (JetStream stream HPS_x_batches, replicas 3)`. */
  what: string;
  /** The NATS servers of the run; empty: the in-process bus. */
  servers: readonly string[];
  /** What to look at when it fails. */
  check: string;
}

/** Errors of the job's own rules (a stale plan, a bad config) already say what is wrong: passed on unchanged. */
function isOwnDomainError(e: unknown): boolean {
  return e instanceof HetpsError && !(e instanceof TimeoutError) && !(e instanceof ConnectionError) && e.constructor !== HetpsError;
}

function causeChain(e: unknown): unknown[] {
  const out: unknown[] = [];
  for (let c = e; c !== undefined && c !== null && out.length < 6; c = (c as { cause?: unknown }).cause) out.push(c);
  return out;
}

function kindOf(e: unknown): 'timeout' | 'connection' | 'other' {
  for (const c of causeChain(e)) {
    const name = c instanceof Error ? c.name : '';
    const text = `${c instanceof Error ? c.message : String(c)} ${(c as { code?: unknown }).code ?? ''}`;
    if (c instanceof TimeoutError || name === 'TimeoutError' || /timeout|timed out/i.test(text)) return 'timeout';
    if (c instanceof ConnectionError || name === 'ConnectionError' || /ECONNREFUSED|CONNECTION_REFUSED|connection (refused|closed)|disconnect|closed/i.test(text)) return 'connection';
  }
  return 'other';
}

export function setupError(step: SetupStep, e: unknown): HetpsError {
  const where = step.servers.length ? `on ${step.servers.join(',')}` : 'on the in-process bus';
  const message = `${step.what} ${where} failed: ${e instanceof Error ? e.message : String(e)} — check ${step.check}`;
  const options = { cause: e, data: { step: step.what, servers: [...step.servers] } };
  const kind = kindOf(e);
  if (kind === 'timeout') return new TimeoutError(message, options);
  if (kind === 'connection') return new ConnectionError(message, options);
  return new HetpsError(message, options);
}

/** Runs one set-up step; its failure becomes an error that names the step and the servers. */
export async function setupStep<T>(step: SetupStep, run: () => Promise<T>): Promise<T> {
  try {
    return await run();
  } catch (e) {
    if (isOwnDomainError(e)) throw e;
    throw setupError(step, e);
  }
}

/** What to check when JetStream does not answer, for a cluster this run started (its logs in `natsDir`) or one given in the config. */
export function jetStreamCheck(natsDir: string | null): string {
  return natsDir
    ? `that a JetStream quorum of the cluster is up (nats-server logs in ${natsDir})`
    : 'that a JetStream quorum of the cluster in nats.servers is up (its servers\' logs; `nats server report jetstream`)';
}

export function connectCheck(natsDir: string | null): string {
  return natsDir
    ? `the local nats-servers' logs in ${natsDir}`
    : 'the addresses in nats.servers and that this machine can reach them';
}
