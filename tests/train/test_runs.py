"""K prompt runs in one jitted step equal the same runs trained one at a time.

Tiny byte-vocabulary T5 (dropout 0.1 on), a local TSV task (tests/helpers/k_runs.py). For Prompt
Tuning, SMoP, Residual and ULPT: K = 2 seeds in one job against the same 2 runs alone: per-step
losses within 1e-5 over the first 5 steps, final prompts within 1e-4; each run's directory is an
ordinary run directory. Through the command line, on two CPU devices: K = 2 shards the runs axis
over the data axis, K = 3 the batch; prompts within 1e-4 of one device. Bad input (an empty or
duplicate seed list, lists of different lengths, runs whose shapes differ, ULPT runs resumed with
another projection) is one line naming the setting, with nothing written.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from spot_jax import prompts
from spot_jax import train as train_lib
from spot_jax.errors import ConfigError
from spot_jax.run_dir import RunDir
from tests.helpers import k_runs
from tests.helpers import local_tasks
from tests.helpers import REPO  # noqa: E402
from tests.helpers.kill import kill_when  # noqa: E402

SEEDS = (0, 1)
STEPS = k_runs.STEPS
ZIP_SEEDS = (3, 4, 5)  # K = 3 runs on two tasks


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
  return k_runs.save_backbone(tmp_path_factory.mktemp("ckpt") / "checkpoint_0")


@pytest.fixture(scope="module")
def task_paths(tmp_path_factory) -> dict[str, dict[str, str]]:
  return {"test_runs_polarity": local_tasks.write_tsv_task_files(
              tmp_path_factory.mktemp("tsv"), n_train=128, n_val=16),
          "test_runs_polarity_b": local_tasks.write_tsv_task_files(
              tmp_path_factory.mktemp("tsv2"), n_train=64, n_val=8)}


@pytest.fixture(scope="module")
def task(task_paths) -> str:
  return local_tasks.register_tsv_task("test_runs_polarity", task_paths["test_runs_polarity"])


@pytest.fixture(scope="module")
def other(task_paths) -> str:
  return local_tasks.register_tsv_task("test_runs_polarity_b", task_paths["test_runs_polarity_b"])


_model, _train = k_runs.model, k_runs.train


@pytest.fixture(scope="module")
def pt_job(tmp_path_factory, task, checkpoint):
  """Prompt Tuning's K = 2 job, shared by the parity and restart tests."""
  job = tmp_path_factory.mktemp("pt") / "job"
  return job, _train(_model("pt"), task, job, checkpoint, seeds=list(SEEDS))


@pytest.fixture(scope="module")
def zip_job(tmp_path_factory, task, other, checkpoint):
  """K = 3 runs zipping TASKS and SEEDS."""
  job = tmp_path_factory.mktemp("zip") / "job"
  return job, _train(_model("pt"), task, job, checkpoint, tasks=[task, other, task],
                     seeds=list(ZIP_SEEDS))


@pytest.mark.parametrize("method", sorted(k_runs.METHODS))
def test_k_runs_in_one_step_equal_the_runs_one_at_a_time(tmp_path, task, checkpoint, method,
                                                          request):
  model = _model(method)
  if method == "pt":
    job, together = request.getfixturevalue("pt_job")
  else:
    job = tmp_path / "job"
    together = _train(model, task, job, checkpoint, seeds=list(SEEDS))
  assert together.compilations == 1 and len(together.runs) == len(SEEDS)
  for k, seed in enumerate(SEEDS):
    alone = _train(model, task, tmp_path / f"alone_{seed}", checkpoint, seed=seed)
    run = together.runs[k]
    assert run.run.seed == seed and run.run.run_dir.path == job / f"seed_{seed}"
    losses_k = [h["loss"] for h in run.history[:5]]
    losses_1 = [h["loss"] for h in alone.history[:5]]
    np.testing.assert_allclose(losses_k, losses_1, rtol=0, atol=1e-5)
    a, b = RunDir(run.run.run_dir.path), RunDir(tmp_path / f"alone_{seed}")
    np.testing.assert_allclose(np.load(a.prompt_path(STEPS)), np.load(b.prompt_path(STEPS)),
                               rtol=0, atol=1e-4)
    # an ordinary run directory: its own record, states, exports and evaluation
    record = a.read_record()
    assert (record.seed, record.task, record.finished) == (seed, task, True)
    assert a.state_steps() == [STEPS] and a.best_steps() and a.embedding_prompt()[1] == STEPS // 3
    assert record.score == pytest.approx(b.read_record().score, abs=1e-9)
  # the runs really differ (their own seeds: initialisation, data order, dropout keys)
  first = [np.load(RunDir(r.run.run_dir.path).prompt_path(STEPS)) for r in together.runs]
  assert not np.allclose(first[0], first[1])


def test_tasks_and_seeds_zip_into_runs_with_their_own_evaluation(zip_job, task, other):
  job, result = zip_job
  names = sorted(p.name for p in job.iterdir())
  assert names == sorted(["job.json", f"{task}.seed_3", f"{other}.seed_4", f"{task}.seed_5"])
  assert [r.run.task for r in result.runs] == [task, other, task]
  for run in result.runs:
    (_, metrics), = [h for h in run.eval_history if h[0] == STEPS]
    assert list(metrics) == [run.run.task]  # each run evaluated its own task
    assert RunDir(run.run.run_dir.path).read_record().task == run.run.task


