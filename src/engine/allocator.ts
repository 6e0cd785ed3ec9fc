/**
 * The page allocator of one engine's KV pool. Pages are held per room and freed per room, once:
 * a second free of the same room frees nothing, which is what keeps "free pages return to
 * capacity" true after aborts that race with completions.
 */
export class PageAllocator {
  private readonly freeList: number[];
  private readonly held = new Map<string, number[]>();

  constructor(readonly capacity: number) {
    // Low pages first: a fresh pool hands out 0, 1, 2, … (contiguous runs copy as one range).
    this.freeList = Array.from({ length: capacity }, (_, i) => capacity - 1 - i);
  }

  get free(): number {
    return this.freeList.length;
  }

  /** Reserves `count` pages for the room, or returns null (nothing reserved) if too few are free. */
  reserve(room: string, count: number): number[] | null {
    if (this.held.has(room)) throw new Error(`room ${room} already holds pages`);
    if (!Number.isInteger(count) || count < 1 || count > this.freeList.length) return null;
    const pages: number[] = new Array(count);
    for (let i = 0; i < count; i++) pages[i] = this.freeList.pop() as number;
    this.held.set(room, pages);
    return pages;
  }

  pagesOf(room: string): readonly number[] | null {
    return this.held.get(room) ?? null;
  }

  /** Frees the room's pages; returns how many (0 when it held none or was freed before). */
  release(room: string): number {
    const pages = this.held.get(room);
    if (!pages) return 0;
    this.held.delete(room);
    for (let i = pages.length - 1; i >= 0; i--) this.freeList.push(pages[i] as number);
    return pages.length;
  }

  rooms(): string[] {
    return [...this.held.keys()];
  }
}
