/**
 * The room's one coded error: an event that is not one of the room's (type, ids, data). The
 * journal, which validates at its boundary, answers it as `JOURNAL_INVALID_EVENT`.
 */
import { codedErrors } from '../errors.ts';

export const ROOM_ERROR_CODES = ['ROOM_INVALID_EVENT'] as const;

export type RoomErrorCode = (typeof ROOM_ERROR_CODES)[number];

export class RoomError extends codedErrors('RoomError', ROOM_ERROR_CODES, 'ROOM_INVALID_EVENT') {}
