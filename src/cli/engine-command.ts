/** `pdctl engine`: one prefill or decode engine process (the engine's composition root is src/engine/main.ts). */

import { resolve as resolvePath } from 'node:path';
import type { Command } from 'commander';
import { Option } from 'commander';
import { checkKey } from '../bus/admission.ts';
import { type EngineKeys, startEngine } from '../engine/main.ts';
import {
  ENGINE_DEFAULTS,
  type EngineOptions,
  EngineOptionsError,
  resolveEngineOptions,
} from '../engine/options.ts';
import { UsageError } from '../errors.ts';
import { LOG_FORMATS, LOG_LEVELS, type Logger, type LogLevel, processLogger } from '../log.ts';
import { DeterministicModel } from '../model/deterministic.ts';
import { type EngineModel, pagesFor } from '../model/executor.ts';
import { TransferError } from '../transfer/errors.ts';
import { checkKvDevice, engineShapeOptions, intArg } from './args.ts';

export function registerEngineCommand(program: Command): void {
  const command = program
    .command('engine')
    .description(
      'Run one prefill or decode engine that joins a control plane over the bus. `pdctl serve` and ' +
        '`pdctl run` spawn these themselves; start one by hand to add an engine on another host.',
    )
    .addOption(
      new Option('--role <role>', 'prefill or decode')
        .choices(['prefill', 'decode'])
        .makeOptionMandatory(),
    )
    .requiredOption('--id <id>', 'engine id, unique in the fleet (e.g. decode-3)')
    .requiredOption(
      '--control <endpoints>',
      'control plane bus endpoint, e.g. tcp://10.0.0.5:5557; or, comma-separated, those of every control plane sharing a PostgreSQL journal (the engine follows the leader)',
    );
  engineShapeOptions(command)
    .option(
      '--transfer-threads <n>',
      'transfer core copy threads (prefill)',
      intArg('--transfer-threads'),
      ENGINE_DEFAULTS.transferThreads,
    )
    .option(
      '--prefill-concurrency <n>',
      'rooms prefilled or transferring at once',
      intArg('--prefill-concurrency'),
      ENGINE_DEFAULTS.prefillConcurrency,
    )
    .option(
      '--chunk-tokens <n>',
      'tokens per streamed chunk (decode)',
      intArg('--chunk-tokens'),
      ENGINE_DEFAULTS.chunkTokens,
    )
    .option(
      '--heartbeat-ms <n>',
      'heartbeat interval',
      intArg('--heartbeat-ms'),
      ENGINE_DEFAULTS.heartbeatMs,
    )
    .option(
      '--drain-timeout-ms <n>',
      'how long SIGTERM waits for rooms in flight',
      intArg('--drain-timeout-ms'),
      ENGINE_DEFAULTS.drainTimeoutMs,
    )
    .option(
      '--allow-fault-injection',
      'accept inject_fault commands from the control plane (for drills; never in production)',
      false,
    )
    .option(
      '--insecure-bus',
      'connect without CURVE encryption (the control plane must run with --insecure-bus too); the hello is still signed',
      false,
    )
    .addOption(
      new Option('--log-level <level>', 'log level').choices([...LOG_LEVELS]).default('info'),
    )
    .addOption(
      new Option(
        '--log-format <format>',
        'log lines: json (pino records, ISO times), pretty, auto (pretty on a terminal); env PDCTL_LOG_FORMAT',
      )
        .choices([...LOG_FORMATS])
        .default(process.env.PDCTL_LOG_FORMAT ?? 'auto'),
    )
    .addHelpText(
      'after',
      "\nKeys (required): PDCTL_CURVE_SERVER_KEY (the control plane's public key, printed by `pdctl serve`),\n" +
        "PDCTL_CURVE_PUBLIC_KEY and PDCTL_CURVE_SECRET_KEY (this engine's pair, from `pdctl keys`); the control plane\n" +
        'must allow the public key for this id (`pdctl serve --engine-key ID=PUBLIC`). SIGTERM drains: rooms in flight finish first.\n' +
        'SIGHUP resets the bus connection and the transfer endpoint in place (the escalation ladder sends it).',
    )
    .action(async (o: Record<string, unknown>) => {
      let opts: ReturnType<typeof resolveEngineOptions>;
      try {
        opts = resolveEngineOptions({
          id: o.id,
          role: o.role,
          control: o.control,
          model: o.model === undefined ? null : resolvePath(o.model as string),
          sequences: o.sequences,
          contextSize: o.contextSize ?? null,
          threads: o.threads,
          gpu: o.gpu,
          pages: o.pages,
          pageBytes: o.pageBytes,
          kvBytesPerToken: o.kvBytesPerToken,
          prefillUsPerToken: o.prefillUsPerToken,
          decodeUsPerToken: o.decodeUsPerToken,
          prefillCompute: o.prefillCompute,
          decodeCompute: o.decodeCompute,
          kvDevice: o.kvDevice ?? null,
          kvTransport: o.kvTransport ?? ENGINE_DEFAULTS.kvTransport,
          transferThreads: o.transferThreads,
          prefillConcurrency: o.prefillConcurrency,
          kvBlockTokens: o.kvBlockTokens,
          prefixCachePages: o.prefixCachePages ?? null,
          prefixReuse: o.prefixReuse,
          chunkTokens: o.chunkTokens,
          heartbeatMs: o.heartbeatMs,
          drainTimeoutMs: o.drainTimeoutMs,
          allowFaultInjection: o.allowFaultInjection,
        });
      } catch (err) {
        if (err instanceof EngineOptionsError) throw new UsageError(err.message);
        throw err;
      }
      if (opts.kvDevice !== null) checkKvDevice(opts.kvDevice);
      const env = process.env;
      const missing = [
        'PDCTL_CURVE_SERVER_KEY',
        'PDCTL_CURVE_PUBLIC_KEY',
        'PDCTL_CURVE_SECRET_KEY',
      ].filter((k) => !env[k]);
      if (missing.length > 0) {
        throw new UsageError(
          `${missing.join(', ')} ${missing.length === 1 ? 'is' : 'are'} not set: an engine proves who it is with its key pair (make one with \`pdctl keys\`) and needs the control plane's public key (printed by \`pdctl serve\`); the control plane must allow it with --engine-key ${opts.id}=PUBLIC`,
        );
      }
      let keys: EngineKeys;
      try {
        keys = {
          serverKey: checkKey('PDCTL_CURVE_SERVER_KEY', env.PDCTL_CURVE_SERVER_KEY),
          publicKey: checkKey('PDCTL_CURVE_PUBLIC_KEY', env.PDCTL_CURVE_PUBLIC_KEY),
          secretKey: checkKey('PDCTL_CURVE_SECRET_KEY', env.PDCTL_CURVE_SECRET_KEY),
          curve: o.insecureBus !== true,
        };
      } catch (err) {
        throw new UsageError((err as Error).message);
      }
      if (o.logFormat !== 'auto') process.env.PDCTL_LOG_FORMAT = o.logFormat as string;
      const log = processLogger('engine', o.logLevel as LogLevel, { engine: opts.id });
      const model = await openEngineModel(opts, log);
      if (model.slots !== null && o.pages === undefined) {
        // Enough pool for two full contexts per sequence: rooms computing, and as many arriving.
        const full = pagesFor(model.kv, opts.pageBytes, model.contextSize ?? 0);
        opts = Object.freeze({ ...opts, pages: Math.max(opts.pages, 2 * model.slots * full) });
      }
      let engine: ReturnType<typeof startEngine>;
      try {
        engine = startEngine(opts, log, keys, model);
      } catch (err) {
        // `--kv-transport ucx` where UCX is not: a flag to change, said in one line.
        if (err instanceof TransferError && err.code === 'TRANSFER_BACKEND_UNAVAILABLE')
          throw new UsageError(err.message);
        throw err;
      }
      const onSignal = (sig: string) => void engine.stop(sig);
      process.once('SIGTERM', onSignal);
      process.once('SIGINT', onSignal);
      await engine.stopped;
    });
}

