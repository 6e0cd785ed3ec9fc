/** `pdctl run`, `pdctl engine` and `pdctl keys` as a newcomer runs them: real processes end to end. */
import { describe, expect, it } from 'vitest';
import { DeterministicModel, generateInProcess } from '../src/model/deterministic.ts';
import { pdctl } from './helpers/spawn.ts';
import { tempDir } from './helpers/tmp.ts';

const dir = tempDir('pdctl-run-');

describe('pdctl run', () => {
  it('streams one completion equal to the model in-process, journals it, and exits 0', async () => {
    const journal = `${dir}/journal.db`;
    const text = 'the river carries the light across the valley';
    const r = await pdctl(['run', text, '--max-tokens', '12', '--journal', journal], {
      timeoutMs: 60_000,
    });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe(`${generateInProcess(new DeterministicModel(), text, 12).text}\n`);
    const room = /pdctl room (\S+)/.exec(r.stderr)?.[1] as string;
    expect(r.stderr).toMatch(/12 tokens, length, \d+ ms/);
    const shown = await pdctl(['room', room, '--journal', journal, '--json']);
    expect(shown.code).toBe(0);
    const t = JSON.parse(shown.stdout) as { room: { state: string; releasedBy: string[] } };
    expect(t.room.state).toBe('completed');
    expect(t.room.releasedBy.sort()).toEqual(['decode-0', 'prefill-0']);
  }, 90_000);

  it("refuses a request beyond the built-in model's --context-size in one line, as a client is told", async () => {
    const r = await pdctl(
      [
        'run',
        'the river carries the light across the valley and the hills',
        '--context-size',
        '16',
        '--max-tokens',
        '8',
        '--journal',
        `${dir}/context.db`,
      ],
      { timeoutMs: 60_000 },
    );
    expect(r.code).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr.trim()).toBe(
      "pdctl: refused: this model's context is 16 tokens; the prompt has 11 and max_tokens asks for 8 more (19); shorten the prompt or ask for at most 5 tokens",
    );
  }, 90_000);

  it('refuses bad flags with a message that says what is wrong', async () => {
    const r = await pdctl(['run', 'hello', '--max-tokens', 'lots']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--max-tokens must be a positive integer, got "lots"/);
    const e = await pdctl(['engine', '--role', 'decode', '--id', 'd0', '--control', 'localhost:1']);
    expect(e.code).toBe(2);
    expect(e.stderr).toMatch(/control must be a tcp:\/\/ or ipc:\/\/ endpoint/);
    const k = await pdctl([
      'engine',
      '--role',
      'middle',
      '--id',
      'd0',
      '--control',
      'tcp://127.0.0.1:1',
    ]);
    expect(k.code).toBe(2);
    expect(k.stderr).toMatch(/Allowed choices are prefill, decode/);
  });

  it('prints a CURVE key pair', async () => {
    const r = await pdctl(['keys', '--json']);
    expect(r.code).toBe(0);
    const k = JSON.parse(r.stdout) as { publicKey: string; secretKey: string };
    expect(k.publicKey).toHaveLength(40);
    expect(k.secretKey).toHaveLength(40);
  });
});
