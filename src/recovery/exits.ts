/**
 * What a supervisor does when an engine's process ends — `pdctl serve`'s (app/stack.ts) and the
 * simulator's (sim/fleet.ts) alike: the exit is journaled (`engine.exited`), and the rooms the
 * control plane had on that process continue elsewhere at once, not when its replacement says
 * hello.
 */
import type { ControlPlane } from '../control/control-plane.ts';
import type { JournalLog } from '../journal/store.ts';
import type { Logger } from '../log.ts';

export interface EngineExit {
  engine: string;
  /** The process that ended; null when it never started. */
  pid: number | null;
  code: number | null;
  signal: string | null;
  /** Times the engine was started again before this exit. */
  restarts: number;
  /** pdctl ended it on purpose (a shutdown, a ladder restart). */
  expected: boolean;
}

/** Journals the exit and, unless `moveRooms` is false (the stack is stopping), moves its rooms. */
export function engineExited(
  control: Pick<ControlPlane, 'engine' | 'engineLost'>,
  journal: Pick<JournalLog, 'append'>,
  log: Logger,
  exit: EngineExit,
  moveRooms = true,
): void {
  const s = control.engine(exit.engine);
  // The registered session is this process's (not a newer one's that already said hello).
  const held = s !== undefined && s.pid === exit.pid;
  journal
    .append({
      type: 'engine.exited',
      engine: exit.engine,
      source: 'supervisor',
      data: {
        pid: exit.pid ?? 0,
        code: exit.code,
        signal: exit.signal,
        rooms: held ? s.liveRooms : 0,
        restarts: exit.restarts,
        expected: exit.expected,
      },
    })
    .catch((err) => log.error({ err, engine: exit.engine }, 'could not journal engine.exited'));
  if (!held || !moveRooms) return;
  void control.engineLost(
    exit.engine,
    s.incarnation,
    `process ${exit.pid} exited (${exit.signal ?? `code ${exit.code}`})`,
  );
}
