/**
 * `pdctl serve --kv-device N`: the engines' KV pools in GPU memory, pages moved GPU to GPU
 * between the engine processes through CUDA IPC. On CI this runs on the stand-in CUDA runtime
 * (native/test/fake-cudart.cc), which the engines load through PDCTL_CUDART; under
 * `npm run gpu-check` (PDCTL_CUDA_TESTS=real) on the machine's own runtime and GPU. Without CUDA the
 * flag is refused before any engine starts.
 */
import { readdirSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { FAKE_CUDART_PATH } from '../src/transfer/native.ts';
import { type Served, serve } from './helpers/serve.ts';
import { pdctl } from './helpers/spawn.ts';
import { waitFor } from './helpers/stack.ts';
import { tempDir } from './helpers/tmp.ts';

const REAL = process.env.PDCTL_CUDA_TESTS === 'real';

async function complete(s: Served, prompt: string): Promise<{ text: string; room: string }> {
  const res = await fetch(`${s.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'pdctl-deterministic-1', prompt, max_tokens: 24 }),
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as { choices: Array<{ text: string }>; pdctl_room: string };
  return { text: body.choices[0]?.text ?? '', room: body.pdctl_room };
}

describe('pdctl serve --kv-device', () => {
  it('serves from KV pages in device memory, moved GPU to GPU, with the same answers as host pools', async () => {
    // A prompt long enough for several pages (64 B of KV per token, 4 KiB pages).
    const prompt = Array.from({ length: 300 }, (_, i) => (i % 2 ? 'river' : 'stone')).join(' ');
    const host = await serve(['--canary-interval-ms', '0']);
    const expected = await complete(host, prompt);
    expect(await host.stop()).toBe(0);

    const device = await serve(
      ['--canary-interval-ms', '0', '--kv-device', '0'],
      REAL ? {} : { PDCTL_CUDART: FAKE_CUDART_PATH },
    );
    // serve() returns at "listening on"; the device line follows it.
    await waitFor('the device line', () => /KV pages in the memory/.test(device.stderr()));
    expect(device.stderr()).toMatch(
      REAL
        ? /KV pages in the memory of CUDA device 0 \(.*: \d+ device\(s\)\)/
        : /KV pages in the memory of CUDA device 0 \(.*pdctl_fake_cudart/,
    );
    const got = await complete(device, prompt);
    expect(got.text).toBe(expected.text);
    // Both engines hold their pages in (the stand-in's) device memory: one allocation each.
    const engines = (await (await fetch(`${device.url}/v1/engines`)).json()) as {
      engines: Array<{ pid: number; kvDevice: number | null }>;
    };
    expect(engines.engines).toHaveLength(2);
    // Each engine says where its pages are (hello's kvDevice).
    expect(engines.engines.map((e) => e.kvDevice)).toEqual([0, 0]);
    for (const { pid } of REAL ? [] : engines.engines) {
      expect(readdirSync('/dev/shm').some((f) => f.startsWith(`pdctl-fakecuda-${pid}-`))).toBe(
        true,
      );
    }
    const t = (await (await fetch(`${device.url}/v1/rooms/${got.room}`)).json()) as {
      room: { state: string; kvPages: number; checksum: string };
      events: Array<{ type: string; data: { bytes?: number; checksum?: string } }>;
    };
    expect(t.room.state).toBe('completed');
    expect(t.room.kvPages).toBeGreaterThan(1);
    const moved = t.events.find((e) => e.type === 'room.transfer_completed');
    // The prompt's pages (the decode side reserved room for the answer too).
    expect(moved?.data.bytes).toBeGreaterThan(4096);
    expect((moved?.data.bytes ?? 0) % 4096).toBe(0);
    expect(moved?.data.bytes).toBeLessThanOrEqual(t.room.kvPages * 4096);
    // The decode engine checked the CRC32C of the device pages it received against this.
    expect(moved?.data.checksum).toBe(t.room.checksum);
    expect(await device.stop()).toBe(0);
  });

  it('is refused before any engine starts where there is no CUDA, saying why', async () => {
    const r = await pdctl(['serve', '--kv-device', '0', '--port', '0', '--data-dir', tempDir()], {
      env: { PDCTL_CUDART: `/nonexistent/libcudart-${process.pid}.so` },
    });
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(
      /--kv-device 0: CUDA is not available here \(PDCTL_CUDART=.* could not be loaded/,
    );
    expect(r.stderr).toMatch(/leave out --kv-device/);
  });
});
