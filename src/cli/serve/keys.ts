/**
 * The bus's keys for `pdctl serve`: the control plane's own pair, kept in the data directory so
 * that engines started by hand keep the same server key across restarts, and the engine keys of
 * `--engine-key`, allowed each for its engine id.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { Admission, checkKey, type KeyPair, newKeyPair } from '../../bus/admission.ts';
import { UsageError } from '../../errors.ts';
import { JournalError } from '../../journal/errors.ts';

/**
 * The admission of a serving stack: the server pair of `keyFile` (made on first start), and each
 * engine key allowed; `say` warns of a key that may speak for any engine.
 */
export function admissionFor(
  keyFile: string,
  engineKeys: ReadonlyArray<{ engine: string; key: string }>,
  say: (line: string) => void,
): Admission {
  const admission = new Admission(loadServerKeys(keyFile));
  for (const { engine, key } of engineKeys) {
    try {
      admission.allow(engine, key);
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
    if (engine === '*') {
      say(
        `pdctl serve: WARNING --engine-key *=${key.slice(0, 8)}… lets that key speak for any engine id not yet registered (docs/security.md); give each engine a key of its own unless every holder is trusted`,
      );
    }
  }
  return admission;
}

/**
 * The control plane's bus key pair, kept in the data directory (mode 0600) so that engines
 * started by hand keep the same server key across restarts; made on first start.
 */
function loadServerKeys(path: string): KeyPair {
  if (existsSync(path)) {
    let keys: KeyPair;
    try {
      keys = JSON.parse(readFileSync(path, 'utf8')) as KeyPair;
      checkKey('publicKey', keys.publicKey);
      checkKey('secretKey', keys.secretKey);
    } catch (err) {
      throw new UsageError(
        `${path} is not a bus key file (${(err as Error).message}); move it away and pdctl serve makes a new one (engines started by hand then need the new PDCTL_CURVE_SERVER_KEY)`,
      );
    }
    return keys;
  }
  const keys = newKeyPair();
  try {
    // The data directory is its owner's alone, as the journal in it (journal/sqlite/privacy.ts).
    mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
    writeFileSync(path, `${JSON.stringify(keys, null, 2)}\n`, { mode: 0o600, flag: 'wx' });
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EROFS' || code === 'EACCES' || code === 'EPERM') {
      throw new JournalError(
        'JOURNAL_READ_ONLY',
        `cannot write ${path} (${(err as Error).message}): the data directory is on a read-only file or filesystem; pdctl serve keeps its journal and bus key there — fix the permissions or pass --data-dir on a writable disk. Read commands (pdctl rooms, journal verify) work on the journal as it is`,
        { cause: err },
      );
    }
    throw err;
  }
  return keys;
}
