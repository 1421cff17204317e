# Helpers sourced by the launch/*.sh scripts (not run on its own).
# shellcheck shell=bash

# The script's name in messages, e.g. "launch/tpu_pod.sh".
LAUNCH_PROG="launch/$(basename "${0}")"
# The repository root (this file's folder's parent), whatever the working directory.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# What a process's log says when it only stopped because another process had died (jax's
# coordination service, or spot-jax's own "lost contact" line).
PEER_LOSS='detected fatal errors|another task died|heartbeat timeout|Socket closed'
PEER_LOSS+='|lost contact with another process'
# fd 3: the launcher's own stderr while supervising, when fd 2 is muted (bash reports each
# process that a signal ended, "line N: <pid> Killed ...", on fd 2; the one-line report says it).
exec 3>&2
# Imports spot_jax and finds what it runs on (and the modules named as arguments); prints the
# first problem (one line) and exits 1.
# The repository's gin/ folder passes for the gin package (a namespace package) when gin-config
# is missing and the repository root is on sys.path, so gin is checked for being a real package.
PROBE='import importlib.util, sys
try:
  import spot_jax
  gin = importlib.util.find_spec("gin")
  if gin is None or gin.origin is None:
    stand_in = ", so the repository'"'"'s gin/ folder stands in for the gin package"
    raise ImportError("gin-config is not installed" + (stand_in if gin else ""))
  for name in ("jax", "flax", "optax", "orbax.checkpoint", "seqio", "tensorflow", *sys.argv[1:]):
    if importlib.util.find_spec(name) is None:
      raise ImportError(f"No module named {name!r}")
except ImportError as e:
  print(str(e).splitlines()[0] if str(e) else type(e).__name__)
  sys.exit(1)'

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

# show CMD...: print the command, quoted so it can be pasted.
show() {
  printf '%q ' "$@" | sed 's/ $//'
  echo
}

# run CMD...: print the command and run it unless dry-running.
run() {
  show "$@"
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
  if [ -n "${TASK_MODULE:-}" ]; then
    printf '%s\n' "--gin.MIXTURE_OR_TASK_MODULE='${TASK_MODULE}'"
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
      *) die "unknown argument '${arg}'; the only flag is --dry_run (settings are environment" \
             "variables)" ;;
    esac
  done
}

# choose_python: PY = $PYTHON when set, else the repository's .venv/bin/python, else python3;
# and the repository goes first on PYTHONPATH, so this checkout's spot_jax runs.
choose_python() {
  if [ -n "${PYTHON:-}" ]; then
    PY="${PYTHON}"
  elif [ -x "${REPO}/.venv/bin/python" ]; then
    PY="${REPO}/.venv/bin/python"
  else
    PY=python3
  fi
  export PYTHONPATH="${REPO}${PYTHONPATH:+:${PYTHONPATH}}"
}

# check_python [MODULE...]: refuse in one line when PY cannot import spot_jax (or cannot find a
# MODULE); nothing in dry runs.
check_python() {
  local why
  is_dry_run && return 0
  if ! command -v "${PY}" >/dev/null 2>&1; then
    die "PYTHON=${PY} is not an interpreter that can be run; set PYTHON to one with spot-jax's" \
        "dependencies, or create ${REPO}/.venv (python3 -m venv .venv &&" \
        ".venv/bin/pip install -e .)"
  fi
  if ! why="$("${PY}" -c "${PROBE}" "$@" 2>&1)"; then
    why="$(printf '%s\n' "${why}" | grep -v '^[[:space:]]*$' | tail -n 1)"
    die "${PY} cannot import spot_jax (${why:-it ended without a message}); set PYTHON to an" \
        "interpreter with spot-jax's dependencies, or create ${REPO}/.venv (python3 -m venv" \
        ".venv && .venv/bin/pip install -e .), which the launcher then uses"
  fi
}

