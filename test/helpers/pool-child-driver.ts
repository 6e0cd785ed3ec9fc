/** Drives pool-child.ts, the other process of the cross-process pool and transfer tests. */
import { spawnTs } from './spawn.ts';

export interface PoolChild {
  /** What the child printed once every page was written. */
  written: { epoch: number; checksums: string[]; all: string };
  /** Lets the child exit; resolves with its exit code. */
  finish(): Promise<number | null>;
}

/** Starts a process that creates pool `name`, fills every page with the pattern and waits. */
export async function startPoolChild(
  name: string,
  pages: number,
  pageBytes: number,
): Promise<PoolChild> {
  const child = spawnTs('test/helpers/pool-child.ts', [name, String(pages), String(pageBytes)], {
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  const deadline = Date.now() + 20_000;
  while (!out.includes('\n') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  return {
    written: JSON.parse(out) as PoolChild['written'],
    finish: () => {
      const exited = new Promise<number | null>((r) => child.once('exit', r));
      child.stdin?.write('done\n');
      return exited;
    },
  };
}
