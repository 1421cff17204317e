"""Strict loading and saving of frozen T5 weights: T5X (legacy and orbax) and Hugging Face.

`load_checkpoint(path, config)` detects the format from the directory:
  * T5X legacy: a msgpack `checkpoint` file whose `optimizer/target` (older) or `target`
    (newer) tree holds inline numpy arrays or tensorstore specs of zarr arrays with paths
    relative to the checkpoint directory. Each array is read with tensorstore shard by shard
    straight into its target sharding, so no host ever holds a full copy of a large model.
  * Orbax: a directory written by orbax's PyTree/Standard checkpointers (`_METADATA`,
    `manifest.ocdbt`, ...), parameters under `optimizer/target`, `target`, a lone `params`
    key or at the root; restored by orbax with the target shardings.
  * Hugging Face: `config.json` plus safetensors or `pytorch_model.bin` (see `spot_jax.t5.hf`).
Optimizer state is never read. Loading is strict: every parameter of `Transformer(config)` must
be stored with its exact shape and every stored parameter must be used, otherwise a
`CheckpointError` names each offending parameter path. Arrays come back as float32 (or `dtype`).

`save_checkpoint(params, path)` writes the T5X legacy format (version 3, gzip zarr arrays under
`optimizer/target`, which t5x reads) or orbax, into a temporary directory renamed into place.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import os
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from flax import serialization, traverse_util
from jax.sharding import Mesh, NamedSharding, Sharding, SingleDeviceSharding

from spot_jax import fileio
from spot_jax import partitioning
from spot_jax.t5.config import T5Config
from spot_jax.t5.network import Transformer

Index = tuple[slice, ...]
Params = dict[str, Any]

_ORBAX_MARKERS = ("_METADATA", "manifest.ocdbt", "_CHECKPOINT_METADATA")
_T5X_VERSION = 3
_CHUNK_BYTES = 64 * 1024 * 1024
_MAX_LISTED = 8


class CheckpointError(ValueError):
  """A checkpoint does not fit the model, or cannot be read; the message names the parameter."""


@dataclasses.dataclass(frozen=True)
class StoredArray:
  """One stored parameter, read lazily in t5x orientation.

  Attributes:
    shape: shape as stored (after any transpose into t5x orientation).
    read: returns `array[index]` for a tuple of slices, as numpy.
    origin: where it lives (file, array directory or tensor name), for error messages.
  """
  shape: tuple[int, ...]
  read: Callable[[Index], np.ndarray]
  origin: str


# ----------------------------------------------------------------------------- expected tree


def abstract_params(config: T5Config) -> tuple[dict[str, jax.ShapeDtypeStruct], Any]:
  """The parameters `Transformer(config)` expects, without allocating them.

  Returns:
    (flat {path: ShapeDtypeStruct} with "/"-joined paths, boxed tree with logical axis names).
  """
  flat, boxed = _abstract_params(config)
  return dict(flat), boxed


@functools.lru_cache(maxsize=16)
def _abstract_params(config: T5Config) -> tuple[dict[str, jax.ShapeDtypeStruct], Any]:
  tokens = jnp.ones((1, 1), jnp.int32)
  init = lambda: Transformer(config).init(jax.random.PRNGKey(0), tokens, tokens, tokens,
                                          enable_dropout=False)
  boxed = jax.eval_shape(init)["params"]
  return traverse_util.flatten_dict(nn.unbox(boxed), sep="/"), boxed


def _target_shardings(boxed: Any, mesh: Optional[Mesh], rules) -> dict[str, Sharding]:
  if mesh is None:
    device = SingleDeviceSharding(jax.local_devices()[0])
    return {p: device for p in traverse_util.flatten_dict(nn.unbox(boxed), sep="/")}
  rules = partitioning.DEFAULT_RULES if rules is None else rules
  return traverse_util.flatten_dict(partitioning.param_shardings(boxed, mesh, rules), sep="/")


def _check_divisible(path: str, shape: Sequence[int], sharding: Sharding) -> None:
  if not isinstance(sharding, NamedSharding):
    return
  for dim, (size, axes) in enumerate(zip(shape, sharding.spec)):
    axes = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
    parts = math.prod(sharding.mesh.shape[a] for a in axes)
    if size % parts:
      raise ValueError(f"{path} {list(shape)}: axis {dim} of size {size} cannot be split over mesh "
                       f"axes {axes} ({parts} devices); use a mesh whose axis sizes divide it or "
                       "override its logical axis rule")


def _allowed(path: str, prefixes: Sequence[str]) -> bool:
  return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def check_fit(stored: Mapping[str, StoredArray], expected: Mapping[str, Sequence[int]],
              allow_missing: Sequence[str], source: str) -> None:
  """Raises `CheckpointError` unless `stored` has exactly the `expected` paths and shapes.

  Paths under an `allow_missing` prefix may be absent, and stored ones there are ignored.
  """
  problems = []
  for p in sorted(set(stored) & set(expected)):
    if tuple(stored[p].shape) != tuple(expected[p]):
      problems.append(f"{p}: expected shape {list(expected[p])}, found {list(stored[p].shape)}")
  problems += [f"missing {p} {list(expected[p])}" for p in sorted(set(expected) - set(stored))
               if not _allowed(p, allow_missing)]
  problems += [f"unexpected {p} {list(stored[p].shape)} ({stored[p].origin})"
               for p in sorted(set(stored) - set(expected)) if not _allowed(p, allow_missing)]
  if problems:
    more = f"; ... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
    count = f"{len(problems)} problems" if len(problems) > 1 else "1 problem"
    raise CheckpointError(f"checkpoint {source} does not fit the model config ({count}): "
                          f"{'; '.join(problems[:_MAX_LISTED])}{more}")


def _place(path: str, stored: StoredArray, sharding: Sharding, dtype: np.dtype) -> jax.Array:
  """Builds the global array shard by shard from `stored`, each shard read on its own."""

  def read(index: Index) -> np.ndarray:
    try:
      return np.asarray(stored.read(index)).astype(dtype)
    except CheckpointError:
      raise
    except Exception as e:  # tensorstore/safetensors raise assorted types for damaged files
      raise CheckpointError(f"cannot read {path} from {stored.origin}: {_brief(e)}") from e

  return jax.make_array_from_callback(tuple(stored.shape), sharding, read)


def _brief(error: Exception) -> str:
  """The first line of an error, without tensorstore's long spec dump."""
  text = str(error).strip()
  first = text.splitlines()[0] if text else type(error).__name__
  return first.split(" [tensorstore_spec=")[0]