# absolute PATH: PATH made absolute against the working directory (paths with :// unchanged).
absolute() {
  case "$1" in
    /*|*://*) printf '%s\n' "$1" ;;
    *) printf '%s\n' "${PWD}/$1" ;;
  esac
}

# quote WORD: WORD as a shell word (single-quoted unless it is plain).
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,@+%-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# relaunch_command: the command that started this launch: the settings the user gave (as given,
# before any default), then the script as it was called.
relaunch_command() {
  printf '%s%s' "${GIVEN_SETTINGS}" "$(quote "${0}")"
}

# last_saved_step DIR: the newest complete training state of the run directory DIR, or nothing.
# spot_jax keeps DIR/checkpoints/<step>, t5x DIR/checkpoint_<step>; partial or set-aside states
# (orbax's <step>.orbax-checkpoint-tmp-*, <step>.corrupt, t5x's .tmp-*) are not complete steps.
last_saved_step() {
  local dir="$1" path name best=""
  for path in "${dir}"/checkpoints/* "${dir}"/checkpoint_*; do
    [ -d "${path}" ] || continue
    name="$(basename "${path}")"
    name="${name#checkpoint_}"
    [[ "${name}" =~ ^[0-9]+$ ]] || continue
    if [ -z "${best}" ] || [ "$((10#${name}))" -gt "${best}" ]; then
      best="$((10#${name}))"
    fi
  done
  printf '%s' "${best}"
}

# describe_exit STATUS: "exit 1", or "killed by SIGKILL" for a signal (status 128+N).
describe_exit() {
  if [ "$1" -gt 128 ] && [ "$1" -lt 160 ]; then
    printf 'killed by SIG%s' "$(kill -l "$(($1 - 128))" 2>/dev/null || echo "$(($1 - 128))")"
  else
    printf 'exit %s' "$1"
  fi
}

# error_line LOG: the program's own one-line error in LOG ("spot_jax.train: error: ..."), if any.
error_line() {
  grep -E '^spot_jax\.[A-Za-z_.]+: (internal )?error: ' "$1" 2>/dev/null | tail -n 1 || true
}

# peer_loss LOG: whether LOG shows its process stopped only because another one had died.
peer_loss() {
  grep -Eq "${PEER_LOSS}" "$1" 2>/dev/null
}

# open_logs DIR NAME...: LOG_DIR=DIR, ready for <NAME>.log (the previous launch's logs are kept
# as <NAME>.prev.log).
open_logs() {
  local name
  LOG_DIR="$1"
  shift
  if ! mkdir -p "${LOG_DIR}" 2>/dev/null; then
    die "cannot create the log folder ${LOG_DIR}; give a writable MODEL_DIR"
  fi
  for name in "$@"; do
    if [ -e "${LOG_DIR}/${name}.log" ]; then
      mv -f "${LOG_DIR}/${name}.log" "${LOG_DIR}/${name}.prev.log"
    fi
  done
}

# start I NAME LABEL SHOW CMD...: runs CMD in the background, its stdout and stderr into
# LOG_DIR/<NAME>.log; LABEL names it in messages ("process 1 of 2"). SHOW: "stdout" also shows
# its stdout here (spot_jax's progress lines; crash traces and library noise are on stderr),
# "all" both streams (t5x logs its progress on stderr), "none" nothing. Sets PIDS[I], LOGS[I]
# and NAMES[I].
start() {
  local i="$1" log="${LOG_DIR}/$2.log" label="$3" show="$4"
  shift 4
  # shellcheck disable=SC2094  # tee and the process only append to the log; nothing reads it
  case "${show}" in
    stdout) PYTHONUNBUFFERED=1 "$@" > >(tee -a "${log}") 2>>"${log}" 3>&- & ;;
    all) PYTHONUNBUFFERED=1 "$@" > >(tee -a "${log}") 2>&1 3>&- & ;;
    *) PYTHONUNBUFFERED=1 "$@" >>"${log}" 2>&1 3>&- & ;;
  esac
  PIDS[i]=$!
  LOGS[i]="${log}"
  NAMES[i]="${label}"
}

# stop_processes: SIGTERM to every process of PIDS still running, SIGKILL 2 s later to those left
# (once jax.distributed is up, jax catches SIGTERM as a preemption notice and carries on);
# STOPPED = how many there were. A process `start` had forked but not yet recorded (a trap runs
# between two commands, so Ctrl-C can land between the fork and `PIDS[i]=$!`) is still one of
# this shell's running jobs: it is recorded first, or it would run on with the launcher gone.
stop_processes() {
  local i pid tries=10 left=()
  STOPPED=0
  for pid in $(jobs -rp); do
    for i in "${!PIDS[@]}"; do
      [ "${PIDS[i]}" != "${pid}" ] || continue 2
    done
    PIDS[${#PIDS[@]}]="${pid}"
  done
  for i in "${!PIDS[@]}"; do
    if [ -z "${STATUS[i]:-}" ]; then
      left+=("${i}")
      kill -TERM "${PIDS[i]}" 2>/dev/null || true
    fi
  done
  while [ "${tries}" -gt 0 ] && [ "${#left[@]}" -gt 0 ]; do
    sleep 0.2
    tries=$((tries - 1))
    for i in "${!left[@]}"; do
      kill -0 "${PIDS[left[i]]}" 2>/dev/null || unset "left[i]"
    done
  done
  for i in "${!PIDS[@]}"; do
    if [ -z "${STATUS[i]:-}" ]; then
      kill -KILL "${PIDS[i]}" 2>/dev/null || true
      { wait "${PIDS[i]}"; } 2>/dev/null || true
      STATUS[i]=stopped
      STOPPED=$((STOPPED + 1))
    fi
  done
}

# outcome: "last saved step N, resume with: <RESUME>" or "nothing was saved; ..." for MODEL_DIR.
outcome() {
  local step
  step="$(last_saved_step "${MODEL_DIR}")"
  if [[ "${MODEL_DIR}" == *://* ]]; then
    printf 'rerun the same command to resume from the last saved step in %s' "${MODEL_DIR}"
  elif [ -n "${step}" ]; then
    printf 'last saved step %s, resume with: %s' "${step}" "${RESUME}"
  else
    printf 'nothing was saved; rerun the same command to start again'
  fi
}

# guard_interrupts: from here on, Ctrl-C or SIGTERM to the launcher stops every process `start`
# has started (on_interrupt). Call it before the first `start`: in the background the processes
# ignore Ctrl-C, and a launcher ended by it before `supervise` would leave them running.
guard_interrupts() {
  STATUS=()
  trap on_interrupt INT TERM HUP
}

# on_interrupt: Ctrl-C or SIGTERM to the launcher stops the processes (in the background they
# ignore Ctrl-C) and says where the run stands. A second Ctrl-C meanwhile is ignored: with the
# default action it would end the launcher halfway, leaving processes running.
on_interrupt() {
  trap '' INT TERM HUP
  stop_processes
  exec 2>&3
  echo "${LAUNCH_PROG}: error: interrupted; stopped ${STOPPED} process(es); $(outcome)" >&2
  exit 130
}

# supervise: waits for the processes started with `start` (after guard_interrupts).
# When one fails, the others get GRACE_PERIOD seconds (3) to end on their own and are then stopped;
# one line names the process that failed first (a process whose log shows it only lost its peer
# is not the cause when another failed too), its exit, the last saved step and how to resume.
# Returns 0 when every process succeeded, else the status of the process that failed first.
supervise() {
  local i code failed=() polls=0 grace_polls running root="" cause err line
  grace_polls=$((${GRACE_PERIOD:-3} * 5))
  guard_interrupts  # (again: a launcher that started processes without it)
  exec 2>/dev/null
  while :; do
    for i in "${!PIDS[@]}"; do
      if [ -z "${STATUS[i]:-}" ] && ! kill -0 "${PIDS[i]}" 2>/dev/null; then
        # (braces: bash's own "Killed ..." job report goes nowhere; the line below says it)
        { wait "${PIDS[i]}"; } 2>/dev/null && code=0 || code=$?
        STATUS[i]="${code}"
        [ "${code}" = 0 ] || failed+=("${i}")
      fi
    done
    running=0
    for i in "${!PIDS[@]}"; do
      [ -n "${STATUS[i]:-}" ] || running=$((running + 1))
    done
    [ "${running}" != 0 ] || break
    [ "${#failed[@]}" = 0 ] || [ "${polls}" -lt "${grace_polls}" ] || break
    [ "${#failed[@]}" = 0 ] || polls=$((polls + 1))
    sleep 0.2
  done
  stop_processes
  trap - INT TERM HUP
  exec 2>&3
  [ "${#failed[@]}" -gt 0 ] || return 0
  for i in "${failed[@]}"; do
    if ! peer_loss "${LOGS[i]}"; then
      root="${i}"
      break
    fi
  done
  if [ -n "${root}" ]; then
    cause="failed"
    [ "${#PIDS[@]}" = 1 ] || cause="failed first"
  else
    root="${failed[0]}"
    cause="stopped because another process died"
  fi
  err="$(error_line "${LOGS[root]}")"
  line="${NAMES[root]} ${cause} ($(describe_exit "${STATUS[root]}")${err:+: ${err}})"
  case "${STOPPED}" in
    0) ;;
    1) line+="; stopped the other process" ;;
    *) line+="; stopped the other ${STOPPED} processes" ;;
  esac
  echo "${LAUNCH_PROG}: error: ${line}; $(outcome); log: ${LOGS[root]}" >&2
  return "${STATUS[root]}"
}

# The settings as the user gave them (for the resume command), before the scripts add defaults.
GIVEN_SETTINGS=""
for _name in GIN_FILES MODEL_DIR TASK TASK_MODULE INITIAL_CHECKPOINT_PATH TRAINER PYTHON \
             NUM_PROCESSES PORT HEARTBEAT_TIMEOUT GRACE_PERIOD COORDINATOR_ADDRESS PROCESS_ID EXTRA_ARGS; do
  if [ -n "${!_name:-}" ]; then
    GIVEN_SETTINGS+="${_name}=$(quote "${!_name}") "
  fi
done
unset _name
