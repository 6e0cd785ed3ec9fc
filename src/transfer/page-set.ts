/**
 * Which pages of one KV pool are taken: the engine's allocator holds its own pool with it, and the
 * control plane's page map holds each decode engine's pool with it, to choose a room's pages
 * before the engine sees the room (docs/critical-path.md). Both take the lowest free pages of a
 * fresh pool first (contiguous runs copy as one range) and can take named pages; taking and giving
 * back cost the pages moved, not the pool's size.
 */
export class PageSet {
  private readonly taken: Uint8Array;
  /**
   * Candidates for `take`, the next on top: every free page is here; a page taken by name stays
   * until it comes to the top and is skipped (`inStack` keeps each page here at most once).
   */
  private readonly stack: number[];
  private readonly inStack: Uint8Array;
  private freeCount: number;

  constructor(readonly capacity: number) {
    if (!Number.isInteger(capacity) || capacity < 0)
      throw new RangeError(`a pool has a whole number of pages, not ${capacity}`);
    this.taken = new Uint8Array(capacity);
    this.inStack = new Uint8Array(capacity).fill(1);
    this.stack = Array.from({ length: capacity }, (_, i) => capacity - 1 - i);
    this.freeCount = capacity;
  }

  get free(): number {
    return this.freeCount;
  }

  has(page: number): boolean {
    return this.taken[page] === 1;
  }

  /** Takes `count` free pages, or none (null) when fewer are free. */
  take(count: number): number[] | null {
    if (!Number.isInteger(count) || count < 1 || count > this.freeCount) return null;
    const pages: number[] = [];
    while (pages.length < count) {
      const page = this.stack.pop() as number;
      this.inStack[page] = 0;
      if (this.taken[page] === 1) continue;
      this.taken[page] = 1;
      pages.push(page);
    }
    this.freeCount -= count;
    return pages;
  }

  /**
   * Takes exactly these pages, or none: null when taken, else what is wrong with them (a page out
   * of the pool, named twice, or already taken), for the caller's refusal.
   */
  takeExact(pages: readonly number[]): string | null {
    const seen = new Set<number>();
    for (const page of pages) {
      if (!Number.isInteger(page) || page < 0 || page >= this.capacity)
        return `page ${page} is outside the pool (${this.capacity} pages)`;
      if (seen.has(page)) return `page ${page} is named twice`;
      if (this.taken[page] === 1) return `page ${page} is taken`;
      seen.add(page);
    }
    for (const page of pages) this.taken[page] = 1;
    this.freeCount -= pages.length;
    return null;
  }

  /** Gives taken pages back (a free page given back is left as it is); returns how many came back. */
  give(pages: readonly number[]): number {
    let given = 0;
    for (let i = pages.length - 1; i >= 0; i--) {
      const page = pages[i] as number;
      if (this.taken[page] !== 1) continue;
      this.taken[page] = 0;
      given++;
      if (this.inStack[page] === 0) {
        this.inStack[page] = 1;
        this.stack.push(page);
      }
    }
    this.freeCount += given;
    return given;
  }
}
