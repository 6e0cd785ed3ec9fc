/** Child processes for tests: run TypeScript entry points through tsx, and never outlive the test. */
import { type ChildProcess, type SpawnOptions, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterEach } from 'vitest';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));

const live = new Set<ChildProcess>();
afterEach(() => {
  for (const child of live) child.kill('SIGKILL');
  live.clear();
});

/** Spawns `node --import tsx <script> ...args` from the repository root. */
export function spawnTs(script: string, args: string[], options: SpawnOptions = {}): ChildProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', script, ...args], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
    ...options,
  });
  live.add(child);
  child.once('exit', () => live.delete(child));
  return child;
}

export interface RunResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the pdctl CLI from source to completion. */
export function pdctl(args: string[], options: { timeoutMs?: number } = {}): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawnTs('src/cli/bin.ts', args);
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
