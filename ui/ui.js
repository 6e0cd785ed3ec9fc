// The live page of `pdctl serve` (/ui): engines with their ladder state and pages, rooms in flight
// by state, the journal as it is committed, and a room's timeline on click. It reads only the
// public query routes (/v1/engines, /v1/live, /v1/rooms, /v1/journal?follow=1, /health/ready),
// so what it shows is what `pdctl engines`, `pdctl rooms` and `pdctl journal tail` show.
// Plain DOM, no framework, nothing loaded from elsewhere; text is set with textContent only.

const POLL_MS = 1000;
const JOURNAL_KEEP = 500;
const STATE_COLORS = {
  created: '#8a94a0',
  bootstrapping: '#a371f7',
  waiting_for_input: '#db61a2',
  prefilling: '#58a6ff',
  transferring: '#d29922',
  transferred: '#e3b341',
  decoding: '#3fb950',
  completed: '#2ea043',
  aborted: '#f0883e',
  failed: '#f85149',
  migrated: '#79c0ff',
};

const $ = (selector) => document.querySelector(selector);

/** An element with attributes and children (strings become text nodes). */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'style') Object.assign(el.style, v);
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// With PDCTL_ADMIN_TOKEN set, the query routes need it: asked for once, kept for this tab only.
const TOKEN_KEY = 'pdctl-admin-token';
let tokenAsked = false;

// Marks the page's requests (the server's access log writes them at debug level), with the token.
function headers() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return { 'x-pdctl-client': 'ui', ...(token ? { authorization: `Bearer ${token}` } : {}) };
}

async function api(path) {
  const r = await fetch(path, { cache: 'no-store', headers: headers() });
  if (r.status !== 401 || tokenAsked) return r;
  tokenAsked = true;
  const token = window.prompt(
    'This pdctl serve has an admin token (PDCTL_ADMIN_TOKEN): the page needs it to show the engines and rooms.',
  );
  if (!token) return r;
  sessionStorage.setItem(TOKEN_KEY, token.trim());
  return fetch(path, { cache: 'no-store', headers: headers() });
}

async function getJson(path, okStatuses = [200]) {
  const r = await api(path);
  if (!okStatuses.includes(r.status)) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function age(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '-';
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 3_600_000) return `${Math.floor(ms / 60_000)} m ${Math.floor((ms % 60_000) / 1000)} s`;
  return `${(ms / 3_600_000).toFixed(1)} h`;
}

function clock(ts) {
  const d = new Date(ts);
  return `${d.toISOString().slice(11, 23)}Z`;
}

const badgeClass = (value) => {
  if (['ready', 'ok', 'completed', 'live'].includes(value)) return 'badge ok';
  if (['failed', 'gave_up', 'not_ready', 'disconnected', 'aborted'].includes(value))
    return 'badge bad';
  if (
    [
      'resetting',
      'restarting',
      'restarting_stack',
      'fenced',
      'cordoned',
      'ejected',
      'draining',
      'connecting',
      'stale',
      'stalled',
    ].includes(value)
  )
    return 'badge warn';
  return 'badge info';
};

// ---- connection state: the header says when the page last heard from the server ----

const link = { lastOk: 0, error: null };
function markOk() {
  link.lastOk = Date.now();
  link.error = null;
}
function markError(err) {
  link.error = err instanceof Error ? err.message : String(err);
}
function renderLink() {
  const el = $('#link');
  const stale = Date.now() - link.lastOk > 3 * POLL_MS;
  if (link.lastOk === 0 && !link.error) return;
  if (link.error || stale) {
    el.className = 'badge bad';
    el.textContent = `disconnected${link.error ? `: ${link.error}` : ''} — retrying`;
  } else {
    el.className = 'badge ok';
    el.textContent = `live · updated ${age(Date.now() - link.lastOk)} ago`;
  }
}

// ---- engines ----

