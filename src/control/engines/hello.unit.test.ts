/**
 * The hello checks, in order, on hellos signed with real keys: each refusal names its check and
 * the nack the engine gets; an admitted hello says whether it is a new incarnation. No bus: the
 * whole handshake over ZeroMQ is in test/attacks/bus-admission.e2e.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { engineSession } from '../../../test/helpers/engine-session.ts';
import { Admission, newKeyPair, signHello } from '../../bus/admission.ts';
import { type EngineMessage, PROTOCOL_VERSION } from '../../bus/protocol.ts';
import type { EngineSession } from './engine-session.ts';
import { checkHello, type HelloContext } from './hello.ts';

const admission = new Admission();
const keys = admission.issue('p0');

function hello(over: Partial<EngineMessage<'hello'>> = {}): EngineMessage<'hello'> {
  const id = { engine: 'p0', role: 'prefill' as const, incarnation: 'p0-b', ...over };
  return {
    protocol: PROTOCOL_VERSION,
    pid: 1,
    pages: 8,
    pageBytes: 4096,
    pool: '/p0',
    epoch: 1,
    lastSeq: 0,
    rooms: [],
    ...over,
    ...id,
    auth: over.auth ?? signHello(id, keys, admission.server.publicKey),
  } as EngineMessage<'hello'>;
}

function context(over: Partial<HelloContext> = {}): HelloContext {
  return {
    admission,
    prev: undefined,
    modelFormat: null,
    fenced: () => undefined,
    mayRegister: () => true,
    others: () => [],
    ...over,
  };
}

/** The engine as registered before: same key, incarnation p0-a. */
const registered = (over: Partial<EngineSession> = {}) =>
  engineSession('p0', 'prefill', { key: keys.publicKey, ...over });

describe('checkHello', () => {
  it('admits a first hello with its key, as a new incarnation', () => {
    expect(checkHello(hello(), context())).toEqual({ ok: true, key: keys.publicKey, fresh: true });
  });

  it('admits the same incarnation again (a reconnect) without taking from the quota', () => {
    let asked = 0;
    const verdict = checkHello(
      hello({ incarnation: 'p0-a' }),
      context({ prev: registered(), mayRegister: () => ++asked > 99 }),
    );
    expect(verdict).toMatchObject({ ok: true, fresh: false });
    expect(asked).toBe(0);
  });

  it.each([
    [
      'speaks this protocol',
      () => checkHello(hello({ protocol: PROTOCOL_VERSION + 1 }), context()),
      'BUS_PROTOCOL_MISMATCH',
    ],
    [
      'proves its key',
      () => {
        const other = newKeyPair();
        const auth = signHello(
          { engine: 'p0', role: 'prefill', incarnation: 'p0-b' },
          other,
          admission.server.publicKey,
        );
        return checkHello(hello({ auth }), context());
      },
      'BUS_UNAUTHORIZED',
    ],
    [
      'not fenced',
      () => checkHello(hello(), context({ fenced: () => 'declared lost' })),
      'BUS_FENCED',
    ],
    [
      'keeps its role',
      () => checkHello(hello(), context({ prev: registered({ role: 'decode' }) })),
      'BUS_INVALID_EVENT',
    ],
    [
      'runs this model',
      () => checkHello(hello(), context({ modelFormat: 'llama.cpp tiny.gguf' })),
      'BUS_MODEL_MISMATCH',
    ],
    [
      'owns its KV pool',
      () =>
        checkHello(
          hello(),
          context({ others: () => [engineSession('d0', 'decode', { pool: '/p0' })] }),
        ),
      'BUS_IDENTITY_CONFLICT',
    ],
    [
      'within its registration quota',
      () => checkHello(hello(), context({ prev: registered(), mayRegister: () => false })),
      'BUS_RATE_LIMITED',
    ],
  ])('refuses a hello that fails "%s"', (check, run, code) => {
    const verdict = run();
    expect(verdict.ok).toBe(false);
    if (verdict.ok) return;
    expect(verdict.refusal).toMatchObject({ check, code });
    expect(verdict.refusal.message.length).toBeGreaterThan(10);
  });

  it("refuses a hello naming another engine's UCX worker address, and admits its own pool and address", () => {
    const kvRemote = {
      transport: 'ucx' as const,
      address: new Uint8Array([1, 2, 3]),
      pages: 8,
      pageBytes: 4096,
      epoch: 1,
    };
    const holder = engineSession('d0', 'decode', { pool: '/d0', kvRemote });
    const taken = checkHello(hello({ kvRemote }), context({ others: () => [holder] }));
    expect(taken.ok === false && taken.refusal).toMatchObject({
      code: 'BUS_IDENTITY_CONFLICT',
      message: expect.stringContaining("UCX worker address this engine names is engine d0's"),
    });
    const own = { ...kvRemote, address: new Uint8Array([9, 9]) };
    expect(checkHello(hello({ kvRemote: own }), context({ others: () => [holder] })).ok).toBe(true);
  });

  it('tells only a holder of the key that its incarnation is fenced', () => {
    const other = newKeyPair();
    const id = { engine: 'p0', role: 'prefill' as const, incarnation: 'p0-b' };
    const forged = hello({ auth: signHello(id, other, admission.server.publicKey) });
    const verdict = checkHello(forged, context({ fenced: () => 'declared lost' }));
    expect(verdict.ok === false && verdict.refusal.check).toBe('proves its key');
  });
});
