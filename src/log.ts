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

/** `json`: one pino JSON record per line; `pretty`: one short human line; `auto`: pretty on a terminal. */
export const LOG_FORMATS = ['auto', 'json', 'pretty'] as const;
export type LogFormat = (typeof LOG_FORMATS)[number];

/**
 * The format this process logs in: `PDCTL_LOG_FORMAT` (set by `--log-format`, and inherited by the
 * engines a stack spawns, so that one stream has one format), else pretty on a terminal.
 */
function logFormat(): 'json' | 'pretty' {
  const f = process.env.PDCTL_LOG_FORMAT;
  if (f === 'json' || f === 'pretty') return f;
  return process.stderr.isTTY ? 'pretty' : 'json';
}

/**
 * A process logger on stderr (stdout stays for command output), with `name` on every line
 * (`control`, `engine`): pino JSON lines with ISO-8601 times, or one short human line per record
 * (`--log-format`, see logFormat).
 */
export function processLogger(name: string, level: LogLevel = 'info', base: object = {}): Logger {
  if (logFormat() === 'pretty') return humanLogger(name, level, base);
  return pino(
    { name, level, base: { pid: process.pid, ...base }, timestamp: pino.stdTimeFunctions.isoTime },
    pino.destination(2),
  );
}

/**
 * A line for the operator whatever the log level (where it listens, what to run next), in the
 * log's format: plain text for a human, a JSON record (`"msg"`) among JSON records — never a
 * line of plain text in a stream a log shipper parses as JSON.
 */
export function announce(name: string, line: string, level = 30): void {
  if (logFormat() === 'pretty') process.stderr.write(`${line}\n`);
  else
    process.stderr.write(
      `${JSON.stringify({ level, time: new Date().toISOString(), pid: process.pid, name, msg: line })}\n`,
    );
}

/** Why a process could not go on, as `announce` writes it, at pino's `error` level. */
export function announceFailure(name: string, line: string): void {
  announce(name, line, 50);
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
