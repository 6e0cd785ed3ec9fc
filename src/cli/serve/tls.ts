/**
 * `serve --tls-cert --tls-key`: the certificate and key the HTTP API serves HTTPS with, read and
 * checked at start, and again on SIGHUP — a renewed certificate is taken without a restart, and
 * one that does not load leaves the one before in place.
 */
import { X509Certificate } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createSecureContext } from 'node:tls';
import type { TlsPair } from '../../api/app.ts';
import { UsageError } from '../../errors.ts';
import type { Logger } from '../../log.ts';

export interface TlsFiles {
  cert: string;
  key: string;
}

/** Reads and checks the pair: a file missing, not PEM, or a key that is not the certificate's. */
export function readTls(files: TlsFiles): TlsPair & { subject: string; validTo: string } {
  const read = (flag: string, path: string) => {
    try {
      return readFileSync(path, 'utf8');
    } catch (err) {
      throw new UsageError(`${flag} ${path}: ${(err as Error).message}`);
    }
  };
  const pair = { cert: read('--tls-cert', files.cert), key: read('--tls-key', files.key) };
  let x509: X509Certificate;
  try {
    x509 = new X509Certificate(pair.cert);
  } catch (err) {
    throw new UsageError(
      `--tls-cert ${files.cert} is not a PEM certificate: ${(err as Error).message}`,
    );
  }
  try {
    createSecureContext(pair);
  } catch (err) {
    throw new UsageError(
      `--tls-key ${files.key} does not go with --tls-cert ${files.cert}: ${(err as Error).message}`,
    );
  }
  return { ...pair, subject: x509.subject.replaceAll('\n', ', '), validTo: x509.validTo };
}

/** On SIGHUP, the files are read again and the API serves them to new connections. */
export function reloadOnSighup(
  files: TlsFiles,
  reload: (pair: TlsPair) => void,
  log: Logger,
): () => void {
  const onHup = () => {
    try {
      const t = readTls(files);
      reload(t);
      log.info(
        { cert: files.cert, subject: t.subject, validTo: t.validTo },
        'SIGHUP: TLS certificate reloaded; new connections get it',
      );
    } catch (err) {
      log.error(
        { cert: files.cert, err: (err as Error).message },
        'SIGHUP: TLS certificate not reloaded; still serving the one before',
      );
    }
  };
  process.on('SIGHUP', onHup);
  return () => process.off('SIGHUP', onHup);
}
