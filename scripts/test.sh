#!/usr/bin/env bash
# Every test: the C++ unit and end-to-end suites (ctest), then the Python
# conformance suite that checks mx2nv's output with the ecosystem's own
# libraries, then the Python package (wheel in a fresh venv). Builds first
# if needed, and installs the test-only tools on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x build/mx2nv ]]; then MX2NV_SKIP_DEMO=1 scripts/setup.sh; fi
scripts/test-deps.sh  # the test-only tools (Slurm, XFS/btrfs, headless Chromium, ...), on first use
cmake --build build
ctest --test-dir build --output-on-failure -j "$(nproc)"

if [[ -d tests/conformance ]]; then  # Python suites: conformance oracles, hostile-input corpus, engine recipes, docs links
  scripts/python-env.sh
  .venv/bin/python -m pytest -q tests/conformance tests/corpus tests/engines tests/docs
fi

scripts/python-package-test.sh  # the wheel: API, Ctrl-C, terminal progress, HTML in a browser
