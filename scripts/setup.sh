#!/usr/bin/env bash
# One command from a fresh Debian/Ubuntu machine: install what building and
# running mx2nv need, build mx2nv (build/mx2nv), and run the demo conversion.
set -euo pipefail
cd "$(dirname "$0")/.."

# What building and running mx2nv need, nothing more: the tools only the
# tests use are installed by scripts/test.sh on first use (scripts/test-deps.sh).
APT_PACKAGES=(g++ cmake ninja-build pkgconf nlohmann-json3-dev libcli11-dev libfmt-dev libxxhash-dev
              libsimdjson-dev libre2-dev
              libgtest-dev libgmock-dev libbenchmark-dev  # the test and benchmark targets the build includes
              python3-venv python3-dev)                   # the Python package and its tests
source scripts/apt-packages.sh
install_missing "${APT_PACKAGES[@]}"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMX2NV_WERROR="${MX2NV_WERROR:-ON}" >/dev/null
cmake --build build

if [[ "${MX2NV_SKIP_DEMO:-0}" != 1 ]]; then
  build/mx2nv demo build/demo
fi
