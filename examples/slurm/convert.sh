#!/usr/bin/env bash
# Converts SRC into DST on a Slurm cluster: plan once (here, on the submit
# host), a job array converts the shards (task I of N runs --shards I/N), and a
# finalize job that starts only when every array task succeeded writes the
# companions, config and index last.
#
#   examples/slurm/convert.sh SRC DST [N_TASKS] [extra sbatch args...]
#
# Every step is idempotent, so --requeue (node failure, preemption) and manual
# resubmission are safe: a task whose shards are done exits 0 at once, two
# tasks on the same shard serialise on its lock, and a finished DST answers
# "already complete". SRC and DST must be on storage every node mounts at the
# same path (or pass SRC/DST explicitly in convert.sbatch).
set -euo pipefail
src=${1:?usage: convert.sh SRC DST [N_TASKS] [sbatch args...]}
dst=${2:?usage: convert.sh SRC DST [N_TASKS] [sbatch args...]}
tasks=${3:-8}
shift $(( $# < 3 ? $# : 3 ))
here=$(cd "$(dirname "$0")" && pwd)
MX2NV=${MX2NV:-mx2nv}

"$MX2NV" plan "$src" "$dst"
plan="$dst/.mx2nv/plan.json"
array=$(sbatch --parsable --requeue --array="0-$((tasks - 1))" "$@" \
        --export=ALL,MX2NV="$MX2NV",MX2NV_PLAN="$plan",MX2NV_TASKS="$tasks" "$here/convert.sbatch")
final=$(sbatch --parsable --requeue --dependency="afterok:$array" "$@" \
        --export=ALL,MX2NV="$MX2NV",MX2NV_PLAN="$plan" "$here/finalize.sbatch")
echo "mx2nv: shards in job array $array ($tasks tasks), finalize in job $final"
