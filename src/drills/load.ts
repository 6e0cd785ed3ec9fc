/**
 * Drill load: streaming OpenAI clients over real HTTP, each sending one request after another
 * until stopped, recording what every request got — the room, the text, and how it ended — so
 * that invariants can be checked per request (its room in the journal, its text against the
 * deterministic model's).
 */
import { type DeterministicModel, generateInProcess } from '../model/deterministic.ts';

export interface RequestRecord {
  client: number;
  prompt: string;
  maxTokens: number;
  /** From `x-pdctl-room`; null if the request never got response headers. */
  room: string | null;
  status: number | null;
  text: string;
  /** Completion tokens and finish reason, from the stream's final usage and choice. */
  tokens: number | null;
  finishReason: string | null;
  /** `completed` (finish_reason, then [DONE]), `error` (an error event or a non-200), `dropped`. */
  outcome: 'completed' | 'error' | 'dropped';
  error: string | null;
  startedAt: number;
  endedAt: number;
  /** The time between two chunks that was longest, in ms. */
  maxGapMs: number;
}

export interface LoadOptions {
  base: string;
  model: string;
  clients: number;
  maxTokens: number;
  /** Words in each prompt (plus a per-request suffix). Default 30. */
  promptWords?: number;
  /** Pause between one client's requests, ms. Default 0. */
  thinkMs?: number;
  /** Read each chunk this slowly (slow clients), ms. Default 0. */
  readDelayMs?: number;
}

export class Load {
  readonly records: RequestRecord[] = [];
  private stopped = false;
  private readonly workers: Array<Promise<void>> = [];
  private readonly controllers = new Set<AbortController>();
  private seq = 0;
  /** Requests sent and not yet ended. */
  inFlight = 0;

  constructor(private readonly o: LoadOptions) {}

  start(): this {
    for (let c = 0; c < this.o.clients; c++) this.workers.push(this.worker(c));
    return this;
  }

  /** Requests that ended so far with the given outcome. */
  count(outcome?: RequestRecord['outcome'], since = 0): number {
    return this.records.filter((r) => (!outcome || r.outcome === outcome) && r.endedAt >= since)
      .length;
  }

  /** Stops sending new requests and waits for the ones in flight (dropping them after `graceMs`). */
  async stop(graceMs = 15_000): Promise<void> {
    this.stopped = true;
    const timer = setTimeout(() => {
      for (const c of this.controllers) c.abort();
    }, graceMs);
    await Promise.all(this.workers);
    clearTimeout(timer);
  }

  private async worker(client: number): Promise<void> {
    while (!this.stopped) {
      const n = this.seq++;
      const prompt = `drill request ${n} ${'word '.repeat((this.o.promptWords ?? 30) + (n % 17))}`;
      this.inFlight++;
      const rec = await this.one(client, prompt);
      this.inFlight--;
      this.records.push(rec);
      // A refused connection (the server is down) comes back at once: do not spin on it.
      const pause = rec.outcome === 'dropped' ? Math.max(50, this.o.thinkMs ?? 0) : this.o.thinkMs;
      if (pause) await new Promise((r) => setTimeout(r, pause));
    }
  }

  private async one(client: number, prompt: string): Promise<RequestRecord> {
    const rec: RequestRecord = {
      client,
      prompt,
      maxTokens: this.o.maxTokens,
      room: null,
      status: null,
      text: '',
      tokens: null,
      finishReason: null,
      outcome: 'dropped',
      error: null,
      startedAt: Date.now(),
      endedAt: 0,
      maxGapMs: 0,
    };
    const ac = new AbortController();
    this.controllers.add(ac);
    try {
      const res = await fetch(`${this.o.base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: this.o.model,
          prompt,
          max_tokens: this.o.maxTokens,
          temperature: 0,
          stream: true,
          stream_options: { include_usage: true },
        }),
        signal: ac.signal,
      });
      rec.status = res.status;
      rec.room = res.headers.get('x-pdctl-room');
      if (res.status !== 200) {
        rec.outcome = 'error';
        rec.error = `HTTP ${res.status}: ${(await res.text()).slice(0, 200)}`;
        if (res.status === 429 || res.status === 503) await new Promise((r) => setTimeout(r, 50));
        return rec;
      }
      const reader = (res.body as ReadableStream<Uint8Array>).getReader();
      const decoder = new TextDecoder();
      let buffered = '';
      let finished = false;
      let last = Date.now();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        const now = Date.now();
        rec.maxGapMs = Math.max(rec.maxGapMs, now - last);
        last = now;
        buffered += decoder.decode(value, { stream: true });
        let cut = buffered.indexOf('\n\n');
        while (cut >= 0) {
          const line = buffered.slice(0, cut).replace(/^data: /, '');
          buffered = buffered.slice(cut + 2);
          cut = buffered.indexOf('\n\n');
          if (line === '[DONE]') continue;
          const msg = JSON.parse(line) as {
            error?: { message: string; code: string };
            choices?: Array<{ text: string; finish_reason: string | null }>;
            usage?: { completion_tokens: number } | null;
            pdctl_abort_reason?: string;
          };
          if (msg.usage) rec.tokens = msg.usage.completion_tokens;
          if (msg.error) {
            rec.outcome = 'error';
            rec.error = `${msg.error.code}: ${msg.error.message}`;
          }
          for (const c of msg.choices ?? []) {
            rec.text += c.text;
            if (c.finish_reason) {
              finished = true;
              rec.finishReason = c.finish_reason;
            }
            // Aborted mid-stream (an operator, the control plane): not a completed answer.
            if (c.finish_reason === 'abort') {
              rec.outcome = 'error';
              rec.error = `aborted: ${msg.pdctl_abort_reason ?? 'unknown reason'}`;
            }
          }
        }
        if (this.o.readDelayMs) await new Promise((r) => setTimeout(r, this.o.readDelayMs));
      }
      if (finished && rec.outcome !== 'error') rec.outcome = 'completed';
      else if (rec.outcome !== 'error') rec.error = 'stream ended without a finish_reason';
    } catch (err) {
      rec.outcome = 'dropped';
      rec.error = (err as Error).message;
    } finally {
      rec.endedAt = Date.now();
      this.controllers.delete(ac);
    }
    return rec;
  }
}

/** Completed requests whose text differs from what the deterministic model produces. */
export function wrongAnswers(records: RequestRecord[], model: DeterministicModel): RequestRecord[] {
  return records.filter(
    (r) =>
      r.outcome === 'completed' && r.text !== generateInProcess(model, r.prompt, r.maxTokens).text,
  );
}

/** What went wrong with `records`, counted by error (room ids folded together). */
export function errorsSeen(records: RequestRecord[]): string {
  if (records.length === 0) return 'none';
  const by = new Map<string, number>();
  for (const r of records) {
    const key = (r.error ?? r.outcome).replace(/r-[a-z0-9-]+/g, 'ROOM').slice(0, 80);
    by.set(key, (by.get(key) ?? 0) + 1);
  }
  return [...by].map(([k, n]) => `${n}× ${k}`).join('; ');
}
