"""How a frozen backbone spends memory: the dtype of its weights and the remat of its layers.

  FROZEN_DTYPES   "float32" | "bfloat16": the dtype the frozen parameters are stored in
                  (`param_dtype` of T5Config and DecoderConfig; None there: the checkpoint's,
                  see `spot_jax.backbones.kinds.stored_dtype`). Every use casts a weight to
                  the activation dtype, as transformers does for a bfloat16 model; the prompt,
                  its optimizer state and the loss stay float32.
  REMAT_POLICIES  what each layer keeps for the backward pass (`remat_policy`):
                    none       everything (fastest, most memory)
                    full       only the layer's inputs; the layer runs again in the backward pass
                    save_dots  the outputs of matmuls against weights
                                (`jax.checkpoint_policies.dots_with_no_batch_dims_saveable`)
                    offload    those outputs moved to host memory
                                (`offload_dot_with_no_batch_dims`); on a backend without a host
                                memory space it is refused in one line

`remat_call(block, policy, *arrays, static=..., **traced)` runs one flax layer under its policy;
`cast(tree, dtype)` casts the floating leaves of a parameter tree (arrays or ShapeDtypeStructs,
boxed or not).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import flax.linen as nn
from flax.core.scope import LazyRng
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError

Array = jax.Array

FROZEN_DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "save_dots", "offload")


def check_dtype(value: Optional[str], setting: str) -> Optional[str]:
  """`value` if it is None (the checkpoint's) or one of `FROZEN_DTYPES`, else a one-line error."""
  return None if value is None else validate.one_of(value, setting, FROZEN_DTYPES)


def check_remat(value: str, setting: str) -> str:
  """`value` if it is one of `REMAT_POLICIES`, else a one-line error."""
  return validate.one_of(value, setting, REMAT_POLICIES)


def frozen_dtype(param_dtype: Optional[str]) -> jnp.dtype:
  """The jnp dtype of frozen parameters stored as `param_dtype` (None: float32)."""
  return jnp.dtype(param_dtype or "float32")


def host_offload_supported() -> bool:
  """Whether the default backend has a pinned host memory space to offload activations to."""
  try:
    kinds = {m.kind for m in jax.local_devices()[0].addressable_memories()}
  except Exception:  # pylint: disable=broad-except  (a backend without memory spaces)
    return False
  return "pinned_host" in kinds


def policy(name: str) -> Optional[Callable[..., Any]]:
  """The `jax.checkpoint` policy of a REMAT setting (None for "full": save nothing).

  Raises:
    ConfigError: an unknown name, or "offload" on a backend without host memory.
  """
  check_remat(name, "REMAT")
  if name == "save_dots":
    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  if name == "offload":
    if not host_offload_supported():
      valid = ", ".join(p for p in REMAT_POLICIES if p != "offload")
      raise ConfigError(f"REMAT='offload' needs a pinned host memory space, which the "
                        f"{jax.default_backend()} backend lacks; valid here: {valid}")
    return jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")
  return None


def remat_call(block: nn.Module, policy_name: str, *arrays: Any,
               static: Optional[Mapping[str, Any]] = None, **traced: Any) -> Any:
  """`block(*arrays, **traced, **static)`, rematerialised under `policy_name` unless "none".

  `block` is a bound child layer whose constructor takes its `config` only; `arrays` and
  `traced` are pytrees of arrays (or None), traced; `static` holds the Python values the block
  branches on (flags). Under remat the layer runs as a pure function of its parameters and
  inputs through `checkpointed` (`nn.remat` alone saves almost nothing on XLA:CPU). Its
  "dropout" rng is handed over as the same lazy key (root key and module path) the bound layer
  holds, so every dropout mask is the one the layer draws without remat. Initialisation runs
  the layer as is.
  """
  static = dict(static or {})
  if policy_name == "none" or block.is_initializing():
    return block(*arrays, **traced, **static)
  fresh = type(block)(block.config, parent=None)
  lazy = block.scope.rngs.get("dropout")
  lazy = None if lazy is None else LazyRng.create(lazy)
  suffix = () if lazy is None else lazy.suffix

  def run(params, key, arrays, traced):
    rngs = {} if key is None else {"dropout": LazyRng(key, suffix)}
    return fresh.apply({"params": params}, *arrays, **traced, **static, rngs=rngs)

  key = None if lazy is None else lazy.rng
  return checkpointed(run, policy_name)(block.variables["params"], key, arrays, traced)


def checkpointed(fn: Callable[..., Any], policy_name: str) -> Callable[..., Any]:
  """`fn` (a pure function of array pytrees) whose backward pass recomputes what
  `policy_name` does not save, after the cotangent of its output has arrived.

  `jax.checkpoint` alone leaves the recomputation identical to the forward computation: a
  backend that drops its optimization barriers before common-subexpression elimination (XLA on
  CPU) then merges the two and keeps every layer's activations. Here the saved residuals get
  `+ 0 * (one entry of the cotangent)` first: the recomputation depends on the cotangent, so it
  is neither merged nor scheduled early; a non-finite cotangent makes the gradient NaN (it is
  not finite either way). "offload" residuals live in host memory and are left as saved.
  """
  saved = jax.checkpoint(fn, policy=policy(policy_name), prevent_cse=False)

  @jax.custom_vjp
  def run(*args):
    return fn(*args)

  def forward(*args):
    return jax.vjp(saved, *args)

  def backward(vjp_fn, cotangent):
    if policy_name != "offload":
      vjp_fn = tied(vjp_fn, cotangent)
    return vjp_fn(cotangent)

  run.defvjp(forward, backward)
  return run


def weight_as(weight: Array, dtype: Any, after: Array, *, detach: bool = False) -> Array:
  """A frozen weight in the activation `dtype`, for one use that follows `after`.

  What a use makes of a weight (its conversion: ours, or the one XLA on CPU inserts to compute
  a bfloat16 matmul in float32; under FSDP, its all-gather) is tied to `after`, the activation
  it multiplies: schedulers otherwise run every layer's conversion or gather at the start of
  the step and keep them all alive, a float32 or gathered copy of the whole model. Tied, each
  lives for its one matmul. The values are the weight's (`+ 0 * one entry of after`). A
  float32 weight used in float32 is left as is: without remat its tied copy would be kept for
  the backward pass, where the weight itself serves.

  `detach`: the tie sends `after` no gradient. Differentiated, `weight + 0 * after[0]` sends
  `after` the sum of the copy's cotangent times 0: the whole weight's gradient is computed and
  multiplied away (for Llama-3.2-3B's tied output table, 1.5 GB of float32 at the step's peak).
  The output layer detaches; the layers do not: detached there, XLA:CPU keeps more per layer
  under remat (0.15 against 0.056 GiB per Llama-3.2-3B layer at batch 8 x 612).
  """
  if weight.dtype == jnp.float32 and jnp.dtype(dtype) == jnp.float32:
    return weight
  return tied(weight, after, detach).astype(dtype)


def tied(tree: Any, to: Any, detach: bool = False, integers: bool = False) -> Any:
  """`tree` with `0 * (one entry of to's first float leaf)` added to its float leaves (and its
  integer leaves with `integers`: a quantized kernel's values, else converted at any time): the
  same values, computed only once `to` is (`detach`: with no gradient to `to`)."""
  leaf = next(x for x in jax.tree.leaves(to) if jnp.issubdtype(x.dtype, jnp.inexact))
  tie = jnp.ravel(leaf)[0]
  tie = (jax.lax.stop_gradient(tie) if detach else tie) * 0
  kinds = (jnp.inexact, jnp.integer) if integers else (jnp.inexact,)
  return jax.tree.map(
      lambda r: r + tie.astype(r.dtype) if any(jnp.issubdtype(r.dtype, k) for k in kinds)
      else r, tree)


def cast(tree: Any, dtype: Any) -> Any:
  """`tree` with its floating leaves in `dtype` (arrays, numpy arrays or ShapeDtypeStructs,
  inside logical-axis boxes or not); integer leaves are left alone."""
  dtype = jnp.dtype(dtype)

  def one(x):
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == dtype:
      return x
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)
    if isinstance(x, np.ndarray):
      return x.astype(dtype)
    return jnp.asarray(x, dtype)

  return jax.tree.map(one, tree)
