/**
 * A throwaway process that checks a peer's UCX worker address: `node ucx-check.js` reads
 * `{ address }` (base64) as JSON on stdin, makes an endpoint to it with a UCX context of its own,
 * and exits 0 (good), 3 (refused, the reason on stdout) — or dies, as UCX makes a process that
 * meets a malformed worker address abort. `checkPeer()` (ucx.ts) runs it, so that no engine
 * process hands bytes another engine sent to UCX before they are known to unpack.
 */
import { native } from './native.ts';
import { REFUSED_EXIT } from './ucx.ts';

let input = '';
for await (const chunk of process.stdin) input += chunk;
const { address } = JSON.parse(input) as { address: string };
const why = native().ucxCheckPeer(Buffer.from(address, 'base64'));
if (why !== null) process.stdout.write(why);
process.exitCode = why === null ? 0 : REFUSED_EXIT;
