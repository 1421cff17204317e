#!/usr/bin/env bash
# Train on one GPU host (all its GPUs in one process), with spot-jax's trainer or t5x.train.
# For several GPU hosts, run this on each with COORDINATOR_ADDRESS, NUM_PROCESSES and
# PROCESS_ID set (jax.distributed; process 0's host:port is the coordinator). Runs from any
# working directory: relative paths start there (gin files and the embedded checkpoint are also
# found in the repository).
#
# Required variables:
#   GIN_FILES   space-separated gin files (spot_jax: gin/models/... gin/prompts/... gin/runs/...;
#               t5x: gin/t5x/models/<size>_<method>.gin gin/t5x/runs/prompt_tune.gin)
#   MODEL_DIR   run directory (restarting the same command resumes from it)
#   TASK        seqio task or mixture, e.g. spot_super_glue_rte_v200
#   INITIAL_CHECKPOINT_PATH   the frozen backbone checkpoint
# Optional:
#   TRAINER (spot_jax | t5x; default spot_jax), TASK_MODULE (--gin.MIXTURE_OR_TASK_MODULE),
#   EXTRA_ARGS
#   PYTHON      the interpreter; default the repository's .venv/bin/python when there is one,
#               else python3. It must import spot_jax, or the launcher refuses in one line.
#   COORDINATOR_ADDRESS, NUM_PROCESSES, PROCESS_ID   multi-host GPU jobs (all three or none)
#   DRY_RUN=1 or --dry_run: print the command, run nothing.
# Logs: the process's whole output goes to $MODEL_DIR/logs/process_<PROCESS_ID>.log (the
# previous launch's to process_<PROCESS_ID>.prev.log); its stdout (spot_jax's progress) is also
# shown here (t5x: both streams). When it fails, the launcher prints one line: how it ended, the
# last saved step and the command that resumes (the same one, on every host).
# Example:
#   GIN_FILES="gin/models/t5_1_1_lm100k_base.gin gin/prompts/prompt_tuning_class_labels.gin gin/runs/prompt_tune.gin" \
#   MODEL_DIR=/runs/rte TASK=spot_super_glue_rte_v200 \
#   INITIAL_CHECKPOINT_PATH=/ckpts/t5_1_1_lm100k_base/checkpoint_1100000 launch/gpu_host.sh
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
parse_flags "$@"
require GIN_FILES
require MODEL_DIR
require TASK "e.g. TASK=spot_super_glue_rte_v200"
require INITIAL_CHECKPOINT_PATH "a T5X checkpoint_N directory (or orbax / Hugging Face directory)"
TRAINER="${TRAINER:-spot_jax}"
MODEL_DIR="$(absolute "${MODEL_DIR}")"
mapfile -t GIN < <(gin_args)
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"

multi=()
if [ -n "${COORDINATOR_ADDRESS:-}${NUM_PROCESSES:-}${PROCESS_ID:-}" ]; then
  require COORDINATOR_ADDRESS "give all of COORDINATOR_ADDRESS, NUM_PROCESSES and PROCESS_ID, or none"
  require NUM_PROCESSES "give all of COORDINATOR_ADDRESS, NUM_PROCESSES and PROCESS_ID, or none"
  require PROCESS_ID "give all of COORDINATOR_ADDRESS, NUM_PROCESSES and PROCESS_ID, or none"
fi

case "${TRAINER}" in
  spot_jax)
    if [ -n "${COORDINATOR_ADDRESS:-}" ]; then
      multi=(--coordinator_address="${COORDINATOR_ADDRESS}" --num_processes="${NUM_PROCESSES}" --process_id="${PROCESS_ID}")
    fi
    choose_python
    cmd=("${PY}" -m spot_jax.train "${GIN[@]}" "${multi[@]}" "${EXTRA[@]}")
    show_streams=stdout
    ;;
  t5x)
    if [ -n "${COORDINATOR_ADDRESS:-}" ]; then
      multi=(--multiprocess_gpu --coordinator_address="${COORDINATOR_ADDRESS}" --process_count="${NUM_PROCESSES}" --process_index="${PROCESS_ID}")
    fi
    choose_python
    cmd=("${PY}" -m t5x.train --gin_search_paths="${REPO}" "${GIN[@]}" "${multi[@]}" "${EXTRA[@]}")
    show_streams=all
    ;;
  *) die "TRAINER=${TRAINER} is unknown; valid: spot_jax or t5x" ;;
esac
if [ "${TRAINER}" = t5x ]; then check_python t5x; else check_python spot_jax; fi
show "${cmd[@]}"
is_dry_run && exit 0
RESUME="$(relaunch_command)"
PIDS=() LOGS=() NAMES=()
open_logs "${MODEL_DIR}/logs" "process_${PROCESS_ID:-0}"
guard_interrupts
start 0 "process_${PROCESS_ID:-0}" "process ${PROCESS_ID:-0} of ${NUM_PROCESSES:-1}" "${show_streams}" "${cmd[@]}"
echo "log: ${LOGS[0]}"
supervise
