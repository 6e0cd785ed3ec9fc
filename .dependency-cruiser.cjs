/**
 * The architecture check (`npm run lint` runs it): the layers of src/ from the bottom up, and the
 * rules between them. A module may import from its own layer and the layers below, never above;
 * there are no import cycles; and only the journal itself, the composition root and the journal
 * administration commands name a backend (SQLite, PostgreSQL). docs/design.md ("Layers") explains each layer.
 * Tests are left out: they assemble parts on purpose. Benchmarks are held to the backend rule.
 */
/** [layer, rank, path]: a layer may import from lower ranks; layers of one rank are siblings. */
const LAYERS = [
  ['base', 0, '^src/((errors|log|net|pids|time)\\.ts$|ports/)'],
  ['room', 1, '^src/room/'],
  ['journal', 2, '^src/journal/'],
  ['transfer', 3, '^src/transfer/'],
  ['model', 3, '^src/model/'],
  ['planner', 3, '^src/planner/'],
  ['tenants', 3, '^src/tenants/'],
  ['bus', 4, '^src/bus/'],
  ['engine', 5, '^src/engine/'],
  ['control', 5, '^src/control/'],
  ['recovery', 6, '^src/recovery/'],
  ['api', 7, '^src/api/'],
  ['app', 8, '^src/app/'],
  ['drills', 9, '^src/drills/'],
  ['sim', 9, '^src/sim/'],
  ['cli', 10, '^src/cli/'],
];

const layerRules = LAYERS.flatMap(([name, rank, from]) => {
  const above = LAYERS.filter(([, r]) => r > rank);
  const beside = LAYERS.filter(([n, r]) => r === rank && n !== name);
  return [
    above.length > 0 && {
      name: `no-upward-from-${name}`,
      comment: `${name} sits below ${above.map(([n]) => n).join(', ')}: it may not import from them`,
      severity: 'error',
      from: { path: from },
      to: { path: above.map(([, , p]) => p) },
    },
    beside.length > 0 && {
      name: `no-sideways-from-${name}`,
      comment: `${name} and ${beside.map(([n]) => n).join(', ')} are siblings: neither imports the other`,
      severity: 'error',
      from: { path: from },
      to: { path: beside.map(([, , p]) => p) },
    },
  ].filter(Boolean);
});

module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      comment: 'an import cycle: break it by moving the shared part down a layer',
      severity: 'error',
      from: {},
      to: { circular: true },
    },
    {
      name: 'backends-only-behind-the-journal',
      comment:
        'only src/journal/, the composition root (src/app/), the journal administration commands (src/cli/journal/) and the journal benchmarks name a backend (SQLite, PostgreSQL); everything else holds a JournalStore or JournalReader',
      severity: 'error',
      from: {
        path: '^(src|bench)/',
        // bench/journal.ts measures each backend itself against its raw database, and
        // bench/inline-writer.ts the SQLite writer's own work (bench:journal and bench:engines),
        // bench/retention.ts SQLite's packing beside retention (bench:retention); the simulator's
        // storage (src/sim/storage.ts) is its composition root for `--journal sqlite`.
        pathNot: [
          '^src/journal/',
          '^src/app/',
          '^src/sim/storage\\.ts$',
          '^src/cli/journal/',
          '^bench/journal(-postgres)?\\.ts$',
          '^bench/inline-writer\\.ts$',
          '^bench/retention\\.ts$',
        ],
      },
      to: { path: '^src/journal/(sqlite|postgres)/' },
    },
    {
      name: 'engines-and-wires-never-name-the-journal',
      comment:
        'engine, transfer, bus, planner and tenants act on the room (src/room/) and are handed what they need of the journal by the composition root; none of them imports src/journal/',
      severity: 'error',
      from: { path: '^src/(engine|transfer|bus|planner|tenants)/' },
      to: { path: '^src/journal/' },
    },
    ...layerRules,
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: ['\\.test\\.ts$', '^test/', '^scripts/', '^native/'] },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: { extensions: ['.ts', '.js'] },
  },
};