# ----------------------------------------------------------------------------- public API


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
    dtype: dtype of the returned arrays (default float32).

  Returns:
    The parameter tree (plain nested dicts of jax Arrays), without any `prompt` subtree.

  Raises:
    CheckpointError: a missing, unexpected or mis-shaped parameter, a mismatched HF
      config.json, or an unreadable array file; the message names the parameter.
  """
  dtype = np.dtype(jnp.float32 if dtype is None else dtype)
  expected, boxed = abstract_params(config)
  shardings = _target_shardings(boxed, mesh, rules)
  fmt, where = detect_format(path)
  if fmt == "orbax":
    return _load_orbax(where, expected, shardings, allow_missing, dtype)
  stored = _checked_arrays(fmt, where, config, expected, allow_missing)
  for p in stored:
    _check_divisible(p, expected[p].shape, shardings[p])
  flat = {p: _place(p, s, shardings[p], dtype) for p, s in stored.items()}
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
  stored = _t5x_arrays(where) if fmt == "t5x" else _hf_arrays(where, config)
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
    stored = _orbax_shapes(where)[1]
    check_fit({name: stored[name]} if name in stored else {}, {name: want}, (), where)
    params = _load_orbax(where, {name: jax.ShapeDtypeStruct(want, jnp.float32)}, sharding,
                         (), np.dtype(np.float32), strict=False)
    return np.asarray(params["token_embedder"]["embedding"])
  stored = _t5x_arrays(where) if fmt == "t5x" else _hf_arrays(where, config)
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
    if _gcs_exists(path, "checkpoint") and not any(_gcs_exists(path, m) for m in _ORBAX_MARKERS[:2]):
      return "t5x", path + "/checkpoint"
    if any(_gcs_exists(path, m) for m in _ORBAX_MARKERS):
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


# ----------------------------------------------------------------------------- T5X legacy


def _is_ts_spec(leaf: Any) -> bool:
  return isinstance(leaf, dict) and "driver" in leaf and ("kvstore" in leaf or "path" in leaf)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  if not isinstance(tree, dict) or _is_ts_spec(tree):
    return {prefix: tree}
  out = {}
  for k, v in tree.items():
    out.update(_flatten(v, f"{prefix}/{k}" if prefix else str(k)))
  return out


def _t5x_arrays(ckpt_file: str) -> dict[str, StoredArray]:
  """The parameters (the `target` tree) of a legacy T5X checkpoint file, unread."""
  try:
    contents = serialization.msgpack_restore(_read_bytes(ckpt_file))
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
    spec["kvstore"] = {"driver": "gcs", "bucket": bucket, "path": f"{prefix}/{relative}".lstrip("/")}
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


def _read_bytes(path: str) -> bytes:
  if path.startswith("gs://"):
    directory, _, key = path.rpartition("/")
    result = _gcs_store(directory).read(key).result()
    if result.state != "value":
      raise CheckpointError(f"{path} does not exist")
    return bytes(result.value)
  with open(path, "rb") as f:
    return f.read()


def _gcs_store(directory: str) -> ts.KvStore:
  bucket, _, prefix = directory[len("gs://"):].partition("/")
  return ts.KvStore.open({"driver": "gcs", "bucket": bucket,
                          "path": prefix.rstrip("/") + "/" if prefix else ""}).result()


def _gcs_exists(directory: str, key: str) -> bool:
  return _gcs_store(directory).read(key).result().state == "value"


# ----------------------------------------------------------------------------- orbax


def _orbax_shapes(directory: str) -> tuple[tuple[str, ...], dict[str, StoredArray]]:
  """(prefix of the params subtree, {path: shape-only StoredArray}) from orbax metadata."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  try:
    meta = ocp.PyTreeCheckpointer().metadata(directory)
  except Exception as e:
    raise CheckpointError(f"cannot read orbax metadata of {directory}: {e}") from e
  tree = getattr(getattr(meta, "item_metadata", meta), "tree", getattr(meta, "item_metadata", meta))
  if isinstance(tree.get("optimizer"), dict) and "target" in tree["optimizer"]:
    prefix = ("optimizer", "target")
  elif isinstance(tree.get("target"), dict):
    prefix = ("target",)
  elif list(tree) == ["params"] and isinstance(tree["params"], dict):  # a flax variables dict
    prefix = ("params",)
  else:
    prefix = ()
  for key in prefix:
    tree = tree[key]

  def restored_by_orbax(index: Index) -> np.ndarray:
    raise NotImplementedError(f"arrays of the orbax checkpoint {directory} are read by orbax")
  stored = {p: StoredArray(tuple(getattr(m, "shape", ())), restored_by_orbax, f"{directory} (orbax)")
            for p, m in traverse_util.flatten_dict(tree, sep="/").items()}
  return prefix, stored


