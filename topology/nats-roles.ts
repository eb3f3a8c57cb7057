/**
 * Who a process logs in as when a job runs with access control
 * (`nats.secure`): one NATS user per role, its credentials in
 * `<auth dir>/<role>.json` as `hetps nats up --secure` (deploy/auth.ts)
 * writes them. hetps' own processes log in with the role's nkey; the
 * user/password in the same file is for clients in other languages.
 */
import { fromSeed } from '@nats-io/nkeys';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { ConfigError, type NatsAuth } from '../runtime/mod.ts';
import { natsConnection, type HetpsConfig } from './config.ts';

export const ROLES = ['scheduler', 'worker', 'shard', 'operator', 'monitor'] as const;
export type Role = typeof ROLES[number];
export const AUTH_DIR = 'auth';

/** What `<role>.json` holds besides the permissions. */
export interface RoleLogin {
  role: Role;
  /** The job the permissions are for; '*' = any job on this cluster. */
  job: string;
  user: string;
  password: string;
  nkey_seed: string;
  nkey_public: string;
  /** A server node's own shard user (`shard-<node>.json`): only the replicas on that node. */
  node?: string;
}

/** The credentials of `<role>.json` (as `hetps nats up --secure` or `nats.secure` wrote it), checked. */
export function readRoleFile(file: string): RoleLogin {
  const hint = 'use a <role>.json that `hetps nats up --secure` wrote under <dir>/auth/';
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    throw new ConfigError(`credentials ${file}: cannot read it (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}); ${hint}`, { cause: e });
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new ConfigError(`credentials ${file}: not JSON (${(e as Error).message}); ${hint}`, { cause: e });
  }
  const r = raw as Partial<RoleLogin>;
  const missing = (['role', 'user', 'password', 'nkey_seed'] as const).filter((k) => typeof r[k] !== 'string' || r[k] === '');
  if (missing.length) throw new ConfigError(`credentials ${file}: missing ${missing.join(', ')}; ${hint}`);
  if (!(ROLES as readonly string[]).includes(r.role!)) throw new ConfigError(`credentials ${file}: unknown role ${JSON.stringify(r.role)} (expected one of ${ROLES.join(', ')})`);
  try {
    fromSeed(new TextEncoder().encode(r.nkey_seed!));
  } catch (e) {
    throw new ConfigError(`credentials ${file}: nkey_seed is not a valid user seed (${(e as Error).message})`, { cause: e });
  }
  return r as RoleLogin;
}


/** `<name>.json` under an auth directory (`<dir>` itself or `<dir>/auth`); null when neither has it. */
function credentialsFile(authDir: string, name: string): string | null {
  const dir = resolve(authDir);
  for (const candidate of [join(dir, `${name}.json`), join(dir, AUTH_DIR, `${name}.json`)]) {
    try {
      readFileSync(candidate);
      return candidate;
    } catch { /* next */ }
  }
  return null;
}

/** The credentials file of `role` under an auth directory (`<dir>/auth` or `<dir>`), which must exist. */
export function roleFile(authDir: string, role: Role): string {
  const file = credentialsFile(authDir, role);
  if (file !== null) return file;
  throw new ConfigError(`no credentials for role ${role} under ${resolve(authDir)} (looked for ${role}.json and ${AUTH_DIR}/${role}.json); \`hetps nats up --secure --dir DIR\` writes them to DIR/${AUTH_DIR}/`);
}

/** How hetps' own clients log in with a role's credentials: its nkey. */
export function roleAuth(creds: RoleLogin): NatsAuth {
  return { user: null, pass: null, token: null, nkeySeed: creds.nkey_seed, credsFile: null };
}

/**
 * The connection options of `config` for a process of `role`. Secure
 * (`nats.secure`): that role's nkey from `authDir` (a run's own generated
 * credentials) or `nats.auth_dir`; otherwise the config's own login.
 */
export function natsConnectionAs(config: HetpsConfig, role: Role, authDir: string | null = null, node: string | null = null): ReturnType<typeof natsConnection> & { role: Role | null } {
  const conn = natsConnection(config);
  if (!config.nats.secure) return { ...conn, role: null };
  const dir = authDir ?? config.nats.auth_dir;
  if (dir === null) {
    throw new ConfigError(`nats.secure: no credentials for role ${role}: give nats.auth_dir (the DIR/auth of \`hetps nats up --secure --dir DIR\`), or leave nats.servers out so \`hetps up\` starts a secure local cluster`, { data: { field: 'nats.auth_dir' } });
  }
  // A server node's own user where there is one (`shard-<node>.json`), else the role's.
  const own = role === 'shard' && node !== null ? credentialsFile(dir, `shard-${node}`) : null;
  return { ...conn, auth: roleAuth(readRoleFile(own ?? roleFile(dir, role))), role };
}

