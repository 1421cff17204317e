"""Weight-only quantization of a frozen backbone with qwix (int8, int4, nf4).

A config's `quantization` ("none", "int8", "int4", "nf4") and `quantization_tile` (None:
one scale per output channel; n: sub-channel, one scale per n entries of the contracted axis)
say how its frozen matmul kernels are held. The tree is quantized once, after loading:

  quantize(params, boxed, config)   float tree -> the same tree with each matmul kernel a
                                    `qwix.QArray` (int values + float scales)
  abstract(boxed, config)           the quantized tree as ShapeDtypeStructs (nothing allocated:
                                    what a memory planner compiles against)
  shardings(boxed, config, mesh, rules)   its NamedShardings (scales follow their kernel)

What is quantized: every matmul kernel ("kernel" leaves: attention q/k/v/o, MLP, an untied
output layer). Embedding tables stay float (prompt initialisers read them; a tied output layer
shares them), as do norms, biases and relative-position tables. Activations stay float: the
layers' `einsum`/`dot` hand a quantized kernel to qwix, which dequantizes it into the matmul,
so gradients reach the prompt through the dequantized weights (and none reaches the kernel:
the backward pass dequantizes it again, one layer at a time).

A kernel either reads the embedding (its first axis is "embed" or an MLP/attention input:
it contracts axis 0) or writes it (its last axis is "embed": it contracts all the others); the
scales run along the axes it keeps.
"""
from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from jax.sharding import NamedSharding, PartitionSpec

from spot_jax import partitioning
from spot_jax.backbones import memory
from spot_jax import validate
from spot_jax.errors import ConfigError

QUANTIZATIONS = ("none", "int8", "int4", "nf4")
PIP = "pip install 'spot-jax[quant]'"
_QTYPES = {"int8": jnp.int8, "int4": jnp.int4, "nf4": "nf4"}


def check(kind: Any, tile: Any, name: str) -> None:
  """Refuses an unknown quantization type or a tile that is not a positive integer."""
  validate.one_of(kind, name + "quantization", QUANTIZATIONS)
  if tile is not None:
    validate.positive_int(tile, name + "quantization_tile")


def qwix() -> Any:
  """The qwix module, or a one-line ConfigError naming the pip command."""
  try:
    return importlib.import_module("qwix")
  except ImportError:
    raise ConfigError(f"QUANTIZATION needs qwix, which is not installed; {PIP}") from None


def enabled(config: Any) -> bool:
  return getattr(config, "quantization", "none") != "none"


def is_quantized(x: Any) -> bool:
  """True for a qwix QArray (qwix is never imported here: without it nothing is quantized)."""
  module = sys.modules.get("qwix")
  return module is not None and isinstance(x, module.QArray)


def einsum(spec: str, x: jax.Array, kernel: Any, dtype: Any, *, detach: bool = False
           ) -> jax.Array:
  """jnp.einsum(spec, x, kernel) in `dtype`; a quantized kernel goes through qwix's einsum.

  The kernel is tied to `x`, so that it is converted (`memory.weight_as`, whose `detach` this
  passes on) or dequantized (`_frozen`: no gradient through it either way) for this use only.
  """
  if is_quantized(kernel):
    return _frozen(lambda x, k: qwix().einsum(spec, x.astype(dtype), k.astype(dtype)), x, kernel)
  return jnp.einsum(spec, x, memory.weight_as(kernel, dtype, x, detach=detach))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _frozen(matmul: Any, x: jax.Array, kernel: Any) -> jax.Array:
  """`matmul(x, kernel)`, linear in x, of a frozen quantized kernel (no gradient reaches it).

  Each pass dequantizes the kernel only once its input is there: the forward pass once `x` is,
  the backward pass once the output's cotangent is. Otherwise XLA may dequantize every layer's
  kernel at once (the backward pass's as soon as it starts), more bytes than the float
  network's weights.
  """
  return matmul(x, memory.tied(kernel, x, True, integers=True))


def _frozen_fwd(matmul: Any, x: jax.Array, kernel: Any) -> tuple[jax.Array, tuple]:
  return _frozen(matmul, x, kernel), (x, kernel)


def _frozen_bwd(matmul: Any, saved: tuple, grad: jax.Array) -> tuple[jax.Array, Any]:
  x, kernel = saved
  kernel = memory.tied(kernel, grad, True, integers=True)
  _, pull = jax.vjp(lambda x: matmul(x, kernel), x)
  none = lambda a: (np.zeros(a.shape, jax.dtypes.float0)  # noqa: E731
                    if jnp.issubdtype(a.dtype, jnp.integer) else jnp.zeros_like(a))
  return pull(grad)[0], jax.tree.map(none, kernel)


_frozen.defvjp(_frozen_fwd, _frozen_bwd)


def dot(x: jax.Array, kernel: Any, dtype: Any) -> jax.Array:
  """x [..., in] @ kernel [in, out] in `dtype`; a quantized kernel goes through qwix's dot."""
  if is_quantized(kernel):
    return _frozen(lambda x, k: qwix().dot(x.astype(dtype), k.astype(dtype)), x, kernel)
  return jnp.dot(x, memory.weight_as(jnp.asarray(kernel), dtype, x))