function renderEngines(engines) {
  const body = $('#engines tbody');
  const rows = engines
    .slice()
    .sort((a, b) => a.id.localeCompare(b.id))
    .map((e) => {
      const total = e.totalPages ?? 0;
      const used = e.freePages === null ? null : total - e.freePages;
      const share = used === null || total === 0 ? 0 : used / total;
      const phase = e.recovery?.phase ?? '-';
      const queues = Object.entries(e.queues ?? {})
        .filter(([, n]) => n > 0)
        .map(([q, n]) => `${q} ${n}`)
        .join(' · ');
      return h(
        'tr',
        { 'data-engine': e.id, 'data-phase': phase },
        h('td', {}, e.id),
        h('td', {}, e.role),
        h(
          'td',
          {
            class: 'status',
            title: e.cordon
              ? `cordoned by the ${e.cordon.by}: ${e.cordon.reason}${e.cordon.evidence ? ` — ${e.cordon.evidence}` : ''}; pdctl engines uncordon ${e.id}`
              : `the engine says: ${e.state}`,
          },
          h('span', { class: badgeClass(e.status) }, e.status),
          e.cordon ? h('span', { class: badgeClass('cordoned') }, 'cordoned') : null,
          e.ejection
            ? h('span', { class: badgeClass('ejected'), title: e.ejection.reason }, 'ejected')
            : null,
          // Out of rotation: why and since when, in words, not only on hover.
          e.cordon
            ? h(
                'div',
                { class: 'why', 'data-why': 'cordon' },
                `cordoned by the ${e.cordon.by} ${age(Date.now() - e.cordon.at)} ago: ${e.cordon.reason}`,
              )
            : null,
          e.ejection
            ? h(
                'div',
                { class: 'why', 'data-why': 'ejection' },
                `ejected ${age(Date.now() - e.ejection.since)} ago: ${e.ejection.reason}`,
              )
            : null,
        ),
        h('td', { class: 'ladder' }, h('span', { class: badgeClass(phase) }, phase)),
        h('td', { class: 'num' }, age(e.heartbeatAgeMs)),
        h(
          'td',
          { class: 'pages' },
          h(
            'span',
            { class: 'bar' },
            h('span', {
              class: share > 0.95 ? 'bad' : share > 0.8 ? 'warn' : '',
              style: { width: `${(share * 100).toFixed(1)}%` },
            }),
          ),
          used === null ? `- / ${total}` : `${used} / ${total}`,
        ),
        h(
          'td',
          { class: 'host', title: e.host ?? 'the engine did not say' },
          (e.hostTag ?? '-') + (e.kvUcx ? ' +ucx' : ''),
        ),
        h('td', { class: 'transfers muted' }, transfersText(e.transfers)),
        h('td', { class: 'num' }, e.liveRooms),
        h('td', { class: 'muted' }, queues || 'idle'),
        h('td', { class: 'num' }, e.restarts ?? e.recovery?.restarts ?? '-'),
        h('td', { class: 'muted' }, e.recovery?.reason ?? e.recovery?.lastOutcome ?? ''),
      );
    });
  body.replaceChildren(...rows);
  if (rows.length === 0)
    body.replaceChildren(h('tr', {}, h('td', { colspan: 12, class: 'muted' }, 'no engines')));
}

/** "ucx 12 · shm 3": how the KV of an engine's rooms moved, most used first. */
function transfersText(transfers) {
  const parts = Object.entries(transfers ?? {})
    .sort(([, a], [, b]) => b - a)
    .map(([t, n]) => `${t} ${n}`);
  return parts.length > 0 ? parts.join(' · ') : '-';
}

// ---- rooms ----

/** `search`: what was typed in the find box, on the 'found' tab. */
const view = { tab: 'live', selected: null, search: '' };

function renderCounts(live) {
  $('#live-total').textContent = `${live.total} in flight`;
  $('#state-counts').replaceChildren(
    // The server lists every live state, in the state machine's order.
    ...Object.keys(live.counts).map((s) =>
      h(
        'span',
        { class: 'count', 'data-state': s, style: { borderColor: STATE_COLORS[s] } },
        h('b', {}, live.counts[s] ?? 0),
        s,
      ),
    ),
  );
}

function renderRooms(rooms) {
  const now = Date.now();
  const rows = rooms.map((r) =>
    h(
      'tr',
      {
        'data-room': r.room,
        'data-state': r.state,
        class: r.room === view.selected ? 'selected' : '',
        onclick: () => openTimeline(r.room),
      },
      h('td', {}, r.room),
      h('td', {}, h('span', { class: badgeClass(r.state) }, r.state)),
      h('td', { class: 'num' }, r.terminalAt === null ? age(now - r.stateSince) : '-'),
      h('td', {}, r.prefillEngine),
      h('td', {}, r.decodeEngine),
      h('td', { class: 'num' }, r.tokens ?? '-'),
      h('td', {}, r.reason ?? r.finishReason ?? ''),
      h('td', { class: 'muted' }, r.origin),
    ),
  );
  $('#rooms tbody').replaceChildren(...rows);
  $('#rooms-empty').hidden = rows.length > 0;
}

