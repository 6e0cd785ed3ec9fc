/**
 * The PostgreSQL server CI runs the tests against (`.ci/run`): `start` makes a throwaway cluster
 * in a temp directory on a loopback port (fsync off) and prints `URL DIR`; `stop DIR` stops and
 * removes it. `npm test` uses the server PDCTL_TEST_POSTGRES names, or starts one of its own.
 */
import { startPgCluster, stopPgCluster } from '../src/journal/postgres/cluster.ts';

const [verb, dir] = process.argv.slice(2);
if (verb === 'start') {
  const cluster = await startPgCluster({ fast: true });
  process.stdout.write(`${cluster.url} ${cluster.dir}\n`);
} else if (verb === 'stop' && dir) {
  stopPgCluster(dir);
} else {
  process.stderr.write('usage: pg-test-cluster.ts start | stop DIR\n');
  process.exit(2);
}
