/**
 * Talking to a running job from a terminal, as any NATS client would:
 *
 *   hetps ctl <command> [json] [--config X | --nats URL --job NAME] [--json]
 *       sends `hps.<job>.ctl.<command>` with a JSON body and prints the reply
 *       (status, pause, resume, regroup, recover, checkpoint, shutdown);
 *   hetps top [--every S] [--once]
 *       a live view of the job's nodes, groups and shards (redrawn in place
 *       on a terminal by log-update; plain blocks of lines otherwise);
 *   hetps tail [kind…] [--json] [--count N]
 *       prints the job's telemetry (`hps.<job>.tel.<kind>.<source>`: batch,
 *       progress, start, done, regroup, profile, health, event) as lines or
 *       JSON lines.
 *
 * The NATS servers and credentials come from the config (`nats:`) or
 * `--nats`; `hetps up` prints the URLs of the cluster it starts.
 */
import type { Command } from 'commander';
import {
  ConfigError, HetpsError, connectTransport, decode, jobPrefix, telemetryWildcard, token, type Transport,
} from '../runtime/mod.ts';
import { requestControl } from '../actors/scheduler/scheduler.messages.ts';
import { loadConfig, natsConnection, natsConnectionAs, readRoleFile, roleAuth, type HetpsConfig, type Role } from '../topology/mod.ts';
import { natsServersFrom, withJobName } from './launch.ts';

interface ConnectFlags { config?: string; nats?: string; job?: string; auth?: string }

/** The job's name and a connection to its NATS cluster, from --config and/or --nats and --job. */
export async function connectToJob(flags: ConnectFlags, name: string, role: Role = 'operator'): Promise<{ job: string; transport: Transport }> {
  let config: HetpsConfig | null = null;
  if (flags.config !== undefined) config = withJobName(await loadConfig(flags.config), flags.job);
  const job = config?.job.name ?? (flags.job !== undefined ? token(flags.job, '--job') : null);
  if (job === null) throw new ConfigError(`hetps ${name} needs the job: give --config FILE (its job.name and nats:) or --job NAME with --nats URL`, { data: { field: '--job' } });
  let servers: string[];
  if (config !== null) servers = natsServersFrom(flags.nats, config);
  else if (flags.nats !== undefined) servers = flags.nats.split(',').map((s) => s.trim()).filter(Boolean);
  else throw new ConfigError(`hetps ${name} needs NATS: give --nats URL[,URL…] or --config FILE with nats.servers (\`hetps up\` prints "NATS cluster up: …")`, { data: { field: '--nats' } });
  // --auth: a role's credentials file; else, with nats.secure in the config, this command's role from nats.auth_dir.
  const conn = flags.auth !== undefined
    ? { auth: roleAuth(readRoleFile(flags.auth)), tls: config !== null ? natsConnection(config).tls : null }
    : config !== null ? natsConnectionAs(config, role) : { auth: null, tls: null };
  const transport = await connectTransport({ servers, name: `hetps-${name}`, auth: conn.auth, tls: conn.tls });
  return { job, transport };
}

/** A control command as a JSON NATS client sends it; the reply's result, or a HetpsError with the job's error message. */
export async function sendControl(transport: Transport, job: string, command: string, fields: unknown, timeoutMs = 60_000): Promise<unknown> {
  let reply;
  try {
    reply = await requestControl(transport, job, command, fields, timeoutMs);
  } catch (e) {
    throw new HetpsError(`no answer to ctl.${command} from the scheduler of job ${job} (${(e as Error).message}); is the job running on these NATS servers, under this name?`, { cause: e });
  }
  if (reply.type !== 'reply' || reply.result === undefined) throw new HetpsError(`ctl.${command} refused: ${reply.error?.message ?? JSON.stringify(reply)}`);
  return reply.result;
}

