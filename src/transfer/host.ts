/**
 * Which host a process runs on, as far as moving KV is concerned: two engines are on the same
 * host when one can open the other's shared-memory pool. Hostnames do not say that — test hosts
 * (src/drills/hosts.ts), containers and pods share a kernel, and often a hostname, but each has
 * its own /dev/shm — so the identity is the kernel's boot id and the device of the /dev/shm this
 * process sees. Engines send it in their hello; `--kv-transport auto` uses shared memory between
 * engines of equal identity and UCX between the others (docs/protocol.md, "Across hosts").
 */
import { createHash } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';

let cached: string | null = null;

export function hostIdentity(): string {
  if (cached !== null) return cached;
  let boot = 'unknown-boot';
  try {
    boot = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  } catch {
    // not Linux: the device of /dev/shm alone
  }
  let shm = 'no-shm';
  try {
    shm = String(statSync('/dev/shm').dev);
  } catch {
    // no /dev/shm: nothing to share with anyone
  }
  cached = `${boot}:${shm}`;
  return cached;
}

/** A short tag of a host identity for people (`pdctl engines` HOST, /ui): equal tags, one host. */
export function hostTag(host: string): string {
  return `h-${createHash('sha256').update(host).digest('hex').slice(0, 6)}`;
}
