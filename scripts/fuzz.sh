#!/usr/bin/env bash
# Runs the libFuzzer targets (clang from Debian) and merges what they find
# into the checked-in corpora.  usage: scripts/fuzz.sh [SECONDS_PER_TARGET [TARGET...]]
# (default: every target)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift $(( $# > 0 ? 1 : 0 ))
targets=("$@")
if (( ${#targets[@]} == 0 )); then
  # Every target: one fuzz_<name>.cpp each in tests/fuzz, all in CMakeLists.txt's
  # MX2NV_FUZZ_TARGETS (cmake --build --target refuses one that is not).
  for source in tests/fuzz/fuzz_*.cpp; do targets+=("$(basename "$source" .cpp)"); done
fi
command -v clang++ >/dev/null || { echo "fuzz: needs clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev)"; exit 2; }
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMX2NV_FUZZ=ON \
    -DMX2NV_TESTS=OFF >/dev/null
for target in "${targets[@]}"; do
  cmake --build build-fuzz --target "$target"
  work=$(mktemp -d)
  cp -r "tests/fuzz/corpus/$target/." "$work/"
  build-fuzz/$target -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 "$work"
  build-fuzz/$target -merge=1 "tests/fuzz/corpus/$target" "$work"
  rm -rf "$work"
done
