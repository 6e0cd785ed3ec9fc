/**
 * The journal of a simulated fleet as production runs it (issue 67, `--journal sqlite`): SQLite
 * in a file of its own, packing the rooms that ended, retention pruning them into an archive
 * while serving, state checkpoints — all on the fleet's virtual clock — with the storage faults an
 * operator meets: a full disk under the database (SQLITE_FULL, by a cap on its pages), an archive
 * whose disk fills (writes come up short, then ENOSPC) or whose fsync fails, and a control plane
 * killed mid-write, which also tears whatever the archive had not synced.
 *
 * The fleet's in-memory disk becomes the record of what was committed: every event as its commit
 * published it. At the end every room in it must read back, byte for byte, through pdctl's own
 * readers — from the journal, or from the archive for a room retention pruned — and after every
 * crash `journal verify` must pass on the file.
 */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openArchiveReader } from '../journal/archive/segments.ts';
import { copyEvent, type MemoryDisk } from '../journal/memory/disk.ts';
import { releasedByBoth } from '../journal/queries.ts';
import { Retention } from '../journal/retention.ts';
import type { SqliteFaults } from '../journal/sqlite/faults.ts';
import { SqliteJournal } from '../journal/sqlite/journal.ts';
import { SqliteReader } from '../journal/sqlite/reader.ts';
import type { JournalReader, JournalStore } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import type { Clock } from '../ports/clock.ts';
import { type FileFault, MemoryFiles } from '../ports/files.ts';
import type { Ids } from '../ports/ids.ts';
import type { Random } from '../ports/random.ts';
import type { JournalEvent } from '../room/events.ts';
import { reduce } from '../room/reducer.ts';
import type { Violation } from './invariants.ts';

/** Where retention writes the archive, on the simulated archive disk. */
export const ARCHIVE_DIR = '/archive';
/**
 * Rooms that ended this long ago are packed, and pruned into the archive this much later: short
 * enough that a 200-room seed packs and prunes most of its rooms while faults still land.
 */
const PACK_AFTER_MS = 2000;
const PACK_EVERY_MS = 1000;
const RETAIN_MS = 5000;
const RETAIN_EVERY_MS = 2000;
/**
 * The control plane's state checkpoints, at least this often: well inside the horizon, as
 * production's 60 s are inside `--retain`'s least 5 min (what a restart restores is then the
 * fold of everything committed, rooms pruned since included).
 */
export const SIM_CHECKPOINT_EVERY_MS = 1000;

export type ArchiveFault = 'archive-full' | 'archive-eio';

export class SqliteStorage {
  /** The archive's file system, in memory; its faults are set while an archive fault lasts. */
  readonly files = new MemoryFiles();
  readonly violations: Violation[] = [];
  /** Why the database's disk is full now; null: it has room. */
  private full: string | null = null;
  /** A fault or crash may have torn the archive: a damaged stretch is then no defect. */
  private tornBy: string | null = null;
  private crashes = 0;
  /** The journal the running control plane opened; null once it died. */
  private current: SqliteJournal | null = null;

  private constructor(
    readonly dir: string,
    /** Every event as committed: the fleet's in-memory disk. */
    private readonly committed: MemoryDisk,
    private readonly random: Random,
  ) {}

  /** Its file goes in memory where the machine has it (/dev/shm): the run is not the disk's. */
  static create(committed: MemoryDisk, random: Random): SqliteStorage {
    const base = existsSync('/dev/shm') ? '/dev/shm' : tmpdir();
    return new SqliteStorage(mkdtempSync(join(base, 'pdctl-sim-')), committed, random);
  }

  get path(): string {
    return join(this.dir, 'journal.db');
  }

  /**
   * The journal a control-plane process opens, as `pdctl serve` opens it (process durability: the
   * writer is inline, and so are its WAL checkpoints, so nothing waits on a thread off the virtual
   * clock), packing on; its commits are recorded before anything else hears of them.
   */
  async open(clock: Clock, ids: Ids, log: Logger): Promise<JournalStore> {
    const journal = await SqliteJournal.open({
      path: this.path,
      durability: 'process',
      walCheckpoints: 'inline',
      clock,
      ids,
      packAfterMs: PACK_AFTER_MS,
      packEveryMs: PACK_EVERY_MS,
      logger: log,
      faults: true,
    });
    journal.subscribe(this.committed.headSeq(), (ev) => record(this.committed, ev));
    const faults = hooks(journal);
    if (this.full !== null) await faults.limitPages(faults.pageCount());
    this.current = journal;
    return journal;
  }

  /** Retention while serving on the journal just opened, archiving onto the simulated disk. */
  retention(log: Logger, clock: Clock): Retention {
    if (this.current === null) throw new Error('retention before the journal was opened');
    return new Retention(
      this.current,
      { roomsMs: RETAIN_MS, everyMs: RETAIN_EVERY_MS, archiveDir: ARCHIVE_DIR },
      log,
      clock,
      this.files,
    );
  }

  /** The database's disk fills (`why`) or has room again (null): the writer's page cap. */
  refuseWrites(why: string | null): void {
    this.full = why;
    const journal = this.current;
    if (journal === null) return;
    const faults = hooks(journal);
    void faults.limitPages(why === null ? null : faults.pageCount()).catch(() => {
      // A closed journal: the next one opened takes the cap at its open.
    });
  }