def param(module: nn.Module, name: str) -> Optional[Any]:
  """The module's stored quantized parameter `name`, or None (then create it as usual)."""
  if module.has_variable("params", name):
    value = module.get_variable("params", name)
    if is_quantized(value):
      return value
  return None


def _axes(boxed: Any) -> dict[tuple, tuple]:
  """{path: logical axis names} of a boxed tree's leaves."""
  flat = traverse_util.flatten_dict(
      jax.tree.map(lambda b: tuple(b.names), boxed,
                   is_leaf=lambda b: isinstance(b, nn.LogicallyPartitioned)))
  return flat


def _contracted(names: tuple) -> tuple[int, ...]:
  if len(names) > 2 and names[-1] == "embed":
    return tuple(range(len(names) - 1))
  return (0,)


def _how(path: tuple, names: tuple, config: Any) -> Optional[dict]:
  """qwix.quantize's arguments for the leaf at `path`, or None (kept float)."""
  if path[-1] != "kernel" or len(names) < 2:
    return None
  contracted = _contracted(names)
  tiled = {contracted[-1]: config.quantization_tile} if config.quantization_tile else None
  return {"qtype": _QTYPES[config.quantization],
          "channelwise_axes": tuple(i for i in range(len(names)) if i not in contracted),
          "tiled_axes": tiled}


def _check_tile(path: tuple, shape: tuple, how: dict) -> None:
  for axis, tile in (how["tiled_axes"] or {}).items():
    if shape[axis] % tile:
      raise ConfigError(f"QUANTIZATION_TILE={tile} does not divide {'/'.join(path)}'s contracted "
                        f"axis of {shape[axis]}; give a divisor of it, or None (per channel)")


def _quantizer(how: dict) -> Any:
  return lambda x: qwix().quantize(x, how["qtype"], channelwise_axes=how["channelwise_axes"],
                                   tiled_axes=how["tiled_axes"])


def quantize(params: Any, boxed: Any, config: Any, *, mesh: Any = None, rules: Any = None) -> Any:
  """`params` (an unboxed float tree of `boxed`'s structure) with its kernels quantized.

  Each kernel is quantized by itself (on its sharding when `mesh` is given) and its float
  array released, so the peak is the float tree plus one kernel's quantized copy.
  """
  if not enabled(config):
    return params
  qwix()
  axes = _axes(boxed)
  placed = shardings(boxed, config, mesh, rules) if mesh is not None else None
  placed = traverse_util.flatten_dict(placed) if placed else {}
  flat = traverse_util.flatten_dict(params)
  for path in list(flat):
    how = _how(path, axes.get(path, ()), config)
    if how is None:
      continue
    _check_tile(path, flat[path].shape, how)
    fn = jax.jit(_quantizer(how), out_shardings=placed.get(path))
    flat[path] = fn(flat.pop(path))
  return traverse_util.unflatten_dict(flat)


def abstract(boxed: Any, config: Any) -> Any:
  """The quantized frozen tree of `boxed` (a boxed tree of ShapeDtypeStructs, e.g. from
  `jax.eval_shape(model.init_backbone, ...)`) as ShapeDtypeStructs: nothing is allocated."""
  unboxed = jax.tree.map(lambda b: b.unbox(apply_constraint=False), boxed,
                         is_leaf=lambda b: isinstance(b, nn.LogicallyPartitioned))
  return jax.eval_shape(lambda p: quantize(p, boxed, config), unboxed)


def _scale_spec(spec: PartitionSpec, shape: tuple, mesh: Any) -> PartitionSpec:
  """`spec` with the mesh axes dropped where a scale's axis does not divide over them."""
  out = []
  for i, entry in enumerate(tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
    size = 1
    for n in names:
      size *= mesh.shape[n]
    out.append(entry if size > 0 and shape[i] % size == 0 else None)
  return PartitionSpec(*out)


def shardings(boxed: Any, config: Any, mesh: Any, rules: Any) -> Any:
  """NamedShardings of the quantized tree: a kernel's values as the float kernel's, its scales
  likewise where their (shorter) axes divide over the mesh, else replicated there."""
  float_shardings = partitioning.param_shardings(boxed, mesh, rules)
  if not enabled(config):
    return float_shardings
  shapes = abstract(boxed, config)
  flat_s = traverse_util.flatten_dict(float_shardings)
  flat_a = traverse_util.flatten_dict(shapes)
  out = {}
  for path, shape in flat_a.items():
    sharding = flat_s[path]
    if is_quantized(shape):
      shape = jax.tree.map(
          lambda leaf, s=sharding: NamedSharding(
              mesh, _scale_spec(s.spec, leaf.shape, mesh)), shape)
      out[path] = shape
    else:
      out[path] = sharding
  return traverse_util.unflatten_dict(out)
