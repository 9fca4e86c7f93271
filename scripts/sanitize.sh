#!/usr/bin/env bash
# Test mode with AddressSanitizer + UndefinedBehaviorSanitizer: builds every
# target instrumented (build-asan/), runs the whole C++ suite (unit and
# end-to-end: every command on generated checkpoints), then the hostile-input
# corpus against the instrumented CLI. The conformance suite is not run again
# here: it checks values against the ecosystem's oracles on valid checkpoints,
# the paths the end-to-end suite already drives under the sanitizers.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/test-deps.sh  # the test-only tools, when sanitize.sh runs on its own
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMX2NV_SANITIZE=ON \
      -DMX2NV_WERROR="${MX2NV_WERROR:-ON}" >/dev/null
cmake --build build-asan
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-asan --output-on-failure -j "$(nproc)"
scripts/python-env.sh
MX2NV="$PWD/build-asan/mx2nv" .venv/bin/python -m pytest -q tests/corpus
