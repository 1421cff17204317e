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
#   TRAINER (spot_jax | t5x; default spot_jax), PROJECT (gcloud project), PYTHON (python3 on the
#   workers), T5X_DIR (a t5x checkout on the workers, put on PYTHONPATH for TRAINER=t5x),
#   EXTRA_ARGS, DRY_RUN=1 or --dry_run: print the gcloud command, run nothing.
# Example:
#   TPU_NAME=pod ZONE=us-central2-b REPO_DIR=~/spot-jax MODEL_DIR=/mnt/runs/rte \
#   GIN_FILES="gin/t5x/models/t5_1_1_lm100k_xxl_prompt_tuning.gin gin/t5x/runs/prompt_tune.gin" \
#   TASK=spot_super_glue_rte_v200 INITIAL_CHECKPOINT_PATH=gs://ckpts/t5_1_1_lm100k_xxl/checkpoint_1100000 \
#   TRAINER=t5x T5X_DIR=~/t5x launch/tpu_pod.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=launch/lib.sh
source launch/lib.sh
parse_flags "$@"
require TPU_NAME
require ZONE "e.g. ZONE=us-central2-b"
require REPO_DIR "the spot-jax checkout on the workers"
require GIN_FILES
require MODEL_DIR
require TASK "e.g. TASK=spot_super_glue_rte_v200"
require INITIAL_CHECKPOINT_PATH "a T5X checkpoint_N directory"
TRAINER="${TRAINER:-spot_jax}"
PYTHON="${PYTHON:-python3}"
mapfile -t GIN < <(gin_args)
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"

case "${TRAINER}" in
  spot_jax)
    train=("${PYTHON}" -m spot_jax.train "${GIN[@]}" --multiprocess "${EXTRA[@]}")
    pythonpath="${REPO_DIR}"
    ;;
  t5x)
    require T5X_DIR "TRAINER=t5x needs the t5x checkout on the workers (see docs/t5x.md)"
    train=("${PYTHON}" -m t5x.train --gin_search_paths="${REPO_DIR}" "${GIN[@]}" "${EXTRA[@]}")
    pythonpath="${REPO_DIR}:${T5X_DIR}"
    ;;
  *) die "TRAINER=${TRAINER} is unknown; valid: spot_jax or t5x" ;;
esac

remote="cd $(printf '%q' "${REPO_DIR}") && PYTHONPATH=$(printf '%q' "${pythonpath}")\${PYTHONPATH:+:\$PYTHONPATH} $(printf '%q ' "${train[@]}")"
gcloud_cmd=(gcloud compute tpus tpu-vm ssh "${TPU_NAME}" --zone="${ZONE}" --worker=all --command="${remote}")
if [ -n "${PROJECT:-}" ]; then
  gcloud_cmd+=(--project="${PROJECT}")
fi
run "${gcloud_cmd[@]}"
