/** The pdctl CLI as an on-call engineer runs it: real processes against real journal files. */
import { createHash } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import Database from 'better-sqlite3';
import { beforeAll, describe, expect, it } from 'vitest';
import { SqliteJournal } from '../src/journal/sqlite/journal.ts';
import { headVersion } from '../src/journal/sqlite/migrate.ts';
import { lifecycle } from './helpers/events.ts';
import { pdctl, spawnPdctl, spawnTs } from './helpers/spawn.ts';
import { tempDir } from './helpers/tmp.ts';
import { waitFor } from './helpers/wait.ts';

const dir = tempDir('pdctl-cli-');
const journal = `${dir}/journal.db`;
const J = ['--journal', journal];
const json = <T>(s: string): T => JSON.parse(s) as T;

beforeAll(async () => {
  const r = await pdctl([
    'journal',
    'synth',
    '--rooms',
    '400',
    '--seed',
    '3',
    '--span',
    '10m',
    '--end',
    '2026-11-30T03:20:00Z',
    ...J,
    '--json',
  ]);
  expect(r.code, r.stderr).toBe(0);
  expect(json<{ rooms: number; events: number }>(r.stdout)).toMatchObject({ rooms: 400 });
}, 60_000);

describe('pdctl on a synthetic journal', () => {
  it('verifies it', async () => {
    const r = await pdctl(['journal', 'verify', ...J]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/rooms projection equals the fold of events/);
    expect(r.stdout).toMatch(/journal is consistent/);
  });

  it('lists rooms in flight at a time, and their states agree with each room timeline', async () => {
    const r = await pdctl([
      'rooms',
      '--in-flight-at',
      '2026-11-30T03:15:00Z',
      '--limit',
      '200',
      ...J,
      '--json',
    ]);
    expect(r.code, r.stderr).toBe(0);
    const page = json<{
      rooms: Array<{ room: string; createdAt: number; terminalAt: number | null }>;
    }>(r.stdout);
    expect(page.rooms.length).toBeGreaterThan(0);
    const t = Date.parse('2026-11-30T03:15:00Z');
    for (const room of page.rooms) {
      expect(room.createdAt).toBeLessThanOrEqual(t);
      expect(room.terminalAt === null || room.terminalAt > t).toBe(true);
    }
    const one = await pdctl(['room', page.rooms[0]?.room as string, ...J]);
    expect(one.code).toBe(0);
    expect(one.stdout).toMatch(/timeline/);
    expect(one.stdout).toMatch(/time in each state/);
    expect(one.stdout).toMatch(/room\.created/);
  });

  it("exports an incident's window as a journal of its own that verify accepts", async () => {
    const out = `${dir}/window.db`;
    const r = await pdctl([
      'journal',
      'export',
      '--since',
      '2026-11-30T03:14:00Z',
      '--until',
      '2026-11-30T03:15:00Z',
      '--to',
      out,
      ...J,
      '--json',
    ]);
    expect(r.code, r.stderr).toBe(0);
    const res = json<{ rooms: number; events: number; bytes: number }>(r.stdout);
    expect(res.rooms).toBeGreaterThan(0);
    expect(res.rooms).toBeLessThan(400);
    expect((await pdctl(['journal', 'verify', '--journal', out])).code).toBe(0);
    const rooms = (journalPath: string, flags: string[]) =>
      pdctl([
        'rooms',
        ...flags,
        '--limit',
        '1000',
        '--origin',
        'all',
        '--journal',
        journalPath,
        '--json',
      ]).then((x) => json<{ rooms: Array<{ room: string; createdAt: number }> }>(x.stdout).rooms);
    const exported = new Set((await rooms(out, [])).map((x) => x.room));
    expect(exported.size).toBe(res.rooms);
    // Every room in flight inside the window is there, with every one of its events.
    const inFlight = await rooms(journal, ['--in-flight-at', '2026-11-30T03:14:30Z']);
    expect(inFlight.length).toBeGreaterThan(0);
    for (const x of inFlight) expect(exported.has(x.room), x.room).toBe(true);
    const one = inFlight[0]?.room as string;
    const events = async (journalPath: string) =>
      json<{ events: unknown[] }>(
        (await pdctl(['room', one, '--journal', journalPath, '--json'])).stdout,
      ).events;
    expect(await events(out)).toEqual(await events(journal));
    // Rooms created after the window are not.
    const later = (await rooms(journal, [])).filter(
      (x) => x.createdAt > Date.parse('2026-11-30T03:15:00Z'),
    );
    expect(later.length).toBeGreaterThan(0);
    for (const x of later) expect(exported.has(x.room)).toBe(false);
    // Refusals: a window that ends before it starts, and a file that exists.
    const bad = await pdctl([
      'journal',
      'export',
      '--since',
      '03:15',
      '--until',
      '03:14',
      '--to',
      `${dir}/x.db`,
      ...J,
    ]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/is before --since/);
    const exists = await pdctl([
      'journal',
      'export',
      '--since',
      '1h',
      '--until',
      'now',
      '--to',
      out,
      ...J,
    ]);
    expect(exists.code).toBe(2);
    expect(exists.stderr).toMatch(/already exists/);
  });

  it('leaves the state checkpoint out of an export, which is not the fold of the window', async () => {
    // A journal a control plane served has a checkpoint folded from its whole history.
    const served = `${dir}/served.db`;
    copyFileSync(journal, served);
    const db = new Database(served);
    db.prepare(
      `INSERT INTO state_checkpoints (name, seq, format, schema_version, written_at, digest, data)
       VALUES ('control', 1, 1, ?, 0, 'x', '{}')`,
    ).run(headVersion());
    db.close();
    const out = `${dir}/served-window.db`;
    const r = await pdctl([
      'journal',
      'export',
      '--since',
      '2026-11-30T03:14:00Z',
      '--until',
      '2026-11-30T03:15:00Z',
      '--to',
      out,
      '--journal',
      served,
    ]);
    expect(r.code, r.stderr).toBe(0);
    const check = new Database(out, { readonly: true });
    expect(check.prepare('SELECT count(*) FROM state_checkpoints').pluck().get()).toBe(0);
    check.close();
    const verify = await pdctl(['journal', 'verify', '--journal', out]);
    expect(verify.code, verify.stdout).toBe(0);
    expect(verify.stdout).toMatch(/state checkpoint: none yet/);
  });

  // Schema 4 keeps events in a table of their own; schema 9 packs the rooms that ended (its
  // fixture's are), each event naming its shape. The export reads and writes each as it is.
  for (const version of [4, 9]) {
    it(`exports from a journal of schema ${version} a journal of that schema, row for row`, async () => {
      const name = `journal-schema-${String(version).padStart(4, '0')}.db`;
      const old = `${dir}/${name}`;
      copyFileSync(new URL(`fixtures/${name}`, import.meta.url), old);
      const out = `${dir}/schema${version}-window.db`;
      const r = await pdctl([
        'journal',
        'export',
        '--since',
        '2000-01-01T00:00:00Z',
        '--until',
        '2100-01-01T00:00:00Z',
        '--to',
        out,
        '--journal',
        old,
      ]);
      expect(r.code, r.stderr).toBe(0);
      const rows = (path: string) => {
        const db = new Database(path, { readonly: true });
        try {
          return {
            version: db.prepare('SELECT max(version) FROM schema_migrations').pluck().get(),
            events: db.prepare('SELECT * FROM events ORDER BY seq').all(),
            rooms: db.prepare('SELECT * FROM rooms ORDER BY id').all(),
            packs:
              version >= 8 ? db.prepare('SELECT * FROM room_packs ORDER BY first_seq').all() : [],
          };
        } finally {
          db.close();
        }
      };
      const [from, to] = [rows(old), rows(out)];
      expect(to.version).toBe(version);
      expect(to.events.length).toBeGreaterThan(0);
      if (version >= 8) expect(to.packs.length).toBeGreaterThan(0);
      expect(to).toEqual(from);
    });
  }

  it("prints what docs/journal.md's incident walkthrough shows, command by command", async () => {
    const doc = readFileSync(new URL('../docs/journal.md', import.meta.url), 'utf8');
    const section = doc.split('## An incident, walked through')[1]?.split('\n## ')[0] ?? '';
    const blocks = [...section.matchAll(/```\n([\s\S]*?)```/g)].map((m) => m[1] as string);
    // Each `$ npx pdctl …` line, and the lines it prints up to the next one (`…`: the rest
    // is left out of the doc).
    const steps: Array<{ args: string[]; expected: string[] }> = [];
    for (const block of blocks)
      for (const line of block.replace(/\n$/, '').split('\n')) {
        if (line.startsWith('$ npx pdctl '))
          steps.push({ args: line.slice(12).split(' '), expected: [] });
        else steps.at(-1)?.expected.push(line);
      }
    // A blank line between two commands of one block separates them; it is not printed.
    for (const s of steps) while (s.expected.at(-1) === '') s.expected.pop();
    expect(steps.map((s) => s.args.slice(0, 2).join(' '))).toEqual([
      'journal synth',
      'journal tail',
      'rooms --engine',
      'rooms --in-flight-at',
      'room req-r-mx2p3k3b-000a24',
    ]);
    const file = `${dir}/walkthrough/incident.db`;
    mkdirSync(`${dir}/walkthrough`);
    // Only the time synth took varies.
    const steady = (s: string) =>
      s
        .replace(/ in [\d.]+s \(\d+ events\/s;/, ' in Ts (N events/s;')
        .replaceAll(file, 'incident.db');
    for (const { args, expected } of steps) {
      const r = await pdctl(args.map((a) => (a === 'incident.db' ? file : a)));
      expect(r.code, `${args.join(' ')}: ${r.stderr}`).toBe(0);
      const got = steady(r.stdout).replace(/\n$/, '').split('\n');
      const cut = expected.at(-1) === '…' ? expected.length - 1 : expected.length;
      expect(got.slice(0, cut), args.join(' ')).toEqual(expected.slice(0, cut).map(steady));
      if (cut === expected.length) expect(got.length, args.join(' ')).toBe(expected.length);
    }
  }, 60_000);

  it('plan replays the journal through the planner: a row an interval, each with a documented reason', async () => {
    const human = await pdctl(['plan', ...J, '--interval', '2m']);
    expect(human.code, human.stderr).toBe(0);
    // docs/planner.md shows this very run (the same synthetic journal): it cannot go stale.
    const doc = readFileSync('docs/planner.md', 'utf8');
    const shown = /\$ pdctl plan --journal data\/journal.db --interval 2m\n([\s\S]*?)```/.exec(doc);
    expect(shown?.[1]).toBe(human.stdout);
    expect(human.stdout).toMatch(
      /^from \(UTC\) +rooms\/s .* fleet P\/D +target P\/D +proposal P\/D +reason/,
    );
    expect(human.stdout).toMatch(/\d+ intervals of 2m; \d+ steps? proposed/);
    const r = await pdctl(['plan', ...J, '--interval', '2m', '--budget', '4', '--json']);
    expect(r.code, r.stderr).toBe(0);
    const ds = json<Array<{ reason: string; fleet: { prefill: number; decode: number } }>>(
      r.stdout,
    );
    expect(ds.length).toBeGreaterThanOrEqual(5);
    const { REASONS } = await import('../src/planner/model.ts');
    for (const d of ds) expect(REASONS).toContain(d.reason);
    expect(ds.at(-1)?.fleet).toEqual({ prefill: 2, decode: 2 });
    // A trace instead of a journal: its costs must be given; its fleet follows the proposals.
    const trace = `${dir}/trace.jsonl`;
    writeFileSync(
      trace,
      Array.from({ length: 240 }, (_, i) =>
        JSON.stringify({
          timestamp: i * 1000,
          input_length: 30_000,
          output_length: 20,
          hash_ids: [i],
        }),
      ).join('\n'),
    );
    const costless = await pdctl(['plan', '--trace', trace]);
    expect(costless.code).toBe(2);
    expect(costless.stderr).toMatch(
      /--trace needs what a token costs your engines: --prefill-us-per-token N --decode-us-per-token N/,
    );
    const planned = await pdctl([
      'plan',
      '--trace',
      trace,
      '--prefill-us-per-token',
      '100',
      '--decode-us-per-token',
      '1000',
      '--budget',
      '6',
    ]);
    expect(planned.code, planned.stderr).toBe(0);
    expect(planned.stderr).toMatch(
      /240 requests from .*trace\.jsonl; a fleet of 3 prefill and 3 decode engines, moved as the planner proposes/,
    );
    expect(planned.stdout).toMatch(/^from start +rooms\/s/);
    expect(planned.stdout).toMatch(/\n\+0:01:00 .* 3\/3 .* 4\/2 +rebalance_to_prefill\n/);
    expect(planned.stdout).toMatch(/4 intervals of 60s; 2 steps taken/);
    const bad = await pdctl(['plan', ...J, '--utilisation', '1.5']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--utilisation must be a share above 0 and at most 1, got "1.5"/);
  });

  it('synth writes only a journal of its own: one that holds rooms is refused and left as it was', async () => {
    const sha = (path: string) => createHash('sha256').update(readFileSync(path)).digest('hex');
    const before = sha(journal);
    const r = await pdctl(['journal', 'synth', '--rooms', '5', ...J]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(
      new RegExp(
        `${journal} already holds rooms \\(r-[^,]+, …\\): synth writes a journal of its own; give --journal a new path`,
      ),
    );
    expect(sha(journal)).toBe(before);
  });

  it('a refused request id leads to its refusal: room, rooms --request-id', async () => {
    const path = `${dir}/refused.db`;
    const j = await SqliteJournal.open({ path });
    const at = Date.parse('2026-11-30T03:12:00Z');
    await j.append({
      type: 'request.refused',
      source: 'api',
      data: {
        reason: 'engines_draining',
        status: 503,
        count: 3,
        requestIds: ['ticket-8', 'ticket-9', 'ticket-10'],
        message: 'every engine is draining',
        firstAt: at,
        lastAt: at + 400,
      },
    });
    await j.drain();
    const told =
      'refused at 2026-11-30T03:12:00.000Z: 503 engines_draining — every engine is draining (one of 3 refused engines_draining from 2026-11-30T03:12:00.000Z to 2026-11-30T03:12:00.400Z)';
    const room = await pdctl(['room', 'ticket-9', '--journal', path]);
    expect(room.code, room.stderr).toBe(0);
    expect(room.stdout.trim()).toBe(`request ticket-9: ${told}`);
    const rooms = await pdctl(['rooms', '--request-id', 'ticket-9', '--journal', path]);
    expect(rooms.stdout.trim()).toBe(`no room: request ticket-9 ${told}`);
    // An id the record does not hold at all (ticket-1 is no prefix match of ticket-10).
    const none = await pdctl(['room', 'ticket-1', '--journal', path]);
    expect(none.code).toBe(1);
    expect(none.stdout).toMatch(/no room and no request ticket-1 .*\(pruned, or never created\)/);
    expect(none.stdout).not.toMatch(/without their ids/);
    // Past the cap of ids waiting on a journal that refused writes, refusals are counted without
    // their ids: an id found nowhere then says so, and when.
    const j2 = await SqliteJournal.open({ path });
    await j2.append({
      type: 'request.refused',
      source: 'api',
      data: {
        reason: 'journal_unavailable',
        status: 503,
        count: 50,
        requestIds: Array.from({ length: 20 }, (_, i) => `kept-${i}`),
        message: 'the journal refuses writes',
        firstAt: at + 60_000,
        lastAt: at + 61_000,
      },
    });
    await j2.drain();
    const unkept =
      '30 refused requests from 2026-11-30T03:13:00.000Z to 2026-11-30T03:13:01.000Z were counted without their ids (more waited than are kept while the journal refused writes): if it was refused then, its id was not kept';
    const lost = await pdctl(['room', 'ticket-1', '--journal', path]);
    expect(lost.code).toBe(1);
    expect(lost.stdout.trim().split('\n').at(-1)).toBe(unkept);
    const listed = await pdctl(['rooms', '--request-id', 'ticket-1', '--journal', path]);
    expect(listed.stdout.trim().split('\n').at(-1)).toBe(unkept);
  });

  it('filters failed rooms by reason, and stats count the same rooms', async () => {
    const stats = json<{
      failuresByReason: Record<string, number>;
      rooms: number;
      fileBytes: number;
      stateCheckpoint: unknown;
    }>((await pdctl(['journal', 'stats', ...J, '--json'])).stdout);
    // Written by synth, never served: no control plane checkpointed its state.
    expect(stats.stateCheckpoint).toBeNull();
    const [reason, count] = Object.entries(stats.failuresByReason)[0] as [string, number];
    const r = await pdctl([
      'rooms',
      '--state',
      'failed',
      '--reason',
      reason,
      '--limit',
      '1000',
      ...J,
      '--json',
    ]);
    expect(json<{ rooms: unknown[] }>(r.stdout).rooms).toHaveLength(count);
    const human = await pdctl(['journal', 'stats', '--per-minute', ...J]);
    expect(human.stdout).toMatch(/rooms by state/);
    expect(human.stdout).toMatch(/per minute/);
    expect(human.stdout).toMatch(/checkpoint {2}none: a control plane starting on it folds/);
    // What to size a disk by: the file over its rooms.
    expect(human.stdout).toContain(`, ${Math.round(stats.fileBytes / stats.rooms)} bytes a room)`);
  });

  it('leaves the health canary out of room listings unless asked, and says so', async () => {
    const path = `${dir}/origins.db`;
    const j = await SqliteJournal.open({ path, durability: 'process' });
    for (const [room, source] of [
      ['r-client', 'api'],
      ['r-canary', 'canary'],
    ] as const) {
      await j.append({
        type: 'room.created',
        room,
        source,
        data: { prefillEngine: 'p0', decodeEngine: 'd0' },
      });
    }
    await j.drain();
    const human = await pdctl(['rooms', '--journal', path]);
    expect(human.code, human.stderr).toBe(0);
    expect(human.stdout).toMatch(/r-client +created .* api/);
    expect(human.stdout).not.toMatch(/r-canary/);
    expect(human.stdout).toMatch(/canary rooms not shown: --origin all/);
    const rooms = async (...args: string[]) =>
      json<{ rooms: Array<{ room: string; origin: string }> }>(
        (await pdctl(['rooms', '--journal', path, '--json', ...args])).stdout,
      ).rooms.map((r) => `${r.room}:${r.origin}`);
    expect(await rooms('--origin', 'all')).toEqual(['r-canary:canary', 'r-client:api']);
    expect(await rooms('--origin', 'canary')).toEqual(['r-canary:canary']);
    const one = await pdctl(['room', 'r-canary', '--journal', path]);
    expect(one.stdout).toMatch(/origin +canary/);
  });

  it('tails events with filters', async () => {
    const r = await pdctl(['journal', 'tail', '--type', 'room.failed', '-n', '5', ...J, '--json']);
    const lines = r.stdout
      .trim()
      .split('\n')
      .map((l) => json<{ type: string; seq: number }>(l));
    expect(lines).toHaveLength(5);
    expect(new Set(lines.map((l) => l.type))).toEqual(new Set(['room.failed']));
    expect(lines.map((l) => l.seq)).toEqual([...lines.map((l) => l.seq)].sort((a, b) => a - b));
  });

  it('a filter naming what the journal does not hold is an error that lists what it holds', async () => {
    for (const args of [
      ['rooms', '--engine', 'decode-0'],
      ['journal', 'tail', '--engine', 'decode-0'],
    ]) {
      const r = await pdctl([...args, ...J]);
      expect(r.code, args.join(' ')).toBe(2);
      expect(r.stdout).toBe('');
      expect(r.stderr).toContain(
        'no room or event of this journal names engine "decode-0"; its engines are: d0, d1, p0, p1',
      );
    }
    const bad = await pdctl(['rooms', '--reason', 'decode_died', ...J]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(
      /"decode_died" is no reason pdctl gives .*; its rooms failed or were aborted for: .*deadline_exceeded/,
    );
    // An engine it holds at a time with no rooms, or a reason of pdctl's own no room has: none.
    for (const args of [
      ['--engine', 'd0', '--since', '2030-01-01T00:00:00Z'],
      ['--reason', 'operator'],
    ]) {
      const r = await pdctl(['rooms', ...args, ...J]);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout).toMatch(/^no rooms match/);
    }
  });

  it('exits quietly when its reader closes the pipe early (| head)', async () => {
    const child = spawnPdctl(['journal', 'tail', '-n', '10000', ...J]);
    let stderr = '';
    child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    await new Promise((r) => child.stdout?.once('data', r));
    child.stdout?.destroy();
    const code = await new Promise((r) => child.once('exit', r));
    expect(code).toBe(0);
    expect(stderr).not.toMatch(/EPIPE|Unhandled/);
  });

  it('follows the journal live while another process appends', async () => {
    const path = `${dir}/follow.db`;
    const j = await SqliteJournal.open({ path });
    await j.append(lifecycle('before')[0] as never);
    const child = spawnPdctl(['journal', 'tail', '-f', '--interval-ms', '50', '--journal', path]);
    let out = '';
    child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
    // Appends start once the follower has printed what was there: it is reading.
    await waitFor('the follower reading', () => out.includes('before'));
    for (const ev of lifecycle('followed')) await j.append(ev);
    const deadline = Date.now() + 10_000;
    while (!out.includes('room.completed') && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 50));
    child.kill('SIGTERM');
    await j.drain();
    expect(out).toMatch(/before/);
    expect(out).toMatch(/followed.*\n(.*\n)*.*room\.completed/);
  });
});

describe('pdctl refuses bad input with a clear message and the right exit code', () => {
  it.each([
    [['rooms', '--state', 'stuck'], /unknown state "stuck"; states are: created/],
    [['rooms', '--since', 'yesterday'], /invalid time "yesterday"/],
    [['rooms', '--limit', '0'], /--limit must be an integer/],
    [['rooms', '--origin', 'a b'], /--origin must be "all" or a comma-separated list/],
    [['journal', 'prune', '--older-than', 'a week'], /invalid --older-than/],
    [['journal', 'tail', '--type', 'room.nope'], /unknown event type "room.nope"/],
    [['journal', 'synth', '--rooms', 'many'], /--rooms must be an integer/],
    [['room', 'not a room id'], /is neither a room id nor a request id/],
    [['journal', 'bogus'], /unknown command/],
  ])('%j', async (args, message) => {
    const r = await pdctl([...args, ...J]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(message);
  });

  it('a missing journal: exit 3, says where it looked, creates nothing', async () => {
    const r = await pdctl(['rooms', '--journal', `${dir}/nope/journal.db`]);
    expect(r.code).toBe(3);
    expect(r.stderr).toMatch(/no journal at .*nope\/journal\.db/);
  });

  it('a corrupt or newer journal: exit 3 and the file is unchanged', async () => {
    const corrupt = `${dir}/corrupt.db`;
    writeFileSync(corrupt, Buffer.alloc(8192, 7));
    const newer = `${dir}/newer.db`;
    copyFileSync(new URL('./fixtures/journal-schema-0001.db', import.meta.url).pathname, newer);
    const db = new Database(newer);
    db.prepare('INSERT INTO schema_migrations VALUES (2000, ?, 0)').run('future');
    db.close();
    for (const [path, message] of [
      [corrupt, /damaged/],
      [newer, /schema version 2000/],
    ] as const) {
      const before = createHash('sha256').update(readFileSync(path)).digest('hex');
      for (const args of [
        ['journal', 'verify'],
        ['journal', 'synth', '--rooms', '5'],
        ['journal', 'prune', '--older-than', '1d'],
      ]) {
        const r = await pdctl([...args, '--journal', path]);
        expect(r.code, `${args.join(' ')} on ${path}`).toBe(3);
        expect(r.stderr).toMatch(message);
      }
      expect(createHash('sha256').update(readFileSync(path)).digest('hex')).toBe(before);
    }
  });

  it('verify exits 1 and names the field when the projection was tampered with', async () => {
    const path = `${dir}/tampered.db`;
    copyFileSync(journal, path);
    const db = new Database(path);
    const room = db
      .prepare("SELECT room FROM rooms WHERE state = 'completed' LIMIT 1")
      .pluck()
      .get() as string;
    db.prepare("UPDATE rooms SET state = 'decoding' WHERE room = ?").run(room);
    db.close();
    const r = await pdctl(['journal', 'verify', '--journal', path]);
    expect(r.code).toBe(1);
    expect(r.stdout).toContain(
      `room ${room}: state is "decoding" in rooms, "completed" by the fold`,
    );
    expect(r.stdout).toMatch(/journal is NOT consistent/);
  });
});

describe('pdctl journal backup and an interrupted synth', () => {
  it('copies a journal consistently while another process appends to it', async () => {
    const path = `${dir}/live.db`;
    const copy = `${dir}/live-copy.db`;
    const j = await SqliteJournal.open({ path });
    let writing = true;
    let n = 0;
    const writer = (async () => {
      while (writing) await Promise.all(lifecycle(`live-${n++}`).map((ev) => j.append(ev)));
    })();
    await waitFor('the writer under way', () => n >= 20);
    const r = await pdctl(['journal', 'backup', '--journal', path, '--to', copy]);
    writing = false;
    await writer;
    await j.drain();
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/copied .* to .*live-copy\.db/);
    expect(existsSync(`${copy}.partial`)).toBe(false);
    const v = await pdctl(['journal', 'verify', '--journal', copy, '--json']);
    expect(v.code).toBe(0);
    expect(json<{ ok: boolean; events: number }>(v.stdout).events).toBeGreaterThan(0);
    const again = await pdctl(['journal', 'backup', '--journal', path, '--to', copy]);
    expect(again.code).toBe(2);
    expect(again.stderr).toMatch(/already exists; .* --force/);
  });

  it('stops a long synth on SIGINT with every appended event committed', async () => {
    const path = `${dir}/interrupted.db`;
    const child = spawnPdctl(['journal', 'synth', '--rooms', '5000000', '--journal', path]);
    let stderr = '';
    child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    const deadline = Date.now() + 20_000;
    while (!stderr.includes('events/s') && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 50));
    child.kill('SIGINT');
    const code = await new Promise((r) => child.once('exit', r));
    expect(code).toBe(130);
    expect(stderr).toMatch(/interrupted after \d+ events; every one of them is committed/);
    expect((await pdctl(['journal', 'verify', '--journal', path])).code).toBe(0);
  });
});

describe('one writer per journal', () => {
  it('refuses a second writer while one runs, serves readers, and takes over from a writer that died', async () => {
    const path = `${dir}/locked.db`;
    const child = spawnTs('test/helpers/crash-child.ts', [path, 'power', '8']);
    let out = '';
    child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
    const deadline = Date.now() + 20_000;
    while (!out.includes('ack ') && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 50));
    const busy = await pdctl(['journal', 'prune', '--older-than', '1d', '--journal', path]);
    expect(busy.code).toBe(3);
    expect(busy.stderr).toMatch(
      new RegExp(`being written by pid ${child.pid} .*one writer at a time`),
    );
    expect((await pdctl(['journal', 'verify', '--journal', path])).code).toBe(0);
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    const after = await pdctl(['journal', 'prune', '--older-than', '1d', '--journal', path]);
    expect(after.code, after.stderr).toBe(0);
  });
});

describe('pdctl journal migrate', () => {
  it('upgrades an older journal in place, after readers asked for it', async () => {
    const head = headVersion();
    // An empty SQLite file (schema 0), and the frozen journal of schema 1 with its rooms.
    const empty = `${dir}/empty.db`;
    new Database(empty).close();
    const old = `${dir}/old.db`;
    copyFileSync(new URL('./fixtures/journal-schema-0001.db', import.meta.url).pathname, old);
    for (const [path, from] of [
      [empty, 0],
      [old, 1],
    ] as const) {
      const refused = await pdctl(['rooms', '--journal', path]);
      expect(refused.code).toBe(3);
      expect(refused.stderr).toContain(`pdctl journal migrate --journal ${path}`);
      const r = await pdctl(['journal', 'migrate', '--journal', path]);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout).toContain(`schema ${from} → ${head}`);
      expect((await pdctl(['journal', 'verify', '--journal', path])).code).toBe(0);
      const again = await pdctl(['journal', 'migrate', '--journal', path]);
      expect(again.stdout).toMatch(/nothing to do/);
    }
    // Schema 2 took each room's origin from its room.created.
    const rooms = json<{ rooms: Array<{ origin: string }> }>(
      (await pdctl(['rooms', '--journal', old, '--origin', 'all', '--limit', '1000', '--json']))
        .stdout,
    ).rooms;
    expect(rooms.length).toBe(60);
    expect(new Set(rooms.map((r) => r.origin))).toEqual(new Set(['api']));
  });
});

describe('pdctl journal prune', () => {
  it('dry-run counts, then prune deletes only old terminal rooms and verify still passes', async () => {
    const path = `${dir}/prune.db`;
    copyFileSync(journal, path);
    const before = json<{ rooms: number; byState: Record<string, number> }>(
      (await pdctl(['journal', 'stats', '--journal', path, '--json'])).stdout,
    );
    const dry = json<{ rooms: number }>(
      (
        await pdctl([
          'journal',
          'prune',
          '--older-than',
          '1h',
          '--dry-run',
          '--journal',
          path,
          '--json',
        ])
      ).stdout,
    );
    const live =
      before.rooms -
      ['completed', 'aborted', 'failed', 'migrated'].reduce(
        (n, s) => n + (before.byState[s] ?? 0),
        0,
      );
    expect(dry.rooms).toBe(before.rooms - live);
    const [old] = json<{ rooms: Array<{ room: string }> }>(
      (await pdctl(['rooms', '--state', 'completed', '--limit', '1', '--journal', path, '--json']))
        .stdout,
    ).rooms;
    const r = await pdctl([
      'journal',
      'prune',
      '--older-than',
      '1h',
      '--chunk',
      '100',
      '--journal',
      path,
    ]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`deleted ${dry.rooms} terminal rooms`));
    const after = json<{ rooms: number }>(
      (await pdctl(['journal', 'stats', '--journal', path, '--json'])).stdout,
    );
    expect(after.rooms).toBe(live);
    expect((await pdctl(['journal', 'verify', '--journal', path])).code).toBe(0);
    // What retention did, as stats tell it; and a pruned room's id leads to the pass.
    const stats = await pdctl(['journal', 'stats', '--journal', path]);
    expect(stats.stdout).toMatch(/^retention {3}policy: read from a file, not known/m);
    expect(stats.stdout).toMatch(
      new RegExp(
        `1 pass deleted; the last at \\S+ \\(seq \\d+\\): rooms that ended before \\S+ \\(1h00m before it\\), ${dry.rooms} rooms with \\d+ events; not archived`,
      ),
    );
    const gone = await pdctl(['room', old?.room as string, '--journal', path]);
    expect(gone.code).toBe(1);
    expect(gone.stdout).toMatch(
      /\(pruned, if it was ever here: its id is of 2026-11-30T\S+, before the cutoff \S+ of the retention pass at \S+ \(seq \d+\), .* it kept no archive\)/,
    );
    const later = `r-${(Date.now() + 60_000).toString(36)}-000001`;
    expect((await pdctl(['room', later, '--journal', path])).stdout).toMatch(
      /\(never created here: its id is of \S+, after the newest retention cutoff/,
    );
    expect((await pdctl(['room', later, ...J])).stdout).toMatch(
      /\(never created here: nothing was ever pruned from this journal/,
    );
  });
});
