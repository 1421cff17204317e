"""Damaged checkpoints and diverging runs: resume from the newest readable state,
or stop in one line.

The restart tests run `python -m spot_jax.train` on the smoke config as a user would; the
best/ and divergence tests call the library directly (no process start-up to pay).
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax.train import job as job_lib
from spot_jax import orbax_io
from spot_jax import data, models, prompts
from spot_jax.train import checkpointer
from spot_jax.train import optimizers
from spot_jax import train as train_lib
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import Transformer, config_by_name
from tests.helpers import local_tasks
from tests.helpers import REPO
from tests.helpers.cli_error_runner import tree_hash

# A damaged restore must leave nothing behind that Python would print later in the run.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")

COMMON = ["--gin_file=gin/test/smoke.gin", "--gin.train.train.eval_cfg=None",
          "--gin.TRAIN_STEPS=20", "--gin.CHECKPOINT_PERIOD=10"]
STARTUP_NOTE = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\) is called "
                          r"are written to STDERR"
                          r"|[IWE]\d{4} [\d:. ]+\d+ [\w.]+:\d+\] .*|WARNING:absl:.*)$")


def _train(model_dir: pathlib.Path) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
  return subprocess.run([sys.executable, "-m", "spot_jax.train", *COMMON,
                         f"--gin.MODEL_DIR='{model_dir}'"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _damage(step_dir: pathlib.Path) -> pathlib.Path:
  """Truncates the largest data file of a saved state (as a full disk or a cut copy would)."""
  victim = max((step_dir / "default" / "ocdbt.process_0" / "d").iterdir(),
               key=lambda p: p.stat().st_size)
  os.truncate(victim, 10)
  return victim


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> pathlib.Path:
  """An uninterrupted 20-step run with states at steps 10 and 20 (the default keep=2)."""
  run = tmp_path_factory.mktemp("recovery") / "reference"
  proc = _train(run)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["10", "20"]
  return run


def test_damaged_latest_state_resumes_from_the_previous_one(reference, tmp_path):
  run = tmp_path / "run"
  shutil.copytree(reference, run)
  victim = _damage(run / "checkpoints" / "20")
  damaged_bytes = victim.read_bytes()

  proc = _train(run)  # the same command again

  assert proc.returncode == 0, proc.stderr[-3000:]
  warnings = [l for l in proc.stdout.splitlines() if l.startswith("warning: the training state")]
  assert len(warnings) == 1, proc.stdout
  assert warnings[0].startswith("warning: the training state of step 20 cannot be read (")
  assert str(run / "checkpoints" / "20" / "default") in warnings[0]  # names the file that failed
  assert warnings[0].endswith(f"moved it to {run / 'checkpoints' / '20.corrupt'} and resumed "
                              "from step 10")
  assert f"resumed from {run / 'checkpoints' / '10'} (step 10)" in proc.stdout
  assert re.search(r"^step 20/20 \|", proc.stdout, re.M)
  assert not [l for l in proc.stderr.splitlines() if l.strip()
              and not STARTUP_NOTE.match(l)], proc.stderr
  # the damaged state is kept aside, untouched; a new step 20 was written from the resumed run
  aside = run / "checkpoints" / "20.corrupt"
  assert (aside / victim.relative_to(run / "checkpoints" / "20")).read_bytes() == damaged_bytes
  assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["10", "20", "20.corrupt"]
  want = np.load(reference / "prompts" / "prompt_step_20.npy")
  got = np.load(run / "prompts" / "prompt_step_20.npy")
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_every_state_damaged_is_one_line_and_nothing_moves(reference, tmp_path):
  run = tmp_path / "run"
  shutil.copytree(reference, run)
  for step in ("10", "20"):
    _damage(run / "checkpoints" / step)
  before = tree_hash(run)

  proc = _train(run)

  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  lines = [l for l in proc.stderr.splitlines() if l.strip() and not STARTUP_NOTE.match(l)]
  assert len(lines) == 1, proc.stderr
  assert lines[0].startswith("spot_jax.train: error: no readable training state in "
                             f"{run / 'checkpoints'} (step 20, 10: ")
  assert "move" in lines[0] and "new MODEL_DIR" in lines[0]
  assert tree_hash(run) == before  # both damaged states still on disk, byte for byte
  assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["10", "20"]


# --- library level: best/, mismatch versus damage, orbax never deleting what was moved aside ----

def _state(length: int = 10) -> dict:
  # 2.5 kB of random floats (incompressible): above orbax's 1 kB limit for values stored inline
  prompt = jax.random.normal(jax.random.PRNGKey(0), (length, 64))
  return {"step": jnp.asarray(5, jnp.int32), "params": {"prompt": {"prompt": prompt}}}


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)


def test_damaged_best_state_is_moved_aside_with_its_metric(tmp_path):
  ckpt = checkpointer.Checkpointer(tmp_path)
  ckpt.save_best(30, _state(), "accuracy", 0.9)
  assert ckpt.best_metric() == 0.9
  _damage(tmp_path / "best" / "30")
  lines = []
  ckpt.check_best(_abstract(_state()), warn=lines.append)
  assert (len(lines) == 1
          and lines[0].startswith("warning: the best state (step 30) cannot be read ("))
  assert (tmp_path / "best" / "30.corrupt" / "metric.json").exists()
  assert ckpt.best_metric() is None  # the next evaluation starts a new best
  ckpt.save_best(40, _state(), "accuracy", 0.5)
  ckpt.close()
  assert (sorted(p.name for p in (tmp_path / "best").iterdir()) == ["30.corrupt", "40",
                                                                    "metric.json"])


def test_mismatch_is_refused_without_moving_anything(tmp_path):
  ckpt = checkpointer.Checkpointer(tmp_path)
  ckpt.save(10, _state())
  before = tree_hash(tmp_path)
  with pytest.raises(ConfigError, match=r"params/prompt/prompt is float32\[10, 64\] in the "
                                        r"checkpoint, float32\[7, 64\] in this run"):
    ckpt.restore_latest(_abstract(_state(7)))
  ckpt.close()
  assert tree_hash(tmp_path) == before


def test_moved_aside_states_survive_later_saves(tmp_path):
  ckpt = checkpointer.Checkpointer(tmp_path, keep=2)
  for step in (10, 20):
    ckpt.save(step, _state())
  _damage(tmp_path / "checkpoints" / "20")
  restored, step = ckpt.restore_latest(_abstract(_state()), warn=lambda line: None)
  assert step == 10 and int(restored["step"]) == 5
  for step in (20, 30, 40):  # keep=2 garbage-collects older steps, never the .corrupt one
    ckpt.save(step, _state())
  assert ckpt.latest_step() == 40
  ckpt.close()
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["20.corrupt", "30", "40"]


# --- a diverging run stops before writing anything of the bad step -------------------------------

def test_nan_loss_stops_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path):
  paths = local_tasks.write_tsv_task_files(tmp_path / "tsv", n_train=256, n_val=8)
  task = local_tasks.register_tsv_task("test_recovery_polarity", paths)
  model = models.EncoderDecoderModel(Transformer(
      config_by_name("t5_1_1_byte_tiny"),
      prompt=prompts.PromptTuning(length=4,
                                  prompt_init=prompts.sampled_vocab(num_most_frequent=256))))
  # The learning rate turns infinite at the 26th update: the state after step 26 is garbage.
  optimizer = optimizers.adafactor(learning_rate=lambda count: jnp.where(count >= 25, jnp.inf, 0.3))
  run = dict(model=model,
             train_dataset_cfg=data.DatasetConfig(task, {"inputs": 24, "targets": 4}, batch_size=8),
             model_dir=str(tmp_path / "run"), optimizer=optimizer, eval_period=1000, log_period=10,
             verbose=False,
             checkpoint_cfg=train_lib.CheckpointConfig(period=10, save_prompt_steps=(28,)))
  train_lib.train(total_steps=20, **dict(run, checkpoint_cfg=train_lib.CheckpointConfig(period=10)))
  saved = {name: tree_hash(tmp_path / "run" / name) for name in ("checkpoints", "prompts", "best")}

  with pytest.raises(ConfigError) as info:
    train_lib.train(total_steps=40, **run)

  message = str(info.value)
  assert "\n" not in message
  assert message.startswith("training diverged: the parameter norm is ")
  assert ("at step 26; nothing from step 26 on was saved and the last checkpoint (step 20) is "
          "intact; lower LEARNING_RATE") in message
  assert {name: tree_hash(tmp_path / "run" / name) for name in saved} == saved
  assert not (tmp_path / "run" / "prompts" / "prompt_step_28.npy").exists()
  restored, step = checkpointer.Checkpointer(tmp_path / "run").restore_latest(
      _abstract_of_run(model, optimizer), warn=pytest.fail)
  assert step == 20 and np.isfinite(np.asarray(restored["params"]["prompt"]["prompt"])).all()


def _abstract_of_run(model, optimizer):
  from spot_jax.train.state import TrainState  # pylint: disable=g-import-not-at-top
  dummy = model.dummy_batch(24, 4)
  backbone = jax.eval_shape(model.init_backbone, jax.random.PRNGKey(0), dummy)
  prompt = jax.eval_shape(lambda b: models.unbox(model.init_prompt(jax.random.PRNGKey(1),
                                                                   models.unbox(b), dummy)),
                          backbone)
  state = jax.eval_shape(lambda p: TrainState.create(p, optimizer, jax.random.PRNGKey(2)), prompt)
  return job_lib._state_dict(state)  # pylint: disable=protected-access


def _coroutine_from(filename: str, body: str = "return None"):
  namespace = {}
  exec(compile(f"async def read():\n  {body}\n", filename, "exec"), namespace)  # pylint: disable=exec-used
  return namespace["read"]()


@pytest.fixture
def frozen_heap():
  """The objects earlier tests left in this process are moved out of the collector's reach: the
  hook's `gc.collect` calls then scan only what the test makes (a whole worker's heap took
  seconds per call)."""
  gc.collect()
  gc.freeze()
  yield
  gc.unfreeze()


def test_after_a_failed_restore_late_orbax_reads_stay_silent_and_nothing_else_does(frozen_heap):
  """A read orbax abandoned that completes after the wait (a busy machine) prints nothing."""
  seen = []
  base = seen.append
  saved = sys.unraisablehook
  sys.unraisablehook = base
  try:
    with orbax_io.quiet_abandoned_reads():
      pass
    assert sys.unraisablehook is base  # a restore that succeeds leaves the hook alone
    with pytest.raises(RuntimeError):
      with orbax_io.quiet_abandoned_reads():
        raise RuntimeError("a read failed")
    hook = sys.unraisablehook
    assert isinstance(hook, orbax_io.DropAbandonedReads) and hook.forward is base
    with pytest.raises(RuntimeError):
      with orbax_io.quiet_abandoned_reads():
        raise RuntimeError("again")
    assert sys.unraisablehook is hook  # installed once
  finally:
    sys.unraisablehook = saved
  orbax_read = _coroutine_from(os.path.join(os.sep, "site-packages", "orbax", "checkpoint",
                                            "serialization.py"))
  other = _coroutine_from(__file__)
  try:
    hook(types.SimpleNamespace(object=orbax_read))
    assert not seen
    hook(types.SimpleNamespace(object=other))
    hook(types.SimpleNamespace(object=None))
    assert [a.object for a in seen] == [other, None]
  finally:
    orbax_read.close()
    other.close()


def _free_a_failed_task(coroutine) -> None:
  """Runs `coroutine` as an asyncio task that fails, nobody retrieving its error, and frees it."""
  loop = asyncio.new_event_loop()
  try:
    task = loop.create_task(coroutine)
    loop.run_until_complete(asyncio.sleep(0.01))
    assert task.done() and task.exception
    del task
    gc.collect()
  finally:
    loop.close()


def test_after_a_failed_restore_orbax_task_errors_stay_off_the_asyncio_log(frozen_heap):
  """A read that fails while orbax's loop still runs is logged by asyncio, not Python's hook."""
  log = logging.getLogger("asyncio")
  filters, saved_hook = list(log.filters), sys.unraisablehook
  records = []
  handler = logging.Handler()
  handler.emit = records.append
  log.addHandler(handler)
  failing = "raise ValueError('OUT_OF_RANGE: Requested byte range is not valid')"
  try:
    with pytest.raises(RuntimeError):
      with orbax_io.quiet_abandoned_reads():
        raise RuntimeError("a read failed")
    with pytest.raises(RuntimeError):
      with orbax_io.quiet_abandoned_reads():
        raise RuntimeError("again")
    assert sum(isinstance(f, orbax_io.DropAbandonedReadErrors) for f in log.filters) == 1
    _free_a_failed_task(_coroutine_from(
        os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "serialization.py"), failing))
    assert not records
    _free_a_failed_task(_coroutine_from(__file__, failing))
    assert ([r.getMessage().splitlines()[0] for r in records]
            == ["Task exception was never retrieved"])
    assert "OUT_OF_RANGE" in str(records[0].exc_info[1])
  finally:
    log.removeHandler(handler)
    log.filters[:] = filters
    sys.unraisablehook = saved_hook
