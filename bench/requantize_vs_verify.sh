#!/usr/bin/env bash
# requantize beside verify on one input, warm page cache, for one or more
# mx2nv builds: each row the minimum and median wall time over REPS runs and
# the CPU seconds (user+system) of the fastest run.
#
#   bench/requantize_vs_verify.sh SRC REPS BUILD/mx2nv [OTHER_BUILD/mx2nv ...]
#   RQ_ARGS="--format modelopt" bench/requantize_vs_verify.sh ...   # extra requantize options
#
# verify reads SRC and a conversion of it (made once with the first build);
# requantize writes a fresh DST each run, at --threads 1 and at the default.
# The first row is the floor of any command that writes a durable tree of
# SRC's size: `cp -r` of SRC, then `sync` (requantize fsyncs its files).
set -euo pipefail
SRC=$(realpath "$1"); REPS=$2; shift 2
W=$(mktemp -d "${TMPDIR:-/tmp}/mx2nv-rq-vs-verify.XXXXXX")
trap 'rm -rf "$W"' EXIT
"$1" convert "$SRC" "$W/converted" >/dev/null
cat -- "$SRC"/* "$W"/converted/* >/dev/null 2>&1 || true  # warm the page cache
row() {  # row LABEL COMMAND...: REPS runs; min and median wall, CPU of the fastest
  local label=$1; shift
  local times=()
  for ((i = 0; i < REPS; i++)); do
    rm -rf "$W/out"
    /usr/bin/time -f "%e %U %S" -o "$W/t" "$@" >/dev/null
    times+=("$(cat "$W/t")")
  done
  printf '%s\n' "${times[@]}" | sort -n | awk -v l="$label" '{w[NR]=$1; c[NR]=$2+$3} END {
    printf "| %s | %.2f | %.2f | %.2f |\n", l, w[1], w[int((NR+1)/2)], c[1] }'
}
echo "| command | min wall s | median wall s | CPU s (fastest) |"
echo "|---|---|---|---|"
row "cp -r --reflink=never + sync" sh -c 'cp -r --reflink=never -- "$1" "$2" && sync' sh "$SRC" "$W/out"
for bin in "$@"; do
  b=$(realpath "$bin")
  row "$bin verify --threads 1" "$b" verify --threads 1 "$SRC" "$W/converted"
  row "$bin verify" "$b" verify "$SRC" "$W/converted"
  # shellcheck disable=SC2086  # RQ_ARGS: options, split on purpose
  row "$bin requantize ${RQ_ARGS:+$RQ_ARGS }--threads 1" "$b" requantize ${RQ_ARGS:-} --threads 1 "$SRC" "$W/out"
  # shellcheck disable=SC2086
  row "$bin requantize${RQ_ARGS:+ $RQ_ARGS}" "$b" requantize ${RQ_ARGS:-} "$SRC" "$W/out"
done