/** The tab's rooms: in flight (they came with the counts), or read from the journal. */
async function roomsForTab(live) {
  if (view.tab === 'live') return live.rooms;
  if (view.tab === 'found') return (await findRooms(view.search)).rooms;
  const q = view.tab === 'failed' ? '&state=failed,aborted' : '';
  return (await getJson(`/v1/rooms?limit=100${q}`)).rooms;
}

for (const [id, tab] of [
  ['#tab-live', 'live'],
  ['#tab-recent', 'recent'],
  ['#tab-failed', 'failed'],
]) {
  $(id).addEventListener('click', () => {
    view.tab = tab;
    for (const b of document.querySelectorAll('.tab')) b.classList.toggle('active', b === $(id));
    $('#room-search').value = '';
    $('#room-search-state').textContent = '';
    void poll();
  });
}

/**
 * The rooms a typed id names: those of a request (its x-request-id; more than one when it
 * migrated), else the room itself (a room id, or the completion id cmpl-<room> a client got).
 */
async function findRooms(text) {
  const id = text.trim().replace(/^(?:chat)?cmpl-(r-.+)$/, '$1');
  const q = `request_id=${encodeURIComponent(id)}&origin=all&limit=100`;
  const page = await getJson(`/v1/rooms?${q}`);
  if (page.rooms.length > 0) return { rooms: page.rooms, what: `request ${id}` };
  // Refused before it had a room: the refusal is all the record holds of it.
  // In the server's words, those of `pdctl room ID` (src/journal/refusal-text.ts).
  const refused = page.refusalText?.[0];
  if (refused) return { rooms: [], what: `request ${id}`, refused };
  const one = await getJson(`/v1/rooms/${encodeURIComponent(id)}`, [200, 400, 404]);
  return { rooms: one.room ? [one.room] : [], what: `room ${id}` };
}

$('#room-search').addEventListener('change', async () => {
  const text = $('#room-search').value.trim();
  if (!text) return;
  view.tab = 'found';
  view.search = text;
  for (const b of document.querySelectorAll('.tab')) b.classList.remove('active');
  const found = await findRooms(text);
  $('#room-search-state').textContent =
    found.rooms.length === 0
      ? found.refused
        ? `${found.what}: ${found.refused}`
        : `nothing found for ${found.what}`
      : `${found.what}: ${found.rooms.length === 1 ? '1 room' : `${found.rooms.length} rooms`}`;
  renderRooms(found.rooms);
  // The oldest room of the request is where it began.
  const first = found.rooms.at(-1);
  if (first) await openTimeline(first.room);
});

// ---- a room's timeline ----

async function openTimeline(room) {
  view.selected = room;
  for (const tr of document.querySelectorAll('#rooms tbody tr'))
    tr.classList.toggle('selected', tr.dataset.room === room);
  const section = $('#timeline-section');
  section.hidden = false;
  $('#timeline-room').textContent = room;
  await renderTimeline(room);
  // It opens below the journal: bring it into view rather than leave it under the fold.
  section.scrollIntoView({ block: 'start' });
}

