/**
 * A tenant's API key: 32 random bytes, shown once when made and never stored. The journal keeps
 * its SHA-256 (a key has 256 bits of its own, so a fast hash is as good as a slow one), and the
 * hash's first 8 hex digits name it in lists and logs.
 */
import { createHash, randomBytes } from 'node:crypto';

/** Every key starts so: a key pasted into the wrong place is recognisable as pdctl's. */
export const KEY_PREFIX = 'pdk-';

export function newTenantKey(): string {
  return `${KEY_PREFIX}${randomBytes(32).toString('base64url')}`;
}

export function keyHash(key: string): string {
  return createHash('sha256').update(key).digest('hex');
}

export function keyIdOf(hash: string): string {
  return hash.slice(0, 8);
}
