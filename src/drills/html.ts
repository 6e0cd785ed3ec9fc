/**
 * `pdctl drill --report FILE`: one self-contained HTML file (no scripts, no external assets) with,
 * per drill, its invariants and a timeline chart — live rooms by state, stacked, and rooms ended
 * by outcome — with the drill's steps (fault, detection, recovery) marked on the time axis.
 */
import { LIVE_STATES } from '../room/states.ts';
import {
  compareRecovery,
  type DrillReport,
  nextCommands,
  type StateSample,
  verdictOf,
  waitingFigures,
} from './report.ts';

const VERDICT_TEXT = {
  ok: 'ok',
  FAIL: 'FAIL',
  met: 'target met',
  MISS: 'target MISSED',
  skip: 'not run',
} as const;

const COLORS: Record<string, string> = {
  created: '#9ecae1',
  waiting_for_input: '#6baed6',
  bootstrapping: '#4292c6',
  prefilling: '#fdae6b',
  transferring: '#f16913',
  transferred: '#d94801',
  decoding: '#74c476',
  completed: '#238b45',
  failed: '#cb181d',
  aborted: '#756bb1',
  migrated: '#636363',
  // Requests, for drills that sample the client side, and requests out with no live room.
  in_flight: '#6baed6',
  waiting: '#bdbdbd',
  error: '#cb181d',
  dropped: '#fd8d3c',
};

