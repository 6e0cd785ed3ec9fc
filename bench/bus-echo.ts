/**
 * A DEALER that echoes every message back, run with `node -e` (argv: zeromq's path, endpoint): the
 * far end of the bus round trips that bench:engines states its floors against, on one host and
 * across test hosts.
 */
export const ECHO = `const zmq = require(process.argv[1]);
(async () => {
  const d = new zmq.Dealer({ linger: 0 });
  d.connect(process.argv[2]);
  await d.send('ready');
  for await (const [m] of d) await d.send(m);
})();`;
