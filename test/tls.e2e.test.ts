/**
 * `pdctl serve --tls-cert --tls-key`: the HTTP API over HTTPS through a real TLS client, the
 * certificate renewed on SIGHUP without a restart, and pairs that cannot serve refused.
 */
import { execFileSync } from 'node:child_process';
import { copyFileSync, readFileSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import { join } from 'node:path';
import type { TLSSocket } from 'node:tls';
import { describe, expect, it } from 'vitest';
import { serve } from './helpers/serve.ts';
import { pdctl } from './helpers/spawn.ts';
import { tempDir } from './helpers/tmp.ts';
import { waitFor } from './helpers/wait.ts';

const TLS_TEST =
  'serves HTTPS to a TLS client that trusts its certificate, takes a renewed one on SIGHUP, keeps it when the new files do not load';

/** A self-signed certificate for 127.0.0.1 named `cn`, and its key. */
function selfSigned(dir: string, cn: string): { cert: string; key: string } {
  const cert = join(dir, `${cn}.crt`);
  const key = join(dir, `${cn}.key`);
  execFileSync(
    'openssl',
    [
      ...['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'],
      ...['-keyout', key, '-out', cert, '-days', '2', '-subj', `/CN=${cn}`],
      ...['-addext', 'subjectAltName=IP:127.0.0.1'],
    ],
    { stdio: 'ignore' },
  );
  return { cert, key };
}

/** GET over TLS trusting only `ca`: the status and the CN of the certificate the server showed. */
function get(url: string, ca: string): Promise<{ status: number; cn: string }> {
  return new Promise((resolve, reject) => {
    const req = https.get(`${url}/health`, { ca: readFileSync(ca) }, (res) => {
      const peer = (res.socket as TLSSocket).getPeerCertificate();
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode ?? 0, cn: String(peer.subject.CN) }));
    });
    req.on('error', reject);
  });
}

describe('pdctl serve over HTTPS', () => {
  it(TLS_TEST, async () => {
    const dir = tempDir('pdctl-tls-');
    const first = selfSigned(dir, 'first');
    const second = selfSigned(dir, 'second');
    // A key that is not the certificate's, and one flag without the other: exit 2, saying so.
    const mismatched = await pdctl([
      'serve',
      '--port',
      '0',
      '--tls-cert',
      first.cert,
      '--tls-key',
      second.key,
    ]);
    expect(mismatched.code).toBe(2);
    expect(mismatched.stderr).toContain(
      `--tls-key ${second.key} does not go with --tls-cert ${first.cert}`,
    );
    const alone = await pdctl(['serve', '--port', '0', '--tls-cert', first.cert]);
    expect(alone.code).toBe(2);
    expect(alone.stderr).toMatch(/--tls-cert and --tls-key go together/);

    const cert = join(dir, 'serving.crt');
    const key = join(dir, 'serving.key');
    copyFileSync(first.cert, cert);
    copyFileSync(first.key, key);
    const s = await serve(['--tls-cert', cert, '--tls-key', key, '--log-level', 'info']);
    try {
      expect(s.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
      expect(await get(s.url, first.cert)).toEqual({ status: 200, cn: 'first' });
      // Plain HTTP to the same port is not served.
      await expect(fetch(s.url.replace('https:', 'http:') + '/health')).rejects.toThrow();
      // The CLI reaches it when Node trusts the certificate (NODE_EXTRA_CA_CERTS).
      const rooms = await pdctl(['rooms', '--url', s.url, '--json'], {
        env: { NODE_EXTRA_CA_CERTS: first.cert },
      });
      expect(rooms.code, rooms.stderr).toBe(0);

      // Renewed on disk, then SIGHUP: new connections get it, no restart.
      copyFileSync(second.cert, cert);
      copyFileSync(second.key, key);
      s.child.kill('SIGHUP');
      await waitFor(
        'the renewed certificate',
        async () => (await get(s.url, second.cert).catch(() => null))?.cn === 'second',
      );
      // Files that do not load: the one before stays, and the log says why.
      writeFileSync(cert, 'not a certificate');
      s.child.kill('SIGHUP');
      await waitFor('the refused reload in the log', () =>
        /TLS certificate not reloaded/.test(s.stderr()),
      );
      expect(await get(s.url, second.cert)).toEqual({ status: 200, cn: 'second' });
      expect(s.stderr()).toMatch(/--tls-cert .*serving\.crt is not a PEM certificate/);
    } finally {
      expect(await s.stop()).toBe(0);
    }
  }, 60_000);
});
