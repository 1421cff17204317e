"""T5X legacy checkpoints: a msgpack `checkpoint` file whose `optimizer/target` (older) or
`target` tree holds inline arrays or tensorstore specs of zarr arrays (read lazily, shard by
shard; gs:// paths through tensorstore's GCS driver)."""
from __future__ import annotations

import copy
import functools
import os
from typing import Any

import numpy as np
import tensorstore as ts
from flax import serialization

from spot_jax.backbones.t5.checkpoints.common import CheckpointError, StoredArray



def _is_ts_spec(leaf: Any) -> bool:
  return isinstance(leaf, dict) and "driver" in leaf and ("kvstore" in leaf or "path" in leaf)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  if not isinstance(tree, dict) or _is_ts_spec(tree):
    return {prefix: tree}
  out = {}
  for k, v in tree.items():
    out.update(_flatten(v, f"{prefix}/{k}" if prefix else str(k)))
  return out


def t5x_arrays(ckpt_file: str) -> dict[str, StoredArray]:
  """The parameters (the `target` tree) of a legacy T5X checkpoint file, unread."""
  try:
    contents = serialization.msgpack_restore(read_bytes(ckpt_file))
  except Exception as e:
    raise CheckpointError(f"cannot parse T5X checkpoint file {ckpt_file}: {e}") from e
  if isinstance(contents.get("optimizer"), dict) and "target" in contents["optimizer"]:
    target = contents["optimizer"]["target"]
  elif "target" in contents:
    target = contents["target"]
  else:
    raise CheckpointError(f"{ckpt_file} has neither optimizer/target nor target; top-level keys: "
                          f"{sorted(contents)}")
  if ckpt_file.startswith("gs://"):
    ckpt_dir = ckpt_file.rpartition("/")[0]
  else:
    ckpt_dir = os.path.dirname(os.path.abspath(ckpt_file))
  stored = {}
  for name, leaf in _flatten(target).items():
    if _is_ts_spec(leaf):
      stored[name] = _ts_array(name, leaf, ckpt_dir)
    elif isinstance(leaf, (np.ndarray, np.generic, int, float)):
      arr = np.asarray(leaf)
      stored[name] = StoredArray(arr.shape, lambda idx, a=arr: a[idx], f"{ckpt_file} (inline)")
    else:
      raise CheckpointError(f"{name} in {ckpt_file} is a {type(leaf).__name__}, neither an array "
                            "nor a tensorstore spec")
  return stored


def _ts_array(name: str, spec: dict, ckpt_dir: str) -> StoredArray:
  spec = copy.deepcopy(spec)
  kvstore = spec.get("kvstore") if isinstance(spec.get("kvstore"), dict) else {}
  relative = kvstore.get("path", spec.pop("path", None))
  if relative is None:
    raise CheckpointError(f"tensorstore spec of {name} has no path: {spec}")
  if ckpt_dir.startswith("gs://"):
    bucket, _, prefix = ckpt_dir[len("gs://"):].partition("/")
    spec["kvstore"] = {"driver": "gcs", "bucket": bucket,
                       "path": f"{prefix}/{relative}".lstrip("/")}
  else:
    # t5x writes "gfile" (or "gcs" when saved on GCS); both are plain files once local.
    spec["kvstore"] = {"driver": "file", "path": os.path.join(ckpt_dir, relative)}
  metadata = spec.setdefault("metadata", {})
  for key in ("chunks", "compressor"):  # writer choices, read from .zarray instead
    metadata.pop(key, None)
  if metadata.get("dtype") == "<u2":
    raise CheckpointError(f"{name} is stored as uint16 (a T5X version<3 bfloat16 checkpoint); "
                          "re-save it with a current t5x")
  if "shape" not in metadata:
    raise CheckpointError(f"tensorstore spec of {name} has no metadata.shape: {spec}")
  origin = spec["kvstore"]["path"]
  if spec["kvstore"]["driver"] == "gcs":
    origin = f"gs://{spec['kvstore']['bucket']}/{origin}"

  @functools.lru_cache(maxsize=1)
  def opened() -> ts.TensorStore:
    # A missing chunk of an array without fill value is damage, not zeros.
    store = ts.open({**spec, "fill_missing_data_reads": False}, open=True).result()
    if store.fill_value is not None:
      store = ts.open(spec, open=True).result()
    return store

  return StoredArray(tuple(metadata["shape"]), lambda idx: opened()[idx].read().result(), origin)


def read_bytes(path: str) -> bytes:
  if path.startswith("gs://"):
    directory, _, key = path.rpartition("/")
    result = gcs_store(directory).read(key).result()
    if result.state != "value":
      raise CheckpointError(f"{path} does not exist")
    return bytes(result.value)
  with open(path, "rb") as f:
    return f.read()


def gcs_store(directory: str) -> ts.KvStore:
  bucket, _, prefix = directory[len("gs://"):].partition("/")
  return ts.KvStore.open({"driver": "gcs", "bucket": bucket,
                          "path": prefix.rstrip("/") + "/" if prefix else ""}).result()


def gcs_exists(directory: str, key: str) -> bool:
  return gcs_store(directory).read(key).result().state == "value"