interface StatusLike {
  job: string; state: string; mode: string | null; run_id: string | null;
  progress: { samples: number; batches_acked: number; batches_total: number | null; samples_per_s: number; loss: number | null };
  groups: { name: string; sync_mode: string; members: { node: string; state: string }[] }[];
  workers: { node: string; group: string | null; state: string; health: string | null; steps: number; samples_per_s: number; utilisation?: number | null; last_heartbeat_ms: number | null }[];
  shards: { shard: string; primary: string; state: string; version: number | null; pulls: number | null; pushes: number | null; rows: number | null; bytes: number | null }[];
  events: { at_ms: number; kind: string; text: string }[];
}

const pad = (s: string | number, n: number) => String(s).padEnd(n);
const num = (x: number | null | undefined, d = 0) => (x === null || x === undefined ? '-' : x.toFixed(d));

/** `hetps top`'s screen: the job line, then tables of workers, groups and shards, then the latest events. */
export function topScreen(s: StatusLike, at = new Date()): string {
  const p = s.progress;
  const pct = p.batches_total ? ` (${Math.floor((100 * p.batches_acked) / p.batches_total)}%)` : '';
  const out = [
    `hetps top — job ${s.job} (${s.mode ?? '?'}) ${s.state}  ${at.toISOString().slice(11, 19)}`,
    `batches ${p.batches_acked}/${p.batches_total ?? '?'}${pct}  samples ${p.samples}  ${Math.round(p.samples_per_s)} samples/s  loss ${num(p.loss, 4)}`,
    '',
    `${pad('WORKER', 14)}${pad('GROUP', 10)}${pad('STATE', 12)}${pad('HEALTH', 8)}${pad('STEPS', 8)}${pad('SAMPLES/S', 11)}${pad('UTIL', 6)}HEARTBEAT`,
    ...s.workers.map((w) => `${pad(w.node, 14)}${pad(w.group ?? '-', 10)}${pad(w.state, 12)}${pad(w.health ?? '-', 8)}${pad(w.steps, 8)}${pad(Math.round(w.samples_per_s), 11)}`
      + `${pad(w.utilisation === null || w.utilisation === undefined ? '-' : `${Math.round(100 * w.utilisation)}%`, 6)}${w.last_heartbeat_ms === null ? '-' : `${w.last_heartbeat_ms} ms`}`),
    '',
    ...(s.groups.length === 0 ? ['(no groups: every worker in one pool)'] : [`${pad('GROUP', 10)}${pad('SYNC', 13)}MEMBERS`,
      ...s.groups.map((g) => `${pad(g.name, 10)}${pad(g.sync_mode, 13)}${g.members.map((m) => `${m.node}:${m.state}`).join(' ')}`)]),
    '',
    `${pad('SHARD', 12)}${pad('PRIMARY', 12)}${pad('STATE', 14)}${pad('VERSION', 9)}${pad('PULLS', 9)}${pad('PUSHES', 9)}${pad('ROWS', 10)}BYTES`,
    ...s.shards.map((x) => `${pad(x.shard, 12)}${pad(x.primary, 12)}${pad(x.state, 14)}${pad(num(x.version), 9)}${pad(num(x.pulls), 9)}${pad(num(x.pushes), 9)}${pad(num(x.rows), 10)}${num(x.bytes)}`),
    '',
    ...s.events.slice(-5).map((e) => `${new Date(e.at_ms).toISOString().slice(11, 19)} ${e.kind}: ${e.text}`),
  ];
  return out.join('\n');
}

/** `status` for a person: the job, its progress, groups, workers, shards and latest events. */
export function formatStatus(s: StatusLike): string {
  const p = s.progress;
  const lines = [
    `job ${s.job} (${s.mode ?? '?'}, run ${s.run_id ?? '-'}): ${s.state}; ${p.batches_acked}/${p.batches_total ?? '?'} batches, ${p.samples} samples, `
      + `${Math.round(p.samples_per_s)} samples/s, loss ${p.loss === null ? '-' : p.loss.toFixed(4)}`,
  ];
  for (const g of s.groups) lines.push(`group ${g.name} (${g.sync_mode}): ${g.members.map((m) => `${m.node} ${m.state}`).join(', ')}`);
  for (const w of s.workers) lines.push(`worker ${w.node}${w.group ? ` [${w.group}]` : ''}: ${w.state}${w.health && w.health !== 'alive' ? ` (${w.health})` : ''}, ${w.steps} steps, ${Math.round(w.samples_per_s)} samples/s`);
  for (const x of s.shards) lines.push(`shard ${x.shard} on ${x.primary}: ${x.state}, v${x.version ?? '?'}, ${x.pulls ?? '?'} pulls, ${x.pushes ?? '?'} pushes, ${x.rows ?? '?'} rows`);
  for (const e of s.events.slice(-5)) lines.push(`event ${new Date(e.at_ms).toISOString()} ${e.kind}: ${e.text}`);
  return `${lines.join('\n')}\n`;
}

