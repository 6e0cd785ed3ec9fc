/** What recovery shows of each engine to the API and the CLI: its ladder state and restarts. */
import type { LadderView } from './ladder.ts';
import type { EngineTallies } from './supervisor.ts';

export interface RecoveryView {
  /** Where the engine stands on the escalation ladder. */
  ladder(engine: string): LadderView;
  /** How often its process was started again (a crash or the ladder); null: not spawned here. */
  restarts(engine: string): number | null;
  /** Exits by cause and restarts by who, of every engine started here (crash loops show here). */
  tallies(): Map<string, EngineTallies>;
}
