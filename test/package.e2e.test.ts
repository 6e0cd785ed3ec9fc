/**
 * pdctl installed as operators install it: `npm pack`, `npm install -g` of the tarball into a
 * prefix of its own (building the native addon there), then `pdctl serve` from another directory;
 * and the systemd units of deploy/systemd, checked by systemd-analyze against that install.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ROOT } from './helpers/spawn.ts';
import { tempDir } from './helpers/tmp.ts';
import { findTool } from './helpers/tools.ts';

/**
 * The dependencies whose install scripts an install must run (docs/operations.md); pdctl's own
 * is allowed by the tarball's path, as npm matches a package from a file.
 */
const ALLOW_SCRIPTS = 'better-sqlite3,node-llama-cpp,zeromq,msgpackr-extract';
const UNITS = join(ROOT, 'deploy/systemd');
const systemdAnalyze = findTool('systemd-analyze');

/** npm's environment of the `npm test` that runs this, left out: the install is a user's own. */
function userEnv(): NodeJS.ProcessEnv {
  return Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k) && k !== 'INIT_CWD'),
  );
}

const prefix = tempDir('pdctl-prefix-');
const installed = join(prefix, 'bin/pdctl');
let serving: ChildProcess | null = null;

afterAll(() => {
  serving?.kill('SIGKILL');
});

