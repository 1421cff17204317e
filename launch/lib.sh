#!/usr/bin/env bash
# Helpers sourced by the launch/*.sh scripts (not run on its own).
# shellcheck shell=bash

# The script's name in messages, e.g. "launch/tpu_pod.sh".
LAUNCH_PROG="launch/$(basename "${0}")"

# die MESSAGE: one line on stderr, exit 2.
die() {
  echo "${LAUNCH_PROG}: error: $*" >&2
  exit 2
}

# require VAR [HINT]: refuse to start when VAR is unset or empty, naming it.
require() {
  local name="$1" hint="${2:-}"
  if [ -z "${!name:-}" ]; then
    die "${name} is not set; ${hint:-see the variables documented at the top of ${LAUNCH_PROG}}"
  fi
}

# is_dry_run: DRY_RUN=1 or --dry_run among the arguments.
is_dry_run() {
  [ "${DRY_RUN:-0}" = "1" ]
}

# run CMD...: print the command (quoted so it can be pasted) and run it unless dry-running.
run() {
  printf '%q ' "$@" | sed 's/ $//'
  echo
  if ! is_dry_run; then
    "$@"
  fi
}

# gin_args: --gin_file=... for each word of GIN_FILES, then the common overrides.
gin_args() {
  local f
  for f in ${GIN_FILES}; do
    printf '%s\n' "--gin_file=${f}"
  done
  printf '%s\n' "--gin.MODEL_DIR='${MODEL_DIR}'"
  if [ -n "${TASK:-}" ]; then
    printf '%s\n' "--gin.MIXTURE_OR_TASK_NAME='${TASK}'"
  fi
  if [ -n "${INITIAL_CHECKPOINT_PATH:-}" ]; then
    printf '%s\n' "--gin.INITIAL_CHECKPOINT_PATH='${INITIAL_CHECKPOINT_PATH}'"
  fi
}

# parse_flags "$@": accepts --dry_run; anything else is an error.
parse_flags() {
  local arg
  for arg in "$@"; do
    case "${arg}" in
      --dry_run) DRY_RUN=1 ;;
      *) die "unknown argument '${arg}'; the only flag is --dry_run (settings are environment variables)" ;;
    esac
  done
}
