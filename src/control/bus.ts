/**
 * The control plane's end of the bus (src/bus/server.ts): opening it for the control plane's
 * options, and the counters of what crosses it (appends, nacks, token chunks, events delivered,
 * hellos) that /metrics and the bus status show.
 */
import { needsCurve } from '../bus/admission.ts';
import { BusServer } from '../bus/server.ts';
import type { Clock } from '../ports/clock.ts';
import type { ControlDefaults, ControlPlaneOptions } from './options.ts';

export interface ControlCounters {
  appends: number;
  nacks: number;
  tokens: number;
  tokensDropped: number;
  delivered: number;
  hellos: number;
  /** Prefix block names engines said they stored that were not theirs to store (appends.ts). */
  blocksRefused: number;
}

/** Every counter at zero. */
export function zeroCounters(): ControlCounters {
  return {
    appends: 0,
    nacks: 0,
    tokens: 0,
    tokensDropped: 0,
    delivered: 0,
    hellos: 0,
    blocksRefused: 0,
  };
}

/**
 * The control plane's bus, not yet bound: CURVE unless the endpoint needs none (admission.ts
 * `needsCurve`), with the admission's keys deciding who completes a handshake.
 */
export function openBus(
  o: ControlPlaneOptions & Pick<ControlDefaults, 'bus'>,
  clock: Clock,
): BusServer {
  return new BusServer({
    endpoint: o.bus,
    curve:
      (o.curve ?? needsCurve(o.bus))
        ? { ...o.admission.server, allow: (key) => o.admission.knows(key) }
        : undefined,
    maxFrameBytes: o.maxFrameBytes,
    log: o.log,
    clock,
    ...(o.transport ? { transport: o.transport } : {}),
  });
}
