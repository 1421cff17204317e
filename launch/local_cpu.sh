#!/usr/bin/env bash
# Train on this machine's CPU, as one process or as NUM_PROCESSES local processes joined by
# jax.distributed (gloo collectives, coordinator on localhost) -- the multi-host code path
# without a cluster. Runs from any working directory: relative paths (MODEL_DIR, gin files,
# checkpoints, a task module) start there; gin files and the embedded checkpoint are also
# found in the repository.
#
# Required variables:
#   GIN_FILES   space-separated gin files, model -> prompt -> run (e.g. "gin/test/smoke.gin")
#   MODEL_DIR   run directory (restarting the same command resumes from it)
# Optional:
#   TASK, TASK_MODULE, INITIAL_CHECKPOINT_PATH   --gin.MIXTURE_OR_TASK_NAME / _MODULE /
#               INITIAL_CHECKPOINT_PATH
#   NUM_PROCESSES (1), PORT (12355), HEARTBEAT_TIMEOUT (30 s)
#   PYTHON      the interpreter; default the repository's .venv/bin/python when there is one,
#               else python3. It must import spot_jax, or the launcher refuses in one line.
#   GRACE_PERIOD (3 s): after a process fails, how long the others may take to end before the
#               launcher stops them
#   EXTRA_ARGS  more flags, e.g. "--gin.TRAIN_STEPS=100"
#   DRY_RUN=1 or --dry_run: print the commands, run nothing.
# Logs: each process's whole output (stdout and stderr: TensorFlow's and JAX's messages, crash
# traces) goes to $MODEL_DIR/logs/process_<i>.log (the previous launch's to process_<i>.prev.log);
# process 0's progress lines are also shown here. When a process fails, the launcher stops the
# others and prints one line: which process failed first and how, the last saved step and the
# command that resumes from it; it exits with that process's status.
# Example:
#   GIN_FILES=gin/test/smoke.gin MODEL_DIR=/tmp/smoke NUM_PROCESSES=2 launch/local_cpu.sh
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
parse_flags "$@"
require GIN_FILES "e.g. GIN_FILES=gin/test/smoke.gin"
require MODEL_DIR "e.g. MODEL_DIR=/tmp/spot_smoke"
NUM_PROCESSES="${NUM_PROCESSES:-1}"
PORT="${PORT:-12355}"
case "${NUM_PROCESSES}" in
  ''|*[!0-9]*|0) die "NUM_PROCESSES=${NUM_PROCESSES} is not a positive integer" ;;
esac
case "${GRACE_PERIOD:-3}" in
  ''|*[!0-9]*) die "GRACE_PERIOD=${GRACE_PERIOD} is not a whole number of seconds" ;;
esac
MODEL_DIR="$(absolute "${MODEL_DIR}")"
choose_python
check_python spot_jax

export JAX_PLATFORMS=cpu
mapfile -t GIN < <(gin_args)
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"
cmd=("${PY}" -m spot_jax.train "${GIN[@]}" "${EXTRA[@]}")
RESUME="$(relaunch_command)"

PIDS=() LOGS=() NAMES=()
mapfile -t LOG_NAMES < <(seq -f 'process_%g' 0 $((NUM_PROCESSES - 1)))
is_dry_run || open_logs "${MODEL_DIR}/logs" "${LOG_NAMES[@]}"
is_dry_run || guard_interrupts
for ((i = 0; i < NUM_PROCESSES; i++)); do
  dist=()
  if [ "${NUM_PROCESSES}" != "1" ]; then
    dist=(--coordinator_address="localhost:${PORT}" --num_processes="${NUM_PROCESSES}"
          --process_id="${i}" --heartbeat_timeout="${HEARTBEAT_TIMEOUT:-30}")
  fi
  show "${cmd[@]}" "${dist[@]}"
  if ! is_dry_run; then
    shown=none
    [ "${i}" != 0 ] || shown=stdout
    start "${i}" "process_${i}" "process ${i} of ${NUM_PROCESSES}" "${shown}" "${cmd[@]}" "${dist[@]}"
  fi
done
is_dry_run && exit 0
echo "logs: ${LOG_DIR}/process_<i>.log (process 0's progress is shown here)"
supervise
