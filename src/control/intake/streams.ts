/**
 * One room's token stream, from the bus to the caller of `submit`: an async iterator of chunks
 * that ends when `room.completed` is committed, or throws a `RoomEndedError` when the room is
 * aborted, failed or migrated. Chunks are delivered in index order; a repeated index is dropped.
 */

import { type Clock, systemClock } from '../../ports/clock.ts';
import type { Room } from '../../room/reducer.ts';
import type { Band } from '../../tenants/book.ts';
import type { CompletionResult, TokenChunk } from './types.ts';

export class RoomEndedError extends Error {
  override name = 'RoomEndedError';

  constructor(
    readonly room: string,
    readonly state: 'aborted' | 'failed' | 'migrated' | 'unavailable',
    readonly reason: string,
    readonly stage: string | null = null,
  ) {
    super(`room ${room} ${state}: ${reason}${stage ? ` (in ${stage})` : ''}`);
  }
}

export class RoomStream implements AsyncIterable<TokenChunk> {
  private readonly chunks: TokenChunk[] = [];
  private waiter: (() => void) | null = null;
  private ended: { result: CompletionResult } | { error: Error } | null = null;
  private nextIndex = 0;
  text = '';
  tokens = 0;
  /** Token ids streamed, where the engines send them (llama.cpp models). */
  ids: number[] = [];
  /**
   * The answer's first token as the room's prefill engine streamed it (chunk 0, protocol 9), for
   * the room it came from: its `room.transfer_completed` must name the same one, which the decode
   * engine continues after (engines/appends.ts).
   */
  first: { room: string; token: number | null; text: string } | null = null;
  /** The room serving the request now: `room` until a migration moves it. */
  current: string;
  /**
   * Who the request is and who sent it (`x-request-id`, W3C `traceparent`, the tenant whose key
   * it came with and its band): journaled on every room of it, migrations and retries included.
   */
  trace: { requestId?: string; traceparent?: string; tenant?: string; band?: Band } = {};
  /** The caller aborted (its AbortSignal fired): a pending migration does not go on. */
  cancelled = false;
  /** Migrations so far, and where the current room's chunks and tokens start. */
  migrations = 0;
  /** Rooms of this request that failed before its first token and were tried again (migration.ts). */
  retries = 0;
  /**
   * The engines those rooms were tried again without: the request's later rooms, retried or
   * migrated, go without them too where a pair allows (migration.ts).
   */
  readonly leftOut = new Set<string>();
  private indexBase = 0;
  private tokensBase = 0;
  private idsBase = 0;
  readonly result: Promise<CompletionResult>;
  private settle!: { resolve(r: CompletionResult): void; reject(e: Error): void };
  /**
   * Resolves once the room's `room.created` is committed; rejects if the room ended first (the
   * journal refused it). The API answers only after it, so no response names a room the journal
   * does not have.
   */
  readonly admitted: Promise<void>;
  private admit!: { resolve(): void; reject(e: Error): void };

  constructor(
    readonly room: string,
    readonly promptTokens: number,
    readonly startedAt: number,
    private readonly clock: Pick<Clock, 'now'> = systemClock,
  ) {
    this.result = new Promise((resolve, reject) => (this.settle = { resolve, reject }));
    this.current = room;
    this.admitted = new Promise((resolve, reject) => (this.admit = { resolve, reject }));
    // Callers that only iterate must not see an unhandled rejection from `result`.
    this.result.catch(() => {});
    this.admitted.catch(() => {});
  }

  /**
   * The request goes on in `room` (a migration, a retry, or a move off an engine being retired,
   * which counts as neither: nothing failed): its chunks continue this stream's.
   */
  continueIn(room: string, as: 'migration' | 'retry' | 'move' = 'migration'): void {
    this.current = room;
    if (as === 'retry') this.retries++;
    else if (as === 'migration') this.migrations++;
    this.indexBase = this.nextIndex;
    this.tokensBase = this.tokens;
    this.idsBase = this.ids.length;
  }

  /** Token ids streamed by the current room (as many as `currentTokens` where engines send them). */
  get currentIds(): number[] {
    return this.ids.slice(this.idsBase);
  }

  /** Tokens streamed by the current room. */
  get currentTokens(): number {
    return this.tokens - this.tokensBase;
  }

  /** Tokens the current room's decode engine streamed: those after its prefill engine's first. */
  get decodedTokens(): number {
    return this.currentTokens - (this.first?.room === this.current ? 1 : 0);
  }

  push(chunk: TokenChunk): boolean {
    if (this.ended || chunk.index + this.indexBase !== this.nextIndex) return false;
    this.nextIndex++;
    this.text += chunk.text;
    this.tokens += chunk.tokens;
    if (chunk.ids) for (const id of chunk.ids) this.ids.push(id);
    this.chunks.push(chunk);
    this.wake();
    return true;
  }

  complete(finishReason: string): void {
    if (this.ended) return;
    const result: CompletionResult = {
      room: this.room,
      text: this.text,
      tokens: this.tokens,
      promptTokens: this.promptTokens,
      finishReason,
      ms: this.clock.now() - this.startedAt,
    };
    this.admit.resolve();
    this.ended = { result };
    this.settle.resolve(result);
    this.wake();
  }

  /** The room is in the journal. */
  markAdmitted(): void {
    this.admit.resolve();
  }

  fail(error: Error): void {
    if (this.ended) return;
    this.admit.reject(error);
    this.ended = { error };
    this.settle.reject(error);
    this.wake();
  }

  /**
   * The room ended: the stream ends as it did. Tokens missing from a completed room's stream
   * cannot happen if engines follow the protocol (chunks precede the completion on one
   * connection); if it does, the client gets an error, never a silently shortened answer —
   * returned, for the caller to log.
   */
  endAs(room: Room): string | null {
    if (room.state === 'completed' && this.currentTokens !== room.tokens) {
      const missing = `stream is missing ${(room.tokens ?? 0) - this.currentTokens} tokens`;
      this.fail(new RoomEndedError(room.room, 'unavailable', missing));
      return missing;
    }
    if (room.state === 'completed') this.complete(room.finishReason ?? 'length');
    else
      this.fail(
        new RoomEndedError(
          room.room,
          room.state as 'aborted' | 'failed' | 'migrated',
          room.reason ?? (room.state === 'migrated' ? `migrated to ${room.migratedTo}` : 'unknown'),
          room.failedStage,
        ),
      );
    return null;
  }

  get done(): boolean {
    return this.ended !== null;
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<TokenChunk> {
    for (;;) {
      const chunk = this.chunks.shift();
      if (chunk) {
        yield chunk;
        continue;
      }
      if (this.ended) {
        if ('error' in this.ended) throw this.ended.error;
        return;
      }
      await new Promise<void>((r) => (this.waiter = r));
    }
  }
}
