/**
 * `npm run bench:journal -- --backend postgres`: append throughput and latency of the PostgreSQL
 * journal at both durability levels, against bare PostgreSQL inserts into the same `events` table
 * measured in the same run on the same server — one row per transaction (what a lone appender
 * cannot beat) and rows batched as the journal batched them (what group commit cannot beat).
 *
 *   npm run bench:journal -- --backend postgres                 # a throwaway cluster (initdb, fsync on)
 *   npm run bench:journal -- --backend postgres --url postgres://user@host/db   # a server (user needs CREATEDB)
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { createDatabase, type PgCluster, startPgCluster } from '../src/journal/postgres/cluster.ts';
import { PgJournal } from '../src/journal/postgres/journal.ts';
import { PG_MIGRATIONS_DIR } from '../src/journal/postgres/migrate.ts';
import type { Durability } from '../src/journal/store.ts';
import { completedRoomEvents } from '../src/journal/synth.ts';
import { eventKey } from '../src/room/event-keys.ts';
import { uuidv7 } from '../src/room/ids.ts';
import { type AppendRun, appendRun, percentile } from './append-run.ts';

export async function postgresBench(opts: {
  asJson: boolean;
  quick: boolean;
  /** An admin URL of a running cluster; without it, a throwaway one. */
  url: string | undefined;
}): Promise<void> {
  const { asJson, quick } = opts;
  const seconds = quick ? 1.5 : 4;
  const say = (s: string) => {
    if (!asJson) process.stderr.write(`${s}\n`);
  };
  let cluster: PgCluster | null = null;
  let admin = opts.url ?? process.env.PDCTL_BENCH_POSTGRES;
  if (!admin) {
    say('starting a throwaway PostgreSQL cluster (initdb, fsync on) on a loopback port');
    cluster = await startPgCluster();
    admin = cluster.url;
  }
  let n = 0;
  const fresh = () => createDatabase(admin as string, `pdctl_bench_${Date.now()}_${n++}`);
  try {
    const server = new pg.Client({ connectionString: admin });
    await server.connect();
    const version = (
      await server.query<{ v: string }>("SELECT current_setting('server_version') AS v")
    ).rows[0]?.v;
    await server.end();

    const runs: AppendRun[] = [];
    for (const durability of ['power', 'process'] as const) {
      for (const appenders of [1, 256]) {
        say(`append: ${durability}, ${appenders} appender(s), ${seconds}s`);
        runs.push(
          await appendRun(
            await PgJournal.open({ url: await fresh(), durability }),
            durability,
            appenders,
            seconds,
          ),
        );
      }
    }
    const bare: Record<string, { lonePerSec: number; loneP50Ms: number; batchedPerSec: number }> =
      {};
    for (const durability of ['power', 'process'] as const) {
      const batch = Math.max(
        1,
        Math.round(
          runs.find((r) => r.durability === durability && r.appenders === 256)?.avgBatch ?? 100,
        ),
      );
      say(`bare inserts: ${durability}, one row per transaction and ${batch} rows per transaction`);
      bare[durability] = await bareInserts(await fresh(), durability, batch, seconds);
    }
    const rows = runs.map((r) => {
      const b = bare[r.durability] as (typeof bare)[string];
      const baseline = r.appenders === 1 ? b.lonePerSec : b.batchedPerSec;
      return {
        ...r,
        bareRowsPerSec: baseline,
        bareKind: r.appenders === 1 ? 'one row per transaction' : 'rows batched as the journal did',
        ratioToBare: Number((r.appendsPerSec / baseline).toFixed(3)),
      };
    });
    const result = {
      backend: 'postgres',
      server: version,
      secondsPerRun: seconds,
      append: rows,
      bare,
    };
    if (asJson) {
      process.stdout.write(`${JSON.stringify(result)}\n`);
      return;
    }
    const pad = (s: string | number, w: number) => String(s).padStart(w);
    const lines = [
      `pdctl journal benchmark — PostgreSQL ${version}${cluster ? ' (throwaway cluster on this machine, fsync on)' : ''}, ${seconds}s per append run`,
      '',
      '| durability | appenders | appends/s | bare inserts rows/s | bare is | ratio | p50 ms | p99 ms | avg batch | loop delay p99 ms |',
      '|---|---:|---:|---:|---|---:|---:|---:|---:|---:|',
      ...rows.map(
        (r) =>
          `| ${r.durability} | ${pad(r.appenders, 3)} | ${pad(r.appendsPerSec, 7)} | ${pad(r.bareRowsPerSec, 7)} | ${r.bareKind} | ${r.ratioToBare.toFixed(2)} | ${r.p50Ms.toFixed(3)} | ${r.p99Ms.toFixed(3)} | ${r.avgBatch} | ${r.loopDelayP99Ms.toFixed(2)} |`,
      ),
      '',
      ...(['power', 'process'] as const).map((d) => {
        const b = bare[d] as (typeof bare)[string];
        const lone = runs.find((r) => r.durability === d && r.appenders === 1) as AppendRun;
        return `${d}: a bare one-row INSERT commits in ${b.loneP50Ms.toFixed(3)} ms (p50); a lone append takes ${lone.p50Ms.toFixed(3)} ms (${(lone.p50Ms / b.loneP50Ms).toFixed(2)}×: validation, the group-commit turn, and the room's row written in the same statement)`;
      }),
    ];
    process.stdout.write(`${lines.join('\n')}\n`);
  } finally {
    cluster?.stop();
  }
}

