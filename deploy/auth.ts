/**
 * Access control for a NATS cluster that runs hetps jobs (`hetps nats up
 * --secure`, `nats.secure` of `hetps up`): one user per role with subject
 * permissions, written as
 *   <dir>/auth/<role>.json    { role, job, user, password, nkey_seed, nkey_public, permissions }
 *   <dir>/auth/<role>.nk      the role's nkey seed alone (what nats.js' nkeyAuthenticator reads)
 *   <dir>/auth/authorization.conf  the servers' `authorization { users: [...] }` block
 * all mode 0600. Each role can log in two ways: with its nkey (the
 * NATS-recommended way; hetps' own processes use it) or with its
 * user/password (any NATS client in any language). No `no_auth_user` is set,
 * so anonymous connections are refused.
 *
 * The roles and what they may publish (subscriptions are limited likewise):
 *   scheduler  the driver (`hetps up`): the job's control plane, stores and dashboard
 *   worker     pulls/pushes to shards, group messages, telemetry, heartbeats;
 *              takes batches from the work queue; never ctl.*, shard.*.restore,
 *              shard.*.snapshot (nor any other shard op but pull/push/stats)
 *   shard      its replies, replication between shards, telemetry, heartbeats
 *   operator   control commands (`hetps ctl`), reads telemetry
 *   monitor    reads telemetry and heartbeats (`hetps tail`, a collector);
 *              sends no control command, not even `status`
 * Replies go back through `allow_responses`. JetStream API subjects are
 * granted per operation and per stream of the job (`HPS_<job>_batches`,
 * `KV_HPS_<job>_plan`, …), never `$JS.>`; with no job given (`*`) they are
 * granted per operation for every stream.
 *
 * How a process picks its login from these files is topology/nats-roles.ts
 * (natsConnectionAs).
 */
