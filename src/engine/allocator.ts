/**
 * The page allocator of one engine's KV pool. Pages are held per room and freed per room, once:
 * a second free of the same room frees nothing, which is what keeps "free pages return to
 * capacity" true after aborts that race with completions. A room's pages are either chosen here
 * (`reserve`) or named by the control plane's reservation (`claim`, decode engines).
 */
import { PageSet } from '../transfer/page-set.ts';

export class PageAllocator {
  private readonly pages: PageSet;
  private readonly held = new Map<string, number[]>();

  constructor(readonly capacity: number) {
    this.pages = new PageSet(capacity);
  }

  get free(): number {
    return this.pages.free;
  }

  /** Reserves `count` pages for the room, or returns null (nothing reserved) if too few are free. */
  reserve(room: string, count: number): number[] | null {
    if (this.held.has(room)) throw new Error(`room ${room} already holds pages`);
    const pages = this.pages.take(count);
    if (pages) this.held.set(room, pages);
    return pages;
  }

  /**
   * Holds exactly these pages for the room: null when it does, else why it cannot (a page out of
   * the pool, named twice, or held for another room — nothing is held then).
   */
  claim(room: string, pages: readonly number[]): string | null {
    if (this.held.has(room)) return `room ${room} already holds pages`;
    if (pages.length === 0) return 'no pages named';
    const wrong = this.pages.takeExact(pages);
    if (wrong === null) this.held.set(room, [...pages]);
    return wrong;
  }

  pagesOf(room: string): readonly number[] | null {
    return this.held.get(room) ?? null;
  }

  /** Frees the room's pages; returns how many (0 when it held none or was freed before). */
  release(room: string): number {
    const pages = this.held.get(room);
    if (!pages) return 0;
    this.held.delete(room);
    this.pages.give(pages);
    return pages.length;
  }

  rooms(): string[] {
    return [...this.held.keys()];
  }
}
