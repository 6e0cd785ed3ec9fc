/** Drives pool-child.ts, the other process of the cross-process pool and transfer tests. */
import { spawnTs } from './spawn.ts';

export interface PoolChild {
  /** What the child printed once every page was written. */
  written: { epoch: number; checksums: string[]; all: string };
  /** Lets the child exit; resolves with its exit code. */
  finish(): Promise<number | null>;
}

/**
 * Starts a process that creates pool `name` (on CUDA device `device`, if given), fills every page
 * with the pattern and waits.
 */
export async function startPoolChild(
  name: string,
  pages: number,
  pageBytes: number,
  device?: number,
): Promise<PoolChild> {
  const args = [name, String(pages), String(pageBytes)];
  if (device !== undefined) args.push(String(device));
  const child = spawnTs('test/helpers/pool-child.ts', args, { stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
  const deadline = Date.now() + 20_000;
  while (!out.includes('\n') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  if (!out.includes('\n')) throw new Error(`the pool child printed nothing; its stderr:\n${err}`);
  return {
    written: JSON.parse(out) as PoolChild['written'],
    finish: () => {
      const exited = new Promise<number | null>((r) => child.once('exit', r));
      child.stdin?.write('done\n');
      return exited;
    },
  };
}
