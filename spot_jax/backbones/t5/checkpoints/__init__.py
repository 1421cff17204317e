"""Strict loading and saving of frozen T5 weights: T5X (legacy and orbax) and Hugging Face.

`load_checkpoint(path, config)` detects the format from the directory:
  * T5X legacy: a msgpack `checkpoint` file whose `optimizer/target` (older) or `target`
    (newer) tree holds inline numpy arrays or tensorstore specs of zarr arrays with paths
    relative to the checkpoint directory. Each array is read with tensorstore shard by shard
    straight into its target sharding, so no host ever holds a full copy of a large model.
  * Orbax: a directory written by orbax's PyTree/Standard checkpointers (`_METADATA`,
    `manifest.ocdbt`, ...), parameters under `optimizer/target`, `target`, a lone `params`
    key or at the root; restored by orbax with the target shardings.
  * Hugging Face: `config.json` plus safetensors or `pytorch_model.bin` (see
    `spot_jax.backbones.t5.hf`).
Optimizer state is never read. Loading is strict: every parameter of `Transformer(config)` must
be stored with its exact shape and every stored parameter must be used, otherwise a
`CheckpointError` names each offending parameter path. Arrays come back in the config's
`param_dtype` (float32 when None, or `dtype`), each cast and placed as it is read.

`save_checkpoint(params, path)` writes the T5X legacy format (version 3, gzip zarr arrays under
`optimizer/target`, which t5x reads) or orbax, into a temporary directory renamed into place.

  common        the expected tree, stored arrays and strict fit checks every format shares
  t5x_legacy    the msgpack `checkpoint` file and its tensorstore arrays
  orbax_format  orbax checkpoint directories
  huggingface   `config.json` plus safetensors or `pytorch_model.bin`
  save          writing T5X legacy or orbax checkpoints
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from jax.sharding import Mesh, SingleDeviceSharding

from spot_jax import partitioning
from spot_jax.backbones.t5.checkpoints import common, huggingface, orbax_format, t5x_legacy
from spot_jax.backbones.t5.checkpoints.common import (CheckpointError, Params, StoredArray,
                                                      abstract_params, check_fit)
from spot_jax.backbones.t5.checkpoints.save import save_checkpoint
from spot_jax.backbones.t5.config import T5Config

__all__ = ["CheckpointError", "StoredArray", "abstract_params", "check_fit", "detect_format",
           "load_checkpoint", "load_embedding", "save_checkpoint", "stored_arrays"]

_ORBAX_MARKERS = ("_METADATA", "manifest.ocdbt", "_CHECKPOINT_METADATA")



def load_checkpoint(path: str, config: T5Config, *, mesh: Optional[Mesh] = None,
                    rules: Optional[partitioning.LogicalRules] = None,
                    allow_missing: Sequence[str] = (), dtype: Any = None) -> Params:
  """Loads the frozen parameters of `Transformer(config)` from a T5X, orbax or HF checkpoint.

  Args:
    path: a T5X `checkpoint_N` directory or its `checkpoint` file, an orbax checkpoint
      directory, or a Hugging Face model directory (local; T5X and orbax also gs://).
    config: the model configuration the checkpoint must match.
    mesh: a ("data", "model") mesh; arrays are placed with the rule-table shardings.
      Without a mesh, arrays go to the default device.
    rules: logical axis rules (default `spot_jax.partitioning.DEFAULT_RULES`).
    allow_missing: path prefixes (e.g. "prompt", "router") whose parameters may be absent;
      stored parameters under them are not loaded either. Absent ones are not in the result.
    dtype: dtype of the returned arrays (default: the config's `frozen_dtype`); each array is
      cast as it is read, shard by shard.

  Returns:
    The parameter tree (plain nested dicts of jax Arrays), without any `prompt` subtree.

  Raises:
    CheckpointError: a missing, unexpected or mis-shaped parameter, a mismatched HF
      config.json, or an unreadable array file; the message names the parameter.
  """
  dtype = np.dtype(config.frozen_dtype if dtype is None else dtype)
  expected, boxed = abstract_params(config)
  shardings = common.target_shardings(boxed, mesh, rules)
  fmt, where = detect_format(path)
  if fmt == "orbax":
    return orbax_format.load_orbax(where, expected, shardings, allow_missing, dtype)
  stored = _checked_arrays(fmt, where, config, expected, allow_missing)
  for p in stored:
    common.check_divisible(p, expected[p].shape, shardings[p])
  flat = {p: common.place(p, s, shardings[p], dtype) for p, s in stored.items()}
  return traverse_util.unflatten_dict(flat, sep="/")


def stored_arrays(path: str, config: T5Config, *, allow_missing: Sequence[str] = ()
                  ) -> dict[str, StoredArray]:
  """The parameters of a T5X legacy or HF checkpoint, strictly checked but not yet read.

  Each `StoredArray` reads any slice on demand, so a converter can stream a model far larger
  than host memory (see `save_checkpoint`, which accepts them as leaves).

  Raises:
    CheckpointError: as `load_checkpoint`, or for an orbax checkpoint (restore those instead).
  """
  fmt, where = detect_format(path)
  if fmt == "orbax":
    raise CheckpointError(f"{where} is an orbax checkpoint; use load_checkpoint for it")
  return _checked_arrays(fmt, where, config, abstract_params(config)[0], allow_missing)


def _checked_arrays(fmt: str, where: str, config: T5Config,
                    expected: Mapping[str, jax.ShapeDtypeStruct],
                    allow_missing: Sequence[str]) -> dict[str, StoredArray]:
  stored = t5x_legacy.t5x_arrays(where) if fmt == "t5x" else huggingface.hf_arrays(where, config)
  check_fit(stored, {p: s.shape for p, s in expected.items()}, allow_missing, where)
  return {p: stored[p] for p in expected if p in stored}


def load_embedding(path: str, config: T5Config) -> np.ndarray:
  """Only the token embedding table [vocab_size, emb_dim] (float32), e.g. for prompt inits.

  Raises:
    CheckpointError: when it is absent or mis-shaped.
  """
  name, want = "token_embedder/embedding", (config.vocab_size, config.emb_dim)
  fmt, where = detect_format(path)
  if fmt == "orbax":
    sharding = {name: SingleDeviceSharding(jax.local_devices()[0])}
    stored = orbax_format.orbax_shapes(where)[1]
    check_fit({name: stored[name]} if name in stored else {}, {name: want}, (), where)
    params = orbax_format.load_orbax(where,
                                     {name: jax.ShapeDtypeStruct(want, jnp.float32)}, sharding,
                         (), np.dtype(np.float32), strict=False)
    return np.asarray(params["token_embedder"]["embedding"])
  stored = t5x_legacy.t5x_arrays(where) if fmt == "t5x" else huggingface.hf_arrays(where, config)
  check_fit({name: stored[name]} if name in stored else {}, {name: want}, (), where)
  index = tuple(slice(None) for _ in want)
  return np.asarray(stored[name].read(index), np.float32)


def detect_format(path: str) -> tuple[str, str]:
  """("t5x", checkpoint file) | ("orbax", directory) | ("hf", directory) for `path`.

  Raises:
    CheckpointError: when `path` does not exist or holds no recognised checkpoint.
  """
  path = str(path)
  path = path.rstrip("/") or path
  if path.startswith("gs://"):
    if (t5x_legacy.gcs_exists(path, "checkpoint")
        and not any(t5x_legacy.gcs_exists(path, m) for m in _ORBAX_MARKERS[:2])):
      return "t5x", path + "/checkpoint"
    if any(t5x_legacy.gcs_exists(path, m) for m in _ORBAX_MARKERS):
      return "orbax", path
    if path.endswith("/checkpoint"):
      return "t5x", path
    raise CheckpointError(f"no T5X or orbax checkpoint at {path}")
  if not os.path.exists(path):
    raise CheckpointError(f"checkpoint path {path} does not exist")
  if os.path.isfile(path):
    return "t5x", path
  names = set(os.listdir(path))
  if names & set(_ORBAX_MARKERS[:2]):
    return "orbax", path
  if "checkpoint" in names and os.path.isfile(os.path.join(path, "checkpoint")):
    return "t5x", os.path.join(path, "checkpoint")
  if "config.json" in names:
    return "hf", path
  nested = [n for n in sorted(names) if os.path.exists(os.path.join(path, n, "_METADATA"))]
  if "_CHECKPOINT_METADATA" in names and len(nested) == 1:  # an orbax composite with one item
    return "orbax", os.path.join(path, nested[0])
  steps = sorted(n for n in names if n.startswith("checkpoint_"))
  hint = f" (it holds {', '.join(steps[-3:])}: pass one of those)" if steps else ""
  raise CheckpointError(f"{path} is not a checkpoint{hint}; expected a T5X checkpoint_N directory "
                        "(with a `checkpoint` file), an orbax checkpoint (_METADATA) or a Hugging "
                        "Face directory (config.json + model.safetensors / pytorch_model.bin)")