/** JSON of a decoded telemetry message: typed arrays as plain arrays. */
function plain(v: unknown): unknown {
  if (ArrayBuffer.isView(v)) return Array.from(v as unknown as ArrayLike<number>);
  if (Array.isArray(v)) return v.map(plain);
  if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plain(x)]));
  return v;
}

/** One telemetry message as a line: time, kind, source, then its fields as key=value. */
export function telemetryLine(kind: string, source: string, body: unknown, at = new Date()): string {
  const fields = body !== null && typeof body === 'object' && !Array.isArray(body)
    ? Object.entries(plain(body) as Record<string, unknown>).filter(([k]) => k !== 'node').map(([k, v]) => `${k}=${typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v)}`).join(' ')
    : JSON.stringify(plain(body));
  return `${at.toISOString().slice(11, 23)} ${kind.padEnd(8)} ${source.padEnd(12)} ${fields}`;
}

export function register(program: Command): void {
  program
    .command('ctl')
    .description('send a control command to a running job and print the reply (status, pause, resume, regroup, recover, checkpoint, shutdown)')
    .argument('<command>', 'the command: status, pause, resume, regroup, recover, checkpoint, shutdown')
    .argument('[json]', 'its fields as JSON, e.g. \'{"reason":"maintenance"}\' (default {})')
    .option('--config <file>', 'the job\'s config (its job name and NATS servers)')
    .option('--nats <urls>', 'NATS URLs, comma-separated (instead of, or over, nats.servers)')
    .option('--job <name>', 'job name (default: job.name of the config)')
    .option('--auth <file>', 'access control: log in with this role\'s credentials (<dir>/auth/<role>.json of `hetps nats up --secure`; default with nats.secure: the operator role of nats.auth_dir)')
    .option('--timeout <seconds>', 'how long to wait for the reply', '60')
    .option('--json', 'print the reply\'s result as JSON', false)
    .action(async (command: string, json: string | undefined, flags: ConnectFlags & { json: boolean; timeout: string }) => {
      let fields: unknown = {};
      if (json !== undefined) {
        try { fields = JSON.parse(json); } catch (e) { throw new ConfigError(`hetps ctl ${command}: the fields are not JSON (${(e as Error).message}): ${json}`, { data: { field: 'json' } }); }
      }
      const timeoutS = Number(flags.timeout);
      if (!(timeoutS > 0)) throw new ConfigError(`--timeout must be a positive number of seconds, got ${flags.timeout}`, { data: { field: '--timeout' } });
      const { job, transport } = await connectToJob(flags, 'ctl');
      try {
        const result = await sendControl(transport, job, token(command, 'command'), fields, timeoutS * 1000);
        if (flags.json) process.stdout.write(`${JSON.stringify(result)}\n`);
        else if (command === 'status') process.stdout.write(formatStatus(result as StatusLike));
        else process.stdout.write(`ctl.${command}: ${JSON.stringify(result, null, 2)}\n`);
      } finally {
        await transport.close();
      }
    });

  program
    .command('top')
    .description('a live view of a running job: workers, groups, shards and the latest events (plain lines when not on a terminal)')
    .option('--config <file>', 'the job\'s config (its job name and NATS servers)')
    .option('--nats <urls>', 'NATS URLs, comma-separated (instead of, or over, nats.servers)')
    .option('--job <name>', 'job name (default: job.name of the config)')
    .option('--auth <file>', 'access control: log in with this role\'s credentials (<dir>/auth/<role>.json of `hetps nats up --secure`; default with nats.secure: the operator role of nats.auth_dir: top asks status)')
    .option('--every <seconds>', 'refresh interval', '1')
    .option('--once', 'print one screen and exit', false)
    .action(async (flags: ConnectFlags & { every: string; once: boolean }) => {
      const everyS = Number(flags.every);
      if (!(everyS > 0)) throw new ConfigError(`--every must be a positive number of seconds, got ${flags.every}`, { data: { field: '--every' } });
      const { job, transport } = await connectToJob(flags, 'top', 'operator');
      const tty = Boolean(process.stdout.isTTY) && !flags.once;
      const { createLogUpdate } = await import('log-update');
      const draw = tty ? createLogUpdate(process.stdout) : (s: string) => process.stdout.write(`${s}\n\n`);
      let stop = false;
      const onSignal = () => { stop = true; };
      process.once('SIGINT', onSignal);
      process.once('SIGTERM', onSignal);
      try {
        for (;;) {
          let screen: string;
          try {
            screen = topScreen(await sendControl(transport, job, 'status', { events: 5 }, 5_000) as StatusLike);
          } catch (e) {
            if (flags.once) throw e;
            screen = `hetps top — job ${job}: ${(e as Error).message}`;
          }
          draw(screen);
          if (flags.once || stop) break;
          await new Promise((r) => setTimeout(r, everyS * 1000));
          if (stop) break;
        }
      } finally {
        if (tty) (draw as ReturnType<typeof createLogUpdate>).done();
        await transport.close();
      }
    });

  program
    .command('tail')
    .description('print a running job\'s telemetry as it comes (all kinds, or the ones named)')
    .argument('[kinds...]', 'telemetry kinds: batch, progress, start, done, regroup, profile, health, event (default: all)')
    .option('--config <file>', 'the job\'s config (its job name and NATS servers)')
    .option('--nats <urls>', 'NATS URLs, comma-separated (instead of, or over, nats.servers)')
    .option('--job <name>', 'job name (default: job.name of the config)')
    .option('--auth <file>', 'access control: log in with this role\'s credentials (<dir>/auth/<role>.json of `hetps nats up --secure`; default with nats.secure: the monitor role of nats.auth_dir)')
    .option('--json', 'one JSON object per line: { subject, kind, source, at, data }', false)
    .option('--count <n>', 'stop after this many messages')
    .action(async (kinds: string[], flags: ConnectFlags & { json: boolean; count?: string }) => {
      const count = flags.count === undefined ? null : Number(flags.count);
      if (count !== null && (!Number.isInteger(count) || count <= 0)) throw new ConfigError(`--count must be a positive integer, got ${flags.count}`, { data: { field: '--count' } });
      const { job, transport } = await connectToJob(flags, 'tail', 'monitor');
      const prefix = `${jobPrefix(job)}.tel.`;
      let seen = 0;
      let done!: () => void;
      const finished = new Promise<void>((r) => { done = r; });
      const subjects = kinds.length === 0 ? [telemetryWildcard(job)] : kinds.map((k) => telemetryWildcard(job, token(k, 'telemetry kind')));
      const subs = subjects.map((subject) => transport.subscribe(subject, (m) => {
        if (count !== null && seen >= count) return;
        const [kind = '?', ...rest] = m.subject.slice(prefix.length).split('.');
        const source = rest.join('.');
        let body: unknown;
        try { body = decode(m.data); } catch { body = `<${m.data.byteLength} bytes that are not msgpack>`; }
        const at = new Date();
        process.stdout.write(flags.json
          ? `${JSON.stringify({ subject: m.subject, kind, source, at: at.toISOString(), data: plain(body) })}\n`
          : `${telemetryLine(kind, source, body, at)}\n`);
        if (count !== null && ++seen >= count) done();
      }));
      process.stderr.write(`tail: ${subjects.join(', ')} (Ctrl-C to stop)\n`);
      const stop = () => done();
      process.once('SIGINT', stop);
      process.once('SIGTERM', stop);
      await finished;
      for (const s of subs) s.unsubscribe();
      await transport.close();
    });
}
