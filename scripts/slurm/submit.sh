#!/usr/bin/env bash
# submit.sh - submits an attn-fuzz job array (scripts/slurm/attn-fuzz-array.sbatch) and its merge as a dependent job.
#
# usage: scripts/slurm/submit.sh [-n TASKS] [-t SECONDS] [-g GPUS_PER_TASK] [-s SBATCH_ARG]... RUN [ATTN-FUZZ ARG...]
#   -n TASKS   array tasks, i.e. campaigns (default 2)
#   -t SECONDS each campaign's --max-time (default 3600); Slurm's --time is set 10 minutes longer
#   -g N       GPUs per task (--gres=gpu:N); 0 (default) for the cpu emulator
#   -s ARG     extra sbatch argument for both jobs (repeatable), e.g. -s --partition=gpu -s --account=me
#   RUN        run directory on a shared file system (created)
# Prints the two job ids; the merged summary is RUN/merged/summary.md once the merge job ran.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tasks=2 secs=3600 gpus=0 extra=()
while getopts "n:t:g:s:" opt; do
  case $opt in
    n) tasks=$OPTARG ;;
    t) secs=$OPTARG ;;
    g) gpus=$OPTARG ;;
    s) extra+=("$OPTARG") ;;
    *) echo "usage: $0 [-n TASKS] [-t SECONDS] [-g GPUS_PER_TASK] [-s SBATCH_ARG]... RUN [ATTN-FUZZ ARG...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "submit.sh: need RUN (a run directory on a shared file system)" >&2; exit 2; }
case $tasks$secs$gpus in *[!0-9]*) echo "submit.sh: -n, -t and -g take whole numbers" >&2; exit 2 ;; esac
[ "$tasks" -ge 1 ] || { echo "submit.sh: -n must be at least 1" >&2; exit 2; }
mkdir -p "$1"
run=$(cd "$1" && pwd)
shift
export ATTNFUZZ_RUN=$run ATTNFUZZ_TIME=$secs
export ATTNFUZZ_BIN=${ATTNFUZZ_BIN:-$(command -v attn-fuzz || true)}
[ -n "$ATTNFUZZ_BIN" ] || { echo "submit.sh: attn-fuzz is not on PATH: set ATTNFUZZ_BIN" >&2; exit 2; }
limit=$(( (secs + 600 + 59) / 60 ))
gres=()
[ "$gpus" -eq 0 ] || gres=(--gres="gpu:$gpus")
array=$(sbatch --parsable --array="0-$((tasks - 1))" --time="$limit" --chdir="$run" "${gres[@]}" "${extra[@]}" \
          "$here/attn-fuzz-array.sbatch" "$@")
array=${array%%;*}
merge=$(sbatch --parsable --dependency="afterany:$array" --time=30 --chdir="$run" "${extra[@]}" \
          "$here/attn-fuzz-merge.sbatch")
merge=${merge%%;*}
echo "array job $array ($tasks campaign(s), $secs s each), merge job $merge: $run/merged/summary.md"
