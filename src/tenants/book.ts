/**
 * The tenants of the serving API, folded from the journal's `tenant.*` events: who a key belongs
 * to, its band and limits, and whether the API is open at all. Once a tenant has ever been added
 * the serving routes need a key, also after every tenant is revoked — revoking the last one must
 * not open the API to anyone.
 */
import type { BANDS, JournalEvent } from '../room/events.ts';
import { keyHash } from './keys.ts';

export type Band = (typeof BANDS)[number];

export const TENANT_EVENT_TYPES = ['tenant.added', 'tenant.key_rotated', 'tenant.revoked'] as const;

export interface Tenant {
  name: string;
  band: Band;
  /** Rooms of it at once; null: no limit of its own. */
  maxConcurrency: number | null;
  /** Prompt and completion tokens a minute; null: no limit of its own. */
  tokensPerMinute: number | null;
  /** The first 8 hex digits of its key's SHA-256. */
  keyId: string;
  addedAt: number;
  rotatedAt: number | null;
  revokedAt: number | null;
}

export class TenantBook {
  private readonly byName = new Map<string, Tenant>();
  private readonly hashes = new Map<string, string>();

  /** Whether keys are needed: a tenant was ever added (revoked ones count). */
  get closed(): boolean {
    return this.byName.size > 0;
  }

  /** Folds one committed event; any other type is ignored, and so is a second add of a name. */
  apply(ev: JournalEvent): void {
    if (ev.type === 'tenant.added') {
      const d = ev.data;
      if (this.byName.has(d.tenant)) return;
      this.byName.set(d.tenant, {
        name: d.tenant,
        band: d.band,
        maxConcurrency: d.maxConcurrency ?? null,
        tokensPerMinute: d.tokensPerMinute ?? null,
        keyId: d.keyId,
        addedAt: ev.ts,
        rotatedAt: null,
        revokedAt: null,
      });
      this.hashes.set(d.keyHash, d.tenant);
    } else if (ev.type === 'tenant.key_rotated') {
      const t = this.byName.get(ev.data.tenant);
      if (!t || t.revokedAt !== null) return;
      this.dropHashesOf(t.name);
      this.hashes.set(ev.data.keyHash, t.name);
      t.keyId = ev.data.keyId;
      t.rotatedAt = ev.ts;
    } else if (ev.type === 'tenant.revoked') {
      const t = this.byName.get(ev.data.tenant);
      if (!t || t.revokedAt !== null) return;
      this.dropHashesOf(t.name);
      t.revokedAt = ev.ts;
    }
  }

  private dropHashesOf(name: string): void {
    for (const [hash, owner] of this.hashes) if (owner === name) this.hashes.delete(hash);
  }

  /** The live tenant this key belongs to; null for a wrong, rotated-out or revoked key. */
  authenticate(key: string): Tenant | null {
    const name = this.hashes.get(keyHash(key));
    const t = name === undefined ? undefined : this.byName.get(name);
    return t && t.revokedAt === null ? t : null;
  }

  get(name: string): Tenant | undefined {
    return this.byName.get(name);
  }

  /** Every tenant ever added, revoked ones included, by name. */
  list(): Tenant[] {
    return [...this.byName.values()]
      .sort((a, b) => (a.name < b.name ? -1 : 1))
      .map((t) => ({ ...t }));
  }
}