/** The engine's model: the built-in one, or the GGUF of --model in llama.cpp (loaded here, once). */
async function openEngineModel(opts: Readonly<EngineOptions>, log: Logger): Promise<EngineModel> {
  if (opts.model === null) return new DeterministicModel(opts);
  const started = Date.now();
  log.info({ model: opts.model, sequences: opts.sequences, gpu: opts.gpu }, 'loading the model');
  try {
    // Loaded only with --model: node-llama-cpp takes half a second to import.
    const { LlamaEngineModel } = await import('../model/llama/engine-model.ts');
    const model = await LlamaEngineModel.open({
      modelPath: opts.model,
      sequences: opts.sequences,
      contextSize: opts.contextSize,
      threads: opts.threads,
      gpu: opts.gpu,
      // Only a prefill engine's sequences keep prompts; `--prefix-cache-pages 0` turns that off too.
      prefixReuse:
        opts.role === 'prefill' && opts.prefixCachePages !== 0 ? opts.prefixReuse : 'off',
      minReuseTokens: opts.kvBlockTokens,
    });
    log.info(
      {
        model: model.format,
        contextSize: model.contextSize,
        kvBytesPerToken: model.kv.bytesPerToken,
        kvBaseBytes: model.kv.baseBytes,
        prefixReuse: model.heldPrefixes !== undefined,
        ...(model.continuation ? { continuation: model.continuation } : {}),
        ms: Date.now() - started,
      },
      'model loaded',
    );
    return model;
  } catch (err) {
    throw new UsageError(`cannot serve ${opts.model}: ${(err as Error).message}`);
  }
}
