/**
 * Journal files that must not be written. `pdctl serve` refuses a damaged journal (a quick
 * integrity check on a private read-only view, so a -wal left by a crash is never checkpointed
 * into it) and a read-only or immutable one with exit 3 and what to do, never a stack trace, and
 * releases its lock; serve and read commands refuse an empty file alike; read commands leave no
 * -wal/-shm behind.
 */
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  closeSync,
  existsSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  statSync,
  symlinkSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { serve } from '../helpers/serve.ts';
import { pdctl } from '../helpers/spawn.ts';
import { tempDir } from '../helpers/tmp.ts';

const dir = tempDir('pdctl-journal-files-');
const journal = join(dir, 'base', 'journal.db');
const sha = (path: string) => createHash('sha256').update(readFileSync(path)).digest('hex');

beforeAll(async () => {
  mkdirSync(join(dir, 'base'));
  const r = await pdctl(['journal', 'synth', '--rooms', '400', '--journal', journal]);
  expect(r.code).toBe(0);
}, 60_000);

/** Runs `pdctl serve` on a data directory until it exits (it must, here) or 20 s pass. */
async function serveOn(dataDir: string) {
  return pdctl(['serve', '--data-dir', dataDir, '--port', '0', '--bus', 'tcp://127.0.0.1:0'], {
    timeoutMs: 20_000,
  });
}

