#!/usr/bin/env bash
# Train on a Cloud TPU VM pod slice: the same command runs on every worker at once
# (gcloud ... ssh --worker=all), and jax.distributed finds the pod's layout itself.
# Works with spot-jax's trainer (--multiprocess) and with t5x.train.
#
# Required variables:
#   TPU_NAME    the TPU VM (pod slice) name
#   ZONE        its zone, e.g. us-central2-b
#   REPO_DIR    the spot-jax checkout on every worker (same path everywhere)
#   GIN_FILES   space-separated gin files, relative to REPO_DIR
#   MODEL_DIR   run directory every worker sees (gcsfuse mount or shared disk for spot_jax;
#               gs:// works for t5x); restarting the same command resumes from it
#   TASK        seqio task or mixture
#   INITIAL_CHECKPOINT_PATH   the frozen backbone checkpoint
# Optional:
#   TRAINER (spot_jax | t5x; default spot_jax), PROJECT (gcloud project), TASK_MODULE
#   (--gin.MIXTURE_OR_TASK_MODULE), T5X_DIR (a t5x checkout on the workers, put on PYTHONPATH
#   for TRAINER=t5x), EXTRA_ARGS
#   PYTHON      the interpreter on the workers; default REPO_DIR/.venv/bin/python where there
#               is one, else python3. A worker whose interpreter cannot import spot_jax (or
#               t5x) refuses in one line.
#   DRY_RUN=1 or --dry_run: print the gcloud command, run nothing.
# Each worker runs launch/pod_worker.sh (see there): its interpreter is checked, its whole output
# goes to $MODEL_DIR/logs/worker_<hostname>.log (~/spot_jax_logs/ for a gs:// MODEL_DIR), its
# stdout (spot_jax's progress, which process 0 prints) is also shown here (t5x: both streams),
# and when its process ends badly it prints one line: how, the last saved step, and whether it
# failed or only stopped because another worker's process died (jax's heartbeat).
# Example:
#   TPU_NAME=pod ZONE=us-central2-b REPO_DIR=~/spot-jax MODEL_DIR=/mnt/runs/rte \
#   GIN_FILES="gin/t5x/models/t5_1_1_lm100k_xxl_prompt_tuning.gin gin/t5x/runs/prompt_tune.gin" \
#   TASK=spot_super_glue_rte_v200 INITIAL_CHECKPOINT_PATH=gs://ckpts/t5_1_1_lm100k_xxl/checkpoint_1100000 \
#   TRAINER=t5x T5X_DIR=~/t5x launch/tpu_pod.sh
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
parse_flags "$@"
require TPU_NAME
require ZONE "e.g. ZONE=us-central2-b"
require REPO_DIR "the spot-jax checkout on the workers"
require GIN_FILES
require MODEL_DIR
require TASK "e.g. TASK=spot_super_glue_rte_v200"
require INITIAL_CHECKPOINT_PATH "a T5X checkpoint_N directory"
TRAINER="${TRAINER:-spot_jax}"
mapfile -t GIN < <(gin_args)
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"

case "${TRAINER}" in
  spot_jax) train=(-m spot_jax.train "${GIN[@]}" --multiprocess "${EXTRA[@]}") ;;
  t5x)
    require T5X_DIR "TRAINER=t5x needs the t5x checkout on the workers (see docs/t5x.md)"
    train=(-m t5x.train --gin_search_paths="${REPO_DIR}" "${GIN[@]}" "${EXTRA[@]}")
    ;;
  *) die "TRAINER=${TRAINER} is unknown; valid: spot_jax or t5x" ;;
esac

settings=(MODEL_DIR="${MODEL_DIR}" TRAINER="${TRAINER}")
for name in PYTHON T5X_DIR; do
  if [ -n "${!name:-}" ]; then
    settings+=("${name}=${!name}")
  fi
done
remote="cd $(printf '%q' "${REPO_DIR}") && $(printf '%q ' "${settings[@]}")bash launch/pod_worker.sh $(printf '%q ' "${train[@]}")"
gcloud_cmd=(gcloud compute tpus tpu-vm ssh "${TPU_NAME}" --zone="${ZONE}" --worker=all --command="${remote% }")
if [ -n "${PROJECT:-}" ]; then
  gcloud_cmd+=(--project="${PROJECT}")
fi
run "${gcloud_cmd[@]}"
