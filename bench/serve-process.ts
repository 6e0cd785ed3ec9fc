/**
 * `pdctl serve` as a real process for soaks and start-up benchmarks: started in a process group
 * of its own, timed to `/health/ready`, killed as a host crash would kill it, stopped as an
 * operator would.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';

const BIN = resolve(import.meta.dirname, '../bin/pdctl.js');

export interface Server {
  proc: ChildProcess;
  base: string;
  dir: string;
  /** The JSON log lines it wrote (at the log level asked for), in order. */
  lines: string[];
}

/** `pdctl serve` on `dir`, in a process group of its own; resolves once it listens. */
export function startServe(
  dir: string,
  extra: readonly string[] = [],
  logLevel = 'warn',
  onLine: (line: string) => void = () => {},
): Promise<Server> {
  const args = [BIN, 'serve', '--port', '0', '--data-dir', dir, '--log-format', 'json'];
  args.push('--bus', `ipc://${join(dir, 'bus.sock')}`, '--log-level', logLevel, ...extra);
  const proc = spawn(process.execPath, args, {
    detached: true,
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  const lines: string[] = [];
  return new Promise((ok, fail) => {
    const input = createInterface({ input: proc.stderr as NodeJS.ReadableStream });
    input.on('line', (line) => {
      onLine(line);
      lines.push(line);
      if (lines.length > 2000) lines.shift();
      const m = /listening on (http:\/\/[\d.:]+)/.exec(line);
      if (m) ok({ proc, base: m[1] as string, dir, lines });
    });
    proc.once('exit', (code) =>
      fail(
        new Error(`pdctl serve exited ${code} before listening:\n${lines.slice(-20).join('\n')}`),
      ),
    );
  });
}

export async function waitReady(base: string, sinceMs: number): Promise<number> {
  for (;;) {
    const ok = await fetch(`${base}/health/ready`)
      .then((r) => r.status === 200)
      .catch(() => false);
    if (ok) return performance.now() - sinceMs;
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Start to `/health/ready`, ms. */
export async function timedStart(
  dir: string,
  extra: readonly string[] = [],
  logLevel = 'warn',
): Promise<{ server: Server; ms: number }> {
  const t0 = performance.now();
  const server = await startServe(dir, extra, logLevel);
  return { server, ms: await waitReady(server.base, t0) };
}

/** SIGKILL of the server's whole process group (the control plane and its engines). */
export async function killGroup(server: Server): Promise<void> {
  const exited = new Promise((r) => server.proc.once('exit', r));
  process.kill(-(server.proc.pid as number), 'SIGKILL');
  await exited;
}

/** SIGTERM, as an operator stops it; resolves when it has exited. */
export async function stop(server: Server): Promise<void> {
  const exited = new Promise((r) => server.proc.once('exit', r));
  process.kill(server.proc.pid as number, 'SIGTERM');
  await exited;
}

/** The journal's file, WAL and shared memory in `dir`, bytes. */
export function journalBytes(dir: string): number {
  let n = 0;
  for (const f of ['journal.db', 'journal.db-wal', 'journal.db-shm']) {
    try {
      n += statSync(join(dir, f)).size;
    } catch {}
  }
  return n;
}
