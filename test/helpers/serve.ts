/** A real `pdctl serve` subprocess on a free port, for tests that talk HTTP to it. */
import type { ChildProcess } from 'node:child_process';
import { spawnPdctl } from './spawn.ts';
import { tempDir } from './tmp.ts';

export interface Served {
  url: string;
  child: ChildProcess;
  dataDir: string;
  stderr: () => string;
  /** SIGTERM, then the exit code. */
  stop(): Promise<number | null>;
}

export async function serve(args: string[] = [], env: NodeJS.ProcessEnv = {}): Promise<Served> {
  const s = startServe(args, env);
  const url = await s.listening;
  return { ...s, url };
}

/**
 * Starts `pdctl serve` and returns at once; `listening` resolves to its URL once it listens (a
 * standby: once it leads) and rejects if it exits first.
 */
export function startServe(
  args: string[] = [],
  env: NodeJS.ProcessEnv = {},
  /** False: only `args` (and `env`) — the test gives the port, bus, data dir and log level. */
  defaults = true,
): Omit<Served, 'url'> & { listening: Promise<string> } {
  const dataDir = tempDir('pdctl-serve-');
  const given = defaults
    ? [
        '--port',
        '0',
        '--bus',
        'tcp://127.0.0.1:0',
        '--data-dir',
        dataDir,
        '--durability',
        'process',
        '--log-level',
        'warn',
      ]
    : [];
  const child = spawnPdctl(
    ['serve', ...given, ...args],
    { env: { ...process.env, PDCTL_EXIT_WITH_PARENT: String(process.pid), ...env } },
    'file',
  );
  let err = '';
  child.stdout?.resume();
  const listening = new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`pdctl serve did not start:\n${err}`)), 60_000);
    child.stderr?.on('data', (d: Buffer) => {
      err += d.toString();
      const m = /listening on (https?:\/\/\S+)/.exec(err);
      if (m) {
        clearTimeout(timer);
        resolve(m[1] as string);
      }
    });
    child.once('exit', (code) => reject(new Error(`pdctl serve exited ${code}:\n${err}`)));
  });
  listening.catch(() => {});
  return {
    listening,
    child,
    dataDir,
    stderr: () => err,
    stop: () =>
      new Promise((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve(child.exitCode);
        child.once('exit', (code) => resolve(code));
        child.kill('SIGTERM');
      }),
  };
}

/** What a completion answers: the room's id and usage, or an error. */
export interface CompletionBody {
  id: string;
  usage: { prompt_tokens: number; completion_tokens: number };
  error?: { message: string };
}

/** A completion of the built-in model from the serve at `url`, as a client asks: its status and body. */
export async function complete(
  url: string,
  prompt: string,
  maxTokens: number,
): Promise<{ status: number; body: CompletionBody }> {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'pdctl-deterministic-1', prompt, max_tokens: maxTokens }),
  });
  return { status: r.status, body: (await r.json()) as CompletionBody };
}
