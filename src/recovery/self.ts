/**
 * How to run this build's `pdctl` as a child process: from dist/ under node, or from source under
 * tsx (tests and `npx tsx`). The supervisor spawns engines with it, drills spawn `pdctl serve`.
 */
import { fileURLToPath } from 'node:url';

export function selfCommand(
  args: string[],
  /** Another entry of this build to run (the compiled `bin/pdctl.js`); default: this one's own. */
  entryOf?: string,
): { command: string; args: string[] } {
  const ext = import.meta.url.endsWith('.ts') ? 'ts' : 'js';
  const entry = entryOf ?? fileURLToPath(new URL(`../cli/bin.${ext}`, import.meta.url));
  const loader = process.execArgv.filter((a) => !a.startsWith('--inspect'));
  // From source the entry is TypeScript: make sure the child can load it.
  if (entry.endsWith('.ts') && !loader.some((a) => a.includes('tsx')))
    loader.push('--import', 'tsx');
  return { command: process.execPath, args: [...loader, entry, ...args] };
}
