/**
 * A request in flight when the journal's disk fills used to wait out its state's
 * deadline (minutes for a long decode). Now its client is answered once the journal has refused
 * writes for a second, and its room is failed in the journal once the disk has room again.
 */
import { describe, expect, it } from 'vitest';
import { RoomEndedError } from '../../src/control/intake/streams.ts';
import {
  collect,
  fillJournal,
  poolsFull,
  prompt,
  sqliteFaults,
  startTestStack,
  waitFor,
} from '../helpers/stack.ts';

describe('a full disk under a request in flight', () => {
  it('answers the client within a second or two, and fails the room once the journal can say so', async () => {
    // About 20 s of decoding (200 tokens at 100 ms), far from any deadline the test could wait for.
    const { control, journal } = await startTestStack({
      engineArgs: ['--decode-us-per-token', '100000'],
      journalOutageGraceMs: 1000,
    });
    const stream = control.submit({ prompt: prompt(4, 10), maxTokens: 200 });
    const out = collect(stream);
    await waitFor('the room decoding', () => control.room(stream.room)?.state === 'decoding');
    await fillJournal(journal);
    const fullAt = Date.now();
    expect(control.journal.health().writable).toBe(false);

    const { error, text } = await out;
    const answeredMs = Date.now() - fullAt;
    expect(error).toBeInstanceOf(RoomEndedError);
    expect(error).toMatchObject({ state: 'unavailable' });
    expect(error?.message).toMatch(/the journal has refused writes for \d+ ms/);
    // Answered after the 1 s grace, long before the ~20 s decode could have ended it.
    expect(answeredMs).toBeLessThan(10_000);
    expect(text.length).toBeGreaterThan(0);
    expect((await control.journal.timeline(stream.room)).room?.state).toBe('decoding');

    await sqliteFaults(journal).limitPages(null);
    await waitFor(
      'the room failed in the journal',
      async () => (await control.journal.timeline(stream.room)).room?.state === 'failed',
    );
    expect((await control.journal.timeline(stream.room)).room).toMatchObject({
      reason: 'journal_unavailable',
      failedStage: 'decoding',
      detectedBy: 'control',
    });
    const done = Date.now();
    await waitFor('pools back to capacity', () => poolsFull(control, done));
    // And the stack serves again.
    expect(
      (await collect(control.submit({ prompt: prompt(5, 8), maxTokens: 3 }))).error,
    ).toBeNull();
  });
});
