/**
 * Test hosts: several "machines" on this one, for trying pdctl across hosts (docs/drills.md,
 * "Test hosts"). Each host is a network namespace with its own loopback and a mount namespace
 * with its own tmpfs on `/dev/shm`, so that what one host's engines put in shared memory is not
 * there for another's — they share only the kernel. Every pair of hosts is joined by its own veth
 * link (a full mesh), so that one pair can be cut (its link set down) while each still reaches
 * the others: a partition, on a kernel without netem or iptables.
 *
 * Addresses come from 198.18.0.0/15, the range set aside for benchmark tests (RFC 2544): link k
 * between hosts i < j is 198.18.k.0/30, i at .1 and j at .2 (inside the hosts' namespaces, so
 * every set of hosts may use the same). A link from this process's own namespace to a host
 * (`reach`) lives in the namespace every process shares: it takes a /30 of 198.19.0.0/16 no other
 * set of hosts holds, claimed by its interface's name (`pdr-SLOT`), this side at .1.
 * Nothing else is addressed.
 *
 * Needs root (namespaces, mounts) and iproute2; `testHostsUnavailable()` says why not, for a
 * test or drill to skip with the reason. Hosts left by a process that was killed are removed the
 * next time hosts are made (`sweepDeadTestHosts`).
 */
import { type ChildProcess, execFileSync, type SpawnOptions, spawn } from 'node:child_process';
import { randomBytes, randomInt } from 'node:crypto';
import { isAlive } from '../pids.ts';

/** Why test hosts cannot be made here, or null when they can. */
export function testHostsUnavailable(): string | null {
  if (process.platform !== 'linux')
    return `test hosts need Linux namespaces (this is ${process.platform})`;
  if (process.getuid?.() !== 0) return 'test hosts need root (network and mount namespaces)';
  for (const tool of ['ip', 'unshare', 'nsenter']) {
    try {
      execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' });
    } catch {
      return `test hosts need \`${tool}\` (iproute2, util-linux)`;
    }
  }
  return null;
}

interface Host {
  name: string;
  netns: string;
  /** The process that holds the host's mount namespace (its private /dev/shm). */
  anchor: ChildProcess;
  anchorPid: number;
}

interface Link {
  a: string;
  b: string;
  /** Interface names inside a's and b's namespaces. */
  devA: string;
  devB: string;
  addrA: string;
  addrB: string;
}

export interface TestHostsOptions {
  /** Host names: letters, digits and `-`, at most 12 characters each. */
  names: string[];
  /** Hosts this process reaches directly (a link from its own namespace), for HTTP to them. */
  reach?: string[];
  /** Size of each host's /dev/shm tmpfs. Default 512m. */
  shmSize?: string;
}

export class TestHosts {
  private readonly hosts = new Map<string, Host>();
  private readonly links: Link[] = [];
  /** This process's end of each `reach` link: host → [our interface, our address, its address]. */
  private readonly reached = new Map<string, { dev: string; ours: string; theirs: string }>();
  private readonly children = new Set<ChildProcess>();
  private readonly tag = `${process.pid}-${randomBytes(3).toString('hex')}`;
  private destroyed = false;

  private constructor() {}

  /** Makes the hosts; on any failure, removes what it made and throws with the command's error. */
  static async create(o: TestHostsOptions): Promise<TestHosts> {
    const why = testHostsUnavailable();
    if (why) throw new Error(why);
    for (const n of o.names) {
      if (!/^[a-z0-9-]{1,12}$/i.test(n))
        throw new Error(`host name "${n}": letters, digits, - (1–12)`);
    }
    if (new Set(o.names).size !== o.names.length) throw new Error('host names must differ');
    sweepDeadTestHosts();
    const t = new TestHosts();
    try {
      for (const name of o.names) await t.addHost(name, o.shmSize ?? '512m');
      let k = 0;
      for (let i = 0; i < o.names.length; i++)
        for (let j = i + 1; j < o.names.length; j++)
          t.addLink(o.names[i] as string, o.names[j] as string, k++);
      for (const name of o.reach ?? []) t.addReach(name);
      await t.linksUp();
    } catch (err) {
      t.destroy();
      throw err;
    }
    return t;
  }

