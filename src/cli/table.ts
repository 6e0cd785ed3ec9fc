/** Plain-text tables for terminals: a header, aligned columns, numbers right-aligned. */

export interface Column<T> {
  header: string;
  value: (row: T) => string | number | null;
  align?: 'left' | 'right';
}

export function renderTable<T>(rows: readonly T[], columns: ReadonlyArray<Column<T>>): string {
  const cells = rows.map((r) =>
    columns.map((c) => {
      const v = c.value(r);
      return v === null || v === undefined ? '-' : String(v);
    }),
  );
  const widths = columns.map((c, i) =>
    Math.max(c.header.length, ...cells.map((row) => (row[i] as string).length)),
  );
  const line = (values: string[]) =>
    values
      .map((v, i) => {
        const right = columns[i]?.align === 'right';
        const w = widths[i] as number;
        return i === values.length - 1 && !right ? v : right ? v.padStart(w) : v.padEnd(w);
      })
      .join('  ')
      .trimEnd();
  return [line(columns.map((c) => c.header)), ...cells.map(line)].join('\n');
}
