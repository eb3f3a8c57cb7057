/**
 * The `hetps` command. Each command group lives in its own file and registers
 * itself on the program; errors are printed as one clear line plus what to do.
 */
import { Command, CommanderError } from 'commander';
import { readFileSync } from 'node:fs';
import { HetpsError } from '../runtime/errors.ts';

const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };

export function buildProgram(): Command {
  const program = new Command();
  program
    .name('hetps')
    .description('hetps — a heterogeneous parameter server over NATS')
    .version(pkg.version, '-V, --version')
    .showHelpAfterError('(run hetps --help for usage)');
  for (const register of commandRegistry) register(program);
  return program;
}

type Register = (program: Command) => void;
const commandRegistry: Register[] = [];

async function loadCommands(): Promise<void> {
  // Loaded lazily so `hetps --version` does not pay for onnxruntime.
  const mods = await Promise.all([
    import('./nats.ts').catch(missingModule),
    import('./demo.ts').catch(missingModule),
    import('./profile.ts').catch(missingModule),
    import('./train-local.ts').catch(missingModule),
    import('./launch.ts').catch(missingModule),
    import('./up.ts').catch(missingModule),
    import('./plan.ts').catch(missingModule),
    import('./checkpoint.ts').catch(missingModule),
    import('./recover.ts').catch(missingModule),
    import('./ctl.ts').catch(missingModule),
    import('./report.ts').catch(missingModule),
    import('./export.ts').catch(missingModule),
  ]);
  for (const m of mods) if (m && typeof m.register === 'function') commandRegistry.push(m.register as Register);
}

function missingModule(e: unknown): null {
  if ((e as NodeJS.ErrnoException).code === 'ERR_MODULE_NOT_FOUND') return null;
  throw e;
}

export async function main(argv: string[]): Promise<number> {
  await loadCommands();
  const program = buildProgram();
  program.exitOverride();
  try {
    await program.parseAsync(argv);
    return 0;
  } catch (e) {
    if (e instanceof CommanderError) return e.exitCode;
    if (e instanceof HetpsError) {
      process.stderr.write(`hetps: ${e.name}: ${e.message}\n`);
      return 2;
    }
    process.stderr.write(`hetps: ${(e as Error).stack ?? String(e)}\n`);
    return 1;
  }
}

const code = await main(process.argv);
process.exitCode = code;
// A failed command has said why; whatever it still holds open (a connection, a
// timer of an actor it could not stop) must not keep the process alive.
if (code !== 0) setTimeout(() => process.exit(code), 2_000).unref();