import { createUser } from '@nats-io/nkeys';
import { randomBytes } from 'node:crypto';
import { chmod, mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { ROOT, streamName, token } from '../runtime/mod.ts';
import { AUTH_DIR, ROLES, readRoleFile, type Role, type RoleLogin } from '../topology/nats-roles.ts';
import { FAILOVER_ACTOR_ID } from '../actors/shard/shard-host.ts';

export { AUTH_DIR, ROLES, readRoleFile, type Role, type RoleLogin };


export interface SubjectPermissions {
  publish: { allow: string[]; deny: string[] };
  subscribe: { allow: string[]; deny: string[] };
  allow_responses: boolean;
}

export interface RoleCredentials extends RoleLogin {
  permissions: SubjectPermissions;
}

export const AUTHORIZATION_CONF = 'authorization.conf';

/** The JetStream streams of a job (its work queue and KV buckets); '*' for any job. */
function jobStreams(job: string): { batches: string; kv: string[]; buckets: string[] } {
  if (job === '*') return { batches: '*', kv: ['*'], buckets: ['*'] };
  const buckets = ['plan', 'job', 'profiles', 'lease'].map((w) => streamName(job, w));
  return { batches: streamName(job, 'batches'), kv: buckets.map((b) => `KV_${b}`), buckets };
}

/**
 * The subject permissions of one role for one job ('*' = every job). A pure
 * function of its arguments: the servers' configuration and the test that
 * checks it read the same lists.
 */
export function rolePermissions(role: Role, job: string, scope: { node: string; shards: readonly string[] } | null = null): SubjectPermissions {
  const j = job === '*' ? '*' : token(job, 'job name');
  const p = `${ROOT}.${j}`;
  const s = jobStreams(j);
  // Every client: replies to its requests (hetps' inboxes and the NATS default), its own network probe.
  const inboxes = ['_INBOX_hps.>', '_INBOX.>'];
  const probe = ['_INBOX_hps.*.probe.*'];
  const jsInfo = ['$JS.API.INFO'];
  // Reading a KV bucket: its stream's info, direct gets, a watcher (an ordered consumer) and its cleanup.
  const kvRead = s.kv.flatMap((k) => [
    `$JS.API.STREAM.INFO.${k}`, `$JS.API.STREAM.MSG.GET.${k}`, `$JS.API.DIRECT.GET.${k}`, `$JS.API.DIRECT.GET.${k}.>`,
    `$JS.API.CONSUMER.CREATE.${k}`, `$JS.API.CONSUMER.CREATE.${k}.>`, `$JS.API.CONSUMER.DELETE.${k}.*`, `$JS.API.CONSUMER.INFO.${k}.*`,
  ]);
  const kvWrite = s.buckets.map((b) => `$KV.${b}.>`);
  // Taking batches from the work queue: its durable pull consumer, acks.
  const queueConsume = [
    `$JS.API.STREAM.INFO.${s.batches}`, `$JS.API.CONSUMER.INFO.${s.batches}.*`, `$JS.API.CONSUMER.MSG.NEXT.${s.batches}.*`, `$JS.ACK.${s.batches}.>`,
  ];
  const telemetry = [`${p}.tel.>`];
  const heartbeat = [`${p}.hb.*`];
  // A node's health watcher: the heartbeats it hears, and the health actor's verdicts it asks for.
  const healthWatch = { publish: [`${p}.health.*.verdicts`], subscribe: heartbeat };
  const shutdown = [`${p}.ctl.shutdown`];
  const failoverReports = ['replica_ready', 'replica_unseedable'].map((op) => `${p}.scheduler.${FAILOVER_ACTOR_ID}.${op}`);
  switch (role) {
    case 'scheduler': {
      // The one writer of the job: creates and resets its streams and buckets, drives every actor.
      const manage = [s.batches, ...s.kv].flatMap((st) => [
        `$JS.API.STREAM.CREATE.${st}`, `$JS.API.STREAM.UPDATE.${st}`, `$JS.API.STREAM.DELETE.${st}`, `$JS.API.STREAM.PURGE.${st}`,
        `$JS.API.STREAM.INFO.${st}`, `$JS.API.STREAM.MSG.GET.${st}`, `$JS.API.DIRECT.GET.${st}`, `$JS.API.DIRECT.GET.${st}.>`,
        `$JS.API.CONSUMER.CREATE.${st}`, `$JS.API.CONSUMER.CREATE.${st}.>`, `$JS.API.CONSUMER.DURABLE.CREATE.${st}.*`,
        `$JS.API.CONSUMER.DELETE.${st}.*`, `$JS.API.CONSUMER.INFO.${st}.*`, `$JS.API.CONSUMER.MSG.NEXT.${st}.*`, `$JS.ACK.${st}.>`,
      ]);
      return {
        publish: { allow: [`${p}.>`, ...manage, ...kvWrite, ...jsInfo, ...probe], deny: [] },
        subscribe: { allow: [`${p}.>`, ...inboxes], deny: [] },
        allow_responses: true,
      };
    }
    case 'worker':
      return {
        publish: {
          allow: [
            // round_expected: a bsp worker lowers a round's count when a round mate is declared dead.
            `${p}.shard.*.pull`, `${p}.shard.*.push`, `${p}.shard.*.stats`, `${p}.shard.*.round_expected`, `${p}.group.>`, ...telemetry, ...heartbeat,
            ...healthWatch.publish, ...queueConsume, ...kvRead, `$KV.${s.buckets[2]}.>`, ...jsInfo, ...probe,
          ],
          deny: [`${p}.ctl.>`, `${p}.shard.*.restore`, `${p}.shard.*.snapshot`],
        },
        // Its own mailboxes (worker, group member, group), the shutdown broadcast, the health verdicts.
        subscribe: { allow: [`${p}.worker.>`, `${p}.group.>`, `${p}.node.>`, ...shutdown, ...telemetry, ...healthWatch.subscribe, ...inboxes], deny: [] },
        allow_responses: true,
      };
    case 'shard':
      return {
        publish: {
          // Its stream to the other replicas (a new or restarted one is seeded first, in segments), and what it tells the scheduler's
          // failover of them: a seeded replica caught up, or one it cannot seed.
          allow: [`${p}.shard.*.replicate`, ...['seed_begin', 'seed_part', 'seed_logs', 'seed'].map((op) => `${p}.shard.*.${op}`), `${p}.shard.*.round_expected`, ...failoverReports, ...telemetry, ...heartbeat, ...healthWatch.publish, ...kvRead, `$KV.${s.buckets[2]}.>`, ...jsInfo, ...probe],
          deny: [`${p}.ctl.>`],
        },
        // One server node's user (`shard-<node>`) serves only the replicas on that node (`<shard>@<node>`, any shard of
        // the job: failover and re-replication may place any of them there); the role's user, every shard's.
        subscribe: {
          allow: [
            ...(scope === null ? [`${p}.shard.>`, `${p}.node.>`]
              : [...scope.shards.map((sh) => `${p}.shard.${token(sh, 'shard')}@${token(scope.node, 'node name')}.>`), `${p}.node.${scope.node}.>`]),
            ...shutdown, ...telemetry, ...healthWatch.subscribe, ...inboxes,
          ],
          deny: [],
        },
        allow_responses: true,
      };
    case 'operator':
      return {
        publish: { allow: [`${p}.ctl.*`, ...jsInfo], deny: [] },
        subscribe: { allow: [...telemetry, ...heartbeat, ...inboxes], deny: [] },
        allow_responses: false,
      };
    case 'monitor':
      return {
        // An allow list with only its own probe: nothing else (an empty list would allow everything).
        publish: { allow: [...probe], deny: [`${p}.ctl.>`] },
        subscribe: { allow: [...telemetry, ...heartbeat, ...inboxes], deny: [] },
        allow_responses: false,
      };
  }
}

function q(s: string): string { return JSON.stringify(s); }

/**
 * How many messages a client may publish to one request's reply subject:
 * the runtime splits a reply larger than the servers' max_payload into
 * chunks (a shard's snapshot for a checkpoint is many), each a message.
 */
export const MAX_REPLY_MESSAGES = 1_000_000;

function renderPermissions(perm: SubjectPermissions): string {
  const list = (xs: string[]) => `[${xs.map(q).join(', ')}]`;
  const part = (name: string, x: { allow: string[]; deny: string[] }) =>
    `${name}: { allow: ${list(x.allow)}${x.deny.length ? `, deny: ${list(x.deny)}` : ''} }`;
  return `{ ${part('publish', perm.publish)}, ${part('subscribe', perm.subscribe)}${perm.allow_responses ? `, allow_responses: { max: ${MAX_REPLY_MESSAGES} }` : ''} }`;
}

/** The servers' `authorization` block: each role as a user/password and as an nkey; no anonymous user. */
export function renderAuthorization(creds: readonly RoleCredentials[]): string {
  const lines = ['# Written by hetps (deploy/auth.ts): one user per role, as user/password and as nkey. Anonymous connections are refused.', 'authorization {', '  users: ['];
  for (const c of creds) {
    const perms = renderPermissions(c.permissions);
    lines.push(`    { user: ${q(c.user)}, password: ${q(c.password)}, permissions: ${perms} }`);
    lines.push(`    { nkey: ${q(c.nkey_public)}, permissions: ${perms} }`);
  }
  lines.push('  ]', '}');
  return lines.join('\n') + '\n';
}

export interface AuthFiles {
  /** `<dir>/auth`. */
  dir: string;
  job: string;
  /** The path of each role's `<role>.json`. */
  roles: Record<Role, string>;
  /** Per server node given, its own shard user's `shard-<node>.json`. */
  servers: Record<string, string>;
  /** The `authorization { … }` block for the servers' configuration. */
  authorization: string;
}

/**
 * Fresh credentials for every role (new nkeys, new random passwords), written
 * under `<dir>/auth/`; job '*' (or null) grants every job on the cluster.
 */
export async function writeAuthFiles(dir: string, job: string | null, o: { serverNodes?: readonly string[] } = {}): Promise<AuthFiles> {
  const j = job === null || job === '*' ? '*' : token(job, 'job name');
  const authDir = join(resolve(dir), AUTH_DIR);
  await mkdir(authDir, { recursive: true, mode: 0o700 });
  const user = (role: Role, name: string, permissions: SubjectPermissions, node: string | null): RoleCredentials => {
    const kp = createUser();
    return {
      role, job: j, user: name, password: randomBytes(24).toString('base64url'),
      nkey_seed: new TextDecoder().decode(kp.getSeed()), nkey_public: kp.getPublicKey(), ...(node === null ? {} : { node }), permissions,
    };
  };
  const creds: RoleCredentials[] = ROLES.map((role) => user(role, role, rolePermissions(role, j), null));
  // With the job's server nodes known: a user per server node, serving only the replicas on it.
  const servers = (o.serverNodes ?? []).map((n) => token(n, 'server node'));
  for (const node of servers) creds.push(user('shard', `shard-${node}`, rolePermissions('shard', j, { node, shards: servers }), node));
  const roles = {} as Record<Role, string>;
  const nodes: Record<string, string> = {};
  for (const c of creds) {
    const file = join(authDir, `${c.user}.json`);
    await writeSecret(file, `${JSON.stringify(c, null, 2)}\n`);
    await writeSecret(join(authDir, `${c.user}.nk`), `${c.nkey_seed}\n`);
    if (c.node === undefined) roles[c.role] = file;
    else nodes[c.node] = file;
  }
  const authorization = renderAuthorization(creds);
  await writeSecret(join(authDir, AUTHORIZATION_CONF), authorization);
  return { dir: authDir, job: j, roles, servers: nodes, authorization };
}

async function writeSecret(file: string, text: string): Promise<void> {
  await writeFile(file, text, { mode: 0o600 });
  await chmod(file, 0o600);
}


/** Whether NATS subject pattern `pattern` (with `*` and `>` wildcards) matches `subject`. */
export function subjectMatches(pattern: string, subject: string): boolean {
  const p = pattern.split('.');
  const s = subject.split('.');
  for (let i = 0; i < p.length; i++) {
    if (p[i] === '>') return s.length > i;
    if (i >= s.length) return false;
    if (p[i] !== '*' && p[i] !== s[i]) return false;
  }
  return p.length === s.length;
}

/** Whether `perm` lets its user publish (or subscribe to) `subject`, as nats-server decides: allowed and not denied. */
export function permits(perm: SubjectPermissions, op: 'publish' | 'subscribe', subject: string): boolean {
  const x = perm[op];
  return x.allow.some((a) => subjectMatches(a, subject)) && !x.deny.some((d) => subjectMatches(d, subject));
}
