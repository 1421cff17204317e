"""The memory planner (`python -m spot_jax.plan`): does a training run fit, and what would.

It reads the trainer's own configuration (the gin bindings of `spot_jax.train.train`, without
calling it), builds the trainer's step for it and measures it per device from XLA's analysis of
the compiled step (`spot_jax.train.footprint`): nothing is read from a checkpoint and nothing is
allocated. With `device_memory`, a setting that does not fit is refused in one line naming the
nearest setting that does, found by compiling the alternatives in order of how much they change:

  FROZEN_DTYPE='bfloat16' (1), REMAT='full' (1), FSDP=True (1, several devices),
  QUANTIZATION='int8' (2) and 'int4' (3) where qwix is installed, halving BATCH_SIZE (3 each)

A setting is skipped without compiling when its frozen weights and state alone exceed the memory.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
from typing import Any, Callable, Optional, Sequence

import jax

from spot_jax import fileio
from spot_jax import models
from spot_jax import partitioning
from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.train import footprint as footprint_lib
from spot_jax.train import optimizers
from spot_jax.train.footprint import GIB, Footprint

MAX_COMPILES = 8  # alternatives compiled at most when looking for one that fits
ROWS = (("frozen weights", "frozen"), ("prompt + optimizer state", "trainable"),
        ("batch", "batch"), ("activations and temporaries", "temporaries"), ("total", "total"))


FLOAT_FORMATS = ("float32", "bfloat16")  # FROZEN_DTYPE
QUANTIZED_FORMATS = ("int8", "int4")  # QUANTIZATION (of bfloat16 weights), with qwix
_NEAR = {"float32": 0, "bfloat16": 1, "int8": 2, "int4": 3, "nf4": 3}  # cost from float32


def weight_formats() -> tuple[str, ...]:
  """The frozen weights' formats the planner tries: float32, bfloat16, and int8 / int4 where
  qwix (the quantization extra) is installed."""
  if importlib.util.find_spec("qwix") is None:
    return FLOAT_FORMATS
  return FLOAT_FORMATS + QUANTIZED_FORMATS


@dataclasses.dataclass(frozen=True)
class Setting:
  """What the planner varies, as the gin settings that name it.

  Attributes:
    weights: the frozen weights' dtype: "float32" or "bfloat16" (FROZEN_DTYPE).
    remat: REMAT, per-layer rematerialisation ("none", "full", ...).
    fsdp: FSDP, the frozen weights sharded over the data axis too.
    batch_size: BATCH_SIZE, the global batch.
    quantization: QUANTIZATION of the frozen matmul kernels ("none", "int8", "int4", "nf4").
  """
  weights: str
  remat: str
  fsdp: bool
  batch_size: int
  quantization: str = "none"

  @classmethod
  def of_format(cls, weight_format: str, remat: str, fsdp: bool, batch_size: int) -> "Setting":
    """The setting of a weight format of `weight_formats()`: a quantized one is bfloat16
    weights whose matmul kernels are quantized."""
    if weight_format in FLOAT_FORMATS:
      return cls(weight_format, remat, fsdp, batch_size)
    return cls("bfloat16", remat, fsdp, batch_size, quantization=weight_format)

  @property
  def weight_format(self) -> str:
    """The quantization when there is one, else the weights' dtype."""
    return self.weights if self.quantization == "none" else self.quantization

  def gin(self) -> dict[str, Any]:
    """{macro: value} of the gin settings this setting stands for."""
    return {"FROZEN_DTYPE": self.weights, "QUANTIZATION": self.quantization,
            "REMAT": self.remat, "FSDP": self.fsdp, "BATCH_SIZE": self.batch_size}

  def overrides(self, base: Optional["Setting"] = None) -> str:
    """The --gin overrides of this setting (those that differ from `base`, when given)."""
    old = base.gin() if base is not None else {}
    return " ".join(f"--gin.{macro}=" + (f"\"'{value}'\"" if isinstance(value, str)
                                          else str(value))
                    for macro, value in self.gin().items()
                    if macro not in old or old[macro] != value)

  def cost(self, base: "Setting") -> int:
    """How much this setting changes `base`: 1 per step of weight precision (bfloat16 1, int8
    2, int4 and nf4 3 from float32), 1 for remat, 1 for FSDP, 3 per halving of the batch."""
    return (abs(_NEAR.get(self.weight_format, 3) - _NEAR.get(base.weight_format, 3))
            + (self.remat != base.remat) + (self.fsdp != base.fsdp)
            + 3 * ((base.batch_size // self.batch_size).bit_length() - 1))


def setting_of(model: models.Model, fsdp: bool, batch_size: int) -> Setting:
  """The setting a model and the trainer's FSDP and BATCH_SIZE stand for."""
  config = model.config
  return Setting(weights=str(getattr(config, "param_dtype", None) or "float32"),
                 remat=str(getattr(config, "remat_policy", "none")), fsdp=bool(fsdp),
                 batch_size=int(batch_size),
                 quantization=str(getattr(config, "quantization", "none")))


def apply(model: models.Model, setting: Setting) -> models.Model:
  """`model` with the setting's frozen dtype, quantization and remat policy in its config (the
  fields gin's FROZEN_DTYPE, QUANTIZATION and REMAT set)."""
  config = model.config
  changes = {}
  for field, value, plain in (("param_dtype", setting.weights, "float32"),
                              ("quantization", setting.quantization, "none"),
                              ("remat_policy", setting.remat, "none")):
    if hasattr(config, field):
      changes[field] = value
    elif value != plain:
      raise ConfigError(f"{setting.overrides()}: this model's config has no {field}")
  return dataclasses.replace(model, module=model.module.clone(config=config.replace(**changes)))


def alternatives(base: Setting, data_size: int, config: Any) -> list[tuple[int, Setting]]:
  """Every other setting with its cost (how much it changes), nearest first."""
  formats = [f for f in weight_formats()
             if hasattr(config, "param_dtype") and (f in FLOAT_FORMATS
                                                    or hasattr(config, "quantization"))]
  remats = ("none", "full") if hasattr(config, "remat_policy") else (base.remat,)
  fsdps = (False, True) if data_size > 1 else (base.fsdp,)
  batches = [b for b in (base.batch_size, base.batch_size // 2, base.batch_size // 4)
             if b >= data_size and b % data_size == 0]
  out = []
  for weight_format, remat, fsdp, batch in itertools.product(
      dict.fromkeys([base.weight_format] + formats), dict.fromkeys((base.remat,) + remats),
      dict.fromkeys((base.fsdp,) + fsdps), batches):
    setting = (dataclasses.replace(base, remat=remat, fsdp=fsdp, batch_size=batch)
               if weight_format == base.weight_format
               else Setting.of_format(weight_format, remat, fsdp, batch))
    if setting != base:
      out.append((setting.cost(base), setting))
  return sorted(out, key=lambda item: item[0])


@dataclasses.dataclass
class Planner:
  """Measures settings of one training configuration (the trainer's, read from gin).

  Attributes:
    model: the prompted model.
    tx: the optimizer.
    lengths: TASK_FEATURE_LENGTHS.
    mesh: the ("data", "model") mesh.
    shard_prompt_embed, dropout_rng: the trainer's settings of those names.
  """
  model: models.Model
  tx: Any
  lengths: dict
  mesh: jax.sharding.Mesh
  shard_prompt_embed: bool = False
  dropout_rng: str = "threefry"

  def measure(self, setting: Setting) -> Footprint:
    """The footprint of the trainer's step under `setting` (one ahead-of-time compile)."""
    return footprint_lib.measure(apply(self.model, setting), self.tx, self.lengths,
                                 setting.batch_size, self.mesh, fsdp=setting.fsdp,
                                 shard_prompt_embed=self.shard_prompt_embed,
                                 dropout_rng=self.dropout_rng)

  def weights(self, setting: Setting) -> int:
    """The frozen weights' bytes per device under `setting` (shapes only, no compile)."""
    model = apply(self.model, setting)
    rules = partitioning.frozen_rules(partitioning.logical_rules(self.shard_prompt_embed),
                                      setting.fsdp)
    dummy = model.dummy_batch(self.lengths["inputs"], self.lengths["targets"])
    return footprint_lib.shard_bytes(footprint_lib.abstract_frozen(model, dummy, self.mesh, rules))

  def nearest_fit(self, base: Setting, budget: int, trainable: int,
                  log: Callable[[str], None] = lambda _: None
                  ) -> tuple[Optional[Setting], Optional[Footprint]]:
    """The nearest setting whose total fits `budget` bytes, and its footprint (None, None when
    none of the `MAX_COMPILES` nearest settings that could fit does)."""
    compiled = 0
    for _, setting in alternatives(base, self.mesh.shape[partitioning.DATA], self.model.config):
      try:
        floor = self.weights(setting) + trainable
      except ConfigError:  # e.g. FSDP over a mesh that does not divide the weights
        continue
      if floor > budget:
        continue
      if compiled == MAX_COMPILES:
        break
      compiled += 1
      found = self.measure(setting)
      log(f"  tried {setting.overrides(base)}: {size(found.total)}")
      if found.total <= budget:
        return setting, found
    return None, None


def _print(line: str) -> None:
  print(line, flush=True)


def _write(path: Optional[str], result: dict[str, Any]) -> None:
  if path:
    fileio.atomic_write_bytes(path, json.dumps(result, indent=2).encode())


def size(nbytes: float) -> str:
  """Bytes as GiB (MiB below 0.1 GiB), e.g. "13.42 GiB", "27.0 MiB"."""
  if nbytes >= GIB / 10:
    return f"{nbytes / GIB:.2f} GiB"
  return f"{nbytes / (1 << 20):.1f} MiB"


def format_footprint(found: Footprint) -> list[str]:
  """The per-device lines of a footprint."""
  values = found.as_dict()
  lines = [f"  {label:<30}{size(values[key]):>12}" for label, key in ROWS]
  lines.append(f"  {'FLOPs per step':<30}{found.flops:>12.3e}")
  return lines


def check_single_run(trainable: str, seeds: Optional[Sequence[int]],
                     tasks: Optional[Sequence[str]]) -> None:
  """The planner plans one prompt-tuning run; other jobs are refused in one line."""
  if trainable != "prompt":
    raise ConfigError(f"TRAINABLE={trainable!r}: spot_jax.plan plans prompt training "
                      f"(TRAINABLE='prompt'), whose backbone is frozen")
  if seeds or tasks:
    raise ConfigError("spot_jax.plan plans one run; leave SEEDS and TASKS unset (K runs in one "
                      "step need about K times the activations)")


def plan_training(*, model: models.Model, train_dataset_cfg: Any, devices: int,
                  device_memory: Optional[str] = None, optimizer: Any = None,
                  num_partitions: int = 1, fsdp: bool = False,
                  shard_prompt_embed: bool = False, dropout_rng: str = "threefry",
                  trainable: str = "prompt", seeds: Optional[Sequence[int]] = None,
                  tasks: Optional[Sequence[str]] = None, json_path: Optional[str] = None,
                  out: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
  """Plans the trainer's step per device; refuses a setting that does not fit `device_memory`.

  Args:
    model, train_dataset_cfg, optimizer, num_partitions, fsdp, shard_prompt_embed,
      dropout_rng, trainable, seeds, tasks: the trainer's arguments of those names.
    devices: devices of the mesh (JAX's devices: the CPU's, split before JAX started).
    device_memory: the memory of one device, e.g. "24GiB" (None: no fit check).
    json_path: also write the result there (before a refusal is raised).
    out: where the report's lines go.

  Returns:
    {"setting": ..., "footprint": ..., "fits": bool or None, "nearest": setting or None}.

  Raises:
    ConfigError: bad settings, or a setting that does not fit (naming the nearest that does).
  """
  out = out or _print
  check_single_run(trainable, seeds, tasks)
  budget = None if device_memory is None else validate.byte_size(device_memory,
                                                                 "--device_memory")
  mesh = partitioning.create_mesh(num_partitions, jax.devices()[:devices])
  lengths = dict(train_dataset_cfg.task_feature_lengths)
  batch = train_dataset_cfg.batch_size
  if batch % mesh.shape[partitioning.DATA]:
    raise ConfigError(f"BATCH_SIZE={batch} must be divisible by the data-parallel mesh size "
                      f"{mesh.shape[partitioning.DATA]} ({devices} devices / {num_partitions} "
                      f"partitions)")
  planner = Planner(model, optimizer if optimizer is not None else optimizers.adafactor(),
                    lengths, mesh, shard_prompt_embed, dropout_rng)
  base = setting_of(model, fsdp, batch)
  found = planner.measure(base)
  grid = " x ".join(f"{k}={v}" for k, v in mesh.shape.items())
  out(f"per device, batch {batch} x ({lengths['inputs']} + {lengths['targets']}) tokens + "
      f"{model.prompt_length} prompt positions, {devices} device(s) ({grid}), "
      f"{jax.devices()[0].platform} compile:")
  out(f"  setting: {base.overrides()}")
  for line in format_footprint(found):
    out(line)
  result = {"setting": dataclasses.asdict(base), "footprint": found.as_dict(), "fits": None,
            "nearest": None}
  if budget is not None:
    result["fits"] = found.total <= budget
    out(f"fits {device_memory} per device: {'yes' if result['fits'] else 'no'}")
  if budget is None or result["fits"]:
    _write(json_path, result)
    return result
  setting, near = planner.nearest_fit(base, budget, found.trainable, out)
  result["nearest"] = None if setting is None else dataclasses.asdict(setting)
  _write(json_path, result)
  need = f"{size(found.total)} per device, more than --device_memory={device_memory}"
  if setting is None:
    raise ConfigError(f"the planned setting needs {need}, and none of the nearest settings "
                      f"fits; use more devices with --gin.FSDP=True, or a smaller BATCH_SIZE")
  raise ConfigError(f"the planned setting needs {need}; the nearest setting that fits: "
                    f"{setting.overrides(base)} ({size(near.total)} per device)")


def plan_serving(*, model: models.Model, devices: int, slots: int, max_length: int,
                 num_partitions: int = 1, fsdp: bool = False,
                 device_memory: Optional[str] = None, json_path: Optional[str] = None,
                 out: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
  """Serving memory per device: frozen weights + the key/value cache of `slots` x `max_length`
  (arithmetic from shapes, `footprint.serve_memory`)."""
  out = out or _print
  budget = None if device_memory is None else validate.byte_size(device_memory,
                                                                 "--device_memory")
  mesh = partitioning.create_mesh(num_partitions, jax.devices()[:devices])
  sizes = footprint_lib.serve_memory(model, mesh, slots, max_length, fsdp=fsdp)
  _write(json_path, sizes)
  out(f"serving per device, {slots} slots x {max_length} positions, {devices} device(s) "
      f"(arithmetic from shapes):")
  for label, key in (("frozen weights", "frozen"), ("key/value cache", "cache"),
                     ("total", "total")):
    out(f"  {label:<30}{size(sizes[key]):>12}")
  if budget is not None:
    if sizes["total"] > budget:
      raise ConfigError(f"serving needs {size(sizes['total'])} per device, more than "
                        f"--device_memory={device_memory}; give fewer --slots, a shorter "
                        f"--max_length or more devices with --gin.FSDP=True")
    out(f"fits {device_memory} per device: yes")
  return sizes
