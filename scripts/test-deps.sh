#!/usr/bin/env bash
# The tools only the tests use, installed on first use by scripts/test.sh and
# scripts/sanitize.sh (scripts/setup.sh installs only what building and
# running mx2nv need):
#   slurm-wlm, munge          the Slurm recipe's test (a single-node cluster)
#   xfsprogs, btrfs-progs     zero-copy tests and benchmark: loop-mounted XFS/btrfs
#   chromium-headless-shell   the HTML report test in a headless browser
#   bsdutils                  script(1), for the terminal progress test
#   procps                    pgrep, for the Slurm test's daemons check
# Each test that needs one skips with the apt-get line when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/apt-packages.sh
install_missing slurm-wlm munge xfsprogs btrfs-progs
install_missing --no-install-recommends chromium-headless-shell bsdutils procps
