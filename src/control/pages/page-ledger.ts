/**
 * Admission by KV pages: the pages each room will hold on each engine, counted from the moment the
 * control plane picks the pair until that engine releases the room. A prefill engine reserves
 * pages for the prompt's KV; a decode engine too, and for every token it may generate where its
 * model decodes in the pool (`kv.decodeGrows`). A request that no engine can hold now waits
 * (429); one no engine could ever hold is refused (400). Engines that do not say how their KV
 * takes pages (`kv` in their hello) are not counted.
 */
import { pagesFor } from '../../model/executor.ts';
import type { EngineSession } from '../engines/engine-session.ts';

interface Hold {
  engine: string;
  incarnation: string;
  pages: number;
}

/** Tokens of KV a room takes on this engine. */
export function roomTokens(s: EngineSession, promptTokens: number, maxTokens: number): number {
  return s.role === 'decode' && s.kv?.decodeGrows ? promptTokens + maxTokens : promptTokens;
}

/** Pages a room takes on this engine; 0 when it does not say. */
export function roomPages(s: EngineSession, promptTokens: number, maxTokens: number): number {
  if (!s.kv) return 0;
  return pagesFor(s.kv, s.pageBytes, roomTokens(s, promptTokens, maxTokens));
}

/** Whether the engine has `pages` not yet promised to a room. */
export function fitsNow(s: EngineSession, pages: number): boolean {
  return pages === 0 || s.pages - s.load.reservedPages >= pages;
}

/** Whether the engine could hold `pages` at all, with nothing else on it. */
export function couldEverFit(s: EngineSession, pages: number): boolean {
  return pages <= s.pages;
}

/** The pages promised to each room on each engine, from admission until that engine releases it. */
export class PageLedger {
  private readonly byRoom = new Map<string, Hold[]>();

  constructor(private readonly session: (engine: string) => EngineSession | undefined) {}

  hold(room: string, s: EngineSession, pages: number): void {
    if (pages === 0) return;
    s.load.reservedPages += pages;
    const holds = this.byRoom.get(room) ?? [];
    holds.push({ engine: s.engine, incarnation: s.incarnation, pages });
    this.byRoom.set(room, holds);
  }

  /** The engine released the room: its pages are free again. */
  release(room: string, engine: string): void {
    const holds = this.byRoom.get(room);
    if (!holds) return;
    const i = holds.findIndex((h) => h.engine === engine);
    if (i < 0) return;
    const [h] = holds.splice(i, 1) as [Hold];
    if (holds.length === 0) this.byRoom.delete(room);
    this.unhold(h);
  }

  /** The room is gone (never created, or released by both): everything it held is free. */
  releaseAll(room: string): void {
    for (const h of this.byRoom.get(room) ?? []) this.unhold(h);
    this.byRoom.delete(room);
  }

  private unhold(h: Hold): void {
    // A new incarnation starts with an empty pool: the old one's holds are not its own.
    const s = this.session(h.engine);
    if (s && s.incarnation === h.incarnation)
      s.load.reservedPages = Math.max(0, s.load.reservedPages - h.pages);
  }
}