def _load_orbax(directory: str, expected: Mapping[str, jax.ShapeDtypeStruct],
                shardings: Mapping[str, Sharding], allow_missing: Sequence[str], dtype: np.dtype,
                strict: bool = True) -> Params:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  prefix, stored = _orbax_shapes(directory)
  if strict:
    check_fit(stored, {p: s.shape for p, s in expected.items()}, allow_missing, directory)
  wanted = {p: s for p, s in expected.items() if p in stored}
  for p, s in wanted.items():
    _check_divisible(p, s.shape, shardings[p])
  item = traverse_util.unflatten_dict(
      {p: jax.ShapeDtypeStruct(s.shape, dtype, sharding=shardings[p]) for p, s in wanted.items()},
      sep="/")
  args = jax.tree.map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, dtype=x.dtype,
                                                     global_shape=x.shape), item)
  for key in reversed(prefix):
    item, args = {key: item}, {key: args}
  try:
    restored = ocp.PyTreeCheckpointer().restore(
        directory, args=ocp.args.PyTreeRestore(item=item, restore_args=args, partial_restore=True))
  except Exception as e:
    raise CheckpointError(f"orbax restore of {directory} failed: {_brief(e)}") from e
  for key in prefix:
    restored = restored[key]
  return traverse_util.unflatten_dict(traverse_util.flatten_dict(restored, sep="/"), sep="/")


