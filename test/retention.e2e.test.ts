/**
 * Retention while serving, as an operator turns it on: `pdctl serve --retain AGE --archive DIR`
 * archives what each pass prunes, and `pdctl rooms --archive DIR` reads it
 * back. The flag once parsed and never reached retention, so history was deleted unarchived.
 */
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { oldJournal, roomIds } from './helpers/old-journal.ts';
import { startServe } from './helpers/serve.ts';
import { pdctl } from './helpers/spawn.ts';
import { waitFor } from './helpers/stack.ts';
import { tempDir } from './helpers/tmp.ts';

describe('serve --retain with an archive', () => {
  // PDCTL_ARCHIVE reaching the same policy is test/flags.e2e.test.ts's (every variable).
  it('--archive: each pass archives what it prunes, and the archive reads back every room', async () => {
    const journal = await oldJournal(join(tempDir('pdctl-retention-'), 'journal.db'));
    const before = await roomIds(['--journal', journal]);
    const archive = join(tempDir('pdctl-archive-'), 'nested', 'archive');
    const s = startServe([
      '--journal',
      journal,
      '--retain',
      '5m',
      '--archive',
      archive,
      '--canary-interval-ms',
      '0',
    ]);
    try {
      const url = await s.listening;
      await waitFor('the retention line', () => s.stderr().includes('journal retention:'));
      expect(s.stderr()).toContain(`archived first to ${archive}`);
      // The first pass runs at start; its status says when it is done.
      const status = async () =>
        (await (await fetch(`${url}/v1/admin/journal/prune`)).json()) as {
          policy: { archiveDir: string | null };
          last: { result: { rooms: number; archived: boolean }; error: string | null } | null;
        };
      await waitFor('the first pass', async () => (await status()).last !== null, 30_000);
      const { policy, last } = await status();
      expect(policy.archiveDir).toBe(archive);
      expect(last?.error).toBeNull();
      expect(last?.result).toMatchObject({ archived: true });
      expect(last?.result.rooms).toBeGreaterThan(0);
      expect(readdirSync(archive).length).toBeGreaterThan(0);
      const archived = await roomIds(['--archive', archive]);
      expect(archived).toHaveLength(last?.result.rooms as number);
      const kept = await roomIds(['--url', url]);
      expect(before.filter((r) => !archived.includes(r) && !kept.includes(r))).toEqual([]);
      expect(archived.filter((r) => !before.includes(r))).toEqual([]);
      // Retention as an operator reads it: the policy, the last pass, what it deleted.
      const stats = await pdctl(['journal', 'stats', '--url', url]);
      expect(stats.code, stats.stderr).toBe(0);
      expect(stats.stdout).toContain(
        `retention   policy: rooms kept 5m00s after they end, events of no room 5m00s; a pass every 30.00s; archived first to ${archive}`,
      );
      expect(stats.stdout).toMatch(
        new RegExp(`last pass \\S+ \\(schedule, [^)]+\\): ${last?.result.rooms} rooms`),
      );
      expect(stats.stdout).toMatch(/1 pass deleted; the last at .*; archived first/);
      // A pruned room's id leads to the pass that deleted it, and to its archive.
      const gone = await pdctl(['room', archived[0] as string, '--url', url]);
      expect(gone.code).toBe(1);
      expect(gone.stdout).toMatch(
        /\(pruned, if it was ever here: its id is of .* of the retention pass at .*; it archived them first: pdctl room ID --archive DIR/,
      );
    } finally {
      expect(await s.stop()).toBe(0);
    }
  }, 90_000);

  it('--archive without --retain is refused, saying why; nothing is made', async () => {
    const archive = join(tempDir('pdctl-archive-'), 'archive');
    const r = await pdctl(
      [
        'serve',
        '--port',
        '0',
        '--bus',
        'tcp://127.0.0.1:0',
        '--data-dir',
        tempDir('pdctl-serve-'),
        '--archive',
        archive,
      ],
      { timeoutMs: 15_000, env: { PDCTL_EXIT_WITH_PARENT: String(process.pid) } },
    );
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--archive needs --retain/);
    expect(existsSync(archive)).toBe(false);
  });
});
