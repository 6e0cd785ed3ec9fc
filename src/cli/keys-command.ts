/** `pdctl keys`: a new CURVE key pair for the bus (control plane or engine). */
import type { Command } from 'commander';
import { newKeyPair } from '../bus/admission.ts';
import { print, printJson } from './context.ts';

export function registerKeysCommand(program: Command): void {
  program
    .command('keys')
    .description(
      "Print a new CURVE key pair for the bus. Give the control plane its pair and the engines' public " +
        "keys (allow list); give each engine its pair and the control plane's public key. See docs/protocol.md.",
    )
    .option('--json', 'machine-readable output')
    .action((o: { json?: boolean }) => {
      const pair = newKeyPair();
      if (o.json) printJson(pair);
      else {
        print(`public=${pair.publicKey}`);
        print(`secret=${pair.secretKey}`);
      }
    });
}
