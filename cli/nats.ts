/**
 * `hetps nats up | status | down`: a local NATS cluster for development and
 * for `hetps up`. The servers outlive the command; DIR/cluster.json is how the
 * later commands find them.
 */
import { InvalidArgumentError, type Command } from 'commander';
import { resolve } from 'node:path';
import { ConfigError } from '../runtime/mod.ts';
import { clusterStatus, refuseIfRunning, startLocalCluster, stopLocalCluster, type ClusterStatus } from '../deploy/local-cluster.ts';
import { writeAuthFiles, type AuthFiles } from '../deploy/auth.ts';

function parseNodes(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > 32) throw new InvalidArgumentError('expected a whole number from 1 to 32.');
  return n;
}

function parsePort(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0 || n > 65535) throw new InvalidArgumentError('expected a port from 1 to 65535, or 0 for random.');
  return n;
}

/** Bytes, optionally with a binary suffix: 65536, 64K, 64KB, 8M, 8MB. */
function parseBytes(v: string): number {
  const m = /^(\d+)\s*([kKmM]i?[bB]?)?$/.exec(v.trim());
  if (!m) throw new InvalidArgumentError('expected bytes, e.g. 1048576, 64K or 8MB.');
  const unit = (m[2] ?? '').charAt(0).toLowerCase();
  const n = Number(m[1]) * (unit === 'k' ? 1024 : unit === 'm' ? 1024 * 1024 : 1);
  if (n < 1) throw new InvalidArgumentError('must be at least 1 byte.');
  return n;
}

interface UpOptions {
  nodes: number;
  dir: string;
  port: number;
  clusterPort: number;
  httpPort: number;
  maxPayload?: number;
  jetstream: boolean;
  timeout: number;
  json?: boolean;
  secure?: boolean;
  job?: string;
}

