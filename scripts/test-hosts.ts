/**
 * `npm run hosts -- a b c [--reach c]`: makes test hosts (src/drills/hosts.ts) for trying pdctl
 * across "machines" by hand, prints each host's addresses and how to run a command on it, and
 * removes them all on Ctrl-C or SIGTERM. Needs root.
 */
import { TestHosts, testHostsUnavailable } from '../src/drills/hosts.ts';

const args = process.argv.slice(2);
const reach: string[] = [];
const names: string[] = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--reach') reach.push(...(args[++i] ?? '').split(',').filter(Boolean));
  else if (args[i] === '--help' || args[i] === '-h') names.length = 0;
  else names.push(args[i] as string);
}
if (names.length < 2) {
  console.error(
    'usage: npm run hosts -- NAME NAME [NAME…] [--reach NAME,…]\n' +
      '  makes one test host per NAME (network + mount namespaces, a private /dev/shm, a veth link\n' +
      '  to every other host); --reach links this shell’s namespace to those hosts too.',
  );
  process.exit(2);
}
const why = testHostsUnavailable();
if (why) {
  console.error(`cannot make test hosts: ${why}`);
  process.exit(1);
}
const hosts = await TestHosts.create({ names, reach });
for (const h of names) {
  const peers = names.filter((p) => p !== h).map((p) => `${hosts.address(h, p)} (for ${p})`);
  if (reach.includes(h)) peers.push(`${hosts.address(h, 'self')} (for this shell)`);
  console.log(`${h}: ${peers.join(', ')}`);
  console.log(`   run on it: nsenter --target ${hosts.anchorPid(h)} --mount --net -- COMMAND`);
}
console.log('Ctrl-C removes them.');
const stop = () => {
  hosts.destroy();
  console.log('test hosts removed');
  process.exit(0);
};
process.on('SIGINT', stop);
process.on('SIGTERM', stop);
setInterval(() => {}, 1 << 30);
