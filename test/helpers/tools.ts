/**
 * Programs from the distribution that some tests drive (promtool, chromium). Where one is absent
 * its tests are skipped with a note — unless PDCTL_REQUIRE_TOOLS names it (CI does, after
 * installing them), where the absence is itself a failure.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { it } from 'vitest';

/** The program's path, or null when it is not installed. */
export function findTool(name: string, candidates: string[] = []): string | null {
  for (const c of candidates) if (existsSync(c)) return c;
  const r = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : null;
}

/**
 * Declares a test that fails when `tool` is missing but required; returns whether tests that
 * use it should run.
 */
export function requireTool(tool: string, path: string | null, install: string): boolean {
  const required = (process.env.PDCTL_REQUIRE_TOOLS ?? '').split(',').includes(tool);
  if (path === null && !required) {
    console.warn(`${tool} is not installed: its tests are skipped (${install})`);
  }
  it.runIf(required)(`${tool} is installed (PDCTL_REQUIRE_TOOLS names it)`, () => {
    if (path === null) throw new Error(`${tool} is required but not installed: ${install}`);
  });
  return path !== null;
}
