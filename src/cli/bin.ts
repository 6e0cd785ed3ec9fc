/** Process entry of the CLI: `bin/pdctl.js` loads the compiled form of this file. */
import { main } from './main.ts';

// `pdctl journal tail -n 5000 | head` closes the pipe early: that is the reader being done, not
// an error worth a stack trace.
for (const stream of [process.stdout, process.stderr]) {
  stream.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(0);
    throw err;
  });
}

process.exitCode = await main(process.argv);
