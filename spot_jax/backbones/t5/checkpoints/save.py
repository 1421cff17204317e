"""Saving a parameter tree as a T5X legacy (version 3, gzip zarr arrays under
`optimizer/target`) or orbax checkpoint, through a temporary directory renamed into place."""
from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
import tensorstore as ts
from flax import serialization, traverse_util

from spot_jax import fileio
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5.checkpoints.common import StoredArray

_T5X_VERSION = 3
_CHUNK_BYTES = 64 * 1024 * 1024



def save_checkpoint(params: Mapping[str, Any], path: str, *, format: str = "t5x",  # pylint: disable=redefined-builtin
                    step: int = 0, overwrite: bool = False) -> str:
  """Writes `params` (the t5x parameter tree) as a T5X legacy or orbax checkpoint.

  The checkpoint is written to a temporary sibling directory and renamed into place, so a
  reader never sees a half-written checkpoint.

  Args:
    params: nested dict of arrays (jax or numpy), e.g. from `load_checkpoint`, or of
      `StoredArray`s from `stored_arrays` (the "t5x" format then streams them block by
      block as float32; "orbax" reads each fully).
    path: the checkpoint directory to create (local), e.g. ".../checkpoint_0".
    format: "t5x" (msgpack `checkpoint` + gzip zarr arrays under `optimizer/target`, version 3,
      readable by t5x) or "orbax" (tree `{"target": params, "state": {"step": step}}`).
    step: the step recorded under `state/step`.
    overwrite: replace an existing checkpoint at `path`.

  Returns:
    `path`.

  Raises:
    ConfigError: `path` exists and `overwrite` is False, an unknown format, a gs:// path or a
      tree that is not a parameter tree.
  """
  if format not in ("t5x", "orbax"):
    raise ConfigError(f"format must be 't5x' or 'orbax', got {format!r}")
  path = str(path).rstrip("/")
  if path.startswith("gs://"):
    raise ConfigError(f"save_checkpoint writes local directories, got {path}; copy it to GCS "
                      "afterwards")
  flat = traverse_util.flatten_dict(nn.unbox(dict(params)), sep="/")
  if not flat or list(params) == ["params"]:
    raise ConfigError("params must be the parameter tree itself (e.g. variables['params']), got "
                     f"top-level keys {sorted(params)}")
  if os.path.exists(path) and not overwrite:
    raise ConfigError(f"{path} exists; pass overwrite=True to replace it")
  with fileio.staged_directory(path) as fresh:
    if format == "t5x":
      _write_t5x(flat, fresh, step)
    else:
      _write_orbax(flat, fresh, step)
  return path


def _write_t5x(flat: Mapping[str, Any], directory: str, step: int) -> None:
  os.makedirs(directory)
  target = {}
  for name, value in flat.items():
    if len(value.shape) >= 2:
      target[name] = _write_zarr(value, directory, "target." + name.replace("/", "."))
    else:
      target[name] = _host(value)
  contents = {"version": _T5X_VERSION,
              "optimizer": {"target": traverse_util.unflatten_dict(target, sep="/"),
                            "state": {"step": np.asarray(step, np.int32)}}}
  with open(os.path.join(directory, "checkpoint"), "wb") as f:
    f.write(serialization.msgpack_serialize(contents))


def _chunk_shape(shape: Sequence[int], itemsize: int) -> list[int]:
  """Chunks of at most 64 MiB that divide the shape: repeatedly split the largest dimension."""
  chunks = list(shape)
  while math.prod(chunks) * itemsize > _CHUNK_BYTES:
    d = max(range(len(chunks)), key=lambda i: chunks[i])
    factor = next(f for f in range(2, chunks[d] + 1) if chunks[d] % f == 0)
    chunks[d] //= factor
  return chunks


def _host(value: Any) -> np.ndarray:
  if isinstance(value, StoredArray):
    return np.asarray(value.read(tuple(slice(None) for _ in value.shape)), np.float32)
  return np.asarray(jax.device_get(value))


def _write_zarr(value: Any, directory: str, name: str) -> dict:
  """Writes one array with tensorstore (each addressable shard once) -> its relative spec."""
  dtype = np.dtype(np.float32 if isinstance(value, StoredArray) else value.dtype)
  shape = list(np.shape(value))
  metadata = {"shape": shape, "chunks": _chunk_shape(shape, dtype.itemsize),
              "compressor": {"id": "gzip", "level": 1}}
  store = ts.open({"driver": "zarr",
                   "kvstore": {"driver": "file", "path": os.path.join(directory, name)},
                   "metadata": metadata, "dtype": dtype.name}, create=True, open=False).result()
  if isinstance(value, jax.Array):
    for shard in value.addressable_shards:
      if shard.replica_id == 0:
        store[shard.index].write(np.asarray(shard.data)).result()
  elif isinstance(value, StoredArray):  # one row of chunks at a time bounds host memory
    rows = metadata["chunks"][0]
    for start in range(0, shape[0], rows):
      index = (slice(start, min(start + rows, shape[0])),) + (slice(None),) * (len(shape) - 1)
      store[index].write(np.asarray(value.read(index), np.float32)).result()
  else:
    store.write(np.asarray(value)).result()
  written = store.spec().to_json()["metadata"]
  return {"driver": "zarr", "kvstore": {"driver": "file", "path": name},
          "metadata": {k: written[k] for k in ("chunks", "compressor", "dtype", "shape")}}


def _write_orbax(flat: Mapping[str, Any], directory: str, step: int) -> None:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  tree = {"target": traverse_util.unflatten_dict({p: _host(v) if isinstance(v, StoredArray) else v
                                                  for p, v in flat.items()}, sep="/"),
          "state": {"step": np.asarray(step, np.int32)}}
  ocp.PyTreeCheckpointer().save(directory, tree)
