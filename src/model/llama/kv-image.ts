/**
 * A llama.cpp sequence's saved state as it lies in a room's KV pages: a 16-byte header (magic
 * `PDKV`, format version, length) and the state bytes, laid back to back across the pages. The
 * header lets the decode engine read exactly what was written, and refuse pages that never held
 * an image; the transfer's checksum has already proven the bytes arrived as they left.
 */
import { closeSync, fstatSync, openSync, readvSync, writevSync } from 'node:fs';
import { KvImageError } from '../executor.ts';

export const KV_IMAGE_HEADER_BYTES = 16;
const MAGIC = 0x564b4450; // 'PDKV' little-endian
const VERSION = 1;

function capacity(pages: readonly Uint8Array[]): number {
  return pages.reduce((n, p) => n + p.length, 0);
}

/** The pieces of `pages` that bytes [from, from + length) of their concatenation lie in. */
function* spans(
  pages: readonly Uint8Array[],
  from: number,
  length: number,
): Generator<{ page: Uint8Array; offset: number; n: number; at: number }> {
  let skip = from;
  let at = 0;
  for (const page of pages) {
    if (at === length) return;
    if (skip >= page.length) {
      skip -= page.length;
      continue;
    }
    const n = Math.min(page.length - skip, length - at);
    yield { page, offset: skip, n, at };
    at += n;
    skip = 0;
  }
}

/** `views` less their first `bytes` bytes. */
function rest(views: Uint8Array[], bytes: number): Uint8Array[] {
  let skip = bytes;
  let i = 0;
  while (i < views.length && skip >= (views[i] as Uint8Array).length) {
    skip -= (views[i] as Uint8Array).length;
    i++;
  }
  const left = views.slice(i);
  if (skip > 0 && left.length > 0) left[0] = (left[0] as Uint8Array).subarray(skip);
  return left;
}

/** Writes every byte of `views` to the file `fd` at its current position. */
export function writeViews(fd: number, views: Uint8Array[]): void {
  let left = views;
  while (left.length > 0) left = rest(left, writevSync(fd, left));
}

function header(length: number): Uint8Array {
  const h = new Uint8Array(KV_IMAGE_HEADER_BYTES);
  const dv = new DataView(h.buffer);
  dv.setUint32(0, MAGIC, true);
  dv.setUint32(4, VERSION, true);
  dv.setBigUint64(8, BigInt(length), true);
  return h;
}

/** Writes `bytes` at byte `from` of the pages' concatenation. */
function put(pages: readonly Uint8Array[], from: number, bytes: Uint8Array): void {
  for (const { page, offset, n, at } of spans(pages, from, bytes.length))
    page.set(bytes.subarray(at, at + n), offset);
}

function fits(pages: readonly Uint8Array[], stateBytes: number): void {
  if (KV_IMAGE_HEADER_BYTES + stateBytes > capacity(pages)) {
    throw new KvImageError(
      `the KV state is ${stateBytes} bytes; the room's ${pages.length} pages hold ${capacity(pages) - KV_IMAGE_HEADER_BYTES}`,
    );
  }
}

/** Writes `state` with its header into `pages`; the bytes written. */
export function writeKvImage(pages: readonly Uint8Array[], state: Uint8Array): number {
  fits(pages, state.length);
  put(pages, 0, header(state.length));
  put(pages, KV_IMAGE_HEADER_BYTES, state);
  return KV_IMAGE_HEADER_BYTES + state.length;
}

/**
 * Writes the state llama.cpp saved to `file` with its header into `pages`, read from the file
 * straight into them (no copy of the whole state between); the bytes written.
 */
export function writeKvImageFromFile(pages: readonly Uint8Array[], file: string): number {
  const fd = openSync(file, 'r');
  try {
    const length = fstatSync(fd).size;
    fits(pages, length);
    put(pages, 0, header(length));
    // Read into every page's piece at once (page by page costs a system call a page); a read
    // stops short at the system's limit of pieces (IOV_MAX), so it goes on where it stopped.
    let views = [...spans(pages, KV_IMAGE_HEADER_BYTES, length)].map(({ page, offset, n }) =>
      page.subarray(offset, offset + n),
    );
    let done = 0;
    while (done < length) {
      const got = readvSync(fd, views, done);
      if (got === 0) throw new KvImageError(`the state file ended at ${done} of ${length} bytes`);
      done += got;
      views = rest(views, got);
    }
    return KV_IMAGE_HEADER_BYTES + length;
  } finally {
    closeSync(fd);
  }
}

/**
 * The state bytes of the image in `pages` as views of the pages, in order (no copy); throws
 * KvImageError when there is none.
 */
export function kvImageViews(pages: readonly Uint8Array[]): Uint8Array[] {
  const total = capacity(pages);
  if (total < KV_IMAGE_HEADER_BYTES) throw new KvImageError('the pages hold no KV image');
  const h = Buffer.alloc(KV_IMAGE_HEADER_BYTES);
  for (const { page, offset, n, at } of spans(pages, 0, KV_IMAGE_HEADER_BYTES))
    h.set(page.subarray(offset, offset + n), at);
  const magic = h.readUInt32LE(0);
  const version = h.readUInt32LE(4);
  if (magic !== MAGIC) {
    throw new KvImageError(`the pages hold no KV image (magic 0x${magic.toString(16)})`);
  }
  if (version !== VERSION) {
    throw new KvImageError(`KV image format ${version}; this pdctl reads format ${VERSION}`);
  }
  const length = Number(h.readBigUInt64LE(8));
  if (KV_IMAGE_HEADER_BYTES + length > total) {
    throw new KvImageError(
      `the KV image says ${length} bytes; the room's pages hold ${total - KV_IMAGE_HEADER_BYTES}`,
    );
  }
  return [...spans(pages, KV_IMAGE_HEADER_BYTES, length)].map(({ page, offset, n }) =>
    page.subarray(offset, offset + n),
  );
}

/** The state bytes of the image in `pages` (a copy); throws KvImageError when there is none. */
export function readKvImage(pages: readonly Uint8Array[]): Buffer {
  return Buffer.concat(kvImageViews(pages));
}
