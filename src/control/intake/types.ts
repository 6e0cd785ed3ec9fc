/** What a completion streams and how it ends: shared by the control plane and the API. */

/** One streamed piece of a completion. */
export interface TokenChunk {
  room: string;
  index: number;
  text: string;
  tokens: number;
  ids?: number[];
}

/** How a completion ended. */
export interface CompletionResult {
  room: string;
  text: string;
  tokens: number;
  promptTokens: number;
  finishReason: string;
  /** Wall time from submit to the committed `room.completed`, in ms. */
  ms: number;
}