/** Bare inserts into the journal's own `events` table (same columns, indexes and settings). */
async function bareInserts(
  url: string,
  durability: Durability,
  batch: number,
  seconds: number,
): Promise<{ lonePerSec: number; loneP50Ms: number; batchedPerSec: number }> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    // The table as the journal has it: schema 1, and schema 4's event keys (journal/event-keys.ts).
    for (const file of ['0001_initial.sql', '0004_event_keys.sql'])
      await c.query(readFileSync(join(PG_MIGRATIONS_DIR, file), 'utf8'));
    await c.query(`SET synchronous_commit = ${durability === 'power' ? 'on' : 'off'}`);
    const data = JSON.stringify(completedRoomEvents('r')[5]?.data);
    let seq = 0;
    const row = () => {
      seq++;
      return [
        seq,
        Date.now(),
        'room.transfer_completed',
        `r-${seq >> 3}`,
        'p0',
        'p0',
        eventKey(uuidv7(), 'p0'),
        data,
        1,
      ];
    };
    // One row per transaction (autocommit), as a lone appender needs.
    const lat: number[] = [];
    let t0 = performance.now();
    while (performance.now() - t0 < seconds * 1000) {
      const t = performance.now();
      await c.query(
        'INSERT INTO events (seq, ts, type, room, engine, source, event_id, data, term) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)',
        row(),
      );
      lat.push(performance.now() - t);
    }
    const lonePerSec = Math.round(lat.length / ((performance.now() - t0) / 1000));
    const sorted = Float64Array.from(lat).sort();
    // `batch` rows per transaction in one multi-row statement, as group commit writes them.
    let rows = 0;
    t0 = performance.now();
    while (performance.now() - t0 < seconds * 1000) {
      const cols: unknown[][] = Array.from({ length: 9 }, () => []);
      for (let i = 0; i < batch; i++) {
        row().forEach((v, k) => {
          cols[k]?.push(v);
        });
      }
      await c.query(
        `INSERT INTO events (seq, ts, type, room, engine, source, event_id, data, term)
         SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::text[], $9::bigint[])`,
        cols,
      );
      rows += batch;
    }
    const batchedPerSec = Math.round(rows / ((performance.now() - t0) / 1000));
    return { lonePerSec, loneP50Ms: Number(percentile(sorted, 50).toFixed(3)), batchedPerSec };
  } finally {
    await c.end();
  }
}
