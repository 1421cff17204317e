"""The frozen backbone named on a command line: `--model` (a config name or a gin model file)
with `--model_binding`s, as an `EncoderDecoderModel` without a prompt."""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence

from spot_jax import models
from spot_jax.errors import ConfigError


def load_model(spec: str, bindings: Sequence[str] = (), allow_decoder: bool = False
               ) -> tuple[models.Model, str]:
  """The backbone model of a gin model file (its MODEL macro) or of a config name; a gin file's
  DecoderOnlyModel only with `allow_decoder` (commands that serve either kind)."""
  if spec.endswith(".gin"):
    import gin  # pylint: disable=g-import-not-at-top
    from spot_jax.cli import gin_flags  # pylint: disable=g-import-not-at-top  (gin at the edge)
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
    kinds = (models.EncoderDecoderModel, models.DecoderOnlyModel)
    if not isinstance(model, kinds[:2 if allow_decoder else 1]):
      raise ConfigError(f"--model {spec!r}: its MODEL is a {type(model).__name__}, not an "
                        f"EncoderDecoderModel; give a gin/models/ file")
    if model.has_prompt:
      model = dataclasses.replace(model, module=model.module.clone(prompt=None))
    return model, spec
  if bindings:
    raise ConfigError("--model_binding applies to a gin model file; give --model=<file>.gin")
  from spot_jax.backbones import t5  # pylint: disable=g-import-not-at-top
  config = t5.config_by_name(spec, dropout_rate=0.0)
  return models.EncoderDecoderModel(t5.Transformer(config)), spec
