/** Process entry of the CLI: `bin/pdctl.js` loads the compiled form of this file. */
import { main } from './main.ts';

process.exitCode = await main(process.argv);
