import { describe, expect, it } from 'vitest';
import { KvImageError } from '../executor.ts';
import { KV_IMAGE_HEADER_BYTES, readKvImage, writeKvImage } from './kv-image.ts';

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
});
