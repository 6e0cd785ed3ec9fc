/**
 * The live page (/ui) in a real browser: Debian's Chromium, headless, driven by playwright-core.
 * It loads with the engines and their ladder state, shows a room created during the test while it
 * is in flight and its journal events as they are committed (no reload), its timeline on click,
 * and says so when the server goes away. Screenshots are kept in test-results/.
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { type Browser, chromium, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Served, serve } from './helpers/serve.ts';
import { pdctl, ROOT } from './helpers/spawn.ts';
import { findTool, requireTool } from './helpers/tools.ts';

const chromiumPath = findTool('chromium', ['/usr/bin/chromium']);
const hasChromium = requireTool(
  'chromium',
  chromiumPath,
  "Debian's chromium package: apt-get install chromium",
);
const ARTEFACTS = join(ROOT, 'test-results');

describe.runIf(hasChromium)('the live page in headless Chromium', () => {
  let s: Served;
  let browser: Browser;
  let page: Page;
  const pageErrors: string[] = [];
  /** Answers of 400 and up the page got, but /health/ready's 503 before the first canary. */
  const failedRequests: string[] = [];

  beforeAll(async () => {
    // 20 ms per token: a 150-token room stays in flight about 3 s. A canary each second, so that
    // the stack turns ready.
    s = await serve(['--decode-us-per-token', '20000', '--canary-interval-ms', '1000']);
    browser = await chromium.launch({
      executablePath: chromiumPath as string,
      // Nothing may reach the network from here: no background connections. (launch() gives the
      // browser a fresh, empty profile of its own.)
      args: [
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
    });
    page = await browser.newPage({ viewport: { width: 1500, height: 1000 } });
    page.on('pageerror', (e) => pageErrors.push(e.message));
    // Chromium logs every failed request as a console error; those are checked by URL below.
    page.on('console', (m) => {
      if (m.type() === 'error' && !m.text().startsWith('Failed to load resource'))
        pageErrors.push(m.text());
    });
    page.on('response', (r) => {
      if (r.status() >= 400 && !(r.status() === 503 && r.url().endsWith('/health/ready')))
        failedRequests.push(`${r.status()} ${r.url()}`);
    });
    mkdirSync(ARTEFACTS, { recursive: true });
  }, 60_000);

  afterAll(async () => {
    await browser?.close();
    await s?.stop();
  });

  it('loads under a strict content-security policy with every engine and its ladder state', async () => {
    const res = await page.goto(`${s.url}/ui`);
    expect(res?.status()).toBe(200);
    expect(res?.headers()['content-security-policy']).toMatch(/script-src 'self'/);
    await page.locator('#engines tr[data-engine="prefill-0"][data-phase="ok"]').waitFor();
    await page.locator('#engines tr[data-engine="decode-0"][data-phase="ok"]').waitFor();
    expect(
      await page.locator('#engines tr[data-engine="decode-0"] td.pages').textContent(),
    ).toMatch(/^\d+ \/ 4096$/);
    // Both engines run on this machine: one host tag for the two.
    const hostOf = (engine: string) =>
      page.locator(`#engines tr[data-engine="${engine}"] td.host`).textContent();
    // The control plane's one status of each engine, with what the engine says of itself on hover.
    const status = page.locator('#engines tr[data-engine="decode-0"] td.status');
    await expect.poll(() => status.textContent()).toBe('live');
    expect(await status.getAttribute('title')).toBe('the engine says: ready');
    expect(await hostOf('prefill-0')).toMatch(/^h-[0-9a-f]{6}$/);
    expect(await hostOf('decode-0')).toBe(await hostOf('prefill-0'));
    await expect.poll(() => page.locator('#link').textContent()).toMatch(/^live · updated/);
    await expect
      .poll(() => page.locator('#ready').textContent(), { timeout: 10_000 })
      .toBe('ready');
    await expect.poll(() => page.locator('#model').textContent()).toBe('pdctl-deterministic-1');
  });

  it('shows a room created during the test live, its events as committed, its timeline on click', async () => {
    // The page must not reload for any of this: a marker set now must still be there at the end.
    await page.evaluate(() => {
      (globalThis as unknown as { marker: number }).marker = 42;
    });
    const res = await fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'pdctl-deterministic-1',
        prompt: 'a room watched from the browser',
        max_tokens: 150,
        stream: true,
      }),
    });
    expect(res.status).toBe(200);
    const room = res.headers.get('x-pdctl-room') as string;
    expect(room).toMatch(/^r-/);
    const done = res.text();

    // In flight: on the "In flight" tab, counted under its state, its events in the journal.
    await page.locator(`#rooms tr[data-room="${room}"]`).waitFor({ timeout: 5000 });
    await page.locator(`#journal li[data-room="${room}"][data-type="room.created"]`).waitFor();
    await page
      .locator(`#journal li[data-room="${room}"][data-type="room.decode_started"]`)
      .waitFor();
    // The counts come from the page's poll (once a second), the journal from its live stream: the
    // count shows the room decoding at the next poll (a loaded CI run read it before that once).
    await expect
      .poll(
        async () =>
          Number(await page.locator('#state-counts [data-state="decoding"] b').textContent()),
        { timeout: 2500 },
      )
      .toBeGreaterThanOrEqual(1);
    await page.screenshot({ path: join(ARTEFACTS, 'ui-in-flight.png'), fullPage: true });

    // It completes: gone from "In flight", committed in the journal, on "Recent" as completed.
    await done;
    await page.locator(`#journal li[data-room="${room}"][data-type="room.completed"]`).waitFor();
    await page.locator(`#rooms tr[data-room="${room}"]`).waitFor({ state: 'detached' });
    // Its KV moved through shared memory, and both of its engines count the transfer.
    for (const engine of ['prefill-0', 'decode-0'])
      await expect
        .poll(() => page.locator(`#engines tr[data-engine="${engine}"] td.transfers`).textContent())
        .toMatch(/^shm \d+$/);
    await page.click('#tab-recent');
    const row = page.locator(`#rooms tr[data-room="${room}"][data-state="completed"]`);
    await row.waitFor();
    await row.click();

    // The timeline: every event the journal holds for it, and the time in each state — brought
    // into view (it opens below the journal).
    await page.locator('#timeline tr[data-type="room.completed"]').waitFor();
    await expect
      .poll(() =>
        page.locator('#timeline-section').evaluate((el) => {
          const r = el.getBoundingClientRect();
          return (
            r.top >= 0 && r.top < (globalThis as unknown as { innerHeight: number }).innerHeight
          );
        }),
      )
      .toBe(true);
    const journaled = (await (await fetch(`${s.url}/v1/rooms/${room}`)).json()) as {
      events: Array<{ type: string }>;
    };
    const shown = await page
      .locator('#timeline tbody tr')
      .evaluateAll((rows) => rows.map((r) => r.getAttribute('data-type')));
    expect(shown).toEqual(journaled.events.map((e) => e.type));
    for (const state of ['created', 'prefilling', 'transferring', 'decoding'])
      expect(await page.locator(`#timeline-spans [data-state="${state}"]`).count(), state).toBe(1);
    expect(await page.locator('#timeline-room').textContent()).toBe(room);
    expect(await page.evaluate(() => (globalThis as unknown as { marker: number }).marker)).toBe(
      42,
    );
    await page.screenshot({ path: join(ARTEFACTS, 'ui-timeline.png'), fullPage: true });

    // Found by its request id: the room listed and its timeline open, its request named; a long
    // prompt's page numbers are cut short in the timeline.
    const asked = await fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': 'ticket-4711' },
      body: JSON.stringify({
        model: 'pdctl-deterministic-1',
        prompt: 'many words '.repeat(400),
        max_tokens: 2,
      }),
    });
    expect(asked.status).toBe(200);
    const askedRoom = asked.headers.get('x-pdctl-room') as string;
    await page.fill('#room-search', 'ticket-4711');
    await page.press('#room-search', 'Enter');
    await page.locator(`#rooms tr[data-room="${askedRoom}"]`).waitFor();
    await expect.poll(() => page.locator('#timeline-room').textContent()).toBe(askedRoom);
    expect(await page.locator('#room-search-state').textContent()).toBe(
      'request ticket-4711: 1 room',
    );
    // The summary is filled when the room's record arrives, after its id is shown.
    await expect
      .poll(() => page.locator('#timeline-summary').textContent())
      .toContain('ticket-4711');
    const pages = await page
      .locator('#timeline tr[data-type="room.bootstrapped"] td.data')
      .textContent();
    expect(pages).toMatch(/"pages":"\[\d+, \d+, \d+, \d+, … \d+ in all\]"/);
    expect(await page.locator('#rooms tbody tr').count()).toBe(1);

    // A request refused before it had a room (every prefill engine cordoned): its id leads to
    // the refusal, not to "nothing found".
    const cordon = await fetch(`${s.url}/v1/admin/engines/prefill-0/cordon`, { method: 'POST' });
    expect(cordon.status).toBe(202);
    const refused = await fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': 'ticket-4712' },
      body: JSON.stringify({ model: 'pdctl-deterministic-1', prompt: 'refused', max_tokens: 2 }),
    });
    expect(refused.status).toBe(503);
    const code = ((await refused.json()) as { error: { code: string } }).error.code;
    // The page says clients are being refused, though no room is in flight.
    await expect
      .poll(() => page.locator('#refused').textContent(), { timeout: 5000 })
      .toMatch(new RegExp(`^refused in the last 5 min: \\d+ × 503 ${code}`));
    // Refusals are journaled once a second.
    await expect
      .poll(async () => (await fetch(`${s.url}/v1/journal?request_id=ticket-4712`)).text())
      .toContain('request.refused');
    await page.fill('#room-search', 'ticket-4712');
    await page.press('#room-search', 'Enter');
    await expect
      .poll(() => page.locator('#room-search-state').textContent())
      .toMatch(new RegExp(`^request ticket-4712: refused at \\S+: 503 ${code} — .+`));
    // And so does the CLI, reading the server.
    const cli = await pdctl(['room', 'ticket-4712', '--url', s.url]);
    expect(cli.code, cli.stderr).toBe(0);
    expect(cli.stdout).toMatch(new RegExp(`^request ticket-4712: refused at \\S+: 503 ${code} — `));
    // The canary's rooms (one a second here) stay out of the journal pane unless asked for.
    const canaryShown = () => page.locator('#journal li[data-canary]').count();
    expect(await canaryShown()).toBe(0);
    await page.check('#journal-canary');
    await expect.poll(canaryShown).toBeGreaterThan(0);
    await page.uncheck('#journal-canary');
    expect(await canaryShown()).toBe(0);
    expect(pageErrors).toEqual([]);
    expect(failedRequests).toEqual([]);
  });

  it('asks for the admin token of a serve that has one, once, and shows the engines with it', async () => {
    const guarded = await serve(['--canary-interval-ms', '1000'], { PDCTL_ADMIN_TOKEN: 'sesame' });
    const tab = await browser.newPage();
    try {
      const asked: string[] = [];
      tab.on('dialog', (d) => {
        asked.push(d.message());
        void d.accept('sesame');
      });
      await tab.goto(`${guarded.url}/ui`);
      await tab.locator('#engines tr[data-engine="decode-0"][data-phase="ok"]').waitFor();
      expect(asked).toHaveLength(1);
      expect(asked[0]).toMatch(/admin token \(PDCTL_ADMIN_TOKEN\)/);
      // Its polls carry it from then on: the journal pane follows, and nothing asks again.
      await expect.poll(() => tab.locator('#journal-state').textContent()).toBe('following');
      expect(asked).toHaveLength(1);
    } finally {
      await tab.close();
      expect(await guarded.stop()).toBe(0);
    }
  }, 60_000);

  it('says why and since when an engine is out of rotation, names it in the header, and never cuts a room id', async () => {
    // A room in the journal pane (prefill-0 back from the cordon above), then the only decode
    // engine out of rotation.
    expect((await pdctl(['engines', 'uncordon', 'prefill-0', '--url', s.url])).code).toBe(0);
    const served = await fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'pdctl-deterministic-1', prompt: 'narrow', max_tokens: 2 }),
    });
    expect(served.status).toBe(200);
    expect((await pdctl(['engines', 'cordon', 'decode-0', '--url', s.url])).code).toBe(0);
    // A narrow window; and an ejection, which needs a faulty engine, written into the page's
    // view of the engines (the server's answer is not what is tested here, the page is).
    const tab = await browser.newPage({ viewport: { width: 760, height: 900 } });
    const since = Date.now() - 125_000;
    await tab.route('**/v1/engines', async (route) => {
      const real = (await (await route.fetch()).json()) as {
        engines: Array<{ id: string; ejection: unknown }>;
      };
      for (const e of real.engines)
        if (e.id === 'prefill-0')
          e.ejection = {
            reason: '3 of its last 3 rooms failed by its fault',
            since,
            until: since + 300_000,
            times: 1,
          };
      await route.fulfill({ json: real });
    });
    try {
      await tab.goto(`${s.url}/ui`);
      const why = (engine: string, kind: string) =>
        tab.locator(`#engines tr[data-engine="${engine}"] .why[data-why="${kind}"]`).textContent();
      await expect
        .poll(() => why('decode-0', 'cordon'), { timeout: 10_000 })
        .toMatch(/^cordoned by the operator \d+(\.\d)? (ms|s) ago: \S/);
      expect(await why('prefill-0', 'ejection')).toMatch(
        /^ejected 2 m \d+ s ago: 3 of its last 3 rooms failed by its fault$/,
      );
      await expect
        .poll(() => tab.locator('#ready').textContent())
        .toMatch(/ · decode-0 cordoned, prefill-0 ejected$/);
      // Room ids in the journal pane are whole and inside it, however narrow the pane.
      const rooms = tab.locator('#journal li[data-room] .room');
      await rooms.first().waitFor();
      const cells = await rooms.evaluateAll((els) =>
        els.map((el) => {
          const pane = el.closest('#journal')?.getBoundingClientRect();
          const box = el.getBoundingClientRect();
          return {
            text: el.textContent,
            cut:
              el.scrollWidth > el.clientWidth ||
              pane === undefined ||
              box.right > pane.right ||
              box.left < pane.left,
            room: el.parentElement?.getAttribute('data-room'),
          };
        }),
      );
      expect(cells.length).toBeGreaterThan(0);
      for (const c of cells) expect(c).toEqual({ text: c.room, cut: false, room: c.room });
      await tab.screenshot({ path: join(ARTEFACTS, 'ui-out-of-rotation.png') });
    } finally {
      await tab.close();
      expect((await pdctl(['engines', 'uncordon', 'decode-0', '--url', s.url])).code).toBe(0);
    }
  }, 60_000);

  it('says it is disconnected when the server goes away', async () => {
    expect(await s.stop()).toBe(0);
    await expect
      .poll(() => page.locator('#link').textContent(), { timeout: 10_000 })
      .toMatch(/^disconnected/);
    await page.screenshot({ path: join(ARTEFACTS, 'ui-disconnected.png') });
  });
});