describe('journal files pdctl must not write', () => {
  it('serve refuses a journal with 4 KiB of random bytes mid-file: exit 3, file unchanged', async () => {
    const data = join(dir, 'corrupt');
    mkdirSync(data);
    const path = join(data, 'journal.db');
    execFileSync('cp', [journal, path]);
    const fd = openSync(path, 'r+');
    writeSync(fd, randomBytes(4096), 0, 4096, Math.floor(statSync(path).size / 2 / 4096) * 4096);
    closeSync(fd);
    const before = sha(path);
    const r = await serveOn(data);
    expect(r.code).toBe(3);
    expect(r.stderr).toMatch(/failed SQLite's quick_check.*so nothing was written to it/s);
    expect(r.stderr).toMatch(/pdctl journal backup .* \.recover/);
    expect(r.stderr).not.toMatch(/\n\s+at /);
    expect(sha(path)).toBe(before);
    expect(readdirSync(data).sort()).toEqual(['bus.key', 'journal.db']);
  });

  it('a damaged journal a SIGKILLed serve left with its -wal is kept byte for byte, -wal and -shm too', async () => {
    const data = join(dir, 'crashed');
    mkdirSync(data);
    const path = join(data, 'journal.db');
    execFileSync('cp', [journal, path]);
    const s = await serve(['--data-dir', data]);
    s.child.kill('SIGKILL');
    await new Promise((r) => s.child.once('exit', r));
    expect(statSync(`${path}-wal`).size).toBeGreaterThan(0);
    // Random bytes over the start of eight pages across the file (the b-tree headers
    // quick_check reads): one place could be a page the -wal holds a newer copy of.
    const fd = openSync(path, 'r+');
    const pages = Math.floor(statSync(path).size / 4096);
    for (let k = 1; k <= 8; k++)
      writeSync(fd, randomBytes(64), 0, 64, Math.floor((pages * k) / 9) * 4096);
    closeSync(fd);
    const files = ['journal.db', 'journal.db-wal', 'journal.db-shm'];
    const before = files.map((f) => sha(join(data, f)));
    const listed = readdirSync(data).sort();
    const r = await serveOn(data);
    expect(r.code).toBe(3);
    expect(r.stderr).toMatch(/failed SQLite's quick_check.*so nothing was written to it/s);
    expect(r.stderr).toMatch(/its -wal and its -shm were left exactly as they were/);
    expect(r.stderr).not.toMatch(/\n\s+at /);
    expect(files.map((f) => sha(join(data, f)))).toEqual(before);
    // No private check directory is left behind, and the writer lock is released.
    expect(readdirSync(data).sort()).toEqual(listed.filter((f) => !f.endsWith('.writer.lock')));
  });

  it('an immutable journal (chattr +i): serve exits 3 at once and releases its lock', async (t) => {
    const data = join(dir, 'immutable');
    mkdirSync(data);
    const path = join(data, 'journal.db');
    execFileSync('cp', [journal, path]);
    try {
      execFileSync('chattr', ['+i', path], { stdio: 'ignore' });
    } catch {
      t.skip('chattr +i needs root and a filesystem with the immutable flag');
      return;
    }
    try {
      const before = sha(path);
      const started = Date.now();
      const r = await serveOn(data);
      expect(r.code).toBe(3);
      expect(Date.now() - started).toBeLessThan(15_000);
      expect(r.stderr).toMatch(/JOURNAL_READ_ONLY/);
      expect(r.stderr).toMatch(/immutable file/);
      expect(r.stderr).not.toMatch(/\n\s+at /);
      expect(sha(path)).toBe(before);
      expect(existsSync(`${path}.writer.lock`)).toBe(false);
    } finally {
      execFileSync('chattr', ['-i', path]);
    }
  });

  it('an empty file: serve refuses it as the read commands do; journal migrate makes it a journal', async () => {
    const data = join(dir, 'empty-serve');
    mkdirSync(data);
    const path = join(data, 'journal.db');
    closeSync(openSync(path, 'w'));
    const r = await serveOn(data);
    expect(r.code).toBe(3);
    expect(r.stderr).toMatch(/is empty \(0 bytes\): not a pdctl journal/);
    expect(statSync(path).size).toBe(0);
    const rooms = await pdctl(['rooms', '--journal', path]);
    expect(rooms.code).toBe(3);
    expect(rooms.stderr).toMatch(/is empty \(0 bytes\): not a pdctl journal/);
    const migrated = await pdctl(['journal', 'migrate', '--journal', path]);
    expect(migrated.code).toBe(0);
    expect((await pdctl(['rooms', '--journal', path])).code).toBe(0);
  });

  it('read commands leave no -wal or -shm beside a journal that was only read', async () => {
    expect(readdirSync(join(dir, 'base'))).toEqual(['journal.db']);
    for (const args of [['rooms'], ['journal', 'verify'], ['journal', 'stats']]) {
      const r = await pdctl([...args, '--journal', journal]);
      expect(r.code, args.join(' ')).toBe(0);
      expect(readdirSync(join(dir, 'base')), args.join(' ')).toEqual(['journal.db']);
    }
  });

  it('an empty file is not a journal: read commands say so and leave it empty', async () => {
    const path = join(dir, 'empty.db');
    closeSync(openSync(path, 'w'));
    for (const args of [['rooms'], ['journal', 'verify']]) {
      const r = await pdctl([...args, '--journal', path]);
      expect(r.code).toBe(3);
      expect(r.stderr).toMatch(/is empty \(0 bytes\): not a pdctl journal/);
    }
    expect(statSync(path).size).toBe(0);
    expect(existsSync(`${path}-wal`)).toBe(false);
  });

  describe('on a read-only filesystem', () => {
    const mount = join(dir, 'ro');
    let mounted = false;
    beforeAll(() => {
      // As root (CI), file modes do not stop writes: a read-only tmpfs does. Elsewhere, modes do.
      mkdirSync(mount);
      if (process.getuid?.() === 0) {
        execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=64m', 'tmpfs', mount]);
        mounted = true;
      }
      execFileSync('cp', [journal, join(mount, 'journal.db')]);
      if (mounted) execFileSync('mount', ['-o', 'remount,ro', mount]);
      else execFileSync('chmod', ['-R', 'a-w', mount]);
    });
    afterAll(() => {
      if (mounted) execFileSync('umount', [mount]);
      else execFileSync('chmod', ['-R', 'u+w', mount]);
    });

    it('serve exits 3 saying the journal cannot be written; read commands still work', async () => {
      const before = sha(join(mount, 'journal.db'));
      const r = await serveOn(mount);
      expect(r.code).toBe(3);
      expect(r.stderr).toMatch(/read-only file or filesystem/);
      expect(r.stderr).not.toMatch(/\n\s+at /);
      const rooms = await pdctl(['rooms', '--journal', join(mount, 'journal.db')]);
      expect(rooms.code).toBe(0);
      expect(rooms.stdout).toMatch(/ROOM\s+STATE/);
      expect(readdirSync(mount)).toEqual(['journal.db']);
      expect(sha(join(mount, 'journal.db'))).toBe(before);
    });
  });
});

describe('journal prune --archive onto a disk that fills', () => {
  // As root (CI) a 96 KiB tmpfs is a disk that fills halfway through the archive.
  it.runIf(process.getuid?.() === 0)(
    'stops at the chunk the disk could not take: every room is in the journal or readable from the archive',
    async () => {
      const copy = join(dir, 'full-disk', 'journal.db');
      const small = join(dir, 'full-disk', 'small');
      mkdirSync(small, { recursive: true });
      execFileSync('cp', [journal, copy]);
      const ids = async (where: string[]) => {
        const r = await pdctl(['rooms', '--json', '--limit', '10000', ...where]);
        expect(r.code, r.stderr).toBe(0);
        return (JSON.parse(r.stdout) as { rooms: Array<{ room: string }> }).rooms.map(
          (x) => x.room,
        );
      };
      const events = async (where: string[]) => {
        const r = await pdctl(['journal', 'tail', '--json', '--limit', '10000', ...where]);
        expect(r.code, r.stderr).toBe(0);
        return r.stdout.trim().split('\n');
      };
      const before = await ids(['--journal', copy]);
      const eventsBefore = await events(['--journal', copy]);
      expect(before.length).toBeGreaterThanOrEqual(400);
      execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=96k', 'tmpfs', small]);
      try {
        const archive = join(small, 'archive');
        const r = await pdctl([
          'journal',
          'prune',
          '--older-than',
          '5m',
          '--chunk',
          '25',
          '--archive',
          archive,
          '--journal',
          copy,
        ]);
        expect(r.code, r.stdout).not.toBe(0);
        expect(r.stderr).toMatch(/ENOSPC.*Nothing of this chunk was deleted from the journal/);
        const kept = await ids(['--journal', copy]);
        const archived = await ids(['--archive', archive]);
        expect(kept.length).toBeLessThan(before.length);
        expect(archived.length).toBeGreaterThan(0);
        expect(new Set([...kept, ...archived])).toEqual(new Set(before));
        // Every event as it was committed, from one or the other.
        const after = new Set([
          ...(await events(['--journal', copy])),
          ...(await events(['--archive', archive])),
        ]);
        expect(eventsBefore.filter((line) => !after.has(line))).toEqual([]);
        expect((await pdctl(['journal', 'verify', '--journal', copy])).code).toBe(0);
      } finally {
        execFileSync('umount', [small]);
      }
    },
    60_000,
  );
});

describe('backup and export write only a file they create', () => {
  for (const verb of ['backup', 'export'] as const) {
    const args = (to: string) =>
      verb === 'backup'
        ? ['journal', 'backup', '--journal', journal, '--to', to]
        : [
            'journal',
            'export',
            '--journal',
            journal,
            '--since',
            '2h',
            '--until',
            'now',
            '--to',
            to,
          ];

    it(`${verb}: a planted OUT.partial symlink is not followed`, async () => {
      const out = join(dir, `${verb}-sym.db`);
      const victim = join(dir, `${verb}-victim.txt`);
      writeFileSync(victim, 'not yours\n');
      symlinkSync(victim, `${out}.partial`);
      const r = await pdctl(args(out));
      expect(r.code, r.stderr).toBe(0);
      expect(readFileSync(victim, 'utf8')).toBe('not yours\n');
      expect(lstatSync(out).isSymbolicLink()).toBe(false);
      expect(lstatSync(`${out}.partial`).isSymbolicLink()).toBe(true);
      expect((await pdctl(['journal', 'verify', '--journal', out])).code).toBe(0);
      expect(readdirSync(dir).filter((f) => f.startsWith(`.${verb}-sym.db.partial-`))).toEqual([]);
    });

    it(`${verb}: a symlink at OUT is refused, and with --force replaced, never written through`, async () => {
      const out = join(dir, `${verb}-at.db`);
      const victim = join(dir, `${verb}-at-victim.txt`);
      writeFileSync(victim, 'not yours\n');
      symlinkSync(victim, out);
      const refused = await pdctl(args(out));
      expect(refused.code).toBe(2);
      expect(refused.stderr).toMatch(/already exists \(a symbolic link\)/);
      expect(readFileSync(victim, 'utf8')).toBe('not yours\n');
      const forced = await pdctl([...args(out), '--force']);
      expect(forced.code, forced.stderr).toBe(0);
      expect(readFileSync(victim, 'utf8')).toBe('not yours\n');
      expect(lstatSync(out).isSymbolicLink()).toBe(false);
    });

    it(`${verb}: a regular OUT.partial of someone else's is left alone; errors are one line`, async () => {
      const out = join(dir, `${verb}-reg.db`);
      writeFileSync(`${out}.partial`, 'keep me\n');
      const r = await pdctl(args(out));
      expect(r.code, r.stderr).toBe(0);
      expect(readFileSync(`${out}.partial`, 'utf8')).toBe('keep me\n');
      const nowhere = await pdctl(args(join(dir, 'no-such-dir', 'x.db')));
      expect(nowhere.code).toBe(2);
      expect(nowhere.stderr).toMatch(/^pdctl: cannot write .*ENOENT/);
      expect(nowhere.stderr.trim().split('\n')).toHaveLength(1);
    });
  }
});
