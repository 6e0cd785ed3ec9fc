/**
 * Layouts of packed data (PostgreSQL schema 7, migrations/postgres/0007_event_layouts.sql): an
 * object's text with each top-level value as `%s`, kept once in its shape, so that a pack holds
 * an event's values without their key names. The `events` view fills a layout with format(); the
 * readers here.
 */
import { parseObject } from '../../packs.ts';

/** An object's text as a layout and its values (a JSON array), or null where it is not laid out. */
export function layOut(text: string): { layout: string; values: string } | null {
  const data = parseObject(text);
  if (data === null) return null;
  const keys = Object.keys(data);
  const layout = `{${keys.map((k) => `${JSON.stringify(k).replaceAll('%', '%%')}:%s`).join(',')}}`;
  const values = keys.map((k) => data[k]);
  // Only text the layout gives back byte for byte (JSON.stringify's, as pdctl writes it).
  if (JSON.stringify(objectOf(keys, values)) !== text) return null;
  return { layout, values: JSON.stringify(values) };
}

/** A layout's keys, in order. */
export function keysOf(layout: string): string[] {
  const blank = layout.replace(/%(%|s)/g, (_, c: string) => (c === '%' ? '%' : '0'));
  return Object.keys(JSON.parse(blank) as object);
}

/** The object a layout's keys and its values make (`__proto__` a key like any other). */
export function objectOf(keys: string[], values: unknown[]): Record<string, unknown> {
  const o = Object.create(null) as Record<string, unknown>;
  for (let i = 0; i < keys.length; i++) o[keys[i] as string] = values[i];
  return o;
}
