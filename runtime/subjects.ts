/**
 * The only place that builds NATS subjects. Every token is checked, so a node
 * name with a dot or a space can never silently address the wrong actor.
 *
 * Scheme (version SUBJECT_SCHEME_VERSION, see docs/PROTOCOL.md):
 *   hps.<job>.ctl.<command>              control commands (request/reply)
 *   hps.<job>.tel.<kind>.<source>        telemetry
 *   hps.<job>.<actorKind>.<id>.<op>      an actor's mailbox (shard, group, worker, …)
 *   hps.<job>.group.<group>@<member>.<op> a group member's reduce-scatter mailbox
 *   hps.<job>.hb.<node>                  heartbeats
 *   _INBOX_hps.<client>.<token>          replies
 *   _INBOX_hps.<client>.probe.<op>      a client's own network probe (node profiling)
 */
import { InvalidSubjectError } from './errors.ts';

export const SUBJECT_SCHEME_VERSION = 1;
export const ROOT = 'hps';

export type ActorKind = 'shard' | 'group' | 'worker' | 'scheduler' | 'health' | 'monitor' | 'node' | 'actor';
export const ACTOR_KINDS: readonly ActorKind[] = ['shard', 'group', 'worker', 'scheduler', 'health', 'monitor', 'node', 'actor'];

// NATS splits on '.', treats '*' and '>' as wildcards and ends a subject at whitespace.
const BAD_TOKEN = /[\s.*>\u0000-\u001f\u007f]/;

/** Returns `token` if it is a valid single subject token; throws InvalidSubjectError naming it otherwise. */
export function token(value: string, what = 'subject token'): string {
  if (typeof value !== 'string' || value.length === 0) {
    throw new InvalidSubjectError(`${what} must be a non-empty string, got ${JSON.stringify(value)}`);
  }
  if (value.length > 128) throw new InvalidSubjectError(`${what} ${JSON.stringify(value.slice(0, 32))}… is longer than 128 characters`);
  const m = BAD_TOKEN.exec(value);
  if (m) {
    throw new InvalidSubjectError(
      `${what} ${JSON.stringify(value)} contains ${JSON.stringify(m[0])}; tokens may not contain '.', '*', '>', whitespace or control characters`,
    );
  }
  return value;
}

function join(...tokens: string[]): string { return tokens.join('.'); }

export function jobPrefix(job: string): string { return join(ROOT, token(job, 'job name')); }

/** The scheduler's mailbox: commands are its ops (`hps.<job>.ctl.<command>`). */
export function controlAddress(job: string): string { return join(jobPrefix(job), 'ctl'); }
export function controlSubject(job: string, command: string): string {
  return join(controlAddress(job), token(command, 'control command'));
}
export function controlWildcard(job: string): string { return join(jobPrefix(job), 'ctl', '*'); }

export function telemetrySubject(job: string, kind: string, source: string): string {
  return join(jobPrefix(job), 'tel', token(kind, 'telemetry kind'), token(source, 'telemetry source'));
}
/** `kind` = null matches every kind. */
export function telemetryWildcard(job: string, kind: string | null = null): string {
  return kind === null ? join(jobPrefix(job), 'tel', '>') : join(jobPrefix(job), 'tel', token(kind, 'telemetry kind'), '*');
}

export function heartbeatSubject(job: string, node: string): string {
  return join(jobPrefix(job), 'hb', token(node, 'node name'));
}
export function heartbeatWildcard(job: string): string { return join(jobPrefix(job), 'hb', '*'); }

function actorKind(kind: string): ActorKind {
  if (!(ACTOR_KINDS as readonly string[]).includes(kind)) {
    throw new InvalidSubjectError(`unknown actor kind ${JSON.stringify(kind)}; expected one of ${ACTOR_KINDS.join(', ')}`);
  }
  return kind as ActorKind;
}

/** The base address of an actor; messages go to `<address>.<op>`. */
export function actorAddress(job: string, kind: ActorKind, id: string): string {
  return join(jobPrefix(job), actorKind(kind), token(id, `${kind} id`));
}
export function actorOpSubject(address: string, op: string): string {
  return join(address, token(op, 'operation'));
}
/** What an actor subscribes to: every op of its address. */
export function actorMailboxWildcard(address: string): string { return join(address, '>'); }

export function shardSubject(job: string, shard: string, op: string): string {
  return actorOpSubject(actorAddress(job, 'shard', shard), op);
}
export function groupSubject(job: string, group: string, op: string): string {
  return actorOpSubject(actorAddress(job, 'group', group), op);
}

/**
 * The actor id of one member's mailbox for its group's intra-group reduce
 * (`hps.<job>.group.<group>@<member>.<op>`): each member needs an address of
 * its own, and a sibling of the group's address (not a token below it) keeps
 * it out of reach of a `hps.<job>.group.<group>.>` subscription.
 */
export function groupMemberId(group: string, member: string): string {
  return token(`${token(group, 'group name')}@${token(member, 'member name')}`, 'group member id');
}
export function groupMemberSubject(job: string, group: string, member: string, op: string): string {
  return actorOpSubject(actorAddress(job, 'group', groupMemberId(group, member)), op);
}

export const INBOX_ROOT = '_INBOX_hps';
export function inboxPrefix(clientId: string): string { return join(INBOX_ROOT, token(clientId, 'client id')); }
export function inboxSubject(prefix: string, tok: string): string { return join(prefix, token(tok, 'inbox token')); }
export function inboxWildcard(prefix: string): string { return join(prefix, '*'); }
/**
 * A client's network probe (node profiling: round trips and bandwidth to the
 * server it is connected to). Under its own inbox and two tokens deep, so no
 * other client's subjects and not its reply wildcard (`<inbox>.*`) match it.
 */
export function probeSubject(clientId: string, op: 'echo' | 'bandwidth'): string {
  return join(inboxPrefix(clientId), 'probe', token(op, 'probe op'));
}

/** JetStream names may not contain '.', '*', '>' or whitespace either. */
export function streamName(job: string, what: string): string {
  return `HPS_${token(job, 'job name')}_${token(what, 'stream name')}`.replace(/[^A-Za-z0-9_-]/g, '_');
}
export function batchSubject(job: string, partition: string): string {
  return join(jobPrefix(job), 'data', token(partition, 'data partition'));
}
