import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    // Crash tests spawn processes and SIGKILL them: give them room on a 2-core CI machine.
    testTimeout: 60_000,
    hookTimeout: 30_000,
    pool: 'forks',
    // One PostgreSQL server for the run (tests of the PostgreSQL journal); see the file.
    globalSetup: ['test/helpers/postgres-setup.ts'],
    // Under .ci/run (or any CI), also write a summary that .ci/run turns into its closing line.
    reporters:
      process.env.CI || process.env.PDCTL_CI_REPORT
        ? ['default', ['json', { outputFile: '.ci/results.json' }]]
        : ['default'],
  },
});
