#!/usr/bin/env bash
# Train on this machine's CPU, as one process or as NUM_PROCESSES local processes joined by
# jax.distributed (gloo collectives, coordinator on localhost) -- the multi-host code path
# without a cluster.
#
# Required variables:
#   GIN_FILES   space-separated gin files, model -> prompt -> run (e.g. "gin/test/smoke.gin")
#   MODEL_DIR   run directory (restarting the same command resumes from it)
# Optional:
#   TASK, INITIAL_CHECKPOINT_PATH   --gin.MIXTURE_OR_TASK_NAME / INITIAL_CHECKPOINT_PATH
#   NUM_PROCESSES (1), PORT (12355), HEARTBEAT_TIMEOUT (30 s), PYTHON (python3)
#   EXTRA_ARGS   more flags, e.g. "--gin.TRAIN_STEPS=100"
#   DRY_RUN=1 or --dry_run: print the commands, run nothing.
# Example:
#   GIN_FILES=gin/test/smoke.gin MODEL_DIR=/tmp/smoke NUM_PROCESSES=2 launch/local_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=launch/lib.sh
source launch/lib.sh
parse_flags "$@"
require GIN_FILES "e.g. GIN_FILES=gin/test/smoke.gin"
require MODEL_DIR "e.g. MODEL_DIR=/tmp/spot_smoke"
NUM_PROCESSES="${NUM_PROCESSES:-1}"
PORT="${PORT:-12355}"
PYTHON="${PYTHON:-python3}"
case "${NUM_PROCESSES}" in ''|*[!0-9]*|0) die "NUM_PROCESSES=${NUM_PROCESSES} is not a positive integer" ;; esac

export JAX_PLATFORMS=cpu
mapfile -t GIN < <(gin_args)
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"
cmd=("${PYTHON}" -m spot_jax.train "${GIN[@]}" "${EXTRA[@]}")

if [ "${NUM_PROCESSES}" = "1" ]; then
  run "${cmd[@]}"
  exit 0
fi

pids=()
for ((i = 0; i < NUM_PROCESSES; i++)); do
  dist=(--coordinator_address="localhost:${PORT}" --num_processes="${NUM_PROCESSES}"
        --process_id="${i}" --heartbeat_timeout="${HEARTBEAT_TIMEOUT:-30}")
  if is_dry_run; then
    run "${cmd[@]}" "${dist[@]}"
  else
    run "${cmd[@]}" "${dist[@]}" &
    pids+=("$!")
  fi
done
status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "${LAUNCH_PROG}: error: process ${i} of ${NUM_PROCESSES} failed; rerun the same command to resume from ${MODEL_DIR}" >&2
    status=1
  fi
done
exit "${status}"
