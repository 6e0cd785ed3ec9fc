/**
 * Engines ejected as outliers (src/recovery/outliers.ts decides): an ejected engine is no
 * candidate for a room until a canary through it passes, except for that canary itself. The set
 * is the registry's, beside the cordons; unlike a cordon an ejection ends by itself, and a control
 * plane that restarts starts with none (the evidence is counted again).
 */

/** Why and until when an engine is out of rotation. */
export interface Ejection {
  reason: string;
  /** When it was ejected this time (unix ms). */
  since: number;
  /** When a canary through it may first be tried (unix ms). */
  until: number;
  /** Times it has been ejected since this control plane started (each ejection lasts longer). */
  times: number;
}

export class Ejections {
  private readonly byEngine = new Map<string, Ejection>();

  of(engine: string): Ejection | null {
    return this.byEngine.get(engine) ?? null;
  }

  has(engine: string): boolean {
    return this.byEngine.has(engine);
  }

  all(): ReadonlyMap<string, Ejection> {
    return this.byEngine;
  }

  set(engine: string, ejection: Ejection): void {
    this.byEngine.set(engine, ejection);
  }

  delete(engine: string): boolean {
    return this.byEngine.delete(engine);
  }
}
