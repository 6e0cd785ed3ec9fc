/**
 * The page pattern the cross-process pool tests write in one process (pool-child.ts) and check in
 * another. No test-runner imports: the child process loads this too.
 */

/** The byte at `offset` of page `page`. */
export function patternByte(page: number, offset: number): number {
  return (page * 31 + offset * 7) & 0xff;
}

/** The first offset of `data` that does not hold page `page`'s pattern, or -1. */
export function firstWrongByte(data: Uint8Array, page: number): number {
  for (let j = 0; j < data.length; j++) if (data[j] !== patternByte(page, j)) return j;
  return -1;
}
