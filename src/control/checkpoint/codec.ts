/**
 * A state checkpoint as the journal stores it: JSON of the start state (state.ts), its sha256 and
 * a format number. Decoding trusts nothing: a checkpoint whose digest does not match, whose format
 * or journal schema is not this pdctl's, whose seq is past the journal's end or whose content is
 * not the shape this code writes is refused with the reason, and the caller rebuilds from the
 * whole journal instead.
 */
import { createHash } from 'node:crypto';
import type { CheckpointInput, JournalReader, StoredCheckpoint } from '../../journal/store.ts';
import { dataError } from '../../room/events.ts';
import type { Cordon } from '../evidence/cordons.ts';
import { type IndexSnapshot, PrefixIndex } from '../routing/prefix-index.ts';
import {
  type Anchor,
  eventIdAt,
  type LastRegistration,
  type Registration,
  StartState,
} from './state.ts';

/** The control plane's checkpoint row. */
export const CHECKPOINT_NAME = 'control';

/**
 * Bumped whenever what the state holds, or how an event folds into it, changes: a checkpoint of
 * another format is ignored (one full rebuild, then checkpoints of this format).
 */
export const CHECKPOINT_FORMAT = 3;

interface Body {
  /**
   * The last registration folded (format 3; state.ts `Anchor`): a checkpoint is this journal's
   * only where that event is (null: none folded yet — then it holds nothing to restore).
   */
  anchor: Anchor | null;
  index: IndexSnapshot;
  cordons: Record<string, Cordon>;
  pools: Registration[];
  registered: Record<string, LastRegistration>;
}

export function digestOf(data: string): string {
  return createHash('sha256').update(data).digest('hex');
}

/** The state as a row for `setCheckpoint`; `index` is the prefix index folded through the same seq. */
export function encodeCheckpoint(state: StartState, index: PrefixIndex): CheckpointInput {
  const body: Body = {
    anchor: state.anchor,
    index: index.snapshot(),
    cordons: Object.fromEntries(state.cordons),
    pools: [...state.pools.values()],
    registered: Object.fromEntries(state.registered),
  };
  const data = JSON.stringify(body);
  return {
    name: CHECKPOINT_NAME,
    seq: state.seq,
    format: CHECKPOINT_FORMAT,
    digest: digestOf(data),
    data,
  };
}

/** The state a stored checkpoint holds, or why it is not to be trusted. */
export function decodeCheckpoint(
  stored: StoredCheckpoint,
  headSeq: number,
): { state: StartState } | { ignored: string } {
  if (stored.format !== CHECKPOINT_FORMAT)
    return {
      ignored: `it is of format ${stored.format} and this pdctl reads format ${CHECKPOINT_FORMAT}`,
    };
  if (stored.schemaVersion > stored.currentSchemaVersion)
    return {
      ignored: `it was written under journal schema ${stored.schemaVersion}, newer than the journal's ${stored.currentSchemaVersion} (a journal restored from an older copy?)`,
    };
  if (stored.brokenBy !== null)
    return {
      ignored: `journal migration ${stored.brokenBy}, applied since it was written (under schema ${stored.schemaVersion}), changed what events read back`,
    };
  if (digestOf(stored.data) !== stored.digest)
    return { ignored: 'its data does not match its sha256 digest (damaged)' };
  if (!Number.isSafeInteger(stored.seq) || stored.seq < 0 || stored.seq > headSeq)
    return {
      ignored: `it holds the state at seq ${stored.seq} but the journal ends at seq ${headSeq} (a journal restored from an older copy?)`,
    };
  let body: unknown;
  try {
    body = JSON.parse(stored.data);
  } catch (err) {
    return { ignored: `its data is not JSON (${(err as Error).message})` };
  }
  const wrong = shapeError(body);
  if (wrong) return { ignored: `its data is not a format-${CHECKPOINT_FORMAT} state: ${wrong}` };
  const b = body as Body;
  if (b.anchor === null && (b.pools.length > 0 || Object.keys(b.cordons).length > 0))
    return { ignored: 'it names no registration, so it is bound to no journal' };
  const pools = new Map(b.pools.map((ev) => [ev.engine as string, ev]));
  const state = new StartState(
    stored.seq,
    PrefixIndex.from(b.index),
    new Map(Object.entries(b.cordons)),
    pools,
    new Map(Object.entries(b.registered)),
  );
  state.anchor = b.anchor;
  return { state };
}

/**
 * The state a stored checkpoint holds if it can be trusted here: `decodeCheckpoint`'s checks,
 * and the journal's own event at its seq is the one it was folded through — a checkpoint copied
 * from another journal (or left by one restored from an older copy) is not this journal's fold.
 */
export async function trustCheckpoint(
  journal: Pick<JournalReader, 'readFrom'>,
  stored: StoredCheckpoint,
  headSeq: number,
): Promise<{ state: StartState } | { ignored: string }> {
  const decoded = decodeCheckpoint(stored, headSeq);
  if ('ignored' in decoded) return decoded;
  const anchor = decoded.state.anchor;
  if (anchor === null) return decoded;
  const here = await eventIdAt(journal, anchor.seq);
  if (here === null)
    return {
      ignored: `this journal holds no event at seq ${anchor.seq}, where its registration ${anchor.id} was (retention keeps registrations: a journal edited, or restored from another copy?)`,
    };
  if (here !== anchor.id)
    return {
      ignored: `it was taken from another journal: its registration at seq ${anchor.seq} is ${anchor.id}, this journal's event there is ${here}`,
    };
  return decoded;
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

function shapeError(body: unknown): string | null {
  if (!isObject(body)) return 'not an object';
  const { anchor, index, cordons, pools, registered } = body;
  if (
    !(
      anchor === null ||
      (isObject(anchor) && Number.isSafeInteger(anchor.seq) && typeof anchor.id === 'string')
    )
  )
    return '`anchor` is not { seq, id } of a registration';
  if (!isObject(index)) return '`index` is not an object';
  for (const [engine, h] of Object.entries(index)) {
    if (
      !isObject(h) ||
      !(h.incarnation === null || typeof h.incarnation === 'string') ||
      !Array.isArray(h.blocks) ||
      !h.blocks.every((b) => typeof b === 'string')
    )
      return `index entry of ${engine} is not { incarnation, blocks: string[] }`;
  }
  if (!isObject(cordons)) return '`cordons` is not an object';
  for (const [engine, c] of Object.entries(cordons)) {
    if (
      !isObject(c) ||
      typeof c.reason !== 'string' ||
      typeof c.by !== 'string' ||
      !(c.evidence === null || typeof c.evidence === 'string') ||
      typeof c.at !== 'number'
    )
      return `cordon of ${engine} is not { reason, by, evidence, at }`;
  }
  if (!Array.isArray(pools)) return '`pools` is not an array';
  for (const ev of pools) {
    if (
      !isObject(ev) ||
      ev.type !== 'engine.registered' ||
      typeof ev.engine !== 'string' ||
      typeof ev.seq !== 'number'
    )
      return 'a pool is not an engine.registered event';
    const wrong = dataError('engine.registered', ev.data);
    if (wrong) return `the pool of ${ev.engine}: ${wrong}`;
  }
  if (!isObject(registered)) return '`registered` is not an object';
  for (const [engine, r] of Object.entries(registered)) {
    if (!isObject(r) || typeof r.incarnation !== 'string' || typeof r.seq !== 'number')
      return `the registration of ${engine} is not { incarnation, seq }`;
  }
  return null;
}
