/** The tenants a control plane starts with: every `tenant.*` event through the replay's head. */
import { eachEvent, type JournalLog } from '../journal/store.ts';
import { TENANT_EVENT_TYPES, type TenantBook } from '../tenants/book.ts';

/** Folds them into `book`; later ones arrive as commits (commit-stages.ts `tenants`). */
export async function loadTenants(
  journal: Pick<JournalLog, 'tail'>,
  book: TenantBook,
  head: number,
): Promise<void> {
  await eachEvent(journal, { type: [...TENANT_EVENT_TYPES] }, (ev) => {
    if (ev.seq > head) return false;
    book.apply(ev);
    return true;
  });
}
