/** Every drill `pdctl drill` knows, by name. */
import { abortCascade } from './abort-cascade.ts';
import { badEngine } from './bad-engine.ts';
import { controlPlaneFailover } from './control-plane-failover.ts';
import type { DrillScenario } from './harness.ts';
import { hostilePeer } from './hostile-peer.ts';
import { killControlPlane } from './kill-control-plane.ts';
import { noisyNeighborDrill } from './noisy-neighbor.ts';
import { partitionEngine, partitionKv } from './partition.ts';
import { plannerScaleDown } from './planner-scale-down.ts';
import {
  busLoopDeath,
  computeHang,
  journalUnwritable,
  killDecode,
  killPrefill,
  kvCorruption,
  malformedFrames,
  slowClient,
  transferStall,
} from './scenarios.ts';

export const DRILLS: readonly DrillScenario[] = [
  abortCascade,
  killPrefill,
  killDecode,
  killControlPlane,
  controlPlaneFailover,
  busLoopDeath,
  transferStall,
  computeHang,
  malformedFrames,
  hostilePeer,
  kvCorruption,
  slowClient,
  journalUnwritable,
  partitionKv,
  partitionEngine,
  badEngine,
  plannerScaleDown,
  noisyNeighborDrill,
];
