/**
 * `pdctl journal prune`: delete whole terminal rooms older than a cut-off (and, with
 * `--events-older-than`, events of no room). On a journal file or database no control plane
 * writes, it is the writer; with `--url` it asks the serving control plane to prune through its
 * own writer (`POST /v1/admin/journal/prune`) and follows the pass to its end.
 */
import { openJournal, openJournalReader } from '../../app/journal.ts';
import { UsageError } from '../../errors.ts';
import { archiveChunk } from '../../journal/archive/segments.ts';
import {
  DEFAULT_CHUNK_ROOMS,
  type RetentionPass,
  type RetentionStatus,
} from '../../journal/retention.ts';
import type { ArchiveChunk, PrunableCount, PruneResult } from '../../journal/store.ts';
import { silentLogger } from '../../log.ts';
import { formatTs, parseDuration } from '../../time.ts';
import { callServer, errorOf } from '../api-client.ts';
import { type CommonOptions, EXIT, note, print, printJson, writableArchive } from '../context.ts';

export interface PruneOptions extends CommonOptions {
  olderThan: string;
  eventsOlderThan?: string;
  chunk?: string;
  dryRun?: boolean;
  url?: string;
}

/** How often `--url` asks how far the pass got. */
const POLL_MS = 1000;

export async function pruneCommand(opts: PruneOptions): Promise<number> {
  const age = parseDuration(opts.olderThan, '--older-than');
  const eventsAge =
    opts.eventsOlderThan === undefined
      ? undefined
      : parseDuration(opts.eventsOlderThan, '--events-older-than');
  if (eventsAge !== undefined && eventsAge < age)
    throw new UsageError(
      '--events-older-than must be at least --older-than: events of no room are kept at least as long as rooms',
    );
  const chunk = Number(opts.chunk ?? (opts.url === undefined ? 500 : DEFAULT_CHUNK_ROOMS));
  if (!Number.isInteger(chunk) || chunk < 1 || chunk > 100_000)
    throw new UsageError('--chunk must be an integer from 1 to 100000');
  if (opts.url !== undefined) {
    if (opts.archive !== undefined)
      throw new UsageError(
        '--archive with --url: the server archives where its own serve --archive says (GET /v1/admin/journal/prune shows it); leave --archive out',
      );
    return pruneOnServer(opts, chunk);
  }
  const now = Date.now();
  const cutoffTs = now - age;
  const eventsCutoffTs = eventsAge === undefined ? undefined : now - eventsAge;
  if (opts.dryRun) {
    const reader = openJournalReader(opts.journal);
    try {
      const n = await reader.countPrunable(cutoffTs, eventsCutoffTs);
      printCount(opts, { cutoffTs, eventsCutoffTs: eventsCutoffTs ?? null, ...n });
      return EXIT.ok;
    } finally {
      reader.close();
    }
  }
  const dir = opts.archive === undefined ? undefined : writableArchive(opts.archive);
  const journal = await openJournal({ path: opts.journal, create: false, log: silentLogger });
  let sofar: PruneResult | null = null;
  try {
    const r = await journal.prune({
      cutoffTs,
      ...(eventsCutoffTs === undefined ? {} : { eventsCutoffTs }),
      ...(dir === undefined ? {} : { archive: (c: ArchiveChunk) => archiveChunk(dir, c) }),
      chunkRooms: chunk,
      onChunk: (r) => {
        sofar = r;
      },
    });
    printResult(opts, r);
    return EXIT.ok;
  } catch (err) {
    // What was pruned before the failure stays pruned (and archived): say how far it got.
    const done = sofar as PruneResult | null;
    if (done !== null)
      note(
        `pdctl journal prune: stopped after ${done.rooms} rooms and ${done.otherEvents} events of no room${dir === undefined ? '' : `, each archived in ${dir} first`}`,
      );
    throw err;
  } finally {
    await journal.drain();
  }
}

async function pruneOnServer(opts: PruneOptions, chunk: number): Promise<number> {
  const base = opts.url as string;
  const body = {
    olderThan: opts.olderThan,
    ...(opts.eventsOlderThan === undefined ? {} : { eventsOlderThan: opts.eventsOlderThan }),
    chunk,
    ...(opts.dryRun ? { dryRun: true } : {}),
  };
  const started = await callServer<RetentionPass & PrunableCount>(base, '/v1/admin/journal/prune', {
    method: 'POST',
    body,
  });
  if (started.status === 404)
    throw new UsageError(
      `${base} has no journal retention route: is it a pdctl serve of this version? Stop it and run pdctl journal prune --journal on its journal instead`,
    );
  if (started.status !== 200 && started.status !== 202)
    throw new UsageError(errorOf(started.status, started.body));
  if (opts.dryRun) {
    const n = started.body as unknown as PrunableCount &
      Pick<PruneResult, 'cutoffTs' | 'eventsCutoffTs'>;
    printCount(opts, n);
    return EXIT.ok;
  }
  const ours = started.body.startedAt;
  if (!opts.json) print(`pruning on ${base} through its writer, ${chunk} rooms per transaction…`);
  let shown = -1;
  for (;;) {
    await new Promise((r) => setTimeout(r, POLL_MS));
    const s = await callServer<RetentionStatus>(base, '/v1/admin/journal/prune');
    if (s.status !== 200) throw new UsageError(errorOf(s.status, s.body));
    const { running, lastByOperator: last } = s.body;
    if (running?.startedAt === ours) {
      const r = running.result;
      if (!opts.json && r.rooms + r.otherEvents !== shown) {
        shown = r.rooms + r.otherEvents;
        print(
          `  … ${r.rooms} rooms (${r.events} events), ${r.otherEvents} events of no room so far`,
        );
      }
      continue;
    }
    if (last?.startedAt !== ours) {
      throw new UsageError(
        `${base} no longer shows the prune it started (it restarted, or another operator's prune ran since); pdctl journal tail --type journal.pruned --url ${base} says what was pruned`,
      );
    }
    if (last.error !== null) throw new UsageError(`the prune stopped: ${last.error}`);
    printResult(opts, last.result, last.ms);
    return EXIT.ok;
  }
}

function printCount(
  opts: PruneOptions,
  n: PrunableCount & Pick<PruneResult, 'cutoffTs' | 'eventsCutoffTs'>,
): void {
  if (opts.json) {
    printJson({ ...n, dryRun: true });
    return;
  }
  const others =
    n.eventsCutoffTs === null
      ? ''
      : `, and ${n.otherEvents} events of no room from before ${formatTs(n.eventsCutoffTs)}`;
  print(
    `would delete ${n.rooms} terminal rooms (${n.events} events) that ended before ${formatTs(n.cutoffTs)}${others}`,
  );
}

function printResult(opts: PruneOptions, r: PruneResult, ms?: number | null): void {
  if (opts.json) {
    printJson(ms == null ? r : { ...r, ms });
    return;
  }
  const others =
    r.eventsCutoffTs === null
      ? ''
      : `, and ${r.otherEvents} events of no room from before ${formatTs(r.eventsCutoffTs)}`;
  const took = ms == null ? '' : ` in ${(ms / 1000).toFixed(1)} s`;
  print(
    `deleted ${r.rooms} terminal rooms (${r.events} events) that ended before ${formatTs(r.cutoffTs)}${others}, in ${r.batches} transactions${took}; live rooms are never pruned`,
  );
}
