/** The logger interface pdctl code takes: the (obj, msg) shape of pino, so any pino logger fits. */
import { pino } from 'pino';

export interface Logger {
  debug(obj: object, msg: string): void;
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

export const silentLogger: Logger = {
  debug() {},
  info() {},
  warn() {},
  error() {},
};

export const LOG_LEVELS = ['debug', 'info', 'warn', 'error', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/**
 * A process logger: pino JSON lines on stderr (stdout stays for command output), with `name` on
 * every line (`control`, `engine`). On a terminal, one short human line per record instead.
 */
export function processLogger(name: string, level: LogLevel = 'info', base: object = {}): Logger {
  if (process.stderr.isTTY) return humanLogger(name, level, base);
  return pino({ name, level, base: { pid: process.pid, ...base } }, pino.destination(2));
}

function humanLogger(name: string, level: LogLevel, base: object): Logger {
  const rank = LOG_LEVELS.indexOf(level);
  const line = (lvl: LogLevel, obj: object, msg: string) => {
    if (LOG_LEVELS.indexOf(lvl) < rank) return;
    const fields = Object.entries({ ...base, ...obj })
      .map(
        ([k, v]) =>
          `${k}=${v instanceof Error ? v.message : typeof v === 'string' ? v : JSON.stringify(v)}`,
      )
      .join(' ');
    const t = new Date().toISOString().slice(11, 23);
    process.stderr.write(
      `${t} ${lvl.toUpperCase().padEnd(5)} ${name}: ${msg}${fields ? `  ${fields}` : ''}\n`,
    );
  };
  return {
    debug: (o, m) => line('debug', o, m),
    info: (o, m) => line('info', o, m),
    warn: (o, m) => line('warn', o, m),
    error: (o, m) => line('error', o, m),
  };
}