# ----------------------------------------------------------------------------- Hugging Face


def _hf_arrays(directory: str, config: T5Config) -> dict[str, StoredArray]:
  """The tensors of a HF directory under t5x paths; names with no place stay as HF names."""
  from spot_jax.t5 import hf  # pylint: disable=g-import-not-at-top
  config_file = os.path.join(directory, "config.json")
  try:
    with open(config_file, encoding="utf-8") as f:
      hf_config = json.load(f)
    mismatches = hf.config_mismatches(hf_config, config)
  except (OSError, ValueError) as e:
    raise CheckpointError(f"cannot use {config_file}: {e}") from e
  if mismatches:
    raise CheckpointError(f"{config_file} does not match the model config: {'; '.join(mismatches)}")
  try:
    tensors = hf.open_tensors(directory)
  except (OSError, ValueError) as e:
    raise CheckpointError(f"cannot open the weights in {directory}: {e}") from e
  groups: dict[str, list[tuple[hf.HFTensor, bool]]] = {}
  stored: dict[str, StoredArray] = {}
  for name, tensor in tensors.items():
    if name in hf.IGNORED_HF_NAMES:
      continue
    placed = hf.t5x_name(name, tied=config.logits_via_embedding)
    if placed is None:
      stored[name] = StoredArray(tensor.shape, tensor.read, f"{tensor.file}, no t5x counterpart")
    else:
      groups.setdefault(placed[0], []).append((tensor, placed[1]))
  for path, members in groups.items():
    members.sort(key=lambda m: m[0].name != "shared.weight")
    head, transpose = members[0]
    for alias, _ in members[1:]:
      _check_same(head, alias, path)
    stored[path] = _hf_stored(head, transpose)
  return stored


def _hf_stored(tensor, transpose: bool) -> StoredArray:
  origin = f"{tensor.name} in {tensor.file}"
  if not transpose:
    return StoredArray(tensor.shape, tensor.read, origin)
  if len(tensor.shape) != 2:
    raise CheckpointError(f"{origin} has shape {list(tensor.shape)}; a 2-D weight was expected")
  return StoredArray(tensor.shape[::-1], lambda idx: np.asarray(tensor.read(idx[::-1])).T, origin)


def _check_same(a, b, path: str, rows: int = 8192) -> None:
  """HF may store tied copies of one weight; they must agree (compared a block of rows at a time)."""
  if tuple(a.shape) != tuple(b.shape):
    raise CheckpointError(f"{b.name} {list(b.shape)} and {a.name} {list(a.shape)} both map to "
                          f"{path} but differ in shape")
  for start in range(0, a.shape[0], rows):
    idx = (slice(start, min(start + rows, a.shape[0])),) + (slice(None),) * (len(a.shape) - 1)
    if not np.array_equal(np.asarray(a.read(idx)), np.asarray(b.read(idx))):
      hint = (" (the config ties the output layer to the embedding, but this checkpoint has its "
              "own lm_head: use logits_via_embedding=False)") if b.name == "lm_head.weight" else ""
      raise CheckpointError(f"{b.name} differs from {a.name}, yet both map to {path}{hint}")


# ----------------------------------------------------------------------------- saving


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
    FileExistsError: `path` exists and `overwrite` is False.
    ValueError: for an unknown format, a gs:// path or a tree that is not a parameter tree.
  """
  if format not in ("t5x", "orbax"):
    raise ValueError(f"format must be 't5x' or 'orbax', got {format!r}")
  path = str(path).rstrip("/")
  if path.startswith("gs://"):
    raise ValueError(f"save_checkpoint writes local directories, got {path}; copy it to GCS afterwards")
  flat = traverse_util.flatten_dict(nn.unbox(dict(params)), sep="/")
  if not flat or list(params) == ["params"]:
    raise ValueError("params must be the parameter tree itself (e.g. variables['params']), got "
                     f"top-level keys {sorted(params)}")
  if os.path.exists(path) and not overwrite:
    raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
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
  store = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": os.path.join(directory, name)},
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
