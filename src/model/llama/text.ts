/**
 * Generated tokens as text, one token at a time: a token may end in the middle of a UTF-8
 * character (byte tokens), so its text waits until the character is whole; and a word's leading
 * space depends on the tokens before it, so each piece is detokenized after the last few.
 */
import type { LlamaModel, Token } from 'node-llama-cpp';

/** Tokens kept as the context of the next piece. */
const CONTEXT = 16;
/** Tokens held back waiting for a whole character before they are let out as they are. */
const MAX_PENDING = 8;

export class TextStream {
  private pending: Token[] = [];
  private last: Token[];

  constructor(
    private readonly model: LlamaModel,
    context: readonly number[],
  ) {
    this.last = context.slice(-CONTEXT) as Token[];
  }

  /** The text `token` adds (empty while a character is incomplete). */
  push(token: number): string {
    this.pending.push(token as Token);
    const text = this.model.detokenize(this.pending, false, this.last);
    if (text.endsWith('\uFFFD') && this.pending.length < MAX_PENDING) return '';
    this.last = [...this.last, ...this.pending].slice(-CONTEXT);
    this.pending = [];
    return text;
  }
}