function esc(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

const W = 900;
const H = 220;
const PAD = { left: 48, right: 12, top: 10, bottom: 24 };

function axes(maxX: number, maxY: number, label: string): string {
  const out: string[] = [];
  const x0 = PAD.left;
  const y0 = H - PAD.bottom;
  out.push(`<line x1="${x0}" y1="${y0}" x2="${W - PAD.right}" y2="${y0}" stroke="#444"/>`);
  out.push(`<line x1="${x0}" y1="${PAD.top}" x2="${x0}" y2="${y0}" stroke="#444"/>`);
  for (let i = 0; i <= 4; i++) {
    const v = Math.round((maxY * i) / 4);
    const y = y0 - ((y0 - PAD.top) * i) / 4;
    out.push(`<text x="${x0 - 6}" y="${y + 4}" text-anchor="end" font-size="10">${v}</text>`);
  }
  const stepS = Math.max(1, Math.ceil(maxX / 1000 / 10));
  for (let s = 0; s * 1000 <= maxX; s += stepS) {
    const x = x0 + ((W - PAD.left - PAD.right) * s * 1000) / maxX;
    out.push(`<text x="${x}" y="${H - 8}" text-anchor="middle" font-size="10">${s}s</text>`);
  }
  out.push(
    `<text x="${x0 + 4}" y="${PAD.top + 10}" font-size="11" fill="#444">${esc(label)}</text>`,
  );
  return out.join('');
}

function chart(
  samples: StateSample[],
  keys: readonly string[],
  pick: (s: StateSample, key: string) => number,
  stacked: boolean,
  markers: DrillReport['timeline'],
  maxX: number,
  label: string,
): string {
  const totals = samples.map((s) =>
    stacked
      ? keys.reduce((n, k) => n + pick(s, k), 0)
      : Math.max(0, ...keys.map((k) => pick(s, k))),
  );
  const maxY = Math.max(1, ...totals);
  const sx = (ms: number) => PAD.left + ((W - PAD.left - PAD.right) * ms) / maxX;
  const sy = (v: number) => H - PAD.bottom - ((H - PAD.top - PAD.bottom) * v) / maxY;
  const shapes: string[] = [];
  const base = samples.map(() => 0);
  for (const k of keys) {
    if (!samples.some((s) => pick(s, k) > 0)) continue;
    const top = samples.map((s, i) => (stacked ? (base[i] as number) : 0) + pick(s, k));
    const color = COLORS[k] ?? '#999';
    if (stacked) {
      const up = samples.map((s, i) => `${sx(s.atMs)},${sy(top[i] as number)}`);
      const down = samples.map((s, i) => `${sx(s.atMs)},${sy(base[i] as number)}`).reverse();
      shapes.push(
        `<polygon points="${[...up, ...down].join(' ')}" fill="${color}" fill-opacity="0.85"><title>${k}</title></polygon>`,
      );
      for (let i = 0; i < base.length; i++) base[i] = top[i] as number;
    } else {
      const pts = samples.map((s, i) => `${sx(s.atMs)},${sy(top[i] as number)}`).join(' ');
      shapes.push(
        `<polyline points="${pts}" fill="none" stroke="${color}" stroke-width="2"><title>${k}</title></polyline>`,
      );
    }
  }
  const rows = markerRows(markers.map((m) => sx(m.atMs)));
  const marks = markers.map(
    (m, i) =>
      `<line x1="${sx(m.atMs)}" y1="${PAD.top}" x2="${sx(m.atMs)}" y2="${H - PAD.bottom}" stroke="#000" stroke-dasharray="3,3" stroke-opacity="0.5"/>` +
      `<text x="${sx(m.atMs) + 2}" y="${PAD.top + 22 + (rows[i] as number) * MARKER_ROW}" font-size="10">${i + 1}</text>`,
  );
  return `<svg viewBox="0 0 ${W} ${H}" width="100%" role="img" aria-label="${esc(label)}">${axes(maxX, maxY, label)}${shapes.join('')}${marks.join('')}</svg>`;
}

/** Height of a row of marker numbers, and the room one takes across (two digits and a gap). */
const MARKER_ROW = 11;
const MARKER_WIDTH = 16;

/**
 * The row of each marker's number (markers at `xs`, in order): the first row whose last number
 * ends left of it, so that markers close in time stack instead of printing over each other.
 */
export function markerRows(xs: readonly number[]): number[] {
  const ends: number[] = [];
  return xs.map((x) => {
    let row = ends.findIndex((end) => end <= x);
    if (row < 0) row = ends.length;
    ends[row] = x + MARKER_WIDTH;
    return row;
  });
}

function legend(keys: readonly string[]): string {
  return keys
    .map(
      (k) =>
        `<span class="key"><span class="swatch" style="background:${COLORS[k] ?? '#999'}"></span>${k}</span>`,
    )
    .join(' ');
}

function section(r: DrillReport): string {
  const maxX = Math.max(1000, r.ms, ...r.samples.map((s) => s.atMs));
  // Room states in their order; a drill that samples something else (requests) names its own.
  const seen = (pick: (x: StateSample) => Record<string, number>) => {
    const keys = new Set(r.samples.flatMap((x) => Object.keys(pick(x))));
    const ordered = [...LIVE_STATES, 'completed', 'failed', 'aborted', 'migrated'].filter((k) =>
      keys.has(k),
    );
    return [...ordered, ...[...keys].filter((k) => !ordered.includes(k as never)).sort()];
  };
  const liveKeys = seen((x) => x.live);
  const endKeys = seen((x) => x.terminal);
  const rows = r.invariants
    .map(
      (i) =>
        `<tr class="${i.ok || i.skipped ? 'ok' : 'fail'}"><td>${VERDICT_TEXT[verdictOf(i)]}</td><td>${esc(i.name)}</td><td>${esc(
          Object.entries(i.figure)
            .map(([k, v]) => `${k}=${v}`)
            .join(' '),
        )}</td><td>${esc(i.detail)}</td></tr>`,
    )
    .join('');
  const steps = r.timeline
    .map((t, i) => `<li><b>${i + 1}</b> +${t.atMs} ms — ${esc(t.what)}</li>`)
    .join('');
  const comparison = compareRecovery(r);
  const waited = waitingFigures(r.samples);
  const waiting = waited
    ? `<p>Requests waited with no room: up to <b>${waited.peak}</b> at once; some waited for <b>${waited.ms} ms</b> of the drill in all, the longest stretch from +${waited.longest.fromMs} to +${waited.longest.toMs} ms (<b>${waited.longest.toMs - waited.longest.fromMs} ms</b>).</p>`
    : '<p>No request waited without a room.</p>';
  return `<section>
<h2>${esc(r.scenario)} <span class="${r.passed ? 'ok' : 'fail'}">${r.passed ? 'PASSED' : 'FAILED'}</span></h2>
<p>${esc(r.summary)} — started ${new Date(r.startedAt).toISOString()}, ran ${r.ms} ms${
    r.fullRestartMs === null
      ? ''
      : `; a full-stack restart measured in the same run took <b>${r.fullRestartMs} ms</b> to serve again`
  }.</p>${comparison ? `\n<p><b>${esc(comparison.line)}</b>.</p>` : ''}
${chart(r.samples, liveKeys, (s, k) => s.live[k] ?? 0, true, r.timeline, maxX, 'live rooms by state, and requests waiting with no room')}
<p>${legend(liveKeys)}</p>
${chart(r.samples, endKeys, (s, k) => s.terminal[k] ?? 0, false, r.timeline, maxX, 'rooms ended since the start, by outcome')}
<p>${legend(endKeys)}</p>
${waiting}
<ol class="steps">${steps}</ol>
<table><tr><th></th><th>invariant</th><th>figure</th><th>detail</th></tr>${rows}</table>
${afterwards(r)}
</section>`;
}

/** Where its record is, the rooms it cost, what it left out of rotation, and what to run next. */
function afterwards(r: DrillReport): string {
  const ended =
    r.ended === null
      ? '<p>The rooms it failed or moved are in its timeline above.</p>'
      : r.ended.length === 0
        ? '<p>Every client room completed: none failed, moved or was aborted.</p>'
        : `<p>${r.ended.length} client ${r.ended.length === 1 ? 'room' : 'rooms'} did not complete:</p>
<table><tr><th>room</th><th>ended</th><th>why</th></tr>${r.ended
            .slice(0, 50)
            .map(
              (e) =>
                `<tr><td><code>${esc(e.room)}</code></td><td>${e.state}</td><td>${esc(e.why)}</td></tr>`,
            )
            .join(
              '',
            )}</table>${r.ended.length > 50 ? `<p>and ${r.ended.length - 50} more (the first command below lists them all).</p>` : ''}`;
  const left =
    r.leftBehind === null
      ? ''
      : r.leftBehind.length === 0
        ? '<p>It left every engine in rotation.</p>'
        : `<p>It left out of rotation: ${r.leftBehind
            .map(
              (e) =>
                `<b>${esc(e.engine)}</b> ${esc(e.what)}${e.undo ? '' : ' (it comes back by itself when a canary through it passes)'}`,
            )
            .join('; ')}.</p>`;
  return `<h3>Afterwards</h3>
<p>Its journal: <code>${esc(r.journal)}</code>${r.url !== null ? `, served at <code>${esc(r.url)}</code>` : ''}.</p>
${ended}
${left}
<p>What to run next${r.url === null && r.leftBehind?.some((e) => e.undo !== null) ? ' (URL: a <code>pdctl serve</code> on this journal, which keeps the cordon: it is journaled)' : ''}:</p>
<pre>${nextCommands(r).map(esc).join('\n')}</pre>`;
}

export function renderHtml(reports: DrillReport[]): string {
  const passed = reports.filter((r) => r.passed).length;
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pdctl drill report</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:960px;color:#222}
h1{font-size:20px} h2{font-size:17px;margin-top:2em;border-top:1px solid #ccc;padding-top:1em}
.ok{color:#1a7f37} .fail{color:#cf222e;font-weight:bold}
table{border-collapse:collapse;width:100%;font-size:13px} td,th{border-bottom:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top}
.key{margin-right:1em;font-size:12px} .swatch{display:inline-block;width:10px;height:10px;margin-right:4px}
ol.steps{list-style:none;padding-left:0;font-size:13px} ol.steps b{display:inline-block;width:1.5em}
h3{font-size:15px;margin-top:1.5em} pre{background:#f6f8fa;padding:8px;font-size:12px;overflow-x:auto}
</style></head><body>
<h1>pdctl drill report: ${passed} of ${reports.length} passed</h1>
${reports.map(section).join('\n')}
</body></html>
`;
}
