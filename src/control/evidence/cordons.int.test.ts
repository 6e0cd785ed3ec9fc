/**
 * The cordoned set on a real SQLite journal: what cordon and uncordon journal is what a control
 * plane starting on that journal (a restart, a failover) rebuilds, up to the head it starts from.
 */
import { describe, expect, it } from 'vitest';
import { tempDir } from '../../../test/helpers/tmp.ts';
import { SqliteJournal } from '../../journal/sqlite/journal.ts';
import { silentLogger } from '../../log.ts';
import { StartState } from '../checkpoint/state.ts';
import { type CordonDeps, Cordons } from './cordons.ts';

describe('Cordons', () => {
  it('journals cordons and uncordons, and a new control plane rebuilds the same set from them', async () => {
    const journal = await SqliteJournal.open({ path: `${tempDir('pdctl-cordons-')}/j.db` });
    try {
      const fenced: string[] = [];
      const deps: CordonDeps = {
        journal,
        log: silentLogger,
        control: {
          book: { liveOn: (e) => (e === 'decode-1' ? 4 : 0) },
          fence: (e, inc) => fenced.push(`${e}/${inc}`) > 0,
        },
      };
      const live = new Cordons();
      expect(await live.cordon(deps, 'decode-1', 'i7', 'work stall', 'ladder', 'alone')).toBe(true);
      expect(await live.cordon(deps, 'decode-1', 'i7', 'again', 'ladder')).toBe(false);
      expect(await live.cordon(deps, 'prefill-0', null, 'inspect', 'operator')).toBe(true);
      const headWithBoth = await journal.headSeq();
      expect(await live.uncordon(deps, 'prefill-0', 'done')).toBe(true);
      expect(await live.uncordon(deps, 'prefill-0', 'done')).toBe(false);
      expect(fenced).toEqual(['decode-1/i7']);
      const [first] = await journal.tail({ type: 'engine.cordoned', engine: 'decode-1' });
      expect(first?.data).toEqual({
        reason: 'work stall',
        by: 'ladder',
        rooms: 4,
        evidence: 'alone',
      });

      const rebuilt = new StartState();
      await rebuilt.foldJournal(journal, await journal.headSeq());
      expect([...rebuilt.cordons.keys()]).toEqual(['decode-1']);
      expect(rebuilt.cordons.get('decode-1')).toMatchObject({
        reason: 'work stall',
        by: 'ladder',
        evidence: 'alone',
      });
      const earlier = new StartState();
      await earlier.foldJournal(journal, headWithBoth);
      expect([...earlier.cordons.keys()].sort()).toEqual(['decode-1', 'prefill-0']);
      // Restored from a fold, the set answers as the live one did then.
      const restored = new Cordons();
      restored.restore(earlier.cordons);
      expect(restored.has('prefill-0')).toBe(true);
    } finally {
      await journal.close();
    }
  });
});
