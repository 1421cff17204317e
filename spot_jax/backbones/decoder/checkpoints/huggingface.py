"""Hugging Face model directories: `config.json` plus safetensors, one file or sharded.

A directory holds `model.safetensors`, or `model.safetensors.index.json` whose `weight_map`
names each tensor's shard (what `save_pretrained` writes, and what
`AutoModelForCausalLM.from_pretrained` reads). Tensors are read one at a time, through
safetensors' numpy path (bfloat16 through ml_dtypes), each converted and placed before the
next is read; the names and orientation
are `spot_jax.backbones.decoder.hf`'s, which checks them strictly.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterator, Mapping, Optional

import numpy as np

from spot_jax import fileio, validate
from spot_jax.backbones.decoder.checkpoints.common import CheckpointError, Params
from spot_jax.errors import ConfigError

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
DEFAULT_SHARD_SIZE = 5_000_000_000  # bytes: save_pretrained's "5GB"
_VALID = (f"a Hugging Face model directory ({CONFIG} with {SINGLE}, or {CONFIG} with {INDEX} "
          "and its shards)")


class SafetensorsState(Mapping[str, np.ndarray]):
  """{tensor name: array in its stored dtype} over safetensors files, each tensor read when
  asked for (bfloat16 as ml_dtypes' numpy bfloat16); `shape(name)` reads only the header.

  Attributes:
    files: {tensor name: the file holding it}.
  """

  def __init__(self, files: Mapping[str, str]):
    self.files = dict(files)

  def _read(self, name: str, what: Callable[[Any], Any]) -> Any:
    import ml_dtypes  # pylint: disable=g-import-not-at-top,unused-import  (numpy's bfloat16)
    from safetensors import safe_open  # pylint: disable=g-import-not-at-top
    path = self.files[name]
    try:
      with safe_open(path, framework="numpy") as f:
        return what(f)
    except Exception as e:  # pylint: disable=broad-except  (safetensors raises assorted types)
      raise CheckpointError(f"cannot read {name} from {path} ({str(e).splitlines()[0]}); the "
                            "file is damaged: download or copy it again") from None

  def __getitem__(self, name: str) -> np.ndarray:
    return self._read(name, lambda f: np.asarray(f.get_tensor(name)))

  def shape(self, name: str) -> tuple[int, ...]:
    """The tensor's shape, from the file's header."""
    return tuple(self._read(name, lambda f: f.get_slice(name).get_shape()))

  def __iter__(self) -> Iterator[str]:
    return iter(self.files)

  def __len__(self) -> int:
    return len(self.files)


def _names_in(path: str) -> list[str]:
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  try:
    with safe_open(path, framework="numpy") as f:
      return list(f.keys())
  except Exception as e:  # pylint: disable=broad-except
    raise CheckpointError(f"{path} is not a readable safetensors file "
                          f"({str(e).splitlines()[0]}); download or copy it again") from None


def open_state(directory: str) -> SafetensorsState:
  """The tensors of an HF directory, checked against its index, not yet read.

  Raises:
    CheckpointError: no safetensors weights, a shard the index lists that is missing, a
      tensor the index places in a shard that does not hold it, or a tensor stored twice.
  """
  single, index = os.path.join(directory, SINGLE), os.path.join(directory, INDEX)
  if os.path.isfile(single):
    return SafetensorsState({name: single for name in _names_in(single)})
  if not os.path.isfile(index):
    held = sorted(n for n in os.listdir(directory) if n.endswith((".bin", ".pt", ".h5", ".msgpack"))
                  or n.endswith(".safetensors"))
    hint = f" (it holds {', '.join(held[:3])})" if held else ""
    raise CheckpointError(f"{directory} has no {SINGLE} or {INDEX}{hint}; give {_VALID}, e.g. "
                          "re-saved with save_pretrained(path, safe_serialization=True)")
  weight_map = fileio.read_json(index, "the safetensors index").get("weight_map")
  if not isinstance(weight_map, dict) or not weight_map:
    raise CheckpointError(f"{index} has no weight_map; give the index save_pretrained wrote")
  files: dict[str, str] = {}
  for shard in sorted(set(weight_map.values())):
    listed = sorted(n for n, s in weight_map.items() if s == shard)
    path = os.path.join(directory, shard)
    if not os.path.isfile(path):
      raise CheckpointError(f"the shard {shard} is missing from {directory} ({INDEX} lists it for "
                            f"{len(listed)} tensors, e.g. {listed[0]}); copy every shard the "
                            "index names")
    held = _names_in(path)
    absent = sorted(set(listed) - set(held))
    if absent:
      raise CheckpointError(f"{absent[0]} is not in {path}, where {INDEX} places it; copy the "
                            "checkpoint again")
    for name in held:
      if name in files:
        raise CheckpointError(f"{name} is stored twice, in {files[name]} and {path}; keep one")
      files[name] = path
  return SafetensorsState(files)


def read_hf_config(directory: str) -> dict[str, Any]:
  """The `config.json` of an HF directory.

  Raises:
    CheckpointError: `directory` is not a directory or has no config.json, named with what
      would be valid.
  """
  if not os.path.isdir(directory):
    raise CheckpointError(f"{directory} is not a directory; give {_VALID}")
  path = os.path.join(directory, CONFIG)
  if not os.path.isfile(path):
    raise CheckpointError(f"{directory} has no {CONFIG}; give {_VALID}")
  data = fileio.read_json(path, "the Hugging Face config")
  if not isinstance(data, dict):
    raise CheckpointError(f"{path} is not a JSON object; give the config.json of a model")
  return data


def load_hf_config(directory: str) -> Any:
  """The DecoderConfig of an HF directory's config.json (nothing else is read).

  Raises:
    CheckpointError: no config.json, or one this backbone cannot run; one line.
  """
  from spot_jax.backbones.decoder import hf  # pylint: disable=g-import-not-at-top
  directory = os.fspath(directory)
  try:
    return hf.config_from_hf(read_hf_config(directory))
  except CheckpointError:
    raise
  except ConfigError as e:
    raise CheckpointError(f"{os.path.join(directory, CONFIG)}: {e}") from None


def load_hf_dir(path: str, place: Optional[Callable[[str, np.ndarray], Any]] = None
                ) -> tuple[Any, Params]:
  """The config and parameters of a Hugging Face model directory, read tensor by tensor.

  Args:
    path: a directory with config.json and model.safetensors, or model.safetensors.index.json
      and its shards (Llama, Gemma 2, Gemma 3 text models).
    place: called on each tensor as it is read (see `hf.params_from_hf`); None: float32 numpy.

  Returns:
    (DecoderConfig, our parameter tree).

  Raises:
    CheckpointError: one line naming a missing, extra or mis-shaped tensor, a missing shard,
      a missing config.json or a config this backbone cannot run.
  """
  from spot_jax.backbones.decoder import hf  # pylint: disable=g-import-not-at-top
  directory = os.fspath(path)
  config = load_hf_config(directory)
  state = open_state(directory)
  try:
    params = hf.params_from_hf(state, config, place)
  except CheckpointError:
    raise
  except ConfigError as e:  # the weights do not fit their own config.json
    raise CheckpointError(f"{directory}: {e}; copy the checkpoint again, with its own "
                          f"{CONFIG}") from None
  return config, params


def _shards(arrays: Mapping[str, np.ndarray], shard_size: int) -> list[dict[str, np.ndarray]]:
  """Tensors in their order, a new shard when the next would pass `shard_size` bytes (a tensor
  larger than that gets a shard of its own, as save_pretrained does)."""
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, array in arrays.items():
    if shards[-1] and size + array.nbytes > shard_size:
      shards.append({})
      size = 0
    shards[-1][name] = array
    size += array.nbytes
  return shards


def save_hf_dir(path: str, config: Any, params: Params, *,
                shard_size: int = DEFAULT_SHARD_SIZE, overwrite: bool = False,
                dtype: str = "float32") -> str:
  """Writes a directory `AutoModelForCausalLM.from_pretrained(path)` loads.

  Args:
    path: the directory to create; written beside it and renamed into place.
    config: the DecoderConfig of `params`.
    params: our parameter tree.
    shard_size: the most bytes in one safetensors file; above that the tensors are sharded
      with a model.safetensors.index.json.
    overwrite: replace an existing `path`.
    dtype: the stored dtype, "float32" or "bfloat16" (recorded as config.json's `dtype`).

  Returns:
    `path`.

  Raises:
    CheckpointError: `path` exists and `overwrite` is False.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.decoder import hf  # pylint: disable=g-import-not-at-top
  shard_size = validate.positive_int(shard_size, "shard_size", example=DEFAULT_SHARD_SIZE)
  path = os.path.abspath(os.fspath(path))
  if os.path.exists(path) and not overwrite:
    raise CheckpointError(f"{path} exists; pass overwrite=True to replace it, or another path")
  import ml_dtypes  # pylint: disable=g-import-not-at-top  (numpy's bfloat16)
  stored = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[
      validate.one_of(dtype, "dtype", ("float32", "bfloat16"))]
  arrays = {n: np.ascontiguousarray(a.astype(stored)) for n, a in
            hf.params_to_hf(params, config).items()}
  shards = _shards(arrays, shard_size)
  with fileio.staged_directory(path) as fresh:
    os.makedirs(fresh)
    with open(os.path.join(fresh, CONFIG), "w", encoding="utf-8") as f:
      json.dump(dict(hf.config_to_hf(config), dtype=dtype), f, indent=2, sort_keys=True)
    names = ([SINGLE] if len(shards) == 1 else
             [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)])
    for name, shard in zip(names, shards):
      # transformers refuses safetensors files whose metadata names no framework
      save_file(shard, os.path.join(fresh, name), metadata={"format": "pt"})
    if len(shards) > 1:
      index = {"metadata": {"total_size": sum(a.nbytes for a in arrays.values())},
               "weight_map": {t: name for name, shard in zip(names, shards) for t in shard}}
      with open(os.path.join(fresh, INDEX), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2, sort_keys=True)
  return path
