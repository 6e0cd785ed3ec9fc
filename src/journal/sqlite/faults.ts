/**
 * A full disk and a crashed writer thread, on demand. Only a journal opened with `faults: true`
 * has them (drills, tests, the simulator); `pdctl serve` opens without, so nothing in a serving
 * process can cap its journal or kill its writer.
 */
export interface SqliteFaults {
  /**
   * Kills the writer thread the way a crash would (at `power` durability; an inline writer has no
   * thread and this does nothing). The supervisor restarts it; appends queued meanwhile commit
   * once it is back.
   */
  crashWriter(): void;
  /**
   * The database may grow to at most `pages` pages, so commits that need more fail as on a full
   * disk (SQLITE_FULL); null lifts the cap.
   */
  limitPages(pages: number | null): Promise<void>;
  /** Pages the database has now: `limitPages` at this count makes the next growth fail. */
  pageCount(): number;
}
