"""The backbone kinds, and the few things every layer above asks of a kind.

A kind is named by its config class: a `T5Config` is "t5" (encoder-decoder), a `DecoderConfig`
is "decoder" (decoder-only: Llama, Gemma 2/3). Code above the backbones asks here, instead of
importing a kind to test `isinstance` against it:

  kind_of(config)                 "t5" or "decoder"
  named_configs(kind)             the kind's registered configs {name: config}
  load_checkpoint(kind, ...)      the kind's strict loader, returning the parameter tree
  stored_dtype(kind, path)        the frozen dtype a checkpoint asks for (FROZEN_DTYPE None)

Each kind is imported only when asked for, so a job on one kind never loads the other.
"""
from __future__ import annotations

import importlib
from typing import Any, Mapping, Optional

KINDS = ("t5", "decoder")
DESCRIPTIONS = {"t5": "encoder-decoder (T5)", "decoder": "decoder-only (Llama, Gemma)"}
_CONFIG_MODULES = {"t5": "spot_jax.backbones.t5.config",
                   "decoder": "spot_jax.backbones.decoder.config"}
_CONFIG_CLASSES = {"t5": "T5Config", "decoder": "DecoderConfig"}


def kind_of(config: Any) -> str:
  """The kind of a backbone config (or of a model, through its `config`).

  Raises:
    TypeError: `config` is no backbone config (a programming error).
  """
  config = getattr(config, "config", config)
  for kind, module in _CONFIG_MODULES.items():
    cls = type(config)
    if cls.__module__ == module and cls.__name__ == _CONFIG_CLASSES[kind]:
      return kind
  raise TypeError(f"{type(config).__name__} is not a backbone config; valid: "
                  f"{', '.join(_CONFIG_CLASSES.values())}")


def named_configs(kind: str) -> Mapping[str, Any]:
  """The registered configs of `kind` by name (the gin/models/<name>.gin files)."""
  return importlib.import_module(_CONFIG_MODULES[kind]).CONFIGS


def load_checkpoint(kind: str, path: str, config: Any, *, mesh: Optional[Any] = None,
                    rules: Optional[Any] = None) -> Any:
  """The frozen parameters of a `kind` backbone of `config`, strictly loaded from `path`.

  T5: T5X, orbax or Hugging Face; decoder: Hugging Face or Gemma orbax, whose config must be
  `config` (a checkpoint of another shape is refused in one line naming the difference).
  """
  if kind == "t5":
    from spot_jax.backbones import t5  # pylint: disable=g-import-not-at-top
    return t5.load_checkpoint(path, config, mesh=mesh, rules=rules)
  from spot_jax.backbones.decoder import checkpoints  # pylint: disable=g-import-not-at-top
  _, params = checkpoints.load_checkpoint(path, config, mesh=mesh, rules=rules)
  return params


def stored_dtype(kind: str, path: Optional[str]) -> str:
  """The dtype frozen weights are held in when FROZEN_DTYPE is None: "bfloat16" for a
  decoder-only Hugging Face checkpoint stored in bfloat16 (config.json's `torch_dtype` or
  `dtype`), else "float32" (T5, Gemma orbax, remote or no checkpoint: a random backbone)."""
  if kind != "decoder" or not path or "://" in str(path):
    return "float32"
  from spot_jax.backbones.decoder import checkpoints  # pylint: disable=g-import-not-at-top
  return checkpoints.stored_dtype(path)
