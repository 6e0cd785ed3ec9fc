/**
 * A refused request as operators read it, in one wording wherever it is shown: `pdctl room ID`,
 * `pdctl rooms --request-id`, and the /ui page, which shows the text `/v1/rooms` renders with it.
 */
import type { JournalEventOf } from '../room/events.ts';

/**
 * What a refused request's id leads to: `refused at T: 503 engines_draining — message`, and how
 * many were refused for the same reason around it (one `request.refused` event stands for them).
 */
export function describeRefusal(ev: JournalEventOf<'request.refused'>): string {
  const d = ev.data;
  const others =
    d.count > 1
      ? ` (one of ${d.count} refused ${d.reason} from ${new Date(d.firstAt).toISOString()} to ${new Date(d.lastAt).toISOString()})`
      : '';
  return `refused at ${new Date(d.firstAt).toISOString()}: ${d.status} ${d.reason} — ${d.message}${others}`;
}
