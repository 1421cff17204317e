#!/usr/bin/env bash
# One TPU pod worker's part of launch/tpu_pod.sh, which runs it on every worker (gcloud ... ssh
# --worker=all) from the worker's checkout; not meant to be started by hand.
#
# Required variables:
#   MODEL_DIR   the run directory (as tpu_pod.sh was given it)
# Optional:
#   TRAINER (spot_jax | t5x; default spot_jax), T5X_DIR (put on PYTHONPATH for TRAINER=t5x)
#   PYTHON      the interpreter; default this checkout's .venv/bin/python when there is one, else
#               python3. When it cannot import spot_jax (or t5x) the worker refuses in one line.
#   DRY_RUN=1 or --dry_run is not taken: tpu_pod.sh's dry run never reaches the workers.
# Arguments: the trainer's: -m spot_jax.train|t5x.train FLAGS...
# Logs: the whole output goes to $MODEL_DIR/logs/worker_<hostname>.log (a gs:// MODEL_DIR:
# ~/spot_jax_logs/worker_<hostname>.log), stdout (t5x: both streams) also to the terminal; when
# the process ends badly, one line says how, and the last saved step.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
LAUNCH_PROG="launch/tpu_pod.sh on $(hostname)"
require MODEL_DIR
TRAINER="${TRAINER:-spot_jax}"
choose_python
case "${TRAINER}" in
  spot_jax) streams=stdout; check_python spot_jax ;;
  t5x)
    require T5X_DIR "TRAINER=t5x needs the t5x checkout on the workers (see docs/t5x.md)"
    export PYTHONPATH="${PYTHONPATH}:${T5X_DIR}"
    streams=all
    check_python t5x
    ;;
  *) die "TRAINER=${TRAINER} is unknown; valid: spot_jax or t5x" ;;
esac
case "${MODEL_DIR}" in
  *://*) logs="${HOME}/spot_jax_logs" ;;
  *) logs="$(absolute "${MODEL_DIR}")/logs" ;;
esac
RESUME="the same launch/tpu_pod.sh command"
PIDS=() LOGS=() NAMES=()
name="worker_$(hostname)"
open_logs "${logs}" "${name}"
guard_interrupts
start 0 "${name}" "worker $(hostname)'s process" "${streams}" "${PY}" "$@"
supervise
