#!/usr/bin/env bash
# Builds the native addon with AddressSanitizer and UndefinedBehaviorSanitizer, runs the transfer
# core's tests against it, then rebuilds the normal addon whatever happened.
#   npm run test:sanitize
set -uo pipefail
cd "$(dirname "$0")/.."
trap 'npm run --silent build:native >/dev/null 2>&1 || echo "could not rebuild the normal addon: run npm run build:native" >&2' EXIT
PDCTL_SANITIZE=1 npm run --silent build:native >/dev/null || { echo "sanitizer build failed" >&2; exit 1; }
# Node itself is not built with ASan, so the runtime is preloaded; leak checks would report V8's
# own allocations at exit, so they are off. Any other report aborts the process and fails the run.
LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  npx vitest run src/transfer
