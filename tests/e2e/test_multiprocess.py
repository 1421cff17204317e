"""Real two-process runs of spot_jax.eval and infer on one machine (jax.distributed, gloo).

Each process runs the same command with its --process_id; process 0 hosts the coordinator on a
free localhost port. Checked: `spot_jax.eval` and `spot_jax.infer` under two processes give the
one-process results, and incomplete distributed settings are one-line errors. Training under two
processes (the same losses, evaluations, best state and prompts as one process; a killed process
makes the other stop with a line saying why; the printed command resumes to the same end) is
checked through the launcher that runs these same commands: tests/e2e/test_launch.py.
"""
from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from tests.helpers import REPO

# seconds; short so a dead peer is noticed quickly, long enough for a busy CI machine
HEARTBEAT = 10


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _command(model_dir: pathlib.Path, steps: int, *dist: str) -> list[str]:
  return [sys.executable, "-m", "spot_jax.train", "--gin_file=gin/test/smoke.gin",
          f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={steps}", "--gin.BATCH_SIZE=4",
          f"--gin.EVAL_PERIOD={min(steps, 20)}", "--gin.EVAL_NUM_EXAMPLES=24",
          "--gin.EVAL_BATCH_SIZE=8", "--gin.train.train.log_period=1", "--gin.CHECKPOINT_PERIOD=2",
          *dist]


def _dists(num_processes: int) -> list[tuple[str, ...]]:
  if num_processes == 1:
    return [()]
  port = _free_port()
  return [(f"--coordinator_address=localhost:{port}", f"--num_processes={num_processes}",
           f"--process_id={i}", f"--heartbeat_timeout={HEARTBEAT}") for i in range(num_processes)]


def _spawn(commands: list[list[str]], log: pathlib.Path) -> list[subprocess.Popen]:
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
  env.pop("XLA_FLAGS", None)  # one CPU device per process
  procs = []
  for i, command in enumerate(commands):
    out = open(f"{log}.p{i}.log", "w")
    procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT))
  return procs


def _start(model_dir: pathlib.Path, steps: int, num_processes: int,
           log_tag: str) -> list[subprocess.Popen]:
  return _spawn([_command(model_dir, steps, *dist) for dist in _dists(num_processes)],
                model_dir.parent / f"{model_dir.name}.{log_tag}")


EVAL_ARGS = ["--gin_file=gin/models/t5_1_1_byte_tiny.gin", "--gin_file=gin/test/smoke_prompt.gin",
             "--gin_file=gin/runs/eval.gin",
             "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentiment_v100'",
             "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'", "--gin.DROPOUT_RATE=0.0",
             "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}",
             "--gin.EVAL_NUM_EXAMPLES=24", "--gin.EVAL_BATCH_SIZE=8"]
INFER_ARGS = ["--model=t5_1_1_byte_tiny", "--task=spot_synthetic_sentiment_v100",
              "--task_module=tasks.synthetic", "--num_examples=20", "--input_length=48",
              "--target_length=12", "--batch_size=8"]


def _wait(procs, timeout=600) -> list[int]:
  return [p.wait(timeout=timeout) for p in procs]


def _log(model_dir: pathlib.Path, tag: str, i: int) -> str:
  return (model_dir.parent / f"{model_dir.name}.{tag}.p{i}.log").read_text()


def test_eval_and_infer_under_two_processes_equal_one_process(tmp_path):
  one = tmp_path / "one"
  assert _wait(_start(one, 4, 1, "run")) == [0], _log(one, "run", 0)[-3000:]
  for n in (1, 2):
    eval_cmds = [[sys.executable, "-m", "spot_jax.eval", *EVAL_ARGS, f"--gin.MODEL_DIR='{one}'",
                  f"--gin.OUTPUT_DIR='{tmp_path / f'eval{n}'}'", *d] for d in _dists(n)]
    infer_cmds = [[sys.executable, "-m", "spot_jax.infer", *INFER_ARGS, f"--prompt={one}",
                   f"--output={tmp_path / f'infer{n}.jsonl'}", *d] for d in _dists(n)]
    for cmds, tag in ((eval_cmds, "eval"), (infer_cmds, "infer")):
      procs = _spawn(cmds, tmp_path / f"{tag}{n}")
      assert (_wait(procs) == [0] * n), pathlib.Path(
          f"{tmp_path / f'{tag}{n}'}.p0.log").read_text()[-3000:]
  assert (json.loads((tmp_path / "eval2" / "metrics.json").read_text())["metrics"]
          == json.loads((tmp_path / "eval1" / "metrics.json").read_text())["metrics"])
  assert (tmp_path / "infer2.jsonl").read_text() == (tmp_path / "infer1.jsonl").read_text()
  assert len((tmp_path / "infer1.jsonl").read_text().splitlines()) == 20


def test_distributed_settings_are_checked():
  from spot_jax.cli import distributed  # pylint: disable=g-import-not-at-top
  from spot_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  cfg = distributed.resolve(environ={"SPOT_JAX_COORDINATOR_ADDRESS": "h:1",
                                     "SPOT_JAX_NUM_PROCESSES": "2",
                                     "SPOT_JAX_PROCESS_ID": "1", "SPOT_JAX_HEARTBEAT_TIMEOUT": "7"})
  assert cfg == distributed.DistributedConfig("h:1", 2, 1, 7) and cfg.explicit
  # flags win
  assert distributed.resolve("x:2", 4, 3, environ={"SPOT_JAX_PROCESS_ID": "0"}).process_id == 3
  assert not distributed.resolve(environ={}).explicit  # TPU VMs / SLURM: jax detects everything
  for kwargs, message in [({"num_processes": 2, "process_id": 0}, "missing coordinator_address"),
                          ({"coordinator_address": "h", "num_processes": 2,
                            "process_id": 0}, "no port"),
                          ({"coordinator_address": "h:1", "num_processes": 2, "process_id": 2},
                           "must be <"),
                          ({"coordinator_address": "h:1", "num_processes": "two", "process_id": 0},
                           "not an integer")]:
    with pytest.raises(ConfigError, match=message):
      distributed.resolve(environ={}, **kwargs)


def test_incomplete_multiprocess_flags_are_one_line_errors(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
  run = subprocess.run([sys.executable, "-m", "spot_jax.train", "--gin_file=gin/test/smoke.gin",
                        f"--gin.MODEL_DIR='{tmp_path}'", "--num_processes=2", "--process_id=0"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert run.returncode == 2
  lines = [l for l in run.stderr.splitlines() if l.startswith("spot_jax.train")]
  assert lines == ["spot_jax.train: error: multi-process set-up is missing coordinator_address; "
                   "give all of --coordinator_address=HOST:PORT, --num_processes=N and "
                   "--process_id=I (or none, on TPU VMs and SLURM clusters)"]
  assert "Traceback" not in run.stderr
