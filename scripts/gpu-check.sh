#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and its driver: builds the addon, checks that it finds the CUDA
# runtime and a device, runs the CUDA tests against the real runtime (the transfer core, and a
# whole `pdctl serve --kv-device 0`), then bench:transfer (whose CUDA rows appear only where a
# device is found), then the llama.cpp model tests and bench:model on node-llama-cpp's CUDA build. One command, for when a GPU machine is at hand:
#   npm run gpu-check            (or: bash scripts/gpu-check.sh)
# PDCTL_CUDART=/path/to/libcudart.so.N picks the runtime when it is not on the loader's path.
# Exits non-zero at the first step that fails, saying which.
set -uo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*" >&2; }
die() { printf 'gpu-check: %s\n' "$*" >&2; exit 1; }

step "build the addon"
npm run --silent build:native >/dev/null || die "the native build failed: run npm run build:native to see why"

step "find CUDA"
node --input-type=module -e '
  const { createRequire } = await import("node:module");
  const addon = createRequire(process.cwd() + "/")("./native/build/Release/pdctl_native.node");
  const { cuda } = addon.backends();
  console.error(`cuda: ${cuda.available ? "available" : "NOT available"}: ${cuda.reason}`);
  process.exit(cuda.available ? 0 : 1);
' || die "the addon finds no CUDA device; the reason is above (driver missing? set PDCTL_CUDART?)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv >&2

step "CUDA tests against the real runtime: the transfer core, then pdctl serve --kv-device 0"
PDCTL_CUDA_TESTS=real npx vitest run src/transfer/cuda.int.test.ts test/kv-device.e2e.test.ts ||
  die "the CUDA tests failed"

step "bench:transfer (host rows, then CUDA rows)"
npm run --silent bench:transfer -- "$@" || die "bench:transfer failed"

step "llama.cpp: node-llama-cpp's CUDA build finds the GPU"
node --input-type=module -e '
  const { getLlama } = await import("node-llama-cpp");
  const llama = await getLlama({ gpu: "auto", build: "never" });
  console.error(`node-llama-cpp gpu: ${llama.gpu}`);
  process.exit(llama.gpu === "cuda" ? 0 : 1);
' || die "node-llama-cpp found no CUDA build or device (was it installed with --omit=optional?)"

step "llama.cpp model tests with the engines on the GPU (--gpu auto)"
PDCTL_LLAMA_GPU=auto npx vitest run src/model/llama test/llama || die "the llama.cpp model tests failed on the GPU"

step "bench:model on the GPU"
npm run --silent bench:model -- --gpu auto || die "bench:model failed"
