/**
 * One room's token stream, from the bus to the caller of `submit`: an async iterator of chunks
 * that ends when `room.completed` is committed, or throws a `RoomEndedError` when the room is
 * aborted, failed or migrated. Chunks are delivered in index order; a repeated index is dropped.
 */
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
  readonly result: Promise<CompletionResult>;
  private settle!: { resolve(r: CompletionResult): void; reject(e: Error): void };

  constructor(
    readonly room: string,
    readonly promptTokens: number,
    readonly startedAt: number,
  ) {
    this.result = new Promise((resolve, reject) => (this.settle = { resolve, reject }));
    // Callers that only iterate must not see an unhandled rejection from `result`.
    this.result.catch(() => {});
  }

  push(chunk: TokenChunk): boolean {
    if (this.ended || chunk.index !== this.nextIndex) return false;
    this.nextIndex++;
    this.text += chunk.text;
    this.tokens += chunk.tokens;
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
      ms: Date.now() - this.startedAt,
    };
    this.ended = { result };
    this.settle.resolve(result);
    this.wake();
  }

  fail(error: Error): void {
    if (this.ended) return;
    this.ended = { error };
    this.settle.reject(error);
    this.wake();
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
