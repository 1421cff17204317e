"""What the deep prompt methods share: their exported artifact and its conversion to prefixes.

A deep prompt run exports (prompts/prompt_step_N.npy, prompt_best.npy) one 0-d NumPy record
array (a structured dtype, readable with `np.load(path, allow_pickle=False)`) with one field
per attention type that has a deep prompt:

  "encoder", "decoder", "cross"         [layers, 2, P, H, D] float32: plain key (index 0) and
                                        value (index 1) prefixes, every reparameterisation
                                        folded away (prefix tuning)
  "encoder_tokens", "decoder_tokens"    [layers, P, E] float32: deep prompt tokens, whose keys
                                        and values the frozen backbone computes (P-tuning v2;
                                        `fold_tokens` turns them into plain prefixes)

The field names say where each prefix goes, so the file serves without the run's settings.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from spot_jax.backbones import kinds
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import prefixes as prefixes_lib
from spot_jax.backbones.t5.config import T5Config

KV_FIELDS = prefixes_lib.ATTENTION_TYPES
TOKEN_FIELDS = ("encoder_tokens", "decoder_tokens")
FIELDS = KV_FIELDS + TOKEN_FIELDS


def to_record(parts: Mapping[str, Any]) -> np.ndarray:
  """A 0-d record array of `parts` ({field: array}), fields in FIELDS order."""
  unknown = sorted(set(parts) - set(FIELDS))
  if unknown or not parts:
    raise ConfigError(f"deep prompt fields {unknown or '(none)'}; valid: {', '.join(FIELDS)}")
  arrays = {k: np.asarray(parts[k], np.float32) for k in FIELDS if k in parts}
  dtype = np.dtype([(k, np.float32, v.shape) for k, v in arrays.items()])
  record = np.zeros((), dtype)
  for k, v in arrays.items():
    record[k] = v
  return record


def is_record(array: np.ndarray) -> bool:
  """Whether `array` is a deep prompt export (a record with deep prompt fields)."""
  names = getattr(getattr(array, "dtype", None), "names", None)
  return bool(names) and set(names) <= set(FIELDS)


def from_record(array: np.ndarray, source: str = "deep prompt") -> dict[str, np.ndarray]:
  """{field: float32 array} of a deep prompt export, checked (one-line ConfigError otherwise)."""
  if not is_record(array) or array.shape != ():
    raise ConfigError(f"{source} is not a deep prompt export (a record with fields among "
                      f"{', '.join(FIELDS)})")
  parts = {k: np.asarray(array[k], np.float32) for k in array.dtype.names}
  for k, v in parts.items():
    want = 5 if k in KV_FIELDS else 3
    if v.ndim != want or 0 in v.shape or (k in KV_FIELDS and v.shape[1] != 2):
      raise ConfigError(f"{source}: field {k!r} has shape {v.shape}; expected "
                        f"{'[layers, 2, P, H, D]' if k in KV_FIELDS else '[layers, P, E]'}")
    if not np.all(np.isfinite(v)):
      raise ConfigError(f"{source}: field {k!r} holds NaN or infinite values")
  return parts


def check_fits(parts: Mapping[str, np.ndarray], config: T5Config, source: str) -> None:
  """Raises ConfigError when a deep prompt was made for another backbone shape."""
  for k, v in parts.items():
    stack = "encoder" if k.startswith("encoder") else "decoder"
    layers = config.num_encoder_layers if stack == "encoder" else config.num_decoder_layers
    tail = (config.num_heads, config.head_dim) if k in KV_FIELDS else (config.emb_dim,)
    if v.shape[0] != layers or tuple(v.shape[-len(tail):]) != tail:
      raise ConfigError(f"{source}: field {k!r} of shape {v.shape} does not fit the model "
                        f"({layers} {stack} layers, heads x head_dim {config.num_heads} x "
                        f"{config.head_dim}, width {config.emb_dim}); give a prompt trained on "
                        f"this model")


def deep_prompt(parts: Mapping[str, Any]) -> prefixes_lib.DeepPrompt:
  """The network's `DeepPrompt` (batch axis 1) of plain prefixes and/or deep prompt tokens."""
  out = {}
  for name in KV_FIELDS:
    if name in parts:
      kv = jnp.asarray(parts[name])
      out[name] = prefixes_lib.Prefix(key=kv[None, :, 0], value=kv[None, :, 1])
    if f"{name}_tokens" in parts:
      if name in out:
        raise ConfigError(f"the {name} attention has both plain prefixes and deep prompt tokens; "
                          f"give one")
      out[name] = prefixes_lib.Prefix(tokens=jnp.asarray(parts[f"{name}_tokens"])[None])
  return prefixes_lib.DeepPrompt(**out)


def rms_norm(x: Any, scale: Any, epsilon: float) -> Any:
  """T5's layer norm in float32 (as `spot_jax.backbones.t5.layers.RMSNorm`)."""
  x = jnp.asarray(x, jnp.float32)
  var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
  return x * jax.lax.rsqrt(var + epsilon) * jnp.asarray(scale, jnp.float32)


def fold_tokens(tokens: Any, backbone: Mapping[str, Any], config: T5Config, stack: str
                ) -> np.ndarray:
  """Deep prompt tokens [layers, P, E] -> plain prefixes [layers, 2, P, H, D] of `backbone`.

  Each layer's keys and values are its frozen pre-attention layer norm and key/value kernels
  applied to its tokens: exactly what the network computes from the tokens at every call.

  Args:
    tokens: the tokens of the encoder's ("encoder") or decoder's ("decoder") layers.
    backbone: the frozen parameter tree (unboxed).
    config: the model configuration.
    stack: "encoder" or "decoder".
  """
  if kinds.kind_of(config) == "decoder":
    return _fold_decoder_tokens(tokens, backbone, config)
  norm, attention = (("pre_attention_layer_norm", "attention") if stack == "encoder"
                     else ("pre_self_attention_layer_norm", "self_attention"))
  tokens = jnp.asarray(tokens, jnp.float32)
  heads, depth = config.num_heads, config.head_dim
  out = []
  for i in range(tokens.shape[0]):
    layer = backbone[stack][f"layers_{i}"]
    y = rms_norm(tokens[i], layer[norm]["scale"], config.layer_norm_epsilon)
    y = y.astype(config.activation_dtype)
    kv = [jnp.dot(y, jnp.asarray(layer[attention][n]["kernel"], y.dtype)).reshape(
        y.shape[0], heads, depth) for n in ("key", "value")]
    out.append(jnp.stack(kv).astype(jnp.float32))
  return np.asarray(jnp.stack(out))


def _fold_decoder_tokens(tokens: Any, backbone: Mapping[str, Any], config: Any) -> np.ndarray:
  """A decoder-only model's [layers, P, E] tokens -> [layers, 2, P, K, D] prefixes, computed by
  the network itself (`DecoderLM.token_prefixes`: norm, projections, key norm, RoPE)."""
  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.decoder.network import DecoderLM
  # pylint: enable=g-import-not-at-top
  params = {k: v for k, v in backbone.items() if k != "prompt"}
  pairs = DecoderLM(config).apply({"params": params}, jnp.asarray(tokens, jnp.float32),
                                  method=DecoderLM.token_prefixes)
  return np.stack([np.stack([np.asarray(k[0], np.float32), np.asarray(v[0], np.float32)])
                   for k, v in pairs])