async function renderTimeline(room) {
  let t;
  try {
    t = await getJson(`/v1/rooms/${encodeURIComponent(room)}`);
  } catch (err) {
    $('#timeline-summary').replaceChildren(h('span', { class: 'muted' }, String(err.message)));
    return;
  }
  if (view.selected !== room) return;
  const r = t.room;
  const field = (name, value) => h('span', {}, h('b', { class: 'label' }, name), value ?? '-');
  const fields = [
    field('state', r ? h('span', { class: badgeClass(r.state) }, r.state) : 'unknown'),
    field('created', r ? new Date(r.createdAt).toISOString() : null),
    field('prefill', r?.prefillEngine),
    field('decode', r?.decodeEngine),
    field('prompt tokens', r?.promptTokens),
    field('tokens', r?.tokens),
    field('reason', r?.reason ?? r?.finishReason),
    field('origin', r?.origin),
    field('request', r?.requestId),
    r?.migratedFrom ? field('migrated from', r.migratedFrom) : null,
    r?.migratedTo ? field('migrated to', r.migratedTo) : null,
  ];
  $('#timeline-summary').replaceChildren(...fields.filter((f) => f !== null));
  // A terminal state has no duration: it shows as a narrow mark at the end.
  const spanMs = (s) => s.ms ?? (r?.terminalAt != null ? 0 : Date.now() - s.from);
  const total = t.spans.reduce((n, s) => n + spanMs(s), 0) || 1;
  $('#timeline-spans').replaceChildren(
    ...t.spans.map((s) => {
      const ms = spanMs(s);
      const mark = r?.terminalAt != null && s.ms === null;
      return h(
        'div',
        {
          'data-state': s.state,
          title: `${s.state}: ${age(ms)}`,
          style: {
            flex: mark ? '0 0 auto' : `${ms / total} 1 0`,
            background: STATE_COLORS[s.state],
          },
        },
        mark ? s.state : `${s.state} ${age(ms)}`,
      );
    }),
  );
  const t0 = t.events[0]?.ts ?? 0;
  $('#timeline tbody').replaceChildren(
    ...t.events.map((e) =>
      h(
        'tr',
        { 'data-type': e.type },
        h('td', { class: 'num' }, e.seq),
        h('td', {}, clock(e.ts)),
        h('td', { class: 'num' }, e.ts - t0),
        h('td', {}, e.type),
        h('td', {}, e.engine ?? '-'),
        h('td', { class: 'data' }, briefData(e.data)),
      ),
    ),
  );
}

/** An event's data as JSON, long arrays (a room's page numbers) cut to their first few. */
function briefData(data) {
  return JSON.stringify(data, (_key, v) =>
    Array.isArray(v) && v.length > 8 ? `[${v.slice(0, 4).join(', ')}, … ${v.length} in all]` : v,
  );
}

$('#timeline-close').addEventListener('click', () => {
  view.selected = null;
  $('#timeline-section').hidden = true;
  for (const tr of document.querySelectorAll('#rooms tbody tr')) tr.classList.remove('selected');
});

// ---- the journal, followed live ----

const journal = { events: [], lastSeq: 0, paused: false, filter: '', canary: false };
/** Rooms the health canary made (their room.created's source): left out of the pane unless asked. */
const canaryRooms = new Set();

function eventItem(e, fresh) {
  const family = e.type.startsWith('room.') ? e.type.slice(5) : e.type.split('.')[0];
  const data = JSON.stringify(e.data);
  return h(
    'li',
    {
      'data-seq': e.seq,
      'data-type': e.type,
      'data-room': e.room ?? null,
      'data-canary': canaryRooms.has(e.room) ? '' : null,
      class: `type-${family}${fresh ? ' fresh' : ''}`,
      title: data,
      onclick: e.room ? () => openTimeline(e.room) : null,
    },
    // Columns of their own: the data gives way to a narrow pane, never the room or the engine.
    h('span', { class: 'seq' }, String(e.seq)),
    h('span', { class: 'ts' }, clock(e.ts)),
    h('span', { class: 'type' }, e.type),
    h('span', { class: 'room' }, e.room ?? '-'),
    h('span', { class: 'engine' }, e.engine ?? '-'),
    h('span', { class: 'data' }, data.length > 160 ? `${data.slice(0, 160)}…` : data),
  );
}

const matchesFilter = (e) => {
  if (!journal.canary && canaryRooms.has(e.room)) return false;
  const f = journal.filter;
  return !f || e.type.includes(f) || (e.room ?? '').includes(f) || (e.engine ?? '').includes(f);
};

function renderJournal(fresh = new Set()) {
  const shown = journal.events.filter(matchesFilter).slice(-200).reverse();
  $('#journal').replaceChildren(...shown.map((e) => eventItem(e, fresh.has(e.seq))));
}

function addEvents(events) {
  const fresh = new Set();
  for (const e of events) {
    if (e.seq <= journal.lastSeq) continue;
    if (e.type === 'room.created' && e.source === 'canary') canaryRooms.add(e.room);
    journal.events.push(e);
    journal.lastSeq = e.seq;
    fresh.add(e.seq);
    if (e.room && e.room === view.selected) void renderTimeline(e.room);
  }
  if (journal.events.length > JOURNAL_KEEP) {
    journal.events.splice(0, journal.events.length - JOURNAL_KEEP);
    const kept = new Set(journal.events.map((e) => e.room));
    for (const room of canaryRooms) if (!kept.has(room)) canaryRooms.delete(room);
  }
  if (!journal.paused && fresh.size > 0) renderJournal(fresh);
}

