/**
 * A request checked against the model before it is given a pair: its shape, its size in a bus
 * frame, and the model's context (intake.ts).
 */

import { DEFAULT_MAX_FRAME_BYTES, requestTextBytes } from '../../bus/protocol.ts';
import type { ModelInfo } from '../../model/executor.ts';
import { ControlError } from '../errors.ts';
import { MAX_PROMPT_BYTES, MAX_TOKENS_LIMIT, type SubmitRequest } from '../options.ts';

/** A request as checked: what is sent to the engines and how large it is. */
export interface CheckedRequest {
  /** The prompt, and its token ids where the model is sent them. */
  sent: { prompt: string; tokens?: number[] };
  /** The prompt's token ids, as the model's tokenizer makes them. */
  tokens: number[];
  promptTokens: number;
  stop: string[];
}

/**
 * Checks a request's shape and size against the model; throws CONTROL_BAD_REQUEST or
 * CONTROL_CONTEXT_LENGTH_EXCEEDED with what to change.
 */
export function checkRequest(request: SubmitRequest, model: ModelInfo): CheckedRequest {
  const { prompt, maxTokens } = request;
  const stop = request.stop ?? [];
  if (
    !Array.isArray(stop) ||
    stop.length > 4 ||
    stop.some((s) => typeof s !== 'string' || s.length === 0 || s.length > 200)
  ) {
    throw new ControlError(
      'CONTROL_BAD_REQUEST',
      'stop must be at most 4 strings of 1 to 200 characters',
    );
  }
  if (typeof prompt !== 'string' || prompt.length === 0) {
    throw new ControlError('CONTROL_BAD_REQUEST', 'prompt must be a non-empty string');
  }
  if (!Number.isInteger(maxTokens) || maxTokens < 1 || maxTokens > MAX_TOKENS_LIMIT) {
    throw new ControlError(
      'CONTROL_BAD_REQUEST',
      `max tokens must be an integer from 1 to ${MAX_TOKENS_LIMIT}, got ${maxTokens}`,
    );
  }
  const tokens = request.tokens ?? model.tokenize(prompt);
  const promptTokens = tokens.length;
  if (promptTokens === 0) throw new ControlError('CONTROL_BAD_REQUEST', 'prompt has no tokens');
  // The prompt travels to the prefill engine inside its room.created event: one that cannot fit
  // in a bus frame would never arrive, and is refused before anything is journaled.
  const sent = model.sendsTokens ? { prompt, tokens } : { prompt };
  const bytes = requestTextBytes(sent);
  if (bytes > MAX_PROMPT_BYTES) {
    throw new ControlError(
      'CONTROL_BAD_REQUEST',
      `prompt is ${bytes} bytes (UTF-8${model.sendsTokens ? ', and 5 per token id' : ''}); the most an engine can be sent is ${MAX_PROMPT_BYTES} bytes (the bus frame limit of ${DEFAULT_MAX_FRAME_BYTES} bytes less the event around it)`,
    );
  }
  const context = model.contextSize;
  if (context !== null && promptTokens + maxTokens > context) {
    throw new ControlError(
      'CONTROL_CONTEXT_LENGTH_EXCEEDED',
      `this model's context is ${context} tokens; the prompt has ${promptTokens} and max_tokens asks for ${maxTokens} more (${promptTokens + maxTokens}); shorten the prompt or ask for at most ${Math.max(0, context - promptTokens)} tokens`,
    );
  }
  return { sent, tokens, promptTokens, stop };
}
