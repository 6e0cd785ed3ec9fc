/**
 * Metric label values that stay few. A value from the journal (a room's reason, a canary's stage)
 * becomes a label only when it is a code (`deadline_exceeded`, not `decode-0 lost: process 4242
 * exited`) and while the label has fewer than `cap` values; anything else is `other`. Free text —
 * a pid, a time, an engine's own message — would make a new series per incident, which Prometheus
 * keeps for weeks; the detail is in the journal, where `pdctl rooms --reason` finds it.
 */
const CODE = /^[a-z][a-z0-9_]{0,47}$/;

export class BoundedLabel {
  private readonly seen = new Set<string>();

  constructor(
    /** The values it starts with (the ones exported at 0 before they happen). */
    known: readonly string[] = [],
    private readonly cap = 64,
    /** What a value must look like to be its own label: a code, unless told otherwise. */
    private readonly pattern = CODE,
  ) {
    for (const v of known) this.seen.add(v);
  }

  /** The label for `value`: itself when it is a code and the label has room, else `other`. */
  of(value: string | null | undefined): string {
    if (value === null || value === undefined || value === '') return 'none';
    if (this.seen.has(value)) return value;
    if (!this.pattern.test(value) || this.seen.size >= this.cap) return 'other';
    this.seen.add(value);
    return value;
  }
}
