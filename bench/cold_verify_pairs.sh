#!/usr/bin/env bash
# verify (or compare) of two builds from a cold cache, alternating with `cat` of both
# trees, each run from dropped caches in a memory cgroup (root): per run its
# wall time and what it asked of the disk (/proc/diskstats), then each row's
# median (the lower middle of an even count). Pairs run back to back, so both
# builds meet the same disk.
#
#   bench/cold_verify_pairs.sh SRC DST REPS OLD_BUILD/mx2nv NEW_BUILD/mx2nv
#   CAP_MIB=1024 bench/cold_verify_pairs.sh ...     # another cap (default 384)
#   COMMAND=compare bench/cold_verify_pairs.sh ...  # compare SRC DST instead of verify SRC DST
#   AFTER_WRITE=1 bench/cold_verify_pairs.sh ...    # each run right after a durable copy of SRC
#                                                   # (cp -r + sync, then removed), as in benchmark.py --cold
# (bench/benchmark.py --cold makes SRC and DST: work/src-4-shard-*-off and work/cold-ref-*.)
set -euo pipefail
[[ $# -eq 5 ]] || { echo "usage: $0 SRC DST REPS OLD_BUILD/mx2nv NEW_BUILD/mx2nv" >&2; exit 2; }
SRC=$(realpath "$1"); DST=$(realpath "$2"); REPS=$3; OLD=$(realpath "$4"); NEW=$(realpath "$5")
CMD=${COMMAND:-verify}
[[ $CMD == verify || $CMD == compare ]] || { echo "$0: COMMAND is verify or compare" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "$0: needs root (drop caches, a memory cgroup)" >&2; exit 2; }
if [[ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]]; then  # cgroup v1's memory hierarchy
  G=/sys/fs/cgroup/memory/mx2nv-bench; LIMIT=memory.limit_in_bytes; PROCS=$G/tasks
else  # cgroup v2: memory must be enabled for the root's children
  G=/sys/fs/cgroup/mx2nv-bench; LIMIT=memory.max; PROCS=$G/cgroup.procs
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || echo +memory > /sys/fs/cgroup/cgroup.subtree_control || true
fi
mkdir -p "$G" && echo $((${CAP_MIB:-384} << 20)) > "$G/$LIMIT" || { echo "$0: no memory cgroup could be made" >&2; exit 4; }
# The disk of SRC's file system, by device number (a partition's or a
# mapper's row counts its own requests); DST is read from the same disk.
read -r major minor < <(stat -c '%Hd %Ld' "$SRC")
awk -v a="$major" -v b="$minor" '$1 == a && $2 == b {found = 1} END {exit !found}' /proc/diskstats ||
  { echo "$0: SRC's file system ($major:$minor) has no row in /proc/diskstats (not on a block device)" >&2; exit 2; }
W=$(mktemp -d "$(dirname "$SRC")/cold-pairs.XXXXXX")
trap 'rm -rf "$W"; rmdir "$G" 2>/dev/null || true' EXIT
mapfile -t files < <(find "$SRC" "$DST" -type f | sort)
run() {  # run LABEL CMD...: one cold run in the cgroup; prints LABEL wall requests MB
  local label=$1; shift
  if [[ -n ${AFTER_WRITE:-} ]]; then
    cp -r --reflink=never "$SRC" "$W/copy" && sync && rm -rf "$W/copy"
  fi
  sync; echo 3 > /proc/sys/vm/drop_caches
  local r1 s1 r2 s2 t0 t1
  read -r r1 s1 < <(awk -v a="$major" -v b="$minor" '$1 == a && $2 == b {print $4, $6}' /proc/diskstats)
  t0=$(date +%s.%N)
  sh -c 'echo $$ > "$1" && shift && exec "$@"' sh "$PROCS" "$@" >/dev/null
  t1=$(date +%s.%N)
  read -r r2 s2 < <(awk -v a="$major" -v b="$minor" '$1 == a && $2 == b {print $4, $6}' /proc/diskstats)
  awk -v l="$label" -v a="$t0" -v b="$t1" -v r=$((r2 - r1)) -v s=$((s2 - s1)) \
    'BEGIN { printf "%s %.2f %d %.0f\n", l, b - a, r, s * 512 / 1e6 }'
}
echo "$CMD; old: $OLD; new: $NEW; cap ${CAP_MIB:-384} MiB${AFTER_WRITE:+; each run after a durable copy of SRC}"
echo
echo "| run | command | wall s | read requests | MB read | MB a request |"
echo "|---:|---|---:|---:|---:|---:|"
for ((i = 1; i <= REPS; i++)); do
  run cat cat "${files[@]}"
  run old "$OLD" "$CMD" "$SRC" "$DST"
  run new "$NEW" "$CMD" "$SRC" "$DST"
done | tee "$W/runs" | awk -v n=0 '{ n++; printf "| %d | %s | %.2f | %d | %.0f | %.2f |\n", int((n + 2) / 3), $1, $2, $3, $4, $4 / ($3 ? $3 : 1) }'
echo
echo "| command | median wall s | x cat (medians) | median MB read |"
echo "|---|---:|---:|---:|"
for label in cat old new; do
  wall=$(awk -v l=$label '$1 == l {print $2}' "$W/runs" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
  mb=$(awk -v l=$label '$1 == l {print $4}' "$W/runs" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
  echo "$label $wall $mb"
done | awk '$1 == "cat" {c = $2} {printf "| %s | %.2f | %.2f | %.0f |\n", $1, $2, $2 / c, $3}'
