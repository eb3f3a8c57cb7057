/**
 * pino, one child logger per actor. Level comes from the config or
 * HETPS_LOG_LEVEL; output is pretty when stdout is a TTY, JSON lines otherwise
 * (what log shippers expect).
 */
import { pino, type Logger, type LevelWithSilent } from 'pino';

export type { Logger } from 'pino';

const LEVELS: readonly LevelWithSilent[] = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

export function resolveLogLevel(configured: string | null = null): LevelWithSilent {
  const raw = (configured ?? process.env.HETPS_LOG_LEVEL ?? 'info').toLowerCase();
  if (!(LEVELS as readonly string[]).includes(raw)) {
    throw new Error(`log level ${JSON.stringify(raw)} is not one of ${LEVELS.join(', ')} (set HETPS_LOG_LEVEL or logging.level)`);
  }
  return raw as LevelWithSilent;
}

export interface LoggerOptions {
  level?: string | null;
  /** Force pretty or JSON output; default: pretty when stdout is a TTY. */
  pretty?: boolean | null;
  name?: string;
  /** Write to stderr (keeps stdout clean for `--json` output). */
  stderr?: boolean;
}

export function createLogger(opts: LoggerOptions = {}): Logger {
  const level = resolveLogLevel(opts.level ?? null);
  const pretty = opts.pretty ?? Boolean(process.stdout.isTTY);
  const fd = opts.stderr ? 2 : 1;
  if (pretty) {
    return pino({
      name: opts.name ?? 'hetps',
      level,
      transport: { target: 'pino-pretty', options: { destination: fd, colorize: true, translateTime: 'HH:MM:ss.l', ignore: 'pid,hostname' } },
    });
  }
  return pino({ name: opts.name ?? 'hetps', level }, pino.destination({ fd, sync: false }));
}

/** A logger that drops everything; for tests and benchmarks. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
