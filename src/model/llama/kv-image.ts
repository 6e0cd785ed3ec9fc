/**
 * A llama.cpp sequence's saved state as it lies in a room's KV pages: a 16-byte header (magic
 * `PDKV`, format version, length) and the state bytes, laid back to back across the pages. The
 * header lets the decode engine read exactly what was written, and refuse pages that never held
 * an image; the transfer's checksum has already proven the bytes arrived as they left.
 */
import { KvImageError } from '../executor.ts';

export const KV_IMAGE_HEADER_BYTES = 16;
const MAGIC = 0x564b4450; // 'PDKV' little-endian
const VERSION = 1;

function capacity(pages: readonly Uint8Array[]): number {
  return pages.reduce((n, p) => n + p.length, 0);
}

/** Writes `state` with its header into `pages`; the bytes written. */
export function writeKvImage(pages: readonly Uint8Array[], state: Uint8Array): number {
  const total = KV_IMAGE_HEADER_BYTES + state.length;
  if (total > capacity(pages)) {
    throw new KvImageError(
      `the KV state is ${state.length} bytes; the room's ${pages.length} pages hold ${capacity(pages) - KV_IMAGE_HEADER_BYTES}`,
    );
  }
  const header = new Uint8Array(KV_IMAGE_HEADER_BYTES);
  const dv = new DataView(header.buffer);
  dv.setUint32(0, MAGIC, true);
  dv.setUint32(4, VERSION, true);
  dv.setBigUint64(8, BigInt(state.length), true);
  let page = 0;
  let offset = 0;
  for (const part of [header, state]) {
    let from = 0;
    while (from < part.length) {
      const p = pages[page] as Uint8Array;
      const n = Math.min(p.length - offset, part.length - from);
      p.set(part.subarray(from, from + n), offset);
      from += n;
      offset += n;
      if (offset === p.length) {
        page++;
        offset = 0;
      }
    }
  }
  return total;
}

/** The state bytes of the image in `pages` (a copy); throws KvImageError when there is none. */
export function readKvImage(pages: readonly Uint8Array[]): Buffer {
  const all = Buffer.concat(pages as Uint8Array[]);
  if (all.length < KV_IMAGE_HEADER_BYTES) throw new KvImageError('the pages hold no KV image');
  const magic = all.readUInt32LE(0);
  const version = all.readUInt32LE(4);
  if (magic !== MAGIC) {
    throw new KvImageError(`the pages hold no KV image (magic 0x${magic.toString(16)})`);
  }
  if (version !== VERSION) {
    throw new KvImageError(`KV image format ${version}; this pdctl reads format ${VERSION}`);
  }
  const length = Number(all.readBigUInt64LE(8));
  if (KV_IMAGE_HEADER_BYTES + length > all.length) {
    throw new KvImageError(
      `the KV image says ${length} bytes; the room's pages hold ${all.length - KV_IMAGE_HEADER_BYTES}`,
    );
  }
  return all.subarray(KV_IMAGE_HEADER_BYTES, KV_IMAGE_HEADER_BYTES + length);
}
