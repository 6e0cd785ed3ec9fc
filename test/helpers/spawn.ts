/**
 * Child processes for tests, which never outlive the test: pdctl as it is installed (`bin/pdctl.js`,
 * the compiled build, which test/helpers/build-setup.ts keeps up to date with src/), and other
 * TypeScript entry points through tsx.
 */
import { type ChildProcess, type SpawnOptions, spawn } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach } from 'vitest';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** The installed entry point: what `pdctl` runs on a user's machine. */
export const PDCTL_BIN = join(ROOT, 'bin/pdctl.js');

const live = new Set<ChildProcess>();
const fileScoped = new Set<ChildProcess>();
afterEach(() => {
  for (const child of live) child.kill('SIGKILL');
  live.clear();
});
afterAll(() => {
  for (const child of fileScoped) child.kill('SIGKILL');
  fileScoped.clear();
});

/**
 * Spawns `node --import tsx <script> ...args` from the repository root. It is SIGKILLed when the
 * test ends, or with `scope: 'file'` (a server shared by a file's tests) when the file ends.
 */
export function spawnTs(
  script: string,
  args: string[],
  options: SpawnOptions = {},
  scope: 'test' | 'file' = 'test',
): ChildProcess {
  return spawnNode(['--import', 'tsx', script, ...args], options, scope);
}

/** Spawns `pdctl ...args` as installed (`node bin/pdctl.js`); killed as `spawnTs`'s children are. */
export function spawnPdctl(
  args: string[],
  options: SpawnOptions = {},
  scope: 'test' | 'file' = 'test',
): ChildProcess {
  return spawnNode([PDCTL_BIN, ...args], options, scope);
}

function spawnNode(argv: string[], options: SpawnOptions, scope: 'test' | 'file'): ChildProcess {
  const child = spawn(process.execPath, argv, {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
    ...options,
  });
  const set = scope === 'test' ? live : fileScoped;
  set.add(child);
  child.once('exit', () => set.delete(child));
  return child;
}

export interface RunResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the pdctl CLI, as installed, to completion. */
export function pdctl(
  args: string[],
  options: { timeoutMs?: number; env?: NodeJS.ProcessEnv } = {},
): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawnPdctl(args, options.env ? { env: { ...process.env, ...options.env } } : {});
    let stdout = '';
    let stderr = '';
    child.stdout?.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`pdctl ${args.join(' ')} timed out\nstdout: ${stdout}\nstderr: ${stderr}`));
    }, options.timeoutMs ?? 30_000);
    child.once('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}