describe('npm pack, npm install -g, pdctl serve', () => {
  it('installs from the tarball with its native addon, and serves from any directory', async () => {
    // The tarball of this checkout's build (the tests' global setup compiled dist/).
    const packDir = tempDir('pdctl-pack-');
    const pack = spawnSync('npm', ['pack', '--ignore-scripts', '--pack-destination', packDir], {
      cwd: ROOT,
      env: userEnv(),
      encoding: 'utf8',
    });
    expect(pack.status, pack.stderr).toBe(0);
    const [tarball] = readdirSync(packDir).filter((f) => f.endsWith('.tgz'));
    expect(tarball).toMatch(/^pdctl-\d+\.\d+\.\d+\.tgz$/);
    const listed = spawnSync('tar', ['-tzf', join(packDir, tarball as string)], {
      encoding: 'utf8',
    });
    // Sources to build the addon from, and no build of this machine's.
    expect(listed.stdout).toContain('package/native/binding.gyp');
    expect(listed.stdout).toContain('package/deploy/systemd/pdctl.service');
    expect(listed.stdout).not.toContain('package/native/build/');

    const install = spawnSync(
      'npm',
      [
        'install',
        '-g',
        '--prefix',
        prefix,
        `--allow-scripts=${join(packDir, tarball as string)},${ALLOW_SCRIPTS}`,
        '--prefer-offline',
        '--no-audit',
        '--no-fund',
        join(packDir, tarball as string),
      ],
      { cwd: packDir, env: userEnv(), encoding: 'utf8', timeout: 400_000 },
    );
    expect(install.status, install.stderr.slice(-3000)).toBe(0);
    // Every script it needs was allowed by name: npm has nothing to warn of.
    expect(install.stderr).not.toMatch(/install-scripts/);
    const addon = join(prefix, 'lib/node_modules/pdctl/native/build/Release/pdctl_native.node');
    expect(existsSync(addon), addon).toBe(true);

    // From a directory of its own, with nothing of this checkout on its path.
    const cwd = tempDir('pdctl-elsewhere-');
    const child = spawn(
      installed,
      ['serve', '--port', '0', '--bus', 'tcp://127.0.0.1:0', '--durability', 'process'],
      {
        cwd,
        env: { ...userEnv(), PDCTL_EXIT_WITH_PARENT: String(process.pid), PDCTL_JOURNAL: '' },
      },
    );
    serving = child;
    let err = '';
    child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
    child.stdout?.resume();
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no listening line:\n${err}`)), 60_000);
      child.stderr?.on('data', () => {
        const m = /listening on (http:\/\/\S+)/.exec(err);
        if (m) {
          clearTimeout(timer);
          resolve(m[1] as string);
        }
      });
      child.once('exit', (code) => reject(new Error(`serve exited ${code}:\n${err}`)));
    });
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'pdctl-deterministic-1', prompt: 'the river', max_tokens: 3 }),
    });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { usage: { completion_tokens: number } }).usage).toMatchObject({
      completion_tokens: 3,
    });
    // Its journal is where a user who ran it there would look: ./data.
    expect(existsSync(join(cwd, 'data/journal.db'))).toBe(true);
    const code = await new Promise<number | null>((resolve) => {
      child.once('exit', (c) => resolve(c));
      child.kill('SIGTERM');
    });
    serving = null;
    expect(code).toBe(0);
    expect(err).toMatch(/pdctl serve: stopped/);
  }, 480_000);
});

/** `Key=value` lines of a unit's [Service] section (the last of a key wins, as in systemd). */
function serviceKeys(text: string): Map<string, string> {
  const keys = new Map<string, string>();
  let inService = false;
  for (const line of text.split('\n')) {
    if (/^\[.*\]$/.test(line)) inService = line === '[Service]';
    const m = /^(\w+)=(.*)$/.exec(line);
    if (inService && m) keys.set(m[1] as string, m[2] as string);
  }
  return keys;
}

describe('deploy/systemd', () => {
  const units = readdirSync(UNITS).filter((f) => f.endsWith('.service'));

  it('hardens every unit, stops it by SIGTERM to pdctl alone, and gives its drain time', () => {
    expect(units.sort()).toEqual([
      'pdctl-engine@.service',
      'pdctl-postgres.service',
      'pdctl.service',
    ]);
    // The drain deadlines pdctl stops within (serve, engine --help), in ms.
    const drainOf = (command: string) => {
      const help = spawnSync(process.execPath, [join(ROOT, 'bin/pdctl.js'), command, '--help'], {
        encoding: 'utf8',
      }).stdout;
      return Number(/--drain-timeout-ms <n>[\s\S]*?\(default: (\d+)\)/.exec(help)?.[1]);
    };
    for (const unit of units) {
      const keys = serviceKeys(readFileSync(join(UNITS, unit), 'utf8'));
      const drainMs = drainOf(unit.startsWith('pdctl-engine') ? 'engine' : 'serve');
      expect(drainMs, unit).toBeGreaterThan(0);
      expect(
        Number(/^(\d+)s$/.exec(keys.get('TimeoutStopSec') ?? '')?.[1]) * 1000,
        unit,
      ).toBeGreaterThan(drainMs + 10_000);
      expect(keys.get('KillMode'), unit).toBe('mixed');
      expect(keys.get('RestartPreventExitStatus'), unit).toMatch(/^2\b/);
      for (const [key, value] of [
        ['DynamicUser', 'yes'],
        ['NoNewPrivileges', 'yes'],
        ['ProtectSystem', 'strict'],
        ['LimitNOFILE', '65536'],
      ])
        expect(keys.get(key as string), `${unit} ${key}`).toBe(value);
      expect(keys.get('ExecStart'), unit).toMatch(/^\/usr\/local\/bin\/pdctl (serve|engine) /);
    }
  });

  it.runIf(systemdAnalyze !== null)(
    'systemd-analyze verify passes on each unit, run by the pdctl installed above',
    () => {
      const dir = tempDir('pdctl-units-');
      // The install above; run alone (-t), this checkout's own.
      const exec = existsSync(installed) ? installed : join(ROOT, 'bin/pdctl.js');
      for (const unit of units)
        writeFileSync(
          join(dir, unit),
          readFileSync(join(UNITS, unit), 'utf8').replaceAll('/usr/local/bin/pdctl', exec),
        );
      // A template is verified as an instance of it.
      const names = units.map((u) => join(dir, u.replace('@.service', '@decode-1.service')));
      const r = spawnSync(systemdAnalyze as string, ['verify', ...names], {
        cwd: dir,
        encoding: 'utf8',
      });
      // It exits 0 with a directive it ignores: anything it says is a defect.
      expect(r.status, r.stderr).toBe(0);
      expect(`${r.stdout}${r.stderr}`).toBe('');
    },
  );
});
