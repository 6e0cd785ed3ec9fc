/**
 * `pdctl journal verify`: integrity, seq order, the rooms projection rebuilt and compared, and
 * the state checkpoint folded again and compared.
 */

import { isPostgresJournal } from '../../app/journal.ts';
import { checkCheckpoint } from '../../control/checkpoint/verify.ts';
import { formatDuration } from '../../time.ts';
import { type CommonOptions, EXIT, openReader, print, printJson } from '../context.ts';

export async function verifyCommand(opts: CommonOptions): Promise<number> {
  const reader = openReader(opts);
  try {
    const r = await reader.verify();
    const checkpoint = await checkCheckpoint(reader);
    const ok = r.ok && checkpoint.verdict !== 'differs';
    if (opts.json) {
      printJson({ ...r, ok, checkpoint });
      return ok ? EXIT.ok : EXIT.problem;
    }
    const mark = (ok: boolean) => (ok ? 'ok  ' : 'FAIL');
    if (isPostgresJournal(opts.journal)) {
      print(
        '      storage: PostgreSQL checks its own pages (data checksums, amcheck); not repeated here',
      );
    } else print(`${mark(r.integrity === 'ok')}  sqlite integrity_check: ${r.integrity}`);
    print(
      `${mark(r.problems.length === 0)}  events: ${r.events} in seq order${r.problems.length ? `; ${r.problems.join('; ')}` : ''}`,
    );
    print(
      `${mark(r.inconsistent.length === 0)}  every applied event folds${r.inconsistent.length ? `; ${r.inconsistent.length} do not, first: seq ${r.inconsistent[0]?.seq} ${r.inconsistent[0]?.reason}` : ''}`,
    );
    const projOk = r.mismatches.length === 0 && r.missing.length === 0 && r.extra.length === 0;
    print(`${mark(projOk)}  rooms projection equals the fold of events (${r.rooms} rooms)`);
    for (const m of r.mismatches.slice(0, 20)) {
      print(
        `        room ${m.room}: ${m.field} is ${JSON.stringify(m.projection)} in rooms, ${JSON.stringify(m.fold)} by the fold`,
      );
    }
    if (r.missing.length) print(`        missing from rooms: ${r.missing.slice(0, 20).join(', ')}`);
    if (r.extra.length)
      print(`        in rooms but never created: ${r.extra.slice(0, 20).join(', ')}`);
    const shown = { equal: 'ok  ', differs: 'FAIL', pruned: 'note', ignored: 'note', none: 'note' };
    const at = checkpoint.seq === null ? '' : ` at seq ${checkpoint.seq}`;
    print(`${shown[checkpoint.verdict]}  state checkpoint${at}: ${checkpoint.detail}`);
    print(
      `${ok ? 'journal is consistent' : 'journal is NOT consistent'} (checked in ${formatDuration(r.micros / 1000)})`,
    );
    return ok ? EXIT.ok : EXIT.problem;
  } finally {
    reader.close();
  }
}