def test_runs_from_given_arrays_of_one_shape_share_one_initialisation_trace(tmp_path, task,
                                                                          checkpoint, monkeypatch):
  # SPoT's K runs start from retrieved prompts: one trace of the prompt's initialisation for all
  # arrays of one shape (the array is an argument), and each run still starts from its own.
  import optax  # pylint: disable=g-import-not-at-top
  traced = []
  eval_shape = jax.eval_shape
  monkeypatch.setattr(jax, "eval_shape", lambda fn, *a, **k: (
      traced.append(getattr(fn, "__name__", "")), eval_shape(fn, *a, **k))[1])
  arrays = [np.full((4, 64), 0.25 * (i + 1), np.float32) + np.arange(64, dtype=np.float32) / 64
            for i in range(2)]
  runs = [train_lib.RunSpec(s, prompt_init=prompts.from_array(a)) for s, a in zip(SEEDS, arrays)]
  runs.append(train_lib.RunSpec(9))  # the module's own initialiser (sampled vocabulary)
  result = _train(_model("pt"), task, tmp_path / "job", checkpoint, runs=runs, evaluate=False,
                  optimizer=optax.sgd(0.0))  # the prompts stay where they started
  assert traced.count("init_prompt") == 2, traced
  for run, start in zip(result.runs, arrays):
    np.testing.assert_array_equal(np.load(RunDir(run.run.run_dir.path).prompt_path(STEPS)), start)
  sampled = np.load(RunDir(result.runs[2].run.run_dir.path).prompt_path(STEPS))
  assert not any(np.allclose(sampled, a) for a in arrays)


@pytest.mark.parametrize("kwargs, message", [
    (dict(seeds=[]), "SEEDS is empty"),
    (dict(seeds=[0, 1, 0]), "SEEDS lists 0 twice"),
    (dict(seeds=[0, "1"]), "SEEDS[1]='1' is not a non-negative integer seed"),
    (dict(seeds=[0, 1], tasks=["a"]), "SEEDS has 2 entries and TASKS 1"),
    (dict(tasks=[]), "TASKS is empty"),
    (dict(runs=[train_lib.RunSpec(0), train_lib.RunSpec(1, prompt_init=prompts.from_array(
        np.zeros((5, 64), np.float32)))]), "run seed_1's prompt cannot be initialised"),
])
def test_bad_run_lists_are_one_line_and_nothing_is_written(tmp_path, task, checkpoint, kwargs,
                                                           message):
  with pytest.raises(ConfigError) as info:
    _train(_model("pt"), task, tmp_path / "job", checkpoint, **kwargs)
  assert message in str(info.value) and "\n" not in str(info.value)
  assert not (tmp_path / "job").exists()


def test_ulpt_runs_resumed_with_another_projection_are_refused(tmp_path, task, checkpoint):
  """Each run keeps its P beside its prompts; a restart whose settings rebuild another P is
  refused in one line before anything is written."""
  job = tmp_path / "job"
  _train(_model("ulpt"), task, job, checkpoint, seeds=list(SEEDS), evaluate=False)
  kept = {p: p.stat().st_mtime_ns for p in job.rglob("*") if p.is_file()}
  assert (job / "seed_1" / "prompts" / f"projection_step_{STEPS}.npy").is_file()
  other = _model("ulpt")
  other = dataclasses.replace(other, module=other.module.clone(
      prompt=other.module.prompt.clone(projection_seed=1)))
  with pytest.raises(ConfigError, match=r"projection_step_\d+.npy: the run kept projection "
                                        r"\[8, 64\] sha256 \w+, but ULPT .* seed 1 rank 8 "
                                        r"rebuilds") as info:
    _train(other, task, job, checkpoint, seeds=list(SEEDS), evaluate=False)
  assert "\n" not in str(info.value)
  assert {p: p.stat().st_mtime_ns for p in job.rglob("*") if p.is_file()} == kept


def test_runs_with_no_common_saved_step_start_again_and_keep_what_was_saved(tmp_path, task,
                                                                            checkpoint, pt_job):
  """A job killed between its runs' first saves (run seed_1 saved nothing) restarts every run
  from step 0; seed_0's saved states are kept, not rewritten, and the job ends where an
  uninterrupted one does."""
  ref, _ = pt_job
  killed = tmp_path / "killed"
  shutil.copytree(ref, killed)  # a finished job, then as if seed_1 had not reached its first save
  saved = RunDir(killed / "seed_0").state_path(STEPS)
  before = {p: p.stat().st_mtime_ns for p in saved.rglob("*") if p.is_file()}
  for path in (killed / "seed_1").iterdir():
    if path.name != "run.json":
      shutil.rmtree(path) if path.is_dir() else path.unlink()
  again = _train(_model("pt"), task, killed, checkpoint, seeds=list(SEEDS))
  assert again.runs[1].history and again.runs[1].history[0]  # seed_1 trained from step 0
  assert {p: p.stat().st_mtime_ns for p in saved.rglob("*") if p.is_file()} == before
  names = [f"seed_{s}" for s in SEEDS]
  for got, want in zip(k_runs.job_prompts(killed, names), k_runs.job_prompts(ref, names)):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