export function register(program: Command): void {
  const nats = program.command('nats').description('run a local NATS cluster (nats-server processes with routes and JetStream)');

  nats.command('up')
    .description('start N nats-server nodes on 127.0.0.1 and leave them running')
    .option('--nodes <n>', 'number of servers', parseNodes, 3)
    .requiredOption('--dir <dir>', 'directory for configs, logs, JetStream data and cluster.json')
    .option('--port <base>', 'client port of node 1 (node i: base+i-1); 0 = random ports', parsePort, 4222)
    .option('--cluster-port <base>', 'route port of node 1; 0 = random', parsePort, 6222)
    .option('--http-port <base>', 'monitoring port of node 1; 0 = random', parsePort, 8222)
    .option('--max-payload <bytes>', 'server max_payload (NATS default: 1MB)', parseBytes)
    .option('--no-jetstream', 'start without JetStream')
    .option('--timeout <seconds>', 'how long to wait for routes and JetStream', (v) => {
      const n = Number(v);
      if (!(n > 0)) throw new InvalidArgumentError('expected a positive number of seconds.');
      return n;
    }, 30)
    .option('--json', 'print the cluster description as JSON')
    .option('--secure', 'refuse anonymous clients: a user per role (scheduler, worker, shard, operator, monitor) with subject permissions; credentials under DIR/auth/')
    .option('--job <name>', 'with --secure: grant the subjects and JetStream streams of this job only (default: any job)')
    .action(async (opts: UpOptions, cmd: Command) => {
      if (opts.job !== undefined && !opts.secure) throw new ConfigError('--job only applies with --secure (it narrows the permissions to one job); add --secure or leave --job out', { data: { field: '--job' } });
      // Fresh credentials must not replace those of servers still running from DIR.
      if (opts.secure) await refuseIfRunning(resolve(opts.dir));
      const auth: AuthFiles | null = opts.secure ? await writeAuthFiles(opts.dir, opts.job ?? null) : null;
      // `--port 0` alone means "all random"; an explicitly given route/http base still wins.
      const explicit = (key: string) => cmd.getOptionValueSource(key) === 'cli';
      const allRandom = opts.port === 0;
      const base = (value: number, key: string) =>
        value === 0 || (allRandom && !explicit(key)) ? null : value;
      const cluster = await startLocalCluster({
        nodes: opts.nodes,
        dir: opts.dir,
        clientPort: opts.port === 0 ? null : opts.port,
        clusterPort: base(opts.clusterPort, 'clusterPort'),
        httpPort: base(opts.httpPort, 'httpPort'),
        maxPayload: opts.maxPayload ?? null,
        jetstream: opts.jetstream,
        detached: true,
        readyTimeoutMs: opts.timeout * 1000,
        logger: (line) => process.stderr.write(`hetps nats: ${line}\n`),
        authorization: auth?.authorization ?? null,
      });
      if (opts.json) {
        const secure = auth ? { auth_dir: auth.dir, job: auth.job, roles: auth.roles } : null;
        process.stdout.write(JSON.stringify({ dir: cluster.dir, urls: cluster.urls, nodes: cluster.nodes, secure }, null, 2) + '\n');
        return;
      }
      process.stdout.write(
        `NATS cluster "${cluster.clusterName}" is up (${cluster.nodes.length} node${cluster.nodes.length > 1 ? 's' : ''}, ` +
        `${opts.jetstream ? 'JetStream on' : 'no JetStream'}).\n` +
        `  NATS_URL=${cluster.urls.join(',')}\n` +
        `  status: hetps nats status --dir ${opts.dir}\n` +
        `  stop:   hetps nats down --dir ${opts.dir}\n` +
        (auth
          ? `Access control is on (job ${auth.job === '*' ? 'any' : auth.job}); anonymous clients are refused. Credentials, one per role (user/password and nkey seed):\n`
            + Object.entries(auth.roles).map(([role, file]) => `  ${role.padEnd(9)} ${file}\n`).join('')
            + `  jobs:     nats.secure: true and nats.auth_dir: ${auth.dir} in the job's YAML\n`
            + `  commands: hetps ctl status --auth ${auth.roles.operator} --nats ${cluster.urls.join(',')}\n`
          : ''),
      );
    });

  nats.command('status')
    .description('show each node of a local cluster: client URL, routes, running')
    .requiredOption('--dir <dir>', 'the directory given to `nats up`')
    .option('--json', 'print { nodes: [{ name, client_url, routes }] }')
    .action(async (opts: { dir: string; json?: boolean }) => {
      const status = await clusterStatus(opts.dir);
      if (opts.json) {
        const nodes = status.nodes.map(({ name, client_url, routes }) => ({ name, client_url, routes }));
        process.stdout.write(JSON.stringify({ nodes }, null, 2) + '\n');
        return;
      }
      process.stdout.write(formatStatus(status, opts.dir));
    });

  nats.command('down')
    .description('stop the servers of a local cluster (SIGTERM, then SIGKILL after a grace period)')
    .requiredOption('--dir <dir>', 'the directory given to `nats up`')
    .action(async (opts: { dir: string }) => {
      const report = await stopLocalCluster(opts.dir);
      for (const n of report.nodes) {
        process.stdout.write(n.was_running
          ? `stopped ${n.name} (pid ${n.pid}${n.stopped_with === 'SIGKILL' ? ', needed SIGKILL' : ''})\n`
          : `${n.name} (pid ${n.pid}) was not running\n`);
      }
      if (!report.nodes.some((n) => n.was_running)) process.stdout.write(`nothing was running from ${opts.dir}\n`);
    });
}

function formatStatus(status: ClusterStatus, dir: string): string {
  const rows = [['NODE', 'CLIENT URL', 'ROUTES', 'STATE']];
  const peers = status.nodes.length - 1;
  for (const n of status.nodes) {
    rows.push([n.name, n.client_url, `${n.routes}/${peers}`, n.running ? 'running' : 'stopped']);
  }
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => r[c]!.length)));
  const text = rows.map((r) => r.map((cell, c) => cell.padEnd(widths[c]!)).join('  ').trimEnd()).join('\n') + '\n';
  const down = status.nodes.filter((n) => !n.running).length;
  if (down === 0) return text;
  return `${text}${down} of ${status.nodes.length} stopped. Start afresh with \`hetps nats down --dir ${dir}\` then \`hetps nats up --dir ${dir} ...\`; node logs are in ${dir}/<node>/nats.log.\n`;
}