  private host(name: string): Host {
    const h = this.hosts.get(name);
    if (!h) throw new Error(`no test host ${name} (hosts: ${[...this.hosts.keys()].join(', ')})`);
    return h;
  }

  private async addHost(name: string, shmSize: string): Promise<void> {
    const netns = `pdctl-${this.tag}-${name}`;
    ip('netns', 'add', netns);
    ip('-n', netns, 'link', 'set', 'lo', 'up');
    // The anchor holds the host's mount namespace: /dev/shm there is a tmpfs of its own, gone
    // when the anchor dies. It reports its pid (sh's, which becomes sleep's).
    const anchor = spawn(
      'ip',
      [
        'netns',
        'exec',
        netns,
        'unshare',
        '--mount',
        '--propagation',
        'private',
        'sh',
        '-c',
        `mount -t tmpfs -o size=${shmSize},mode=1777 pdctl-shm /dev/shm && echo "$$" && exec sleep 2147483647`,
      ],
      { detached: true, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    this.children.add(anchor);
    const pid = await new Promise<number>((resolve, reject) => {
      let out = '';
      let err = '';
      anchor.stdout?.on('data', (d: Buffer) => {
        out += d.toString();
        const m = /^(\d+)\n/.exec(out);
        if (m) resolve(Number(m[1]));
      });
      anchor.stderr?.on('data', (d: Buffer) => (err += d.toString()));
      anchor.once('exit', (code) =>
        reject(
          new Error(
            `test host ${name}: its namespace could not be set up (exit ${code}): ${err.trim()}`,
          ),
        ),
      );
    });
    this.hosts.set(name, { name, netns, anchor, anchorPid: pid });
  }

  private addLink(a: string, b: string, k: number): void {
    if (k > 255) throw new Error('at most 256 links between test hosts');
    const link: Link = {
      a,
      b,
      devA: `pd${k}-${b}`.slice(0, 15),
      devB: `pd${k}-${a}`.slice(0, 15),
      addrA: `198.18.${k}.1`,
      addrB: `198.18.${k}.2`,
    };
    const na = this.host(a).netns;
    const nb = this.host(b).netns;
    ip(
      'link',
      'add',
      link.devA,
      'netns',
      na,
      'type',
      'veth',
      'peer',
      'name',
      link.devB,
      'netns',
      nb,
    );
    ip('-n', na, 'addr', 'add', `${link.addrA}/30`, 'dev', link.devA);
    ip('-n', nb, 'addr', 'add', `${link.addrB}/30`, 'dev', link.devB);
    ip('-n', na, 'link', 'set', link.devA, 'up');
    ip('-n', nb, 'link', 'set', link.devB, 'up');
    this.links.push(link);
  }

  private addReach(name: string): void {
    const ns = this.host(name).netns;
    // Test hosts made at once by other processes (tests side by side) share this namespace: a
    // slot is claimed by creating its interface, which fails when another process holds it.
    const start = randomInt(REACH_SLOTS);
    for (let i = 0; i < REACH_SLOTS; i++) {
      const slot = (start + i) % REACH_SLOTS;
      const dev = `pdr-${slot}`;
      try {
        ip('link', 'add', dev, 'type', 'veth', 'peer', 'name', 'pd-reach', 'netns', ns);
      } catch (err) {
        if (/File exists/.test((err as Error).message)) continue;
        throw err;
      }
      const at = slot * 4;
      const ours = `198.19.${at >> 8}.${(at & 255) + 1}`;
      const theirs = `198.19.${at >> 8}.${(at & 255) + 2}`;
      this.reached.set(name, { dev, ours, theirs });
      ip('addr', 'add', `${ours}/30`, 'dev', dev);
      ip('link', 'set', dev, 'up');
      ip('-n', ns, 'addr', 'add', `${theirs}/30`, 'dev', 'pd-reach');
      ip('-n', ns, 'link', 'set', 'pd-reach', 'up');
      return;
    }
    throw new Error('every /30 of 198.19.0.0/16 is taken by other test hosts');
  }

  /** The pid whose namespaces are the host's (`nsenter --target PID --mount --net`). */
  anchorPid(host: string): number {
    return this.host(host).anchorPid;
  }

  /** The address `host` has on its link to `peer` (what `peer` connects to). */
  address(host: string, peer: string): string {
    if (peer === 'self') {
      const r = this.reached.get(host);
      if (!r) throw new Error(`test host ${host} is not reachable from this process (reach)`);
      return r.theirs;
    }
    const l = this.linkOf(host, peer);
    return l.a === host ? l.addrA : l.addrB;
  }

  /**
   * The interface `host` has on its link to `peer` ('self': to this process; and for `host`
   * 'self', this process's end of its link to `peer`). Each host has one interface per peer, on
   * a subnet of its own, so a program that picks interfaces by itself (UCX does) must be told
   * which one reaches the peer: `UCX_NET_DEVICES`.
   */
  device(host: string, peer: string): string {
    if (host === 'self' || peer === 'self') {
      const name = host === 'self' ? peer : host;
      const r = this.reached.get(name);
      if (!r) throw new Error(`test host ${name} is not reachable from this process (reach)`);
      return host === 'self' ? r.dev : 'pd-reach';
    }
    const l = this.linkOf(host, peer);
    return l.a === host ? l.devA : l.devB;
  }

  private linkOf(a: string, b: string): Link {
    const l = this.links.find((x) => (x.a === a && x.b === b) || (x.a === b && x.b === a));
    if (!l) throw new Error(`no link between test hosts ${a} and ${b}`);
    return l;
  }

  /**
   * Sets the link between two hosts down (a partition) or up (healed), on both ends; up resolves
   * once the link carries traffic.
   */
  async setLink(a: string, b: string, up: boolean): Promise<void> {
    const l = this.linkOf(a, b);
    ip('-n', this.host(l.a).netns, 'link', 'set', l.devA, up ? 'up' : 'down');
    ip('-n', this.host(l.b).netns, 'link', 'set', l.devB, up ? 'up' : 'down');
    if (up) await this.linksUp();
  }

  /** Sets this process's link to `host` (`reach`) down or up, as `setLink`. */
  async setReach(host: string, up: boolean): Promise<void> {
    const r = this.reached.get(host);
    if (!r) throw new Error(`test host ${host} is not reachable from this process (reach)`);
    ip('link', 'set', r.dev, up ? 'up' : 'down');
    ip('-n', this.host(host).netns, 'link', 'set', 'pd-reach', up ? 'up' : 'down');
    if (up) await this.linksUp();
  }

  /**
   * Waits until every link that is set up also carries traffic (operstate UP): a veth comes up a
   * moment after it is set up, and a program that lists interfaces meanwhile (UCX does, when its
   * worker starts) would not see it.
   */
  private async linksUp(timeoutMs = 5000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const down: string[] = [];
      const check = (netns: string | null, dev: string) => {
        const args = netns
          ? ['-n', netns, '-o', 'link', 'show', 'dev', dev]
          : ['-o', 'link', 'show', 'dev', dev];
        const out = execFileSync('ip', args, { stdio: ['ignore', 'pipe', 'ignore'] }).toString();
        // A link set down stays down on purpose (a partition): only links set up must be UP.
        if (/[<,]UP[,>]/.test(out) && !/ state UP /.test(out)) down.push(dev);
      };
      for (const l of this.links) {
        check(this.host(l.a).netns, l.devA);
        check(this.host(l.b).netns, l.devB);
      }
      for (const [name, r] of this.reached) {
        check(null, r.dev);
        check(this.host(name).netns, 'pd-reach');
      }
      if (down.length === 0) return;
      if (Date.now() > deadline)
        throw new Error(`test host links still not up: ${down.join(', ')}`);
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  /**
   * Starts `command` on `host`: in its network and mount namespaces, in a process group of its
   * own (`destroy` kills the group). The command is exec'd, so the child's pid is the command's.
   */
  spawn(host: string, command: string, args: string[], options: SpawnOptions = {}): ChildProcess {
    if (this.destroyed) throw new Error('the test hosts were destroyed');
    const h = this.host(host);
    const child = spawn(
      'nsenter',
      // Entering a mount namespace leaves the working directory at its root: set it again.
      [
        '--target',
        String(h.anchorPid),
        '--mount',
        '--net',
        `--wd=${options.cwd ?? process.cwd()}`,
        '--',
        command,
        ...args,
      ],
      { stdio: ['ignore', 'pipe', 'pipe'], ...options, detached: true },
    );
    this.children.add(child);
    child.once('exit', () => this.children.delete(child));
    return child;
  }

  /** Runs `command` on `host` to completion. */
  run(
    host: string,
    command: string,
    args: string[],
  ): Promise<{ code: number | null; stdout: string; stderr: string }> {
    return new Promise((resolve, reject) => {
      const child = this.spawn(host, command, args);
      let stdout = '';
      let stderr = '';
      child.stdout?.on('data', (d: Buffer) => (stdout += d.toString()));
      child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
      child.once('error', reject);
      child.once('close', (code) => resolve({ code, stdout, stderr }));
    });
  }

  /** Kills every process started on the hosts (by process group) and removes the namespaces. */
  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    for (const child of this.children) {
      if (child.pid === undefined) continue;
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    this.children.clear();
    for (const r of this.reached.values()) ipQuiet('link', 'del', r.dev);
    for (const h of this.hosts.values()) ipQuiet('netns', 'del', h.netns);
    this.hosts.clear();
  }
}

/**
 * Removes the namespaces of test hosts whose process is gone (a test or drill that was killed):
 * their names start `pdctl-PID-`. Live ones, and anything else, are left alone.
 */
export function sweepDeadTestHosts(): string[] {
  let list: string;
  try {
    list = execFileSync('ip', ['netns', 'list'], {
      stdio: ['ignore', 'pipe', 'ignore'],
    }).toString();
  } catch {
    return [];
  }
  const removed: string[] = [];
  for (const line of list.split('\n')) {
    const name = line.split(' ')[0] ?? '';
    const m = /^pdctl-(\d+)-[0-9a-f]{6}-/.exec(name);
    if (!m || isAlive(Number(m[1]))) continue;
    // What still runs there (its anchor, engines) goes with it.
    try {
      const pids = execFileSync('ip', ['netns', 'pids', name], {
        stdio: ['ignore', 'pipe', 'ignore'],
      });
      for (const pid of pids.toString().split('\n').filter(Boolean)) {
        try {
          process.kill(Number(pid), 'SIGKILL');
        } catch {
          // gone meanwhile
        }
      }
    } catch {
      // no pids to list
    }
    ipQuiet('netns', 'del', name);
    removed.push(name);
  }
  return removed;
}

/** /30 subnets of 198.19.0.0/16, for links to test hosts from the shared namespace. */
const REACH_SLOTS = 16_384;

function ip(...args: string[]): void {
  try {
    execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  } catch (err) {
    const stderr = (err as { stderr?: Buffer }).stderr?.toString().trim();
    throw new Error(`ip ${args.join(' ')}: ${stderr || (err as Error).message}`);
  }
}

function ipQuiet(...args: string[]): void {
  try {
    execFileSync('ip', args, { stdio: 'ignore' });
  } catch {
    // already gone
  }
}
