/**
 * `npm run sim`: the simulator's search over seeds (src/sim/search.ts has the options and
 * docs/simulation.md what runs and what is checked).
 */
import { randomInt } from 'node:crypto';
import { parseSearch, SIM_USAGE, SimUsageError, search } from '../src/sim/search.ts';

try {
  const options = parseSearch(process.argv.slice(2), () => randomInt(2 ** 31));
  if (options === 'help') {
    console.log(SIM_USAGE);
  } else {
    process.exitCode = await search(options, (line) => console.log(line));
  }
} catch (err) {
  if (!(err instanceof SimUsageError)) throw err;
  console.error(`pdctl sim: ${err.message}`);
  process.exitCode = 2;
}
