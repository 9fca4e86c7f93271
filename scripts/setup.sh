#!/usr/bin/env bash
# One command from a fresh Debian/Ubuntu machine: install build dependencies,
# build mx2nv (build/mx2nv), and run the demo conversion.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(g++ cmake ninja-build nlohmann-json3-dev libcli11-dev libfmt-dev
              libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev libsimdjson-dev libre2-dev pkgconf python3-venv python3-dev
              slurm-wlm munge  # the Slurm recipe's test (a single-node cluster)
              xfsprogs btrfs-progs)  # zero-copy tests and benchmark: loop-mounted XFS/btrfs
# Tests only, installed without recommends: a headless browser for the HTML
# report test, script(1) for the terminal progress test, pgrep (procps) for
# the Slurm test's daemons check.
TEST_APT_PACKAGES=(chromium-headless-shell bsdutils procps)
# Installs the packages among "$@" (after any apt-get flags) that dpkg lacks.
install_missing() {
  local flags=() missing=() p
  while [[ $# -gt 0 && $1 == -* ]]; do flags+=("$1"); shift; done
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "setup: installing ${missing[*]}"
  local SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${flags[@]}" "${missing[@]}" >/dev/null
}
install_missing "${APT_PACKAGES[@]}"
install_missing --no-install-recommends "${TEST_APT_PACKAGES[@]}"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMX2NV_WERROR="${MX2NV_WERROR:-ON}" >/dev/null
cmake --build build

if [[ "${MX2NV_SKIP_DEMO:-0}" != 1 ]]; then
  build/mx2nv demo build/demo
fi
