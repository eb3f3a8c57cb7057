/**
 * `hetps recover --force-sync`: the reference article's recovery after a
 * partition — every hps group of a running job re-forms with its groups
 * unchanged: each member pauses at its window boundary, pulls fresh
 * parameters and syncs again (a group degraded to async included). Sent as
 * `hps.<job>.ctl.recover` like any NATS client would.
 */
import type { Command } from 'commander';
import { ConfigError, connectTransport } from '../runtime/mod.ts';
import { sendControl } from './ctl.ts';
import { loadConfig, natsConnectionAs } from '../topology/mod.ts';
import { natsServersFrom, withJobName } from './launch.ts';

interface RecoverFlags { config: string; forceSync: boolean; nats?: string; job?: string; reason: string; json: boolean }

export function register(program: Command): void {
  program
    .command('recover')
    .description('re-form every hps group of a running job: a fresh pull of the parameters, then synchronous rounds again (after a partition)')
    .requiredOption('--config <file>', 'the job\'s config (its job name and NATS servers)')
    .option('--force-sync', 're-form every group now (the only recovery there is; the flag says so explicitly, as in the reference article)', false)
    .option('--nats <urls>', 'NATS URLs, comma-separated, instead of nats.servers')
    .option('--job <name>', 'job name (default: job.name of the config)')
    .option('--reason <text>', 'why, for the job\'s log and events', 'hetps recover --force-sync')
    .option('--json', 'print the reply as JSON', false)
    .action(async (flags: RecoverFlags) => {
      if (!flags.forceSync) throw new ConfigError('hetps recover needs --force-sync (every group re-forms: a fresh pull, then synchronous rounds)', { data: { field: '--force-sync' } });
      const config = withJobName(await loadConfig(flags.config), flags.job);
      const conn = natsConnectionAs(config, 'operator');
      const transport = await connectTransport({ servers: natsServersFrom(flags.nats, config), name: 'hetps-recover', auth: conn.auth, tls: conn.tls });
      try {
        const result = await sendControl(transport, config.job.name, 'recover', { reason: flags.reason }, 30_000) as { groups_version: number; groups: { name: string; nodes: string[] }[] };
        if (flags.json) process.stdout.write(`${JSON.stringify(result)}\n`);
        else process.stdout.write(`recover: groups v${result.groups_version}: ${result.groups.map((g) => `${g.name} [${g.nodes.join(', ')}]`).join('; ')} re-form at their next window boundary (a fresh pull, then synchronous rounds)\n`);
      } finally {
        await transport.close();
      }
    });
}
