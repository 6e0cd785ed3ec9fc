/** `pdctl journal synth`: a realistic synthetic journal through the real append path. */

import { existsSync } from 'node:fs';
import { isPostgresJournal, openJournal, openJournalReader } from '../../app/journal.ts';
import { UsageError } from '../../errors.ts';
import { DURABILITIES, type Durability } from '../../journal/store.ts';
import { synthEvents } from '../../journal/synth.ts';
import { silentLogger } from '../../log.ts';
import { parseDuration, parseTime } from '../../time.ts';
import { type CommonOptions, EXIT, note, print, printJson, VERSION } from '../context.ts';

export interface SynthOptions extends CommonOptions {
  rooms: string;
  seed: string;
  span: string;
  end: string;
  durability: string;
  prefill: string;
  decode: string;
  incidents: string;
}

function parseDurability(input: string): Durability {
  if (!(DURABILITIES as readonly string[]).includes(input))
    throw new UsageError(`--durability must be one of ${DURABILITIES.join(', ')}, got "${input}"`);
  return input as Durability;
}

export async function synthCommand(opts: SynthOptions): Promise<number> {
  const rooms = Number(opts.rooms);
  if (!Number.isInteger(rooms) || rooms < 1 || rooms > 10_000_000)
    throw new UsageError(`--rooms must be an integer from 1 to 10000000, got "${opts.rooms}"`);
  const seed = Number(opts.seed);
  if (!Number.isInteger(seed))
    throw new UsageError(`--seed must be an integer, got "${opts.seed}"`);
  const durability = parseDurability(opts.durability);
  const engines = (s: string, flag: string) => {
    const list = s
      .split(',')
      .map((x) => x.trim())
      .filter(Boolean);
    if (!list.length) throw new UsageError(`${flag} needs at least one engine id`);
    return list;
  };
  const options = {
    rooms,
    seed,
    spanMs: parseDuration(opts.span, '--span'),
    endTs: parseTime(opts.end),
    prefill: engines(opts.prefill, '--prefill'),
    decode: engines(opts.decode, '--decode'),
    incidents: Number(opts.incidents),
  };
  if (!Number.isInteger(options.incidents) || options.incidents < 0 || options.incidents > 1000) {
    throw new UsageError(`--incidents must be an integer from 0 to 1000, got "${opts.incidents}"`);
  }
  await refuseHeldRooms(opts.journal);
  const journal = await openJournal({
    path: opts.journal,
    durability,
    log: silentLogger,
    announce: { source: 'synth', version: VERSION },
  });
  const started = performance.now();
  const progress = { roomsStarted: 0 };
  const counts = { applied: 0, rejected: 0, duplicate: 0 };
  let appended = 0;
  let lastNote = started;
  const window = new Set<Promise<void>>();
  // Ctrl-C stops generating; what was appended is committed before exit, so the journal is whole.
  let interrupted = false;
  const stop = () => {
    interrupted = true;
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  try {
    for (const ev of synthEvents(options, progress)) {
      if (interrupted) break;
      const p = journal.append(ev).then((r) => {
        counts[r.status]++;
        window.delete(p);
      });
      window.add(p);
      appended++;
      if (window.size >= 2048) await Promise.race(window);
      const t = performance.now();
      if (t - lastNote > 1000) {
        lastNote = t;
        note(
          `synth: ${progress.roomsStarted}/${rooms} rooms, ${appended} events, ${Math.round(appended / ((t - started) / 1000))} events/s`,
        );
      }
    }
    await Promise.all(window);
  } finally {
    process.off('SIGINT', stop);
    process.off('SIGTERM', stop);
    await journal.drain();
  }
  if (interrupted) {
    note(
      `synth: interrupted after ${appended} events; every one of them is committed and the journal is consistent`,
    );
    return EXIT.interrupted;
  }
  const secs = (performance.now() - started) / 1000;
  const summary = {
    journal: opts.journal,
    rooms,
    events: appended,
    ...counts,
    seconds: Number(secs.toFixed(2)),
    eventsPerSecond: Math.round(appended / secs),
  };
  if (opts.json) printJson(summary);
  else
    print(
      `wrote ${appended} events for ${rooms} rooms to ${opts.journal} in ${secs.toFixed(1)}s (${summary.eventsPerSecond} events/s; ${counts.rejected} rejected as late, as real races produce)`,
    );
  return EXIT.ok;
}

/**
 * Synthetic rooms go into a journal of their own, never beside real ones: with the default path,
 * that would be the journal `pdctl serve` keeps in ./data. Checked before opening it to write, so
 * that a refused journal is left exactly as it was.
 */
async function refuseHeldRooms(path: string): Promise<void> {
  if (!isPostgresJournal(path) && !existsSync(path)) return;
  let held: string | undefined;
  try {
    const reader = openJournalReader(path);
    try {
      held = (await reader.rooms({ limit: 1 })).rooms[0]?.room;
    } finally {
      reader.close();
    }
  } catch {
    return; // not a journal yet (an empty database, a new file): opening it to write says the rest
  }
  if (held)
    throw new UsageError(
      `${path} already holds rooms (${held}, …): synth writes a journal of its own; give --journal a new path, e.g. --journal /tmp/synth.db`,
    );
}
