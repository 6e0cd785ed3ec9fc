/**
 * What `pdctl journal verify` says of the state checkpoint: whether the next start would trust it,
 * and whether what it holds is what a fold of the journal through its seq gives.
 */
import type { JournalReader } from '../../journal/store.ts';
import { CHECKPOINT_NAME, trustCheckpoint } from './codec.ts';
import { StartState } from './state.ts';

export interface CheckpointCheck {
  /**
   * `equal`: it is the fold of the journal through its seq; `differs`: it is not (a defect);
   * `pruned`: it is not, and retention deleted rooms whose events it folded (expected);
   * `ignored`: the next start would not trust it; `none`: there is none.
   */
  verdict: 'equal' | 'differs' | 'pruned' | 'ignored' | 'none';
  seq: number | null;
  detail: string;
}

/** What a state holds, comparable whatever order its sets were filled in. */
function comparable(s: StartState): string {
  const index = Object.entries(s.index.snapshot())
    .map(([e, h]) => [e, h.incarnation, [...h.blocks].sort()] as const)
    .sort(([a], [b]) => (a < b ? -1 : 1));
  const sorted = <T>(m: Map<string, T>) => [...m].sort(([a], [b]) => (a < b ? -1 : 1));
  return JSON.stringify({
    index,
    cordons: sorted(s.cordons),
    pools: sorted(s.pools).map(([e, ev]) => [e, ev.seq]),
    registered: sorted(s.registered),
  });
}

export async function checkCheckpoint(reader: JournalReader): Promise<CheckpointCheck> {
  const stored = await reader.getCheckpoint(CHECKPOINT_NAME);
  if (!stored)
    return {
      verdict: 'none',
      seq: null,
      detail: 'none yet: the next start folds the whole journal',
    };
  const decoded = await trustCheckpoint(reader, stored, await reader.headSeq());
  if ('ignored' in decoded)
    return {
      verdict: 'ignored',
      seq: stored.seq,
      detail: `the next start would ignore it and fold the whole journal: ${decoded.ignored}`,
    };
  const fold = new StartState();
  await fold.foldJournal(reader, stored.seq);
  if (comparable(fold) === comparable(decoded.state))
    return {
      verdict: 'equal',
      seq: stored.seq,
      detail: 'equals the fold of the journal through it',
    };
  if ((await reader.tail({ type: 'journal.pruned', limit: 1 })).length > 0)
    return {
      verdict: 'pruned',
      seq: stored.seq,
      detail:
        'differs from a fold of what the journal still holds: retention deleted rooms whose events it folded (what a start without it would lose)',
    };
  return {
    verdict: 'differs',
    seq: stored.seq,
    detail:
      'differs from the fold of the journal through it: a start trusts what it holds — report this with the journal',
  };
}
