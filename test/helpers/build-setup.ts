/**
 * vitest global setup: the tests run pdctl as it is installed — `bin/pdctl.js`, the compiled build
 * in dist/ — for the commands they spawn and the engines a stack starts (an engine started through
 * tsx compiles its TypeScript first: about 0.7 s of CPU more per process). So that no test runs
 * an old build, dist/ is compiled again here whenever a file of src/ is newer than it; after
 * `npm install` or `npm run build` (as CI does) it is not, and this costs nothing.
 */
import { execFileSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** The newest modification time under `dir` of files `keep` takes, in ms; 0 when there is none. */
function newest(dir: string, keep: (name: string) => boolean): number {
  let latest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (!entry.isFile() || !keep(entry.name)) continue;
    latest = Math.max(latest, statSync(join(entry.parentPath, entry.name)).mtimeMs);
  }
  return latest;
}

export function setup(): void {
  const source = Math.max(
    newest(join(ROOT, 'src'), (n) => n.endsWith('.ts') && !n.endsWith('.test.ts')),
    statSync(join(ROOT, 'tsconfig.json')).mtimeMs,
    statSync(join(ROOT, 'tsconfig.build.json')).mtimeMs,
  );
  let built = 0;
  try {
    built = statSync(join(ROOT, 'dist/cli/bin.js')).mtimeMs;
  } catch {
    // Never built: built stays 0.
  }
  if (built >= source) return;
  process.stderr.write(
    `tests run the compiled pdctl (bin/pdctl.js): src/ is newer than dist/, compiling it first (npm run build:ts)\n`,
  );
  execFileSync(
    process.execPath,
    [join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.build.json'],
    {
      cwd: ROOT,
      stdio: 'inherit',
    },
  );
}
