"""Evaluating a finished run directory (what `python -m spot_jax.eval` calls).

The trained parameters come from the run directory's states (best/ by default, else the newest
checkpoint, falling back past damaged ones as a restart does; or `step`), which works for every
method; or from a .npy prompt file, which fits Prompt Tuning modules. The frozen backbone given
must be the one the run recorded (`run.json`), unless `allow_backbone_change`. Evaluation runs on
the mesh's global batches, so several processes give the one-process metrics.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from typing import Any, Optional, Union

import flax.linen as nn
import jax
import numpy as np

from spot_jax import backbone as backbone_lib
from spot_jax import fileio
from spot_jax import models
from spot_jax import partitioning
from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.run_dir import RunDir
from spot_jax.train.evaluator import EvalConfig, Evaluator


def _prompt_file_params(model: models.Model, prompt_file: str, backbone: Any,
                        dummy: Any, seed: int) -> dict:
  path = validate.existing_file(prompt_file, "PROMPT_FILE", "a .npy exported by spot_jax.train")
  abstract = jax.eval_shape(model.init_prompt, backbone_lib.seed_keys(seed)[1], backbone, dummy)
  names = sorted(models.unbox(abstract).get(models.PROMPT_KEY, {}))
  if names != ["prompt"]:
    raise ConfigError("PROMPT_FILE fits Prompt Tuning modules (one 'prompt' parameter); this "
                      f"model's prompt has {names}: evaluate its run directory with MODEL_DIR "
                      "instead")
  array = fileio.read_npy(path, "PROMPT_FILE")
  expected = models.unbox(abstract)[models.PROMPT_KEY]["prompt"].shape
  if array.shape != expected:
    raise ConfigError(f"PROMPT_FILE {prompt_file!r} has shape {array.shape}; this model's prompt "
                      f"is {expected}")
  return {models.PROMPT_KEY: {"prompt": array.astype(np.float32)}}


def evaluate_run(*, model: models.Model, eval_cfg: EvalConfig,
                 model_dir: Optional[str] = None, step: Optional[Union[int, str]] = None,
                 use_best: bool = True, prompt_file: Optional[str] = None,
                 initial_checkpoint_path: Optional[str] = None, output_dir: Optional[str] = None,
                 num_partitions: int = 1, seed: int = 0, allow_backbone_change: bool = False
                 ) -> dict[str, dict[str, float]]:
  """Evaluates a trained prompt; returns {task: {metric: value}}.

  Args:
    model: the model the prompt was trained with.
    eval_cfg: what to evaluate.
    model_dir: the training run's directory (its states hold the trained parameters).
    step: a specific checkpoints/<step>, or "best" (default: best/, else the newest readable).
    use_best: prefer best/ over the latest checkpoint.
    prompt_file: a .npy prompt instead of `model_dir` (Prompt Tuning modules only).
    initial_checkpoint_path: the frozen backbone (None: the random backbone of `seed`, as in a
      smoke run trained without a checkpoint).
    output_dir: where metrics.json and seqio's outputs go (default: <model_dir>/eval_<split>).
    num_partitions: model-parallel mesh size.
    seed: the seed of the training run (only used with a random backbone).
    allow_backbone_change: evaluate with another frozen backbone than the run recorded.
  """
  if (model_dir is None) == (prompt_file is None):
    raise ConfigError("give exactly one of MODEL_DIR (a training run's directory) or "
                      "PROMPT_FILE (.npy)")
  if initial_checkpoint_path:
    backbone_lib.check_initial_checkpoint(initial_checkpoint_path)
  run_dir = None
  if model_dir is not None:
    run_dir = RunDir(validate.existing_dir(model_dir, "MODEL_DIR", "a training run's directory"))
    record = run_dir.read_record()
    model = _recorded_frozen_dtype(model, record)
    if record is not None and not allow_backbone_change:
      current = backbone_lib.fingerprint(model.config, initial_checkpoint_path, seed)
      backbone_lib.check_same(record.fingerprint, current, str(run_dir.path),
                              "--gin.ALLOW_BACKBONE_CHANGE=True")
  out = pathlib.Path(output_dir
                     or (run_dir.path if run_dir else pathlib.Path(".")) / f"eval_{eval_cfg.split}")
  out = fileio.creatable_dir(out, "OUTPUT_DIR")  # made once nothing can refuse the run
  mesh = partitioning.create_mesh(num_partitions)
  rules = partitioning.logical_rules()
  lengths = eval_cfg.task_feature_lengths
  dummy = model.dummy_batch(lengths["inputs"], lengths["targets"])
  if run_dir is not None:  # read before the backbone: a bad state fails fast
    warn = lambda line: print(line, file=sys.stderr)  # stdout holds the metrics
    trained, source = run_dir.restore_params(step, prefer_best=use_best, warn=warn,
                                             sharding=partitioning.replicated(mesh))
  backbone, _ = backbone_lib.load_backbone(model, dummy, initial_checkpoint_path, seed, mesh, rules)
  with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
    if prompt_file is not None:
      trained = partitioning.place(_prompt_file_params(model, prompt_file, backbone, dummy, seed),
                                   partitioning.replicated(mesh))
      source = prompt_file
    params = (dict(trained) if models.PROMPT_KEY not in trained
              else models.merge_params(backbone, trained))
    evaluator = Evaluator(model, eval_cfg, log_dir=str(out), mesh=mesh)
    fileio.writable_dir(out, "OUTPUT_DIR")
    metrics = evaluator.evaluate(params)
  if jax.process_index() == 0:
    record = {"source": str(source), "split": eval_cfg.split, "metrics": metrics}
    fileio.atomic_write_bytes(out / "metrics.json", json.dumps(record, indent=2).encode())
  for task, values in metrics.items():
    print(f"{task} [{eval_cfg.split}] "
          + ", ".join(f"{k} {v:.4g}" for k, v in sorted(values.items())))
  return metrics


def _recorded_frozen_dtype(model: Any, record: Any) -> Any:
  """`model` with the frozen dtype its run recorded, unless FROZEN_DTYPE is set."""
  recorded = ((record.backbone or {}).get("config") or {}).get("param_dtype") if record else None
  if model.config.param_dtype is not None or recorded is None:
    return model
  return model.with_config(dataclasses.replace(model.config, param_dtype=recorded))
