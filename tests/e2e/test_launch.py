"""launch/*.sh: syntax (bash -n, shellcheck when installed), dry runs, one-line refusals, the
interpreter they choose, and real local runs: a process killed with SIGKILL gives one launcher
line naming it, the other is stopped, crash traces stay in the per-process logs.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from tests.helpers import REPO

SCRIPTS = sorted((REPO / "launch").glob("*.sh"))
ENTRY_POINTS = ["gpu_host.sh", "local_cpu.sh", "tpu_pod.sh"]

# PYTHON is given: without it the scripts use the repository's .venv when there is one (CI).
BASE = {"GIN_FILES": "gin/models/t5_1_1_base.gin gin/prompts/smop.gin gin/runs/prompt_tune.gin",
        "MODEL_DIR": "/runs/rte", "TASK": "spot_super_glue_rte_v200",
        "INITIAL_CHECKPOINT_PATH": "/ckpts/t5_1_1_base/checkpoint_1000000", "PYTHON": "python3"}
REQUIRED = {
    "gpu_host.sh": ["GIN_FILES", "MODEL_DIR", "TASK", "INITIAL_CHECKPOINT_PATH"],
    "local_cpu.sh": ["GIN_FILES", "MODEL_DIR"],
    "tpu_pod.sh": ["TPU_NAME", "ZONE", "REPO_DIR", "GIN_FILES", "MODEL_DIR", "TASK",
                   "INITIAL_CHECKPOINT_PATH"],
}
SETTINGS = set(sum(REQUIRED.values(), [])) | {"DRY_RUN", "TRAINER", "NUM_PROCESSES", "PYTHON",
                                             "PROCESS_ID", "COORDINATOR_ADDRESS", "EXTRA_ARGS",
                                             "TASK_MODULE", "GRACE_PERIOD"}
POD = {"TPU_NAME": "my-pod", "ZONE": "us-central2-b", "REPO_DIR": "/home/me/spot-jax"}


def _env(env: dict[str, str]) -> dict[str, str]:
  return {**{k: v for k, v in os.environ.items() if k not in SETTINGS}, **env}


def _run(script: str, env: dict[str, str], *args: str, launch: pathlib.Path = REPO / "launch",
         cwd=None, timeout: float = 60) -> subprocess.CompletedProcess:
  return subprocess.run(["bash", str(launch / script), *args], env=_env(env), cwd=cwd,
                        capture_output=True, text=True, timeout=timeout)


def _lines(text: str) -> list[list[str]]:
  return [shlex.split(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_syntax(path):
  subprocess.run(["bash", "-n", str(path)], check=True)
  assert path.name == "lib.sh" or os.access(path, os.X_OK), f"{path.name} is not executable"


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck is not installed (apt-get install shellcheck)")
def test_shellcheck():
  run = subprocess.run(["shellcheck", "-x", *[str(p.relative_to(REPO)) for p in SCRIPTS]], cwd=REPO,
                       capture_output=True, text=True)
  assert run.returncode == 0, run.stdout


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_the_interrupt_trap_is_set_before_the_first_process_starts(path):
  """Ctrl-C between a `start` and `supervise` must stop what has started: every script that
  starts a process guards first (test_ctrl_c_stops_every_process can hit that window only by
  chance; CI once did, and the launcher died leaving both processes running)."""
  lines = [l.strip() for l in path.read_text().splitlines()]
  starts = [i for i, l in enumerate(lines) if l.startswith("start ")]
  if path.name == "lib.sh" or not starts:
    return
  guards = [i for i, l in enumerate(lines) if l.endswith("guard_interrupts")]
  assert guards and guards[0] < starts[0], (f"{path.name}: guard_interrupts must come before line "
                                            f"{starts[0] + 1}")


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_header_documents_every_required_variable(script):
  header = (REPO / "launch" / script).read_text().split("set -euo pipefail")[0]
  for name in REQUIRED[script] + ["DRY_RUN"]:
    assert name in header, f"{script} does not document {name}"


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_missing_variable_is_refused_in_one_line(script):
  full = {**BASE, **POD}
  for name in REQUIRED[script]:
    env = {k: v for k, v in full.items() if k != name}
    run = _run(script, env, "--dry_run")
    assert run.returncode == 2, (name, run.stderr)
    assert run.stdout == ""
    assert run.stderr.splitlines() == [run.stderr.strip()] and run.stderr.startswith(
        f"launch/{script}: error: {name} is not set"), run.stderr


def test_unknown_argument_and_trainer_are_refused():
  run = _run("gpu_host.sh", BASE, "--now")
  assert run.returncode == 2 and "unknown argument '--now'" in run.stderr
  run = _run("gpu_host.sh", {**BASE, "TRAINER": "pax", "DRY_RUN": "1"})
  assert (run.returncode == 2 and run.stderr.strip() == "launch/gpu_host.sh: error: TRAINER=pax is "
                                                        "unknown; valid: spot_jax or t5x")


def test_local_cpu_dry_run_starts_one_process_per_id():
  run = _run("local_cpu.sh", {"GIN_FILES": "gin/test/smoke.gin", "MODEL_DIR": "/tmp/smoke",
                              "NUM_PROCESSES": "2", "PORT": "23999", "DRY_RUN": "1",
                              "PYTHON": "python3"})
  assert run.returncode == 0, run.stderr
  cmds = _lines(run.stdout)
  assert len(cmds) == 2
  for i, cmd in enumerate(cmds):
    assert cmd[:3] == ["python3", "-m", "spot_jax.train"]
    assert "--gin_file=gin/test/smoke.gin" in cmd and "--gin.MODEL_DIR='/tmp/smoke'" in cmd
    assert f"--process_id={i}" in cmd and "--num_processes=2" in cmd
    assert "--coordinator_address=localhost:23999" in cmd


@pytest.mark.parametrize("trainer", ["spot_jax", "t5x"])
def test_gpu_host_dry_run(trainer):
  env = {**BASE, "TRAINER": trainer, "COORDINATOR_ADDRESS": "10.0.0.1:1234", "NUM_PROCESSES": "2",
         "PROCESS_ID": "1"}
  run = _run("gpu_host.sh", env, "--dry_run")
  assert run.returncode == 0, run.stderr
  (cmd,) = _lines(run.stdout)
  assert cmd[:3] == ["python3", "-m", f"{trainer}.train"]
  assert "--gin.INITIAL_CHECKPOINT_PATH='/ckpts/t5_1_1_base/checkpoint_1000000'" in cmd
  assert "--gin.MIXTURE_OR_TASK_NAME='spot_super_glue_rte_v200'" in cmd
  if trainer == "t5x":
    assert {"--multiprocess_gpu", "--process_count=2", "--process_index=1"} <= set(cmd)
  else:
    assert ({"--coordinator_address=10.0.0.1:1234", "--num_processes=2",
             "--process_id=1"} <= set(cmd))


@pytest.mark.parametrize("trainer", ["spot_jax", "t5x"])
def test_tpu_pod_dry_run_runs_the_same_command_on_every_worker(trainer):
  env = {**BASE, **POD, "TRAINER": trainer, "T5X_DIR": "/home/me/t5x", "PROJECT": "proj"}
  run = _run("tpu_pod.sh", env, "--dry_run")
  assert run.returncode == 0, run.stderr
  (cmd,) = _lines(run.stdout)
  assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-pod"]
  assert "--worker=all" in cmd and "--zone=us-central2-b" in cmd and "--project=proj" in cmd
  remote = next(c for c in cmd if c.startswith("--command="))[len("--command="):]
  cd, worker = remote.split(" && ", 1)
  assert shlex.split(cd) == ["cd", "/home/me/spot-jax"]
  worker = shlex.split(worker)
  start = worker.index("launch/pod_worker.sh")
  assert worker[start - 1] == "bash"  # the worker side: interpreter check, logs, one-line failure
  assert set(worker[:start - 1]) >= {"MODEL_DIR=/runs/rte", f"TRAINER={trainer}", "PYTHON=python3"}
  train = worker[start + 1:]
  assert train[:2] == ["-m", f"{trainer}.train"]
  assert "--gin_file=gin/prompts/smop.gin" in train
  if trainer == "spot_jax":
    assert "--multiprocess" in train
  else:
    assert ("--gin_search_paths=/home/me/spot-jax" in train
            and "T5X_DIR=/home/me/t5x" in worker[:start])


def test_tpu_pod_t5x_needs_t5x_dir():
  run = _run("tpu_pod.sh", {**BASE, **POD, "TRAINER": "t5x", "DRY_RUN": "1"})
  assert (run.returncode == 2
          and run.stderr.startswith("launch/tpu_pod.sh: error: T5X_DIR is not set"))


# ------------------------------------------------------------------ the interpreter


def _sandbox(tmp_path: pathlib.Path) -> pathlib.Path:
  """A checkout without .venv: launch/ copied (the scripts find the repository from there), the
  code and gin files linked."""
  root = tmp_path / "checkout"
  shutil.copytree(REPO / "launch", root / "launch")
  for name in ("spot_jax", "gin", "tasks"):
    (root / name).symlink_to(REPO / name)
  return root


def _interpreter(path: pathlib.Path, *flags: str) -> pathlib.Path:
  """An executable that runs this test's Python with `flags` (e.g. -S: no site-packages)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {' '.join(flags)} \"$@\"\n")
  path.chmod(0o755)
  return path


