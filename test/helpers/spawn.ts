/** Child processes for tests: run TypeScript entry points through tsx, and never outlive the test. */
import { type ChildProcess, type SpawnOptions, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach } from 'vitest';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));

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
  const child = spawn(process.execPath, ['--import', 'tsx', script, ...args], {
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

/** Runs the pdctl CLI from source to completion. */
export function pdctl(
  args: string[],
  options: { timeoutMs?: number; env?: NodeJS.ProcessEnv } = {},
): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawnTs(
      'src/cli/bin.ts',
      args,
      options.env ? { env: { ...process.env, ...options.env } } : {},
    );
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