# --- through the command line: SEEDS=[...], a SIGKILL mid-job, the mesh, length buckets ----------

SMOKE = ["--gin_file=gin/test/smoke.gin", "--gin.BATCH_SIZE=4", "--gin.EVAL_NUM_EXAMPLES=16",
         "--gin.EVAL_BATCH_SIZE=8"]


def _cli(args, **popen) -> subprocess.Popen:
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
  env.pop("XLA_FLAGS", None)
  return subprocess.Popen([sys.executable, "-m", "spot_jax.train", *SMOKE, *args], cwd=REPO,
                          env=env, text=True, **popen)


def _finish(args) -> str:
  proc = _cli(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  out, err = proc.communicate(timeout=900)
  assert proc.returncode == 0, err[-3000:]
  return out


def _job_prompts(job: pathlib.Path, seeds, step) -> list[np.ndarray]:
  return k_runs.job_prompts(job, [f"seed_{s}" for s in seeds], step)


def test_sigkill_of_a_k_run_job_resumes_exactly(tmp_path):
  seeds, steps = (0, 1, 2), 40
  common = [f"--gin.SEEDS={list(seeds)}", f"--gin.TRAIN_STEPS={steps}",
            "--gin.CHECKPOINT_PERIOD=10", "--gin.EVAL_PERIOD=20", "--gin.DROPOUT_RATE=0.1"]
  _finish([*common, f"--gin.MODEL_DIR='{tmp_path / 'ref'}'"])
  job = tmp_path / "killed"
  proc = _cli([*common, f"--gin.MODEL_DIR='{job}'"], stdout=subprocess.DEVNULL,
              stderr=subprocess.DEVNULL)
  # Killed while the K states of step 20 are saved.
  kill_when(proc, lambda: bool(list(job.glob("seed_*/checkpoints/20"))), timeout=600, poll=0.01)
  assert not (job / "seed_0" / "prompts" / f"prompt_step_{steps}.npy").exists(), "killed too late"
  out = _finish([*common, f"--gin.MODEL_DIR='{job}'"])
  assert "resumed 3 runs" in out and not re.search(r"^step 1/", out, re.M)
  for got, want in zip(_job_prompts(job, seeds, steps),
                       _job_prompts(tmp_path / "ref", seeds, steps)):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
  for s in seeds:  # the same best state and evaluation, run by run
    assert (RunDir(job / f"seed_{s}").read_record().score
            == RunDir(tmp_path / "ref" / f"seed_{s}").read_record().score)


@pytest.mark.parametrize("seeds", [(0, 1), (0, 1, 2)], ids=["runs_sharded", "batch_sharded"])
def test_k_runs_on_a_two_device_mesh_equal_one_device(tmp_path, seeds):
  """K divisible by the data axis: the runs axis is sharded over it; else the batch is."""
  common = [f"--gin.SEEDS={list(seeds)}", "--gin.TRAIN_STEPS=4", "--gin.EVAL_PERIOD=4",
            "--gin.train.train.log_period=1", "--gin.DROPOUT_RATE=0.1"]
  outs = {d: _finish([*common, f"--cpu_devices={d}", f"--gin.MODEL_DIR='{tmp_path / f'd{d}'}'"])
          for d in (1, 2)}
  sharded = len(seeds) % 2 == 0
  assert ("runs axis sharded over data" in outs[2]) == sharded, outs[2][-2000:]
  for got, want in zip(_job_prompts(tmp_path / "d2", seeds, 4),
                       _job_prompts(tmp_path / "d1", seeds, 4)):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)  # the acceptance's prompt tolerance


def test_k_runs_with_length_buckets_equal_the_runs_alone(tmp_path):
  """Each step pads the K runs' batches to the widest bucket among them: prompts do not change.

  Each run alone is a job of that one seed (the smoke model's random backbone follows
  RANDOM_SEED, so a plain run of another seed would train against another backbone).
  """
  common = ["--gin.TRAIN_STEPS=5", "--gin.LENGTH_BUCKETS=(16, 32)",
            "--gin.train.train.log_period=1", "--gin.EVAL_PERIOD=5"]
  together = _finish([*common, "--gin.SEEDS=[0, 1]", f"--gin.MODEL_DIR='{tmp_path / 'job'}'"])
  assert "2 runs in one step" in together
  for seed in (0, 1):
    _finish([*common, f"--gin.SEEDS=[{seed}]", f"--gin.MODEL_DIR='{tmp_path / f'alone{seed}'}'"])
    np.testing.assert_allclose(
        np.load(RunDir(tmp_path / "job" / f"seed_{seed}").prompt_path(5)),
        np.load(RunDir(tmp_path / f"alone{seed}" / f"seed_{seed}").prompt_path(5)),
        rtol=0, atol=1e-5)
