/**
 * The incident queries of docs/journal.md (_Questions after an incident, in plain SQL_), timed as
 * on-call runs them: plain SQL on the journal file, read-only. With `--against`, the same queries
 * on a second journal — the same history at another schema (a copy migrated with `pdctl journal
 * migrate`) — interleaved round by round, so that a change of storage shows what it costs a reader.
 *
 *   npm run bench:queries -- --journal a.db
 *   npm run bench:queries -- --journal before.db --against after.db --rounds 15
 *
 * The queries are read from docs/journal.md itself; their example literals (a room, a request id,
 * an instant, "now") are replaced by ones of the first journal — a room and a request from the
 * middle of its history, its middle instant, its last event's time — so they ask about something
 * that is there.
 */
import { readFileSync } from 'node:fs';
import Database from 'better-sqlite3';
import { asJson, checkFlags, flag, say } from './args.ts';

const JOURNAL = flag('--journal', '');
const AGAINST = flag('--against', '');
const ROUNDS = Number(flag('--rounds', '9'));
checkFlags();
if (!JOURNAL || !Number.isInteger(ROUNDS) || ROUNDS < 1) {
  process.stderr.write(
    'usage: npm run bench:queries -- --journal FILE [--against FILE] [--rounds N (9)] [--json]\n',
  );
  process.exit(2);
}

interface Query {
  name: string;
  sql: string;
}

/** The commented queries of the incident section of docs/journal.md. */
function docQueries(): Query[] {
  const doc = readFileSync(new URL('../docs/journal.md', import.meta.url), 'utf8');
  const section = doc.split('## Questions after an incident, in plain SQL')[1] ?? '';
  const block = /```sql\n([\s\S]*?)```/.exec(section)?.[1];
  if (!block) throw new Error('docs/journal.md has no SQL block under its incident questions');
  return block
    .split(';')
    .map((q) => q.trim())
    .filter((q) => q.length > 0)
    .map((q) => {
      const lines = q.split('\n');
      const name = (lines.find((l) => l.startsWith('--')) ?? '-- ?').slice(3);
      return { name, sql: lines.filter((l) => !l.startsWith('--')).join('\n') };
    });
}

/** The doc's example literals replaced by ones the journal holds. */
function forJournal(queries: Query[], db: Database.Database): Query[] {
  const pick = db
    .prepare(
      `SELECT room, request_id AS requestId, created_at AS createdAt FROM rooms
       WHERE request_id IS NOT NULL ORDER BY id LIMIT 1
       OFFSET (SELECT count(*) / 2 FROM rooms WHERE request_id IS NOT NULL)`,
    )
    .get() as { room: string; requestId: string; createdAt: number } | undefined;
  if (!pick) throw new Error(`${JOURNAL} has no room a request made: nothing to ask about`);
  const lastTs = db.prepare('SELECT max(ts) FROM events').pluck().get() as number;
  const instant = new Date(pick.createdAt).toISOString().slice(0, 19).replace('T', ' ');
  return queries.map((q) => ({
    name: q.name,
    sql: q.sql
      .replace(/room = 'r-[^']*'/g, `room = '${pick.room}'`)
      .replace(/request_id = '[^']*'/g, `request_id = '${pick.requestId}'`)
      .replace(/'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d'/g, `'${instant}'`)
      .replace(/strftime\('%s', ?'now'\)/g, String(Math.floor(lastTs / 1000))),
  }));
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

const files = AGAINST ? [JOURNAL, AGAINST] : [JOURNAL];
const dbs = files.map((f) => new Database(f, { readonly: true, fileMustExist: true }));
const queries = forJournal(docQueries(), dbs[0] as Database.Database);
const prepared = dbs.map((db) => queries.map((q) => db.prepare(q.sql)));
const times = files.map(() => queries.map((): number[] => []));
const rows = files.map(() => queries.map(() => 0));
say(`${queries.length} queries of docs/journal.md, ${ROUNDS} rounds on ${files.join(' and ')}`);
for (let round = 0; round <= ROUNDS; round++) {
  for (const [q] of queries.entries()) {
    for (const [f] of files.entries()) {
      const stmt = prepared[f]?.[q] as Database.Statement;
      const t = performance.now();
      const n = stmt.all().length;
      const ms = performance.now() - t;
      if (round === 0) {
        (rows[f] as number[])[q] = n; // the first round warms the page cache: not counted
        continue;
      }
      times[f]?.[q]?.push(ms);
    }
  }
}
for (const db of dbs) db.close();

const result = queries.map((q, i) => ({
  query: q.name,
  rows: rows.map((r) => r[i]),
  medianMs: times.map((t) => Number(median(t[i] as number[]).toFixed(3))),
}));
if (asJson) {
  process.stdout.write(`${JSON.stringify({ journals: files, rounds: ROUNDS, queries: result })}\n`);
} else {
  const head = AGAINST
    ? '| query | rows | first ms | second ms | second / first |'
    : '| query | rows | ms |';
  const lines = [head, AGAINST ? '|---|---:|---:|---:|---:|' : '|---|---:|---:|'];
  for (const r of result) {
    const [a, b] = r.medianMs as [number, number | undefined];
    const rowsCell = r.rows.every((n) => n === r.rows[0]) ? String(r.rows[0]) : r.rows.join(' / ');
    lines.push(
      b === undefined
        ? `| ${r.query} | ${rowsCell} | ${a} |`
        : `| ${r.query} | ${rowsCell} | ${a} | ${b} | ${(b / a).toFixed(2)} |`,
    );
  }
  process.stdout.write(`${lines.join('\n')}\n`);
}