def _one_error_line(run: subprocess.CompletedProcess, script: str) -> str:
  lines = run.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"launch/{script}: error: "), run.stderr
  return lines[0]


def test_refuses_an_interpreter_that_cannot_import_spot_jax(tmp_path):
  # -I -S: no site-packages, no working directory on sys.path: spot_jax is nowhere to import.
  python = _interpreter(tmp_path / "bin" / "python", "-I", "-S")
  for script, env in [("local_cpu.sh", {"GIN_FILES": "gin/test/smoke.gin"}), ("gpu_host.sh", BASE)]:
    run = _run(script, {**env, "MODEL_DIR": str(tmp_path / "run"), "PYTHON": str(python)},
               cwd=tmp_path)
    assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
    line = _one_error_line(run, script)
    assert f"{python} cannot import spot_jax (No module named 'spot_jax')" in line
    assert "set PYTHON" in line and ".venv" in line
  assert not (tmp_path / "run").exists()  # refused before anything was written
  # A pod worker (launch/pod_worker.sh, what tpu_pod.sh runs on each worker) the same way.
  worker = subprocess.run(["bash", str(REPO / "launch" / "pod_worker.sh"), "-m", "spot_jax.train"],
                          env=_env({"MODEL_DIR": str(tmp_path / "run"), "PYTHON": str(python)}),
                          capture_output=True, text=True, timeout=60)
  assert worker.returncode == 2 and worker.stdout == "", worker.stdout + worker.stderr
  (line,) = worker.stderr.splitlines()
  assert re.match(rf"launch/tpu_pod\.sh on \S+: error: {re.escape(str(python))} cannot import "
                  r"spot_jax \(No module named 'spot_jax'\)", line), line
  assert not (tmp_path / "run").exists()
  run = _run("local_cpu.sh", {"GIN_FILES": "gin/test/smoke.gin", "MODEL_DIR": str(tmp_path / "run"),
                              "PYTHON": str(tmp_path / "nowhere" / "python")})
  assert (run.returncode == 2
          and "is not an interpreter that can be run" in _one_error_line(run, "local_cpu.sh"))


