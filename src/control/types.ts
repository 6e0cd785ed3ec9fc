/** Types the control plane shares between its files. */
export type { EngineMessage } from '../bus/protocol.ts';
export type { PeerId as PeerIdLike } from '../bus/server.ts';

/** One streamed piece of a completion. */
export interface TokenChunk {
  room: string;
  index: number;
  text: string;
  tokens: number;
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
