"""spot-jax's prompt methods under `python -m t5x.train` (skips with a reason without t5x).

For each method, 5 real t5x.train steps on CPU from the real tiny T5X checkpoint on the local
synthetic task: the checkpoints hold the prompt side only, the prompt is exported at every save,
and the exported prompt gives the same logits in spot-jax's own model (and runs in
spot_jax.eval). A run stopped and restarted (its backbone re-read from INITIAL_CHECKPOINT_PATH)
ends bit-identical to an uninterrupted one. That t5x's step leaves the backbone bit-identical
and computes no gradient for it: tests/test_t5x_frozen_backbone.py.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("t5x.train",
                    reason="t5x is not importable (install it from its repository: docs/t5x.md)")

import gin  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
from flax import traverse_util
from t5x import checkpoints

from spot_jax.train import evaluate as spot_eval
from spot_jax.train import evaluator as evaluator_lib
from spot_jax import models
from spot_jax import prompts
from spot_jax.backbones import t5
from spot_jax.contrib.t5x import checkpointer
from spot_jax.contrib.t5x import state_fns
from tests.helpers import REPO

METHODS = ("prompt_tuning", "smop", "residual")
STEPS = 5
# The same values as gin/t5x/test/synthetic.gin; given to both t5x.train and the in-process model.
BINDINGS = ["PROMPT_LENGTH=3", "NUM_PROMPTS=2", "BOTTLENECK=6", "NUM_MOST_FREQUENT=200",
            "DROPOUT_RATE=0.0"]


@pytest.fixture(scope="module")
def tiny_checkpoint(t5_fixtures):
  return t5_fixtures / "test_t5_1_1_tiny" / "checkpoint_3"


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in sys.path if p])
  return env


def _t5x_train(method: str, model_dir: pathlib.Path, checkpoint: pathlib.Path, *extra: str,
               steps: int = STEPS):
  cmd = [sys.executable, "-m", "t5x.train", f"--gin_search_paths={REPO}",
         f"--gin_file=gin/t5x/models/t5_1_1_tiny_{method}.gin",
         "--gin_file=gin/t5x/runs/prompt_tune.gin", "--gin_file=gin/t5x/test/synthetic.gin",
         f"--gin.MODEL_DIR='{model_dir}'", f"--gin.INITIAL_CHECKPOINT_PATH='{checkpoint}'",
         f"--gin.TRAIN_STEPS={steps}"] + [f"--gin.{b}" for b in BINDINGS + list(extra)]
  return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)


def _checkpoint(run_dir: pathlib.Path, step: int) -> dict:
  """A checkpoint of the run as t5x reads it ({"target": ..., "state": ...}, NumPy)."""
  return checkpoints.load_t5x_checkpoint(str(run_dir / f"checkpoint_{step}"))


def _model(method: str):
  """The t5x model the gin file builds (parsed in-process; its module is spot-jax's)."""
  gin.clear_config(clear_constants=True)
  gin.add_config_file_search_path(str(REPO))
  gin.parse_config_files_and_bindings([f"gin/t5x/models/t5_1_1_tiny_{method}.gin"],
                                      BINDINGS + ["VOCABULARY=None"], finalize_config=False)
  model = gin.query_parameter("%MODEL").scoped_configurable_fn()
  gin.clear_config(clear_constants=True)
  return model


def _flat(tree):
  return {"/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(tree).items()}


@pytest.mark.parametrize("method", METHODS)
def test_t5x_train_saves_and_exports_the_prompt_side_only(method, tiny_checkpoint, tmp_path):
  run = _t5x_train(method, tmp_path / "run", tiny_checkpoint)
  assert run.returncode == 0, run.stderr[-3000:]
  run_dir = tmp_path / "run"
  final = _checkpoint(run_dir, STEPS)
  start = _checkpoint(run_dir, 0)
  assert int(final["state"]["step"]) == STEPS

  # Checkpoints: the prompt side and its optimizer state, never the frozen backbone, whose path
  # the run records for its restarts.
  for state in (start, final):
    assert list(state["target"]) == ["prompt"]
    opt_state = traverse_util.flatten_dict(state["state"]["param_states"], sep="/")
    assert [k for k, v in opt_state.items() if v is not None and not k.startswith("prompt/")] == []
  assert (run_dir / checkpointer.BACKBONE_FILE).read_text().strip() == (
      f'{{"backbone_path": "{tiny_checkpoint}"}}')
  config = t5.config_by_name("t5_1_1_tiny")
  backbone_params = t5.load_checkpoint(str(tiny_checkpoint), config)
  # Prompt side: every prompt parameter moved in 5 steps.
  before = _flat(start["target"]["prompt"])
  after = _flat(final["target"]["prompt"])
  assert sorted(before) == sorted(after) and after
  for name in after:
    assert not np.allclose(before[name], after[name]), f"prompt/{name} did not change"

  # Exports: one .npy (and .npz of raw parameters) per checkpoint, equal to the trained prompt.
  for step in range(STEPS + 1):
    assert (run_dir / "prompts" / f"prompt_step_{step}.npy").is_file()
  model = _model(method)
  exported = np.load(run_dir / "prompts" / f"prompt_step_{STEPS}.npy")
  raw = state_fns.load_prompt_params(run_dir / "prompts" / f"prompt_params_step_{STEPS}.npz")
  for name, value in _flat(raw["prompt"]).items():
    np.testing.assert_array_equal(value, after[name])
  np.testing.assert_allclose(exported, prompts.effective_prompt(model.module.prompt,
                                                                final["target"]["prompt"]),
                             rtol=0, atol=0)

  # Same logits: t5x's forward pass on its checkpoint vs spot-jax's model on the official
  # backbone plus the exported prompt (.npy into Prompt Tuning for PT and the folded Residual;
  # the raw parameters for SMoP, whose router is part of the prompt side).
  rng = np.random.RandomState(0)
  batch = {"encoder_input_tokens": jnp.asarray(
      np.where(np.arange(12) < 9, rng.randint(3, 250, (4, 12)), 0), jnp.int32),
           "decoder_input_tokens": jnp.asarray(rng.randint(3, 250, (4, 5)), jnp.int32),
           "decoder_target_tokens": jnp.asarray(rng.randint(3, 250, (4, 5)), jnp.int32)}
  t5x_params = models.merge_params(backbone_params, final["target"])
  t5x_logits = model._compute_logits(t5x_params, batch)  # pylint: disable=protected-access
  if method == "smop":
    module, prompt_params = model.module, raw
  else:
    module = t5.Transformer(config, prompt=prompts.PromptTuning(length=exported.shape[0]))
    prompt_params = {"prompt": {"prompt": exported}}
  spot_model = models.EncoderDecoderModel(module=module)
  spot_logits = module.apply({"params": models.merge_params(backbone_params, prompt_params)},
                             batch["encoder_input_tokens"], batch["decoder_input_tokens"],
                             batch["decoder_target_tokens"], enable_dropout=False)
  np.testing.assert_allclose(np.asarray(spot_logits), np.asarray(t5x_logits), rtol=1e-5, atol=1e-5)

  if method == "prompt_tuning":
    # t5x's inference path (seqio evaluation under t5x) decodes like spot-jax's model.
    t5x_tokens = model.predict_batch(t5x_params, batch)
    spot_tokens = spot_model.predict_batch(models.merge_params(backbone_params, prompt_params),
                                           batch["encoder_input_tokens"], max_decode_length=5)
    np.testing.assert_array_equal(np.asarray(t5x_tokens), np.asarray(spot_tokens))
    eval_cfg = evaluator_lib.EvalConfig(mixture_or_task_name="spot_synthetic_sentiment_v100",
                                     task_feature_lengths={"inputs": 32, "targets": 8},
                                     batch_size=8, num_examples=8, module="tasks.synthetic")
    metrics = spot_eval.evaluate_run(model=spot_model, eval_cfg=eval_cfg,
                                     prompt_file=str(run_dir / "prompts"
                                                     / f"prompt_step_{STEPS}.npy"),
                                     initial_checkpoint_path=str(tiny_checkpoint),
                                     output_dir=str(tmp_path / "eval"))
    assert "accuracy" in metrics["spot_synthetic_sentiment_v100"]


def test_t5x_train_restart_rereads_the_backbone_and_resumes_exactly(tiny_checkpoint, tmp_path):
  # Both runs see the same batches: a fixed shuffle seed (t5x's default draws one from the clock)
  # and the dataset position saved with each checkpoint (t5x's save_dataset).
  dataset = "utils.SaveCheckpointConfig.save_dataset=True"
  seed = "train/utils.DatasetConfig.seed=0"
  straight, stopped = tmp_path / "straight", tmp_path / "stopped"
  for run in (_t5x_train("prompt_tuning", straight, tiny_checkpoint, dataset, seed, steps=4),
              _t5x_train("prompt_tuning", stopped, tiny_checkpoint, dataset, seed, steps=2),
              _t5x_train("prompt_tuning", stopped, tiny_checkpoint, dataset, seed, steps=4)):
    assert run.returncode == 0, run.stderr[-3000:]
  assert ("Initializing parameters from specific T5X checkpoint " + str(stopped / "checkpoint_2")
          in run.stderr)
  # the backbone, re-read
  assert f"Restoring from checkpoint: {tiny_checkpoint}/checkpoint" in run.stderr

  expected, resumed = _checkpoint(straight, 4), _checkpoint(stopped, 4)
  assert list(resumed["target"]) == ["prompt"] and int(resumed["state"]["step"]) == 4
  flat_expected = traverse_util.flatten_dict(expected, sep="/")
  flat_resumed = traverse_util.flatten_dict(resumed, sep="/")
  assert sorted(flat_resumed) == sorted(flat_expected)
  for name, value in flat_expected.items():
    if value is not None:
      np.testing.assert_array_equal(flat_resumed[name], value, err_msg=name)
  np.testing.assert_array_equal(np.load(stopped / "prompts" / "prompt_step_4.npy"),
                                np.load(straight / "prompts" / "prompt_step_4.npy"))

  # Restarting on another backbone is refused, naming the one the run was trained against.
  moved = tmp_path / "other_backbone" / "checkpoint_3"
  shutil.copytree(tiny_checkpoint, moved)
  run = _t5x_train("prompt_tuning", stopped, moved, dataset, seed, steps=5)
  assert run.returncode != 0
  assert (f"trained against the backbone {tiny_checkpoint}; INITIAL_CHECKPOINT_PATH is {moved}; "
          f"valid: INITIAL_CHECKPOINT_PATH='{tiny_checkpoint}'") in run.stderr, run.stderr[-3000:]
  assert not (stopped / "checkpoint_5").exists()


def _state(params: dict, with_opt: bool = True) -> dict:
  state = {"target": params, "state": {"step": np.asarray(7)}}
  if with_opt:
    state["state"]["param_states"] = {k: {"v": np.zeros(1)} for k in params}
  return state


def test_strict_restore_keeps_the_backbone_and_drops_only_the_prompt():
  ckpt = _state({"encoder": {"w": np.ones(2)}, "decoder": {"w": np.ones(3)}})
  target = _state({"encoder": {"w": np.zeros(2)}, "decoder": {"w": np.zeros(3)},
                   "prompt": {"prompt": np.zeros((3, 4))}})
  kept = state_fns.strict_prompt_restore(ckpt, target)
  assert set(kept) == {"target"}  # no optimizer state or step: those start fresh with the prompt
  assert sorted(kept["target"]) == ["decoder", "encoder"]
  np.testing.assert_array_equal(kept["target"]["encoder"]["w"], np.ones(2))
  # Resuming this run's own checkpoint keeps everything.
  assert state_fns.strict_prompt_restore(target, target, is_resuming=True) == target


def test_strict_restore_names_a_missing_backbone_parameter():
  ckpt = _state({"encoder": {"w": np.ones(2)}})
  target = _state({"encoder": {"w": np.zeros(2)},
                   "decoder": {"logits_dense": {"kernel": np.zeros(3)}},
                   "prompt": {"prompt": np.zeros((3, 4))}})
  with pytest.raises(ValueError, match="lacks 1 backbone parameter.*decoder/logits_dense/kernel"):
    state_fns.strict_prompt_restore(ckpt, target)
  ckpt = _state({"encoder": {"w": np.ones(2)}, "extra": {"w": np.ones(1)}})
  target = _state({"encoder": {"w": np.zeros(2)}, "prompt": {"prompt": np.zeros((3, 4))}})
  with pytest.raises(ValueError, match="has 1 parameter.*this model lacks: extra/w"):
    state_fns.strict_prompt_restore(ckpt, target)


def test_t5x_train_refuses_a_checkpoint_of_another_architecture(tiny_checkpoint, tmp_path):
  # Original-T5 tiny (ReLU MLP "wi", tied logits) against the T5.1.1 tiny checkpoint: t5x would
  # fill the missing kernels from scratch under fallback_to_scratch; the strict restore names them.
  run = _t5x_train("prompt_tuning", tmp_path / "run", tiny_checkpoint, "CONFIG_NAME='t5_tiny'")
  assert run.returncode != 0
  assert "the checkpoint lacks" in run.stderr and "mlp/wi/kernel" in run.stderr, run.stderr[-3000:]
  assert not (tmp_path / "run" / "prompts").exists()
