"""Strict reading and writing of frozen decoder-only weights: Hugging Face and Gemma orbax.

`load_checkpoint(path, config=None)` detects the format from the directory:
  * Hugging Face: `config.json` plus `model.safetensors`, or `model.safetensors.index.json`
    and its shards. The config comes from config.json; a `config` passed must equal it.
  * Gemma orbax: a directory written by orbax (`_METADATA`, `manifest.ocdbt`; a kauldron step's
    `default/` item) in the layout of Google DeepMind's `gemma` library. It carries no config:
    the caller names one, and every array is checked against it.
Loading is strict: a missing, extra or mis-shaped array is a `CheckpointError` (a ConfigError:
the command line's exit 2) whose one line names it. Arrays are read one at a time (Gemma orbax:
one layer at a time), each cast to the config's `param_dtype` (None: `stored_dtype`) and placed
on the default device or on a mesh with the rule table's shardings before the next is read.

  common       the error type, the strict shape check, the config's sizes, placement
  huggingface  `load_hf_dir`, `save_hf_dir` (safetensors, sharded with an index when large)
  gemma        `load_gemma_orbax`, `save_gemma_orbax`, `params_from_gemma`, `params_to_gemma`
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

from jax.sharding import Mesh

from spot_jax import partitioning
from spot_jax.backbones import memory
from spot_jax.backbones.decoder.checkpoints import common
from spot_jax.backbones.decoder.checkpoints.common import CheckpointError, Params, check_fit
from spot_jax.backbones.decoder.checkpoints.gemma import (gemma_shapes, load_gemma_orbax,
                                                         params_from_gemma, params_to_gemma,
                                                         save_gemma_orbax)
from spot_jax.backbones.decoder.checkpoints.huggingface import (load_hf_config, load_hf_dir,
                                                               save_hf_dir)

__all__ = ["CheckpointError", "check_fit", "detect_format", "gemma_shapes", "load_checkpoint",
           "load_gemma_orbax", "load_hf_dir", "params_from_gemma", "params_to_gemma",
           "save_gemma_orbax", "save_hf_dir", "stored_dtype"]

_ORBAX_MARKERS = ("_METADATA", "manifest.ocdbt")


def detect_format(path: str) -> str:
  """"hf" or "gemma" (orbax) for the checkpoint directory `path`.

  Raises:
    CheckpointError: `path` does not exist or holds neither, named with what would be valid.
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    raise CheckpointError(f"checkpoint path {path} does not exist")
  if os.path.isdir(path):
    names = set(os.listdir(path))
    if names & set(_ORBAX_MARKERS) or os.path.isfile(os.path.join(path, "default", "_METADATA")):
      return "gemma"
    if "config.json" in names or any(n.endswith((".safetensors", ".safetensors.index.json"))
                                     for n in names):
      return "hf"  # without config.json, load_hf_dir says so
  raise CheckpointError(f"{path} is not a decoder checkpoint; give a Hugging Face model directory "
                        "(config.json + model.safetensors, or model.safetensors.index.json + "
                        "shards) or a Gemma orbax checkpoint directory (_METADATA)")


def stored_dtype(path: str) -> str:
  """"bfloat16" for a Hugging Face directory whose config.json says its weights are stored
  so (`torch_dtype`, or transformers 5's `dtype`), else "float32"."""
  if detect_format(path) != "hf":
    return "float32"
  from spot_jax.backbones.decoder.checkpoints import huggingface  # pylint: disable=g-import-not-at-top
  hf_config = huggingface.read_hf_config(os.fspath(path))
  stored = hf_config.get("dtype") or hf_config.get("torch_dtype")
  if stored is None and isinstance(hf_config.get("text_config"), dict):  # Gemma 3 multimodal
    stored = hf_config["text_config"].get("dtype") or hf_config["text_config"].get("torch_dtype")
  return "bfloat16" if stored == "bfloat16" else "float32"


# The activation dtype, the stored dtype and remat are the caller's choice, not the
# checkpoint's (spot_jax.backbone hashes the other fields as the weights' identity).
_NOT_STORED = ("dtype", "param_dtype", "remat_policy")


def _config_differences(given: Any, stored: Any) -> list[str]:
  return [f"{f.name}={getattr(given, f.name)!r} (the checkpoint has "
          f"{getattr(stored, f.name)!r})" for f in dataclasses.fields(given)
          if f.name not in _NOT_STORED and getattr(given, f.name) != getattr(stored, f.name)]


def load_checkpoint(path: str, config: Optional[Any] = None, *, mesh: Optional[Mesh] = None,
                    rules: Optional[partitioning.LogicalRules] = None) -> tuple[Any, Params]:
  """The config and frozen parameters of a Hugging Face or Gemma orbax checkpoint.

  Args:
    path: a Hugging Face model directory or a Gemma orbax checkpoint directory (local).
    config: the DecoderConfig the weights must fit; required for Gemma orbax checkpoints
      (they carry none), optional for Hugging Face ones (every field but `dtype`,
      `param_dtype` and `remat_policy` must equal config.json's; the given config is returned).
    mesh: a ("data", "model") mesh; arrays are placed with the rule table's shardings of the
      network's logical axes. Without a mesh, arrays go to the default device.
    rules: logical axis rules (default `spot_jax.partitioning.DEFAULT_RULES`).

  Returns:
    (DecoderConfig, parameter tree of jax Arrays in the config's `param_dtype`, None: the
    checkpoint's `stored_dtype`).

  Raises:
    CheckpointError: a missing, unexpected or mis-shaped array, a config that does not match,
      or a path that holds no checkpoint; one line naming it.
  """
  fmt = detect_format(path)
  if fmt == "hf":
    stored = load_hf_config(path)
    diffs = [] if config is None else _config_differences(config, stored)
    if diffs:
      raise CheckpointError(f"the config does not match {os.path.join(path, 'config.json')}: "
                            f"{'; '.join(diffs[:4])}; pass config=None to use the "
                            "checkpoint's own")
    config = stored if config is None else config
    dtype = config.param_dtype or stored_dtype(path)
    _, params = load_hf_dir(path, common.placer(config, mesh, rules, memory.frozen_dtype(dtype)))
  else:
    if config is None:
      raise CheckpointError(f"{path} is a Gemma orbax checkpoint, which carries no config; name "
                            "its config (a DecoderConfig of the decoder's CONFIGS)")
    params = load_gemma_orbax(path, config, place=common.placer(config, mesh, rules,
                                                                 config.frozen_dtype))
  return config, params
