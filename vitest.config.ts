import { availableParallelism } from 'node:os';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    // Crash tests spawn processes and SIGKILL them: give them room on a 2-core CI machine.
    testTimeout: 60_000,
    hookTimeout: 30_000,
    pool: 'forks',
    // Two test files at once at least: vitest's default is a core less than the machine has, so on
    // CI's 2 cores the files ran one at a time, while most of their time is spent waiting on the
    // processes and timers they start (the suite took 983 s one at a time, 680 s two at a time).
    maxWorkers: Math.max(2, availableParallelism() - 1),
    // The compiled build the tests spawn, compiled again if src/ is newer; one PostgreSQL server
    // for the run (tests of the PostgreSQL journal). See the files.
    globalSetup: ['test/helpers/build-setup.ts', 'test/helpers/postgres-setup.ts'],
    // Under .ci/run (or any CI), also write a summary that .ci/run turns into its closing line.
    reporters:
      process.env.CI || process.env.PDCTL_CI_REPORT
        ? ['default', ['json', { outputFile: '.ci/results.json' }]]
        : ['default'],
  },
});
