/**
 * A llama.cpp model as the control plane sees it: the GGUF's own tokenizer (loaded vocabulary
 * only, no weights) for prompt sizes and the token ids rooms carry, its chat template for
 * `/v1/chat/completions`, and the context limit.
 */
import { basename } from 'node:path';
import {
  type ChatHistoryItem,
  type LlamaModel,
  resolveChatWrapper,
  type Token,
} from 'node-llama-cpp';
import type { ChatMessage, ModelInfo, ModelRequest } from '../executor.ts';
import { type LlamaGpu, llamaFormat, llamaRuntime } from './runtime.ts';

export interface LlamaModelOptions {
  modelPath: string;
  /** Sequences per engine context (rooms at once); prefill and decode must agree. */
  sequences: number;
  /** Tokens per room (prompt + max_tokens); null: the model's training context, at most 4096. */
  contextSize: number | null;
  gpu: LlamaGpu;
}

/** The context a room gets when `--context-size` is not given. */
export const DEFAULT_CONTEXT_CAP = 4096;

/** The context size for a model trained with `trainContextSize`. */
export function roomContextSize(asked: number | null, trainContextSize: number): number {
  const train = trainContextSize > 0 ? trainContextSize : DEFAULT_CONTEXT_CAP;
  return asked ?? Math.min(train, DEFAULT_CONTEXT_CAP);
}

export class LlamaModelInfo implements ModelInfo {
  readonly sendsTokens = true;
  readonly samples = true;
  readonly name: string;
  readonly format: string;
  readonly contextSize: number;

  private constructor(
    private readonly model: LlamaModel,
    o: LlamaModelOptions,
  ) {
    this.name = basename(o.modelPath);
    this.format = llamaFormat(o.modelPath, o.sequences);
    this.contextSize = roomContextSize(o.contextSize, model.fileInsights.trainContextSize ?? 0);
  }

  static async open(o: LlamaModelOptions): Promise<LlamaModelInfo> {
    llamaFormat(o.modelPath, o.sequences);
    const llama = await llamaRuntime(o.gpu);
    const model = await llama.loadModel({ modelPath: o.modelPath, vocabOnly: true });
    return new LlamaModelInfo(model, o);
  }

  tokenize(text: string): number[] {
    const tokens = this.model.tokenize(text);
    const bos = this.model.tokens.bos;
    return this.model.tokens.shouldPrependBosToken && bos !== null ? [bos, ...tokens] : tokens;
  }

  chat(messages: readonly ChatMessage[]): { prompt: string; tokens: number[] } {
    const wrapper = resolveChatWrapper(this.model);
    if (!wrapper) throw new Error(`${this.name} has no chat template this server can use`);
    const history: ChatHistoryItem[] = messages.map((m) =>
      m.role === 'system' || m.role === 'developer'
        ? { type: 'system', text: m.content }
        : m.role === 'assistant'
          ? { type: 'model', response: [m.content] }
          : { type: 'user', text: m.content },
    );
    // An open model turn: the template's generation prompt.
    history.push({ type: 'model', response: [] });
    let tokens: number[] = wrapper
      .generateContextState({ chatHistory: history })
      .contextText.tokenize(this.model.tokenizer);
    const bos = this.model.tokens.bos;
    if (this.model.tokens.shouldPrependBosToken && bos !== null && tokens[0] !== bos) {
      tokens = [bos, ...tokens];
    }
    return { prompt: this.model.detokenize(tokens as Token[], true), tokens };
  }

  contextTokens(request: ModelRequest): number[] {
    return request.tokens ? [...request.tokens] : this.tokenize(request.prompt);
  }

  async close(): Promise<void> {
    await this.model.dispose();
  }
}
