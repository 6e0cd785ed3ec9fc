/** `pdctl journal prune`: delete whole terminal rooms older than a cut-off. */

import { openJournal, openJournalReader } from '../../app/journal.ts';
import { UsageError } from '../../errors.ts';
import { silentLogger } from '../../log.ts';
import { formatTs, parseDuration } from '../../time.ts';
import { type CommonOptions, EXIT, print, printJson } from '../context.ts';

export interface PruneOptions extends CommonOptions {
  olderThan: string;
  chunk: string;
  dryRun?: boolean;
}

export async function pruneCommand(opts: PruneOptions): Promise<number> {
  const age = parseDuration(opts.olderThan, '--older-than');
  const chunk = Number(opts.chunk);
  if (!Number.isInteger(chunk) || chunk < 1 || chunk > 100_000)
    throw new UsageError('--chunk must be an integer from 1 to 100000');
  const cutoffTs = Date.now() - age;
  if (opts.dryRun) {
    const reader = openJournalReader(opts.journal);
    try {
      const n = await reader.countPrunable(cutoffTs);
      if (opts.json) printJson({ cutoffTs, rooms: n.rooms, events: n.events, dryRun: true });
      else
        print(
          `would delete ${n.rooms} terminal rooms (${n.events} events) that ended before ${formatTs(cutoffTs)}`,
        );
      return EXIT.ok;
    } finally {
      reader.close();
    }
  }
  const journal = await openJournal({ path: opts.journal, create: false, log: silentLogger });
  try {
    const r = await journal.prune({ cutoffTs, chunkRooms: chunk });
    if (opts.json) printJson(r);
    else
      print(
        `deleted ${r.rooms} terminal rooms (${r.events} events) that ended before ${formatTs(cutoffTs)}, in ${r.batches} chunks; live rooms are never pruned`,
      );
    return EXIT.ok;
  } finally {
    await journal.drain();
  }
}
