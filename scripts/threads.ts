/**
 * CPU time per thread of every process whose command line contains a text, over a window: what a
 * V8 profile (bench:profile) does not see — ZeroMQ's I/O thread in each process, the kernel's time
 * in a thread's system calls (the journal writer's fsync), V8's own threads. Linux only (/proc).
 *
 *   npm run bench:engines -- --lone --seconds 12 &   # something to watch
 *   sleep 14 && npm run threads -- --seconds 5 --match pdctl
 *
 * Flags: `--seconds N` (5), `--match TEXT` (node: every Node process), `--json`.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { asJson, checkFlags, flag } from '../bench/args.ts';

const SECONDS = Number(flag('--seconds', '5'));
const MATCH = flag('--match', 'node');
checkFlags();
if (!(SECONDS > 0)) {
  process.stderr.write(`threads: --seconds takes a number of seconds > 0, got ${SECONDS}\n`);
  process.exit(2);
}
if (!asJson) process.stderr.write(`threads: sampling for ${SECONDS} s …\n`);

/** Clock ticks per second of /proc's utime and stime (USER_HZ; 100 on every Linux we run on). */
const TICK_MS = 10;

interface Sample {
  pid: number;
  tid: number;
  name: string;
  command: string;
  userMs: number;
  systemMs: number;
}

function read(path: string): string | null {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return null; // the process or thread ended meanwhile
  }
}

function snapshot(): Map<string, Sample> {
  const out = new Map<string, Sample>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const command = read(`/proc/${entry}/cmdline`)?.replaceAll('\0', ' ').trim() ?? '';
    if (!command.includes(MATCH) || command.includes('scripts/threads.ts')) continue;
    let tids: string[];
    try {
      tids = readdirSync(`/proc/${entry}/task`);
    } catch {
      continue;
    }
    for (const tid of tids) {
      const stat = read(`/proc/${entry}/task/${tid}/stat`);
      if (!stat) continue;
      // "tid (name) state ppid ..." — the name may hold spaces and parentheses.
      const name = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      out.set(`${entry}/${tid}`, {
        pid: Number(entry),
        tid: Number(tid),
        name,
        command,
        userMs: Number(fields[11]) * TICK_MS,
        systemMs: Number(fields[12]) * TICK_MS,
      });
    }
  }
  return out;
}

const before = snapshot();
await new Promise((r) => setTimeout(r, SECONDS * 1000));
const after = snapshot();
const rows = [...after.entries()]
  .map(([key, a]) => {
    const b = before.get(key);
    const userMs = a.userMs - (b?.userMs ?? 0);
    const systemMs = a.systemMs - (b?.systemMs ?? 0);
    const thread = a.tid === a.pid ? 'main' : a.name.startsWith('ZMQbg') ? 'zeromq' : a.name;
    return { ...a, thread, userMs, systemMs, cpuMs: userMs + systemMs };
  })
  .filter((r) => r.cpuMs > 0)
  .sort((x, y) => y.cpuMs - x.cpuMs);
const total = rows.reduce((n, r) => n + r.cpuMs, 0);
if (asJson) {
  process.stdout.write(
    `${JSON.stringify({ seconds: SECONDS, match: MATCH, totalMs: total, threads: rows }, null, 2)}\n`,
  );
} else {
  const lines = [
    `CPU per thread over ${SECONDS} s, processes matching "${MATCH}" (ms; /proc ticks of ${TICK_MS} ms):`,
    '',
    '| process | pid | thread | tid | CPU ms | user | system | % of a core |',
    '|---|--:|---|--:|--:|--:|--:|--:|',
    ...rows.map(
      (r) =>
        `| ${r.command.slice(0, 80)} | ${r.pid} | ${r.thread} | ${r.tid} | ${r.cpuMs} | ${r.userMs} | ${r.systemMs} | ${((100 * r.cpuMs) / (SECONDS * 1000)).toFixed(1)} |`,
    ),
    `| **total** | | | | ${total} | | | ${((100 * total) / (SECONDS * 1000)).toFixed(1)} |`,
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
}