def test_without_venv_or_python_from_the_repository_root_refuses_in_one_line(tmp_path):
  # The case: no .venv, PYTHON unset, and the system python3 lacks gin-config (here: this
  # Python without site-packages), run from the repository root. The repository's gin/ folder
  # then passes for the gin package; the launcher says so instead of starting processes that
  # end in "ImportError: cannot import name 'config_parser' from 'gin'".
  root = _sandbox(tmp_path)
  bin_dir = tmp_path / "bin"
  _interpreter(bin_dir / "python3", "-S")
  env = {"GIN_FILES": "gin/test/smoke.gin", "MODEL_DIR": str(tmp_path / "run"),
         "NUM_PROCESSES": "2", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
  run = _run("local_cpu.sh", env, launch=root / "launch", cwd=root)
  assert run.returncode == 2, run.stdout + run.stderr
  line = _one_error_line(run, "local_cpu.sh")
  assert "python3 cannot import spot_jax (gin-config is not installed, so the repository's gin/ " \
         "folder stands in for the gin package)" in line, line
  assert f"create {root}/.venv" in line and "resume" not in line
  assert not (tmp_path / "run").exists()


def test_the_repository_venv_is_used_unless_python_is_set(tmp_path):
  root = _sandbox(tmp_path)
  venv_python = _interpreter(root / ".venv" / "bin" / "python")
  env = {"GIN_FILES": "gin/test/smoke.gin", "MODEL_DIR": "run", "DRY_RUN": "1"}
  for script, extra in [("local_cpu.sh", {}), ("gpu_host.sh", {**BASE, "PYTHON": ""})]:
    run = _run(script, {**extra, **env}, launch=root / "launch", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    (cmd,) = _lines(run.stdout)
    assert cmd[0] == str(venv_python)
    assert f"--gin.MODEL_DIR='{tmp_path}/run'" in cmd  # relative to the working directory
    run = _run(script, {**extra, **env, "PYTHON": "/opt/py/bin/python"}, launch=root / "launch")
    assert _lines(run.stdout)[0][0] == "/opt/py/bin/python"  # PYTHON wins


def _last_saved_step(tmp_path: pathlib.Path, names: list[str]) -> str:
  run_dir = tmp_path / "run"
  for name in names:
    (run_dir / name).mkdir(parents=True)
  script = (f'source {shlex.quote(str(REPO / "launch" / "lib.sh"))}; last_saved_step '
            f'{shlex.quote(str(run_dir))}')
  return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout


def test_last_saved_step_counts_complete_step_directories_only(tmp_path):
  assert _last_saved_step(tmp_path / "a", []) == ""
  assert _last_saved_step(tmp_path / "b",
                          ["checkpoints/2", "checkpoints/10", "checkpoints/12.corrupt",
                           "checkpoints/14.orbax-checkpoint-tmp-1700000000"]) == "10"
  assert _last_saved_step(tmp_path / "c",
                          ["checkpoint_300", "checkpoint_400.tmp-1700000000"]) == "300"  # t5x


# ------------------------------------------------------------------ real local runs (2 processes)

# Tracebacks that jax's C++ side prints when a process loses its peer: log files only.
CRASH_TRACE = ("Terminating process", "Aborted", "*** Check failure", "@     0x",
               "Fatal Python error")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _launch(model_dir: pathlib.Path, steps: int, *extra: str, env=None) -> subprocess.Popen:
  """launch/local_cpu.sh with 2 processes on the smoke configuration, from a folder outside the
  repository (relative gin files), checkpointing every 2 steps."""
  args = [f"--gin.TRAIN_STEPS={steps}", "--gin.BATCH_SIZE=4", "--gin.CHECKPOINT_PERIOD=2",
          "--gin.train.train.log_period=1", *extra]
  env = _env({"GIN_FILES": "gin/test/smoke.gin", "MODEL_DIR": str(model_dir), "NUM_PROCESSES": "2",
              "PORT": str(_free_port()), "HEARTBEAT_TIMEOUT": "10", "PYTHON": sys.executable,
              "EXTRA_ARGS": " ".join(a for a in args if a), "TF_CPP_MIN_LOG_LEVEL": "3",
              **(env or {})})
  env.pop("XLA_FLAGS", None)  # one CPU device per process
  return subprocess.Popen(["bash", str(REPO / "launch" / "local_cpu.sh")], cwd=model_dir.parent,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=_interruptible)


def _interruptible() -> None:
  """Ctrl-C's default action in the launcher, as in a terminal: when the tests themselves run
  in the background of a non-interactive shell, SIGINT reaches them ignored, and bash cannot trap
  a signal ignored on entry."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def _processes(model_dir: pathlib.Path) -> dict[int, int]:
  """process_id -> pid of the trainer processes of this run (from /proc)."""
  found = {}
  for proc in pathlib.Path("/proc").iterdir():
    try:
      args = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
      continue
    words = [a.decode(errors="replace") for a in args]
    if "spot_jax.train" in words and any(str(model_dir) in w for w in words):
      ids = [w.split("=", 1)[1] for w in words if w.startswith("--process_id=")]
      if ids:
        found[int(ids[0])] = int(proc.name)
  return found


@pytest.mark.parametrize("victim", [1, 0])
def test_sigkill_gives_one_launcher_line_and_stops_the_other_process(tmp_path, victim):
  run_dir = tmp_path / "run"
  # The survivor gets longer than its heartbeat timeout (10 s) to notice the lost peer itself, so
  # its log shows how it ended however busy the machine is (with the default 3 s, a survivor
  # between two collectives can be stopped by the launcher before it notices).
  launcher = _launch(run_dir, 60, env={"GRACE_PERIOD": "30"})
  deadline = time.time() + 300
  while not (run_dir / "checkpoints" / "2").is_dir():  # a complete step directory
    assert time.time() < deadline and launcher.poll() is None, launcher.communicate()
    time.sleep(0.05)
  pids = _processes(run_dir)
  assert sorted(pids) == [0, 1], pids
  os.kill(pids[victim], signal.SIGKILL)
  out, err = launcher.communicate(timeout=120)

  assert launcher.returncode == 128 + signal.SIGKILL, (out, err)
  assert _processes(run_dir) == {}  # the survivor was stopped (or ended), nothing left behind
  (line,) = err.splitlines()
  assert line.startswith(f"launch/local_cpu.sh: error: process {victim} of 2 failed first (killed "
                         "by SIGKILL); "), line
  step = int(line.split("last saved step ")[1].split(",")[0])
  assert step >= 2 and (run_dir / "checkpoints" / str(step)).is_dir()
  resume = line.split("resume with: ", 1)[1].rsplit("; log: ", 1)[0]
  assert (resume.startswith(f"GIN_FILES=gin/test/smoke.gin MODEL_DIR={run_dir} ")
          and " NUM_PROCESSES=2 " in resume)
  # as given, no defaults
  assert resume.endswith("launch/local_cpu.sh") and " GRACE_PERIOD=30 " in resume
  assert "COORDINATOR_ADDRESS=" not in resume and "PROCESS_ID=" not in resume
  assert line.endswith(f"; log: {run_dir}/logs/process_{victim}.log")
  assert not any(t in out + err for t in CRASH_TRACE), out + err
  assert "step 1/60" in out  # process 0's progress reached the terminal

  # The logs hold each process's whole output: its progress, and the survivor's stderr about
  # the lost peer (jax's abort trace when the coordinator died, spot-jax's line otherwise).
  survivor = (run_dir / "logs" / f"process_{1 - victim}.log").read_text()
  assert "step 1/60" in (run_dir / "logs" / "process_0.log").read_text()
  assert any(m in survivor for m in ("detected fatal errors", "Socket closed",
                                     "lost contact with another process", "heartbeat timeout",
                                     "another task died")), survivor[-3000:]
  if victim == 0:
    assert "Terminating process" in survivor or "Socket closed" in survivor, survivor[-3000:]
  # The printed command resuming to the end is checked by this file's last test.


def test_no_resume_offered_when_nothing_was_saved(tmp_path):
  # Both processes stop on a configuration error before the first step: the launcher repeats
  # the program's one line and does not say "resume".
  run_dir = tmp_path / "run"
  launcher = _launch(run_dir, 4, "--gin.MIXTURE_OR_TASK_NAME='spot_no_such_task_v100'")
  out, err = launcher.communicate(timeout=300)
  assert launcher.returncode == 2, (out, err)
  (line,) = err.splitlines()
  assert re.match(r"launch/local_cpu\.sh: error: process [01] of 2 failed first \(exit 2: "
                  r"spot_jax\.train: error: unknown seqio task or mixture "
                  r"'spot_no_such_task_v100'", line), line
  assert ("nothing was saved; rerun the same command to start again" in line
          and "resume with" not in line)
  assert _processes(run_dir) == {}


@pytest.mark.parametrize("running", [2, 1])
def test_ctrl_c_stops_every_process(tmp_path, running):
  # In the background the processes ignore SIGINT (bash without job control), so the launcher
  # must stop them itself, also when Ctrl-C comes while it is still starting them (running=1:
  # as soon as the first one runs; a launcher that set its trap only once all had started died
  # of it and left them running).
  run_dir = tmp_path / "run"
  launcher = _launch(run_dir, 60)
  deadline = time.time() + 120
  while len(_processes(run_dir)) < running:
    assert time.time() < deadline and launcher.poll() is None, launcher.communicate()
    time.sleep(0.01)
  launcher.send_signal(signal.SIGINT)
  out, err = launcher.communicate(timeout=60)
  assert launcher.returncode == 130, (out, err)
  (line,) = err.splitlines()
  assert re.match(r"launch/local_cpu.sh: error: interrupted; stopped [12] process\(es\); "
                  r"nothing was saved", line), line
  if running == 2:
    assert "stopped 2 process(es)" in line, line
  assert _processes(run_dir) == {}


# The launcher's own side of Ctrl-C, without a trainer: each stand-in process interrupts the
# launcher as soon as it runs, so the signal lands while `start` is forking the next one, and
# sometimes between a fork and its `PIDS[i]=$!` (a trap runs between two commands). A launcher
# that stopped only the processes in PIDS left that one running, holding its stdout open: the
# real-trainer test above timed out in CI that way.
STAND_IN = """#!/usr/bin/env bash
case "$1" in -c) exit 0 ;; esac  # the launcher's import probe
echo "$$" >> "${STAND_IN_PIDS}"
kill -INT "${PPID}"
exec sleep 60
"""


def _alive(pid: int) -> bool:
  try:
    state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
  except OSError:
    return False
  return state != "Z"


def test_ctrl_c_while_starting_stops_every_started_process(tmp_path):
  python = tmp_path / "python"
  python.write_text(STAND_IN)
  python.chmod(0o755)
  pids = tmp_path / "pids"
  for attempt in range(25):
    pids.write_text("")
    env = _env({"GIN_FILES": "gin/test/smoke.gin", "MODEL_DIR": str(tmp_path / f"run{attempt}"),
                "NUM_PROCESSES": "3", "PYTHON": str(python), "STAND_IN_PIDS": str(pids)})
    launcher = subprocess.Popen(["bash", str(REPO / "launch" / "local_cpu.sh")], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_interruptible)
    try:
      out, err = launcher.communicate(timeout=20)
    except subprocess.TimeoutExpired:
      launcher.kill()
      out, err = launcher.communicate()
    finally:
      started = [int(p) for p in pids.read_text().split()]
      running = [p for p in started if _alive(p)]
      for pid in running:
        os.kill(pid, signal.SIGKILL)
    assert running == [], f"attempt {attempt}: processes {running} outlived the launcher"
    assert launcher.returncode == 130, (attempt, out, err)
    (line,) = err.splitlines()
    assert re.match(r"launch/local_cpu.sh: error: interrupted; stopped [123] process\(es\); "
                    r"nothing was saved", line), line


# ----------------------------------------- evaluation under 2 processes, killed and resumed
# Every 2-process run above evaluates as smoke.gin says (at the end of a 60-step run); this one
# evaluates every 20 steps and compares with one process, then kills process 1 of a third run and
# resumes it with the printed command: it must end where the uninterrupted 2-process run ended.


def _eval_metrics(run_dir: pathlib.Path) -> list[dict]:
  path = run_dir / "eval" / "spot_synthetic_sentiment_v100-metrics.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run_to_end(model_dir: pathlib.Path, steps: int, processes: int,
                *extra: str) -> subprocess.CompletedProcess:
  launcher = _launch(model_dir, steps, *extra, env={"NUM_PROCESSES": str(processes)})
  out, err = launcher.communicate(timeout=900)
  assert launcher.returncode == 0, out[-2000:] + err[-2000:]
  return subprocess.CompletedProcess(launcher.args, 0, out, err)


def test_two_processes_with_evaluation_equal_one_process_and_a_killed_run_resumes_to_the_same_end(
    tmp_path):
  evaluate = ("--gin.EVAL_PERIOD=20", "--gin.EVAL_BATCH_SIZE=8", "--gin.EVAL_NUM_EXAMPLES=32",
              "--gin.BEST_METRIC='accuracy'", "--gin.SAVE_PROMPT_STEPS=[20,40]")
  one, two = tmp_path / "one", tmp_path / "two"
  # The one-process run splits its CPU into 2 devices: the same global mesh and batch shards, so
  # the gradient is summed in the same order and the comparison shows what several processes
  # change (nothing). On one device the sum's order differs, which Adafactor grows to ~3e-5 in
  # 20 steps of the prompt (the metrics still agree).
  _run_to_end(one, 60, 1, *evaluate, "--cpu_devices=2")
  _run_to_end(two, 60, 2, *evaluate)
  metrics_one, metrics_two = _eval_metrics(one), _eval_metrics(two)
  assert [m["step"] for m in metrics_one] == [20, 40, 60] == [m["step"] for m in metrics_two]
  for a, b in zip(metrics_one, metrics_two):
    assert a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 1e-5 for k in a), (a, b)
  assert (sorted(p.name for p in (one / "best").iterdir())
          == sorted(p.name for p in (two / "best").iterdir()))
  for name in ("prompt_step_20.npy", "prompt_step_40.npy", "prompt_best.npy"):
    np.testing.assert_allclose(np.load(two / "prompts" / name), np.load(one / "prompts" / name),
                               rtol=0, atol=1e-5)

  # SIGKILL of process 1 mid-run, then the printed command (the previous launch's logs are kept
  # beside the new ones): the same end as the uninterrupted 2-process run `two`.
  killed = tmp_path / "killed"
  launcher = _launch(killed, 60, *evaluate)
  while not (killed / "checkpoints" / "10").is_dir():
    assert launcher.poll() is None, launcher.communicate()
    time.sleep(0.05)
  os.kill(_processes(killed)[1], signal.SIGKILL)
  _, err = launcher.communicate(timeout=120)
  (line,) = err.splitlines()
  assert "process 1 of 2 failed first (killed by SIGKILL)" in line and "resume with: " in line, line
  resume = line.split("resume with: ", 1)[1].rsplit("; log: ", 1)[0]
  first_logs = {i: (killed / "logs" / f"process_{i}.log").read_text() for i in (0, 1)}
  env = _env({"TF_CPP_MIN_LOG_LEVEL": "3"})
  env.pop("XLA_FLAGS", None)
  again = subprocess.run(["bash", "-c", resume], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900)
  assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
  assert again.stderr == "" and "step 60/60" in again.stdout
  assert "resumed from" in (killed / "logs" / "process_0.log").read_text()
  for i in (0, 1):
    assert (killed / "logs" / f"process_{i}.prev.log").read_text() == first_logs[i]
  assert (killed / "checkpoints" / "60").is_dir() and _processes(killed) == {}
  for name in ("prompt_step_40.npy", "prompt_best.npy"):
    np.testing.assert_allclose(np.load(killed / "prompts" / name), np.load(two / "prompts" / name),
                               rtol=0, atol=1e-6)
  assert _eval_metrics(killed)[-1] == _eval_metrics(two)[-1]
