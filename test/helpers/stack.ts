/** A whole stack for end-to-end tests: real journal file, real bus, real engine processes. */
import { join } from 'node:path';
import { afterEach } from 'vitest';
import { journalFaults } from '../../src/app/journal.ts';
import { type Stack, type StackOptions, startStack } from '../../src/app/stack.ts';
import type { ControlPlane } from '../../src/control/control-plane.ts';
import type { RoomStream } from '../../src/control/intake/streams.ts';
import type { SqliteFaults } from '../../src/journal/sqlite/faults.ts';
import { silentLogger } from '../../src/log.ts';
import { ROOM_PATH } from '../../src/room/states.ts';
import { PDCTL_BIN } from './spawn.ts';
import { tempDir } from './tmp.ts';

export { committed, waitFor } from './wait.ts';

const running = new Set<Stack>();
afterEach(async () => {
  for (const s of running) await s.stop();
  running.clear();
});

export async function startTestStack(options: Partial<StackOptions> = {}): Promise<Stack> {
  const dir = tempDir('pdctl-stack-');
  const stack = await startStack({
    journalPath: join(dir, 'journal.db'),
    durability: 'process',
    log: silentLogger,
    version: 'test',
    engineLogLevel: process.env.PDCTL_TEST_ENGINE_LOG ?? 'error',
    // Engines start as installed ones do, from the compiled build (build-setup.ts keeps it fresh).
    engineEntry: PDCTL_BIN,
    // Tests fill the journal's disk through its fault hooks (fillJournal).
    journalFaults: true,
    ...options,
  });
  running.add(stack);
  return stack;
}

/** Reads a stream to its end: the chunks' text, and the result (or the error it ended with). */
export async function collect(
  stream: RoomStream,
): Promise<{ room: string; text: string; chunks: number; error: Error | null }> {
  let text = '';
  let chunks = 0;
  try {
    for await (const c of stream) {
      text += c.text;
      chunks++;
    }
    return { room: stream.room, text, chunks, error: null };
  } catch (err) {
    return { room: stream.room, text, chunks, error: err as Error };
  }
}

/** The fault hooks of the stack's journal (SQLite, opened with them); throws for another backend. */
export function sqliteFaults(journal: Stack['journal']): SqliteFaults {
  const faults = journalFaults(journal);
  if (!faults) throw new Error('this test needs the SQLite journal, opened with its fault hooks');
  return faults;
}

/**
 * Makes the journal unwritable as a full disk would: it may not grow past its current pages, and
 * operator records fill those until a commit fails. (Not requests: a room created just before the
 * disk fills could not progress afterwards.) `sqliteFaults(journal).limitPages(null)` gives room again.
 */
export async function fillJournal(journal: Stack['journal']): Promise<void> {
  const faults = sqliteFaults(journal);
  await faults.limitPages(faults.pageCount());
  for (const size of [400, 1]) {
    let failed = false;
    for (let i = 0; i < 2000 && !failed; i++) {
      failed = await journal
        .append({
          type: 'recovery.action',
          source: 'test',
          data: { action: 'fill', reason: 'x'.repeat(size), outcome: String(i) },
        })
        .then(
          () => false,
          () => true,
        );
    }
    if (!failed) throw new Error('the journal still took writes after 2000 records');
  }
}

/**
 * True once every engine's latest heartbeat, sent after `since` (unix ms), reports all its pages
 * free: an older heartbeat could predate the rooms.
 */
export function poolsFull(control: ControlPlane, since: number): boolean {
  const s = control.registry.all();
  return (
    s.length > 0 &&
    s.every(
      (e) =>
        e.health.heartbeat !== null &&
        e.health.lastSeen > since &&
        e.health.heartbeat.freePages === e.pages,
    )
  );
}

/** The events of a room that completed undisturbed (its two `room.released` aside). */
const HAPPY_PATH: readonly string[] = ROOM_PATH;

/**
 * Whether a room's event types (its releases aside) are the happy path: every event once,
 * `room.created` first and `room.completed` last, and each engine's own events in the path's
 * order. The decode engine's acknowledgement (`room.bootstrap_started`, `room.bootstrapped`) may
 * commit anywhere before its `room.decode_started` — the prefill engine starts on `room.created`
 * (protocol 7) — so the two engines' events interleave.
 */
export function isHappyPath(types: readonly string[]): boolean {
  const t = types.filter((x) => x !== 'room.released');
  const inOrder = (xs: readonly string[]) => {
    const seen = t.filter((x) => xs.includes(x));
    return seen.length === xs.length && seen.every((x, i) => x === xs[i]);
  };
  return (
    t.length === HAPPY_PATH.length &&
    t[0] === 'room.created' &&
    t.at(-1) === 'room.completed' &&
    inOrder(['room.bootstrap_started', 'room.bootstrapped', 'room.decode_started']) &&
    inOrder(['room.prefill_started', 'room.transfer_posted', 'room.transfer_completed']) &&
    inOrder(['room.transfer_completed', 'room.decode_started'])
  );
}

/** Readable prompts of `words` words, different for each `seed`. */
export function prompt(seed: number, words: number): string {
  const vocab = [
    'amber',
    'north',
    'kettle',
    'orbit',
    'willow',
    'granite',
    'velvet',
    'ferry',
    'quartz',
    'tundra',
    'harp',
    'lilac',
  ];
  const out: string[] = [];
  for (let i = 0; i < words; i++)
    out.push(vocab[(seed * 7 + i * 3 + ((seed * i) % 5)) % vocab.length] as string);
  return out.join(' ');
}
