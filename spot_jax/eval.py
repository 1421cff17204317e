"""`python -m spot_jax.eval`: evaluate a saved prompt (or model-tuned run) on a task split.

  python -m spot_jax.eval \
    --gin_file=gin/models/t5_1_1_base.gin --gin_file=gin/prompts/prompt_tuning_sampled_vocab.gin \
    --gin_file=gin/runs/eval.gin \
    --gin.CHECKPOINT_DIR="'/tmp/rte'" --gin.MIXTURE_OR_TASK_NAME="'spot_glue_rte_v200'" \
    --gin.INITIAL_CHECKPOINT_PATH="'/ckpts/t5_1_1_lm100k_base/checkpoint_1100000'" \
    --gin.PROMPT_LENGTH=100

The prompt-side parameters come from a run directory's training state (best/ by default, else
the latest checkpoints/ step, or `step`), which works for every method (SMoP needs its
router); or from a .npy prompt file (`prompt_file`), which fits Prompt Tuning modules.
Metrics are printed and written to <output_dir>/metrics.json.
"""
from __future__ import annotations

import json
import pathlib
import sys
from typing import Any, Optional

import flax.linen as nn
import jax
import numpy as np

from spot_jax.train import loop as train_loop
from spot_jax import orbax_io
from spot_jax import backbone as backbone_lib
from spot_jax.train import evaluator as evaluator_lib
from spot_jax.cli import gin_flags
from spot_jax import models
from spot_jax import partitioning
from spot_jax.errors import ConfigError


