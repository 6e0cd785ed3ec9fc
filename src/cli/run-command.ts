/** `pdctl run "prompt"`: starts the whole stack, streams one completion, and exits — a smoke test. */
import type { Command } from 'commander';
import { Option } from 'commander';
import { startStack } from '../app/stack.ts';
import { ControlError } from '../control/errors.ts';
import { RoomEndedError } from '../control/intake/streams.ts';
import { DURABILITIES, type Durability } from '../journal/store.ts';
import { LOG_LEVELS, type LogLevel, processLogger } from '../log.ts';
import { engineShapeArgs, engineShapeOptions, intArg } from './args.ts';
import { DEFAULT_JOURNAL, EXIT, note, printJson, VERSION } from './context.ts';
import { openModelInfo, withThreads } from './model.ts';

export function registerRunCommand(program: Command): void {
  const command = program
    .command('run')
    .description(
      'Start the control plane with one prefill and one decode engine, stream one completion to the ' +
        'terminal, and stop. Every step of the room is journaled: look at it afterwards with `pdctl room <id>`.',
    )
    .argument('<prompt>', 'the prompt')
    .option('--max-tokens <n>', 'tokens to generate', intArg('--max-tokens', 1), 32)
    .addOption(
      new Option('--journal <path>', 'journal file (env PDCTL_JOURNAL)').default(DEFAULT_JOURNAL),
    )
    .addOption(
      new Option(
        '--durability <mode>',
        'process or power (see docs/journal.md, "Durability")',
      ).choices([...DURABILITIES]),
    )
    .option('--json', 'print the result as JSON instead of streaming text');
  engineShapeOptions(command)
    .addOption(
      new Option('--log-level <level>', 'log level of the control plane and engines')
        .choices([...LOG_LEVELS])
        .default('warn'),
    )
    .addHelpText(
      'after',
      '\nExamples:\n  pdctl run "the river carries the light" --max-tokens 16\n  pdctl run --model data/tiny.gguf "the river carries the light"   (greedy)',
    )
    .action(async (prompt: string, o: Record<string, unknown>) => {
      const log = processLogger('control', o.logLevel as LogLevel);
      const started = Date.now();
      const model = await openModelInfo(o, log);
      const stack = await startStack({
        journalPath: o.journal as string,
        model,
        engineArgs: engineShapeArgs(withThreads(o, 2)),
        durability: o.durability as Durability | undefined,
        log,
        version: VERSION,
        engineLogLevel: o.logLevel as string,
        restartEngines: false,
      });
      const ac = new AbortController();
      const onSignal = () => ac.abort();
      process.once('SIGINT', onSignal);
      process.once('SIGTERM', onSignal);
      try {
        const stream = stack.control.submit({
          prompt,
          maxTokens: o.maxTokens as number,
          signal: ac.signal,
        });
        if (!o.json) note(`room ${stream.room} (stack up in ${Date.now() - started} ms)`);
        for await (const chunk of stream) if (!o.json) process.stdout.write(chunk.text);
        const result = await stream.result;
        if (o.json) printJson(result);
        else {
          process.stdout.write('\n');
          note(
            `${result.tokens} tokens, ${result.finishReason}, ${result.ms} ms · pdctl room ${result.room} --journal ${o.journal as string}`,
          );
        }
      } catch (err) {
        if (err instanceof RoomEndedError) {
          note(`pdctl: ${err.message}`);
          process.exitCode = ac.signal.aborted ? EXIT.interrupted : EXIT.problem;
        } else if (err instanceof ControlError && err.code !== 'CONTROL_INTERNAL') {
          // Refused, in the words a client is given: as asked (too long for the context, …) it
          // is a usage error; otherwise the stack could not take it now.
          note(`pdctl: refused: ${err.message}`);
          const asked =
            err.code === 'CONTROL_BAD_REQUEST' || err.code === 'CONTROL_CONTEXT_LENGTH_EXCEEDED';
          process.exitCode = asked ? EXIT.usage : EXIT.problem;
        } else throw err;
      } finally {
        process.off('SIGINT', onSignal);
        process.off('SIGTERM', onSignal);
        await stack.stop();
      }
    });
}