async function followJournal() {
  for (;;) {
    try {
      // The first time, the newest 100 (they come newest first); after a drop, what was missed.
      const url =
        journal.lastSeq === 0
          ? '/v1/journal?follow=1&limit=100'
          : `/v1/journal?follow=1&after_seq=${journal.lastSeq}&limit=1000`;
      const r = await api(url);
      if (!r.ok || !r.body) throw new Error(`journal: HTTP ${r.status}`);
      $('#journal-state').textContent = 'following';
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buffer = '';
      let first = journal.lastSeq === 0;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        const lines = buffer.split('\n');
        buffer = lines.pop() ?? '';
        const events = lines.filter((l) => l.trim()).map((l) => JSON.parse(l));
        if (first) {
          events.sort((a, b) => a.seq - b.seq);
          first = false;
        }
        addEvents(events);
      }
    } catch (err) {
      $('#journal-state').textContent = `reconnecting (${err.message})`;
    }
    await sleep(1000);
  }
}

$('#journal-filter').addEventListener('input', (ev) => {
  journal.filter = ev.target.value.trim();
  renderJournal();
});
$('#journal-canary').addEventListener('change', (ev) => {
  journal.canary = ev.target.checked;
  renderJournal();
});
$('#journal-pause').addEventListener('click', (ev) => {
  journal.paused = !journal.paused;
  ev.target.textContent = journal.paused ? 'resume' : 'pause';
  $('#journal-state').textContent = journal.paused ? 'paused (still receiving)' : 'following';
  if (!journal.paused) renderJournal();
});

// ---- the poll: engines, rooms, readiness ----

/**
 * Requests refused in the last five minutes before they had a room (429, 503), by reason: while
 * clients get 503s there may be no room in flight at all, and the page must say so.
 */
async function recentRefusals() {
  const r = await api('/v1/journal?type=request.refused&since=5m&limit=1000');
  if (!r.ok) throw new Error(`refusals: HTTP ${r.status}`);
  const byReason = {};
  for (const line of (await r.text()).split('\n')) {
    if (!line.trim()) continue;
    const d = JSON.parse(line).data;
    byReason[`${d.status} ${d.reason}`] = (byReason[`${d.status} ${d.reason}`] ?? 0) + d.count;
  }
  return byReason;
}

function renderRefused(byReason) {
  const parts = Object.entries(byReason).map(([what, n]) => `${n} × ${what}`);
  const el = $('#refused');
  el.hidden = parts.length === 0;
  el.textContent = parts.length ? `refused in the last 5 min: ${parts.join(' · ')}` : '';
}

async function poll() {
  try {
    // One read of /v1/live gives the counts and, on its tab, the rooms.
    const [engines, live, ready, refused] = await Promise.all([
      getJson('/v1/engines'),
      getJson(`/v1/live?limit=${view.tab === 'live' ? 200 : 0}`),
      getJson('/health/ready', [200, 503]),
      recentRefusals(),
    ]);
    renderRefused(refused);
    const rooms = await roomsForTab(live);
    renderEngines(engines.engines);
    renderCounts(live);
    renderRooms(rooms);
    const readyEl = $('#ready');
    // Ready, with engines out of rotation: ready still, and it says which are out.
    const out = engines.engines
      .filter((e) => e.cordon || e.ejection)
      .sort((a, b) => a.id.localeCompare(b.id));
    readyEl.className =
      ready.status === 'ready' && out.length > 0 ? 'badge warn' : badgeClass(ready.status);
    readyEl.textContent =
      (ready.status === 'ready' ? 'ready' : 'not ready') +
      (out.length > 0
        ? ` · ${out.map((e) => `${e.id} ${e.cordon ? 'cordoned' : 'ejected'}`).join(', ')}`
        : '');
    $('#ready-detail').textContent = Object.entries(ready.checks)
      .filter(([, c]) => !c.ok)
      .map(([name, c]) => `${name}: ${c.detail}`)
      .join(' · ');
    markOk();
  } catch (err) {
    markError(err);
  }
  renderLink();
}

async function loadModel() {
  try {
    const models = await getJson('/v1/models');
    $('#model').textContent = models.data.map((m) => m.id).join(', ');
  } catch {
    $('#model').textContent = '';
  }
}

void loadModel();
void followJournal();
void poll();
setInterval(() => void poll(), POLL_MS);
setInterval(renderLink, 250);
