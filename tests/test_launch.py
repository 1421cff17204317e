"""launch/*.sh: syntax (bash -n, shellcheck when installed), dry runs, and one-line refusals."""
from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "launch").glob("*.sh"))
ENTRY_POINTS = ["gpu_host.sh", "local_cpu.sh", "tpu_pod.sh"]

BASE = {"GIN_FILES": "gin/models/t5_1_1_base.gin gin/prompts/smop.gin gin/runs/prompt_tune.gin",
        "MODEL_DIR": "/runs/rte", "TASK": "spot_super_glue_rte_v200",
        "INITIAL_CHECKPOINT_PATH": "/ckpts/t5_1_1_base/checkpoint_1000000"}
REQUIRED = {
    "gpu_host.sh": ["GIN_FILES", "MODEL_DIR", "TASK", "INITIAL_CHECKPOINT_PATH"],
    "local_cpu.sh": ["GIN_FILES", "MODEL_DIR"],
    "tpu_pod.sh": ["TPU_NAME", "ZONE", "REPO_DIR", "GIN_FILES", "MODEL_DIR", "TASK", "INITIAL_CHECKPOINT_PATH"],
}
POD = {"TPU_NAME": "my-pod", "ZONE": "us-central2-b", "REPO_DIR": "/home/me/spot-jax"}


def _run(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
  clean = {k: v for k, v in os.environ.items()
           if k not in set(sum(REQUIRED.values(), [])) | {"DRY_RUN", "TRAINER", "NUM_PROCESSES"}}
  return subprocess.run(["bash", str(REPO / "launch" / script), *args], env={**clean, **env},
                        capture_output=True, text=True, timeout=60)


def _lines(text: str) -> list[list[str]]:
  return [shlex.split(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_syntax(path):
  subprocess.run(["bash", "-n", str(path)], check=True)
  assert path.name == "lib.sh" or os.access(path, os.X_OK), f"{path.name} is not executable"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt-get install shellcheck)")
def test_shellcheck():
  run = subprocess.run(["shellcheck", "-x", *[str(p.relative_to(REPO)) for p in SCRIPTS]], cwd=REPO,
                       capture_output=True, text=True)
  assert run.returncode == 0, run.stdout


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
  assert run.returncode == 2 and run.stderr.strip() == "launch/gpu_host.sh: error: TRAINER=pax is unknown; valid: spot_jax or t5x"


def test_local_cpu_dry_run_starts_one_process_per_id():
  run = _run("local_cpu.sh", {"GIN_FILES": "gin/test/smoke.gin", "MODEL_DIR": "/tmp/smoke",
                              "NUM_PROCESSES": "2", "PORT": "23999", "DRY_RUN": "1"})
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
    assert {"--coordinator_address=10.0.0.1:1234", "--num_processes=2", "--process_id=1"} <= set(cmd)


@pytest.mark.parametrize("trainer", ["spot_jax", "t5x"])
def test_tpu_pod_dry_run_runs_the_same_command_on_every_worker(trainer):
  env = {**BASE, **POD, "TRAINER": trainer, "T5X_DIR": "/home/me/t5x", "PROJECT": "proj"}
  run = _run("tpu_pod.sh", env, "--dry_run")
  assert run.returncode == 0, run.stderr
  (cmd,) = _lines(run.stdout)
  assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-pod"]
  assert "--worker=all" in cmd and "--zone=us-central2-b" in cmd and "--project=proj" in cmd
  remote = next(c for c in cmd if c.startswith("--command="))[len("--command="):]
  train = shlex.split(remote.split("&&", 1)[1])
  assert train[0].startswith("PYTHONPATH=/home/me/spot-jax")
  assert train[1:4] == ["python3", "-m", f"{trainer}.train"]
  assert "--gin_file=gin/prompts/smop.gin" in train
  if trainer == "spot_jax":
    assert "--multiprocess" in train
  else:
    assert "--gin_search_paths=/home/me/spot-jax" in train and "/home/me/t5x" in train[0]


def test_tpu_pod_t5x_needs_t5x_dir():
  run = _run("tpu_pod.sh", {**BASE, **POD, "TRAINER": "t5x", "DRY_RUN": "1"})
  assert run.returncode == 2 and run.stderr.startswith("launch/tpu_pod.sh: error: T5X_DIR is not set")
