/**
 * The control plane stays a set of parts: no file in src/control/ or its folders may pass 400
 * lines, so that the room book, intake, the engine links and migration do not grow back into one
 * hub (docs/design.md §10). A file that needs more is a concept that wants a module of its own,
 * and a concept of more than one file a folder.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

const MAX_LINES = 400;
const dir = import.meta.dirname;

describe('src/control/', () => {
  it(`has no source file over ${MAX_LINES} lines`, () => {
    const sources = readdirSync(dir, { recursive: true, encoding: 'utf8' }).filter(
      (f) => f.endsWith('.ts') && !f.includes('.test.'),
    );
    expect(sources).toContain('control-plane.ts');
    expect(sources).toContain(join('rooms', 'room-book.ts'));
    const long = sources
      .map((f) => ({ file: f, lines: readFileSync(join(dir, f), 'utf8').split('\n').length }))
      .filter((x) => x.lines > MAX_LINES)
      .map((x) => `${x.file}: ${x.lines} lines`);
    expect(long, 'split these into modules of their own').toEqual([]);
  });
});
