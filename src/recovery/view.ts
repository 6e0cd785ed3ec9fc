/** What recovery shows of each engine to the API and the CLI: its ladder state and restarts. */
import type { LadderView } from './ladder.ts';

export interface RecoveryView {
  /** Where the engine stands on the escalation ladder. */
  ladder(engine: string): LadderView;
  /** How often its process was started again (a crash or the ladder); null: not spawned here. */
  restarts(engine: string): number | null;
}
