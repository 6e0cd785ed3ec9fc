/**
 * Driving scripts/ucx-peer.ts (a UCX receiving node on a test host) from a test: starting it, its
 * stdout one line at a time — UCX's own log lines, which UCX writes to stdout, kept apart — and its first
 * line, the descriptor, or the reason it exited instead.
 */
import type { ChildProcess } from 'node:child_process';
import type { TestHosts } from '../../src/drills/hosts.ts';
import { ROOT } from './spawn.ts';

/**
 * Starts scripts/ucx-peer.ts on test host `on` with a pool of `pages` × `pageBytes`, UCX over TCP
 * on the interface that reaches `toward`: each test host has an interface per peer, each on a
 * subnet of its own, and UCX takes every interface to be on one fabric.
 */
export function spawnUcxPeer(
  hosts: TestHosts,
  on: string,
  toward: string,
  pages: number,
  pageBytes: number,
): ChildProcess {
  return hosts.spawn(
    on,
    process.execPath,
    ['--import', 'tsx', 'scripts/ucx-peer.ts', String(pages), String(pageBytes)],
    {
      cwd: ROOT,
      env: { ...process.env, UCX_TLS: 'tcp', UCX_NET_DEVICES: hosts.device(on, toward) },
      stdio: ['pipe', 'pipe', 'pipe'],
    },
  );
}

export interface PeerLines {
  /** The next line the peer printed that is not UCX's own. */
  next(): Promise<string>;
  /** UCX's log lines (`[…] UCX  WARN …`) the peer printed so far. */
  ucxLog: string[];
}

export function peerLines(child: ChildProcess): PeerLines {
  const queue: string[] = [];
  const waiting: Array<(l: string) => void> = [];
  const ucxLog: string[] = [];
  let buf = '';
  child.stdout?.on('data', (d: Buffer) => {
    buf += d.toString();
    for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
      const l = buf.slice(0, i);
      buf = buf.slice(i + 1);
      if (/\bUCX +[A-Z]+ /.test(l)) {
        ucxLog.push(l);
        continue;
      }
      const w = waiting.shift();
      if (w) w(l);
      else queue.push(l);
    }
  });
  return {
    ucxLog,
    next: () => {
      const l = queue.shift();
      if (l !== undefined) return Promise.resolve(l);
      return new Promise((r) => waiting.push(r));
    },
  };
}

/** The peer's descriptor line, or an error with its stderr if it exited first. */
export function firstLine(child: ChildProcess, lines: PeerLines): Promise<string> {
  let err = '';
  child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
  return Promise.race([
    lines.next(),
    new Promise<string>((_, reject) =>
      child.once('exit', (c) => reject(new Error(`the UCX peer exited ${c}: ${err}`))),
    ),
  ]);
}
