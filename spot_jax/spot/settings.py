"""What every run of the SPoT layer shares: the frozen model, the data lengths and the budgets.

Each command line (`spot_jax.library`, `spot_jax.retrieve`, `spot_jax.study`) takes the same
flags, so the same study runs on a tiny test model, the embedded toy T5 or T5.1.1 XXL by
changing only `--model`, `--checkpoint` and the task names (`spot_jax.cli.flags`):

  --model=gin/models/t5_1_1_lm100k_base.gin   (a gin model file providing MODEL, or a config
                                               name such as t5_1_1_byte_tiny)
  --model_binding="DROPOUT_RATE=0.0"          (gin bindings for the model file, repeatable)
  --checkpoint=/ckpts/...                     (the frozen backbone; omit: random, tests only)
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Mapping, Optional, Sequence

from spot_jax import models
from spot_jax.errors import ConfigError
from spot_jax import backbone as backbone_lib


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """Shared settings of the prompt-tuning runs this layer makes.

  Attributes:
    model: the backbone model (its `module.prompt` is None; each run adds its prompt).
    model_name: the --model value, for records.
    initial_checkpoint_path: the frozen backbone (None: random, from the run seed).
    task_module: module(s) registering the tasks (MIXTURE_OR_TASK_MODULE).
    lengths: {"inputs": T, "targets": S} (prompt excluded).
    batch_size: training batch size.
    train_steps: steps of every full run.
    embedding_step: the early step whose prompt is the task embedding (SAVE_PROMPT_STEPS).
    eval_period: steps between validation evaluations (the best one is kept).
    checkpoint_period: steps between training-state checkpoints (None: eval_period).
    eval_batch_size: evaluation batch size.
    eval_num_examples: validation examples per evaluation (None: all).
    prompt_length: L of the Prompt Tuning prompts.
    learning_rate: Adafactor learning rate (Prompt Tuning: 0.3).
    metric: the validation metric selecting the best prompt, e.g. "accuracy".
    task_metrics: per-task overrides of `metric`.
    metric_max: the metric's best possible value (errors are metric_max - score).
    fingerprint: the frozen model's fingerprint (see `fingerprint.py`), for seed 0.
  """
  model: models.EncoderDecoderModel
  model_name: str
  initial_checkpoint_path: Optional[str]
  task_module: str
  lengths: Mapping[str, int]
  batch_size: int = 32
  train_steps: int = 30000
  embedding_step: int = 10000
  eval_period: int = 1000
  checkpoint_period: Optional[int] = None
  eval_batch_size: int = 32
  eval_num_examples: Optional[int] = None
  prompt_length: int = 100
  learning_rate: float = 0.3
  metric: str = "accuracy"
  task_metrics: Mapping[str, str] = dataclasses.field(default_factory=dict)
  metric_max: float = 100.0
  fingerprint: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    for name in ("batch_size", "train_steps", "embedding_step", "eval_period", "prompt_length"):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        raise ConfigError(f"--{name} must be a positive integer, got {value!r}")
    if self.checkpoint_period is not None and (not isinstance(self.checkpoint_period, int)
                                               or self.checkpoint_period <= 0):
      raise ConfigError(f"--checkpoint_period must be a positive integer, got {self.checkpoint_period!r}")
    if self.embedding_step > self.train_steps:
      raise ConfigError(f"--embedding_step={self.embedding_step} is after the end of training "
                        f"(--train_steps={self.train_steps}); give a step <= train_steps")

  @property
  def embed_dim(self) -> int:
    return int(self.model.config.emb_dim)

  def metric_for(self, task: str) -> str:
    return self.task_metrics.get(task, self.metric)

  def fingerprint_for(self, seed: int) -> dict[str, str]:
    """The backbone's fingerprint for a run of `seed` (a random backbone depends on the seed)."""
    if self.initial_checkpoint_path:
      return dict(self.fingerprint)
    return backbone_lib.fingerprint(self.model.config, None, seed)


def load_model(spec: str, bindings: Sequence[str] = ()) -> tuple[models.EncoderDecoderModel, str]:
  """The backbone model of a gin model file (its MODEL macro) or of a config name."""
  if spec.endswith(".gin"):
    import gin  # pylint: disable=g-import-not-at-top
    from spot_jax.cli import gin_flags  # pylint: disable=g-import-not-at-top
    path = next((pathlib.Path(p, spec) for p in gin_flags.search_paths([])
                 if pathlib.Path(p, spec).is_file()), pathlib.Path(spec))
    if not path.is_file():
      raise ConfigError(f"--model {spec!r}: no such gin file; give a file under gin/models/ or "
                        f"a config name such as t5_1_1_base")
    from spot_jax.cli import gin_overrides, gin_settings  # pylint: disable=g-import-not-at-top
    gin.clear_config()
    for p in gin_flags.search_paths([]):
      gin.add_config_file_search_path(p)
    try:
      gin_overrides.parse_file(str(path), "--model")
      for binding in bindings:
        gin_overrides.parse_override(binding, "--model_binding=")
      try:
        reference = gin.query_parameter("%MODEL")
      except ValueError:
        reference = None
      if not hasattr(reference, "scoped_configurable_fn"):
        raise ConfigError(f"--model {spec!r}: the gin file binds no MODEL = @...(); give a "
                          f"gin/models/ file")
      gin_settings.check_types(gin_overrides.used_keys([reference.configurable.selector]))
      try:
        model = reference.scoped_configurable_fn()
      except ConfigError as e:
        raise ConfigError(f"--model {spec!r}: {gin_settings.name_setting(e)}") from None
    finally:
      gin.clear_config()
    if not isinstance(model, models.EncoderDecoderModel):
      raise ConfigError(f"--model {spec!r}: its MODEL is a {type(model).__name__}, not an "
                        f"EncoderDecoderModel; give a gin/models/ file")
    if model.has_prompt:
      model = dataclasses.replace(model, module=model.module.clone(prompt=None))
    return model, spec
  if bindings:
    raise ConfigError("--model_binding applies to a gin model file; give --model=<file>.gin")
  from spot_jax import t5  # pylint: disable=g-import-not-at-top
  config = t5.config_by_name(spec, dropout_rate=0.0)
  return models.EncoderDecoderModel(t5.Transformer(config)), spec


def model_fingerprint(model: models.EncoderDecoderModel, checkpoint: Optional[str],
                      seed: int = 0) -> dict[str, str]:
  if checkpoint:
    backbone_lib.check_initial_checkpoint(checkpoint)
  return backbone_lib.fingerprint(model.config, checkpoint, seed)


def check_tasks(task_names: Sequence[str], module: str) -> None:
  """A one-line error naming the first unregistered task (with close names)."""
  from spot_jax import data as data_lib  # pylint: disable=g-import-not-at-top
  data_lib.import_modules(module)
  for name in task_names:
    data_lib.get_mixture_or_task(name)


