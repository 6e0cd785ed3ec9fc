import { closeSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { tempDir } from '../../../test/helpers/tmp.ts';
import { KvImageError } from '../executor.ts';
import {
  KV_IMAGE_HEADER_BYTES,
  kvImageViews,
  readKvImage,
  writeKvImage,
  writeKvImageFromFile,
  writeViews,
} from './kv-image.ts';

const pagesOf = (n: number, bytes: number) =>
  Array.from({ length: n }, () => new Uint8Array(bytes));

describe('a KV image in pages', () => {
  it('reads back exactly the state written, across page boundaries', () => {
    const state = Uint8Array.from({ length: 1000 }, (_, i) => (i * 7 + 3) & 0xff);
    const pages = pagesOf(5, 256);
    expect(writeKvImage(pages, state)).toBe(KV_IMAGE_HEADER_BYTES + 1000);
    expect(Buffer.from(readKvImage(pages)).equals(Buffer.from(state))).toBe(true);
    // An empty state (a one-token prompt) is an image too.
    writeKvImage(pages, new Uint8Array(0));
    expect(readKvImage(pages).length).toBe(0);
  });

  it('refuses a state the pages cannot hold, and pages that hold no image', () => {
    expect(() => writeKvImage(pagesOf(2, 64), new Uint8Array(200))).toThrow(KvImageError);
    expect(() => readKvImage(pagesOf(2, 64))).toThrow(/hold no KV image/);
    const pages = pagesOf(2, 64);
    writeKvImage(pages, new Uint8Array(50));
    (pages[0] as Uint8Array)[4] = 9;
    expect(() => readKvImage(pages)).toThrow(/format 9/);
    (pages[0] as Uint8Array)[4] = 1;
    (pages[0] as Uint8Array)[8] = 200;
    expect(() => readKvImage(pages)).toThrow(/says 200 bytes/);
  });

  it('moves a saved state file into the pages and out as views of them, with no copy between', () => {
    const state = Uint8Array.from({ length: 1000 }, (_, i) => (i * 13 + 5) & 0xff);
    const file = join(tempDir('pdctl-kv-image-'), 'seq.state');
    writeFileSync(file, state);
    const pages = pagesOf(5, 256);
    expect(writeKvImageFromFile(pages, file)).toBe(KV_IMAGE_HEADER_BYTES + 1000);
    // The same image as written from memory, byte for byte.
    const fromMemory = pagesOf(5, 256);
    writeKvImage(fromMemory, state);
    expect(pages).toEqual(fromMemory);
    const views = kvImageViews(pages);
    // The header takes the first page's first 16 bytes; the state runs on to the fifth page.
    expect(views.map((v) => v.length)).toEqual([240, 256, 256, 248]);
    expect(views.every((v, i) => v.buffer === (pages[i] as Uint8Array).buffer)).toBe(true);
    expect(Buffer.concat(views).equals(Buffer.from(state))).toBe(true);
    writeFileSync(file, new Uint8Array(1300));
    expect(() => writeKvImageFromFile(pages, file)).toThrow(
      /1300 bytes; the room's 5 pages hold 1264/,
    );
  });

  it('reads and writes more pieces than one system call takes (IOV_MAX is 1024 here)', () => {
    const dir = tempDir('pdctl-kv-image-');
    const state = Uint8Array.from({ length: 3000 * 64 - 100 }, (_, i) => (i * 31 + 7) & 0xff);
    writeFileSync(join(dir, 'in.state'), state);
    const pages = pagesOf(3000, 64);
    writeKvImageFromFile(pages, join(dir, 'in.state'));
    const views = kvImageViews(pages);
    expect(views.length).toBe(2999);
    const fd = openSync(join(dir, 'out.state'), 'w');
    writeViews(fd, views);
    closeSync(fd);
    expect(readFileSync(join(dir, 'out.state')).equals(Buffer.from(state))).toBe(true);
  });
});