  /**
   * An archive fault starts: its disk fills — the next writes come up short, then fail with
   * ENOSPC — or it fails: fsync and truncate with EIO, so what a failed write left stays
   * unsynced, for a crash to tear. Returns what heals it.
   */
  archiveFault(kind: ArchiveFault): () => void {
    this.tornBy ??= kind;
    let free = this.random.between(0, 4096);
    this.files.fault = (op, _path, bytes): FileFault => {
      // A failing disk: no fsync, and no cut-back of what a failed one left (readers skip it).
      if (kind === 'archive-eio')
        return op === 'sync' || op === 'truncate' ? { code: 'EIO' } : null;
      if (op !== 'write') return null;
      if (free === 0) return { code: 'ENOSPC' };
      const n = Math.min(free, bytes);
      free -= n;
      return { short: n };
    };
    return () => {
      this.files.fault = () => null;
    };
  }

  /**
   * The control plane's process died: its journal closes at once (what was committed stays in the
   * file, as process durability promises), the archive loses — or tears — what it had not
   * synced, and `journal verify` must pass on what is left.
   */
  async crashed(): Promise<void> {
    if (this.current === null) return;
    this.current.close();
    this.current = null;
    this.crashes++;
    this.tornBy ??= 'a crash';
    this.files.crash((synced, end) => synced + Math.floor(this.random.next() * (end - synced + 1)));
    const reader = new SqliteReader(this.path);
    try {
      const report = await reader.verify();
      if (!report.ok)
        this.violations.push({
          invariant: 'journal_verifies_after_crash',
          room: null,
          seq: 0,
          detail: `after crash ${this.crashes}: ${JSON.stringify(report).slice(0, 400)}`,
        });
    } finally {
      reader.close();
    }
  }

  /**
   * At the end: every room committed reads back whole through pdctl's readers — the journal's,
   * or the archive's for one retention pruned — every event as it was committed; a room found
   * only in the archive had ended and been released by both its engines when it was pruned (and
   * nothing of it came after); and the archive reads, a torn stretch skipped only where a fault
   * or crash tore it.
   */
  async check(journal: JournalReader): Promise<Violation[]> {
    const out = [...this.violations];
    const damaged: string[] = [];
    let archive: JournalReader | null = null;
    try {
      archive = openArchiveReader(ARCHIVE_DIR, {
        files: this.files,
        onDamage: (d) => damaged.push(`${d.file} at ${d.offset}: ${d.why}`),
      });
    } catch (err) {
      // No archive written at all is no defect: nothing was pruned.
      if (!/does not exist|no such|ENOENT/i.test((err as Error).message))
        out.push({
          invariant: 'archive_readable',
          room: null,
          seq: 0,
          detail: `the archive cannot be read: ${(err as Error).message}`,
        });
    }
    if (damaged.length > 0 && this.tornBy === null)
      out.push({
        invariant: 'archive_readable',
        room: null,
        seq: 0,
        detail: `a stretch of the archive was skipped though no fault tore it: ${damaged.join('; ')}`,
      });
    const byRoom = new Map<string, JournalEvent[]>();
    for (const ev of this.committed.events)
      if (ev.room !== null) byRoom.set(ev.room, [...(byRoom.get(ev.room) ?? []), ev]);
    for (const [room, committed] of byRoom) {
      if (out.length >= 20) break;
      const inJournal = (await journal.timeline(room)).events;
      const archived = inJournal.length > 0 ? null : ((await archive?.timeline(room)) ?? null);
      const read = archived?.events ?? inJournal;
      const from =
        inJournal.length > 0
          ? 'the journal'
          : archived === null
            ? 'neither the journal nor the archive'
            : 'the archive';
      const pruned = archived?.room ?? null;
      if (pruned !== null && (pruned.deadlineAt !== null || !releasedByBoth(pruned)))
        out.push({
          invariant: 'pruned_room_was_done',
          room,
          seq: 0,
          detail: `retention pruned it in ${pruned.state}, released by ${JSON.stringify(pruned.releasedBy)} of ${pruned.prefillEngine} and ${pruned.decodeEngine}: only a room ended and released by both its engines may go`,
        });
      const want = committed.map(text);
      const got = read.map(text);
      if (want.join('\n') === got.join('\n')) continue;
      const at = want.findIndex((w, i) => w !== got[i]);
      out.push({
        invariant:
          from === 'the archive' &&
          got.length > 0 &&
          got.length < want.length &&
          got.every((g, i) => g === want[i])
            ? 'pruned_room_was_done'
            : 'committed_room_readable',
        room,
        seq: committed[at]?.seq ?? 0,
        detail: `${from} gives ${got.length} of its ${want.length} events; the first that differs, committed: ${(want[at] ?? 'none').slice(0, 200)}; read: ${(got[at] ?? 'none').slice(0, 200)}`,
      });
    }
    return out;
  }

  /** The run's files go. */
  remove(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * An event as text, its fields in one order (readers build them in the order of their columns);
 * its data as it was written, byte for byte.
 */
function text(ev: JournalEvent): string {
  return JSON.stringify(
    Object.fromEntries(Object.entries(ev).sort(([a], [b]) => (a < b ? -1 : 1))),
  );
}

/** Records a committed event, folding its room as the journal's writer did. */
function record(committed: MemoryDisk, ev: JournalEvent): void {
  if (ev.seq <= committed.headSeq()) return;
  committed.add(copyEvent(ev));
  committed.lastSeq = ev.seq;
  if (ev.room === null || !ev.type.startsWith('room.') || ev.type === 'room.event_rejected') return;
  const result = reduce(committed.rooms.get(ev.room) ?? null, ev);
  if (!result.ok) return;
  result.room.lastSeq = ev.seq;
  committed.rooms.set(ev.room, result.room);
}

/** The hooks of a journal the simulator opened (always with them). */
function hooks(journal: SqliteJournal): SqliteFaults {
  const faults = journal.faults;
  if (!faults) throw new Error('the simulator opens its SQLite journal with its fault hooks');
  return faults;
}
