#!/usr/bin/env bash
# Every test: the C++ unit and end-to-end suites (ctest), then the Python
# conformance suite that checks mx2nv's output with the ecosystem's own
# libraries, then the Python package (wheel in a fresh venv). Builds first
# if needed, and installs the test-only tools on first use. Prints each
# suite's wall time. tests/README.md says what each suite is for.
#
# usage: scripts/test.sh           every suite
#        scripts/test.sh --quick   the quick tier only (a few minutes): ctest -L quick (unit tests,
#                                  fuzz corpora, layering), no end-to-end, Python or wheel suites
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
case "${1:-}" in
  "") ;;
  --quick) quick=1 ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac

# stage NAME COMMAND...: runs COMMAND, then prints how long it took.
stage() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "test.sh: ${name} took $((SECONDS - start)) s"
}

if [[ ! -x build/mx2nv ]]; then stage setup env MX2NV_SKIP_DEMO=1 scripts/setup.sh; fi
if (( quick )); then
  stage build cmake --build build
  stage "ctest -L quick" ctest --test-dir build --output-on-failure -j "$(nproc)" -L quick
  exit 0
fi
stage test-deps scripts/test-deps.sh  # the test-only tools (Slurm, XFS/btrfs, headless Chromium, ...), on first use
stage build cmake --build build
stage ctest ctest --test-dir build --output-on-failure -j "$(nproc)"

if [[ -d tests/conformance ]]; then  # Python suites: conformance oracles, hostile-input corpus, engine recipes, docs links
  stage python-env scripts/python-env.sh
  stage pytest .venv/bin/python -m pytest -q tests/conformance tests/corpus tests/engines tests/docs
fi

stage python-package scripts/python-package-test.sh  # the wheel: API, Ctrl-C, terminal progress, HTML in a browser