def _step_dirs(folder: pathlib.Path) -> list[pathlib.Path]:
  """checkpoints/<step> (or best/<step>) directories, oldest first; `<step>.corrupt` is skipped."""
  return sorted((p for p in folder.glob("[0-9]*") if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def _restore_params(checkpoint_dir: pathlib.Path, step: Optional[int], use_best: bool) -> tuple[Any, str]:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  candidates = []
  if step is not None:
    candidates.append(checkpoint_dir / "checkpoints" / str(step))
  else:
    if use_best:
      candidates += _step_dirs(checkpoint_dir / "best")[-1:]
    candidates += _step_dirs(checkpoint_dir / "checkpoints")[-1:]
  for path in candidates:
    if (path / "default").is_dir():
      with orbax_io.quiet_abandoned_reads():
        try:
          restored = ocp.StandardCheckpointer().restore(path / "default")
        except Exception as e:  # pylint: disable=broad-except
          raise ConfigError(f"the training state {path} cannot be read ({orbax_io.root_cause(e)}); "
                            f"evaluate another step (CHECKPOINT_STEP) or restart the training run, "
                            f"which falls back to its newest readable state") from None
      return restored["params"], str(path)
  raise ConfigError(f"no training state found under {str(checkpoint_dir)!r} "
                    f"(looked for {'checkpoints/' + str(step) if step is not None else 'best/<step> and checkpoints/<step>'}); "
                    f"give the MODEL_DIR of a spot_jax.train run")


def evaluate(*, model: models.EncoderDecoderModel, eval_cfg: evaluator_lib.EvalConfig,
             checkpoint_dir: Optional[str] = None, step: Optional[int] = None, use_best: bool = True,
             prompt_file: Optional[str] = None, initial_checkpoint_path: Optional[str] = None,
             output_dir: Optional[str] = None, num_partitions: int = 1, seed: int = 0
             ) -> dict[str, dict[str, float]]:
  """Evaluates a trained prompt; returns {task: {metric: value}}.

  Args:
    model: the model the prompt was trained with.
    eval_cfg: what to evaluate.
    checkpoint_dir: a training run's MODEL_DIR (its training state holds the trained params).
    step: a specific checkpoints/<step> (default: best/, else the latest).
    use_best: prefer best/ over the latest checkpoint.
    prompt_file: a .npy prompt instead of `checkpoint_dir` (Prompt Tuning modules only).
    initial_checkpoint_path: the frozen backbone (None: the random backbone of `seed`, as in a
      smoke run trained without a checkpoint).
    output_dir: where metrics.json and seqio's outputs go (default: <checkpoint_dir>/eval_<split>).
    num_partitions: model-parallel mesh size.
    seed: the seed of the training run (only used with a random backbone).
  """
  if (checkpoint_dir is None) == (prompt_file is None):
    raise ConfigError("give exactly one of CHECKPOINT_DIR (a training run's MODEL_DIR) or PROMPT_FILE (.npy)")
  if initial_checkpoint_path:
    backbone_lib.check_initial_checkpoint(initial_checkpoint_path)
  if checkpoint_dir is not None and not pathlib.Path(checkpoint_dir).is_dir():
    raise ConfigError(f"CHECKPOINT_DIR {checkpoint_dir!r} is not a directory; give a training run's MODEL_DIR")
  out = pathlib.Path(output_dir or pathlib.Path(checkpoint_dir or ".") / f"eval_{eval_cfg.split}")
  out = train_loop.prepare_model_dir(str(out))
  mesh = partitioning.create_mesh(num_partitions)
  rules = partitioning.logical_rules()
  lengths = eval_cfg.task_feature_lengths
  dummy = model.dummy_batch(lengths["inputs"], lengths["targets"])
  backbone, _ = backbone_lib.load_backbone(model, dummy, initial_checkpoint_path, seed, mesh, rules)
  with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
    if prompt_file is not None:
      path = pathlib.Path(prompt_file)
      if not path.is_file():
        raise ConfigError(f"PROMPT_FILE {prompt_file!r} does not exist; give a .npy exported by spot_jax.train")
      abstract = jax.eval_shape(model.init_prompt, backbone_lib.seed_keys(seed)[1], backbone, dummy)
      names = sorted(models.unbox(abstract).get(models.PROMPT_KEY, {}))
      if names != ["prompt"]:
        raise ConfigError(f"PROMPT_FILE fits Prompt Tuning modules (one 'prompt' parameter); this model's "
                          f"prompt has {names}: evaluate its run directory with CHECKPOINT_DIR instead")
      array = np.load(path)
      expected = models.unbox(abstract)[models.PROMPT_KEY]["prompt"].shape
      if array.shape != expected:
        raise ConfigError(f"PROMPT_FILE {prompt_file!r} has shape {array.shape}; this model's prompt is {expected}")
      trained, source = {models.PROMPT_KEY: {"prompt": array.astype(np.float32)}}, str(path)
    else:
      # absolute: orbax refuses relative paths (CHECKPOINT_DIR=run from the run's parent folder)
      trained, source = _restore_params(pathlib.Path(checkpoint_dir).absolute(), step, use_best)
    params = dict(trained) if models.PROMPT_KEY not in trained else models.merge_params(backbone, trained)
    evaluator = evaluator_lib.Evaluator(model, eval_cfg, log_dir=str(out))
    metrics = evaluator.evaluate(params)
  record = {"source": source, "split": eval_cfg.split, "metrics": metrics}
  (out / "metrics.json").write_text(json.dumps(record, indent=2))
  for task, values in metrics.items():
    print(f"{task} [{eval_cfg.split}] " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(values.items())))
  return metrics


# The configurables main() calls: gin overrides they never reach are refused.
GIN_ROOTS = ("spot_jax.eval.evaluate",)


def main(args) -> int:
  del args
  import gin  # pylint: disable=g-import-not-at-top
  from spot_jax import eval as eval_module  # gin binds the importable module, not __main__
  gin.get_configurable(eval_module.evaluate)()
  return 0


if __name__ == "__main__":
  sys.exit(gin_flags.run(main, sys.argv[1:], "spot_jax.eval", __doc__.splitlines()[0],
                         GIN_ROOTS))
