"""Where a prompt goes in the embedded encoder input, and the valid mask that results.

Three placements, all on right-padded batches (validity from the caller's `valid` mask):
  "prefix":     [P, x_0, ..., x_{T-1}]
  "after_bos":  [x_0, P, x_1, ..., x_{T-1}]  (after the first token; T5 inputs have no BOS,
                so this is "after the first input token")
  "suffix":     [x_0, ..., x_{n-1}, P, pad...] where n is one past the last real token of the
                row, so the prompt follows the real tokens (and their EOS) on every row.
Prompt positions are always valid; input positions keep their own validity.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import layers

Array = jax.Array

PLACEMENTS = ("prefix", "after_bos", "suffix")


def combine(prompt: Array, embedded: Array, valid: Array, placement: str = "prefix"
            ) -> tuple[Array, Array]:
  """Inserts a prompt into the embedded input.

  Args:
    prompt: [L, E] (shared by the batch) or [B, L, E] (one prompt per example).
    embedded: [B, T, E] embedded input tokens.
    valid: [B, T] bool, True at real tokens.
    placement: "prefix", "after_bos" or "suffix".

  Returns:
    (x [B, L + T, E] in `embedded`'s dtype, valid [B, L + T] bool).
  """
  validate.one_of(placement, "placement", PLACEMENTS)
  batch, length, embed = embedded.shape
  if prompt.ndim == 2:
    prompt = jnp.broadcast_to(prompt[None], (batch,) + prompt.shape)
  if prompt.ndim != 3 or prompt.shape[0] != batch or prompt.shape[2] != embed:
    raise ConfigError(f"prompt of shape {prompt.shape} does not fit an input of shape "
                      f"{embedded.shape}; expected [L, {embed}] or [{batch}, L, {embed}]")
  if valid.shape != (batch, length):
    raise ValueError(f"valid mask of shape {valid.shape} does not match the input [B, T] = "
                     f"{(batch, length)}")
  prompt = prompt.astype(embedded.dtype)
  valid = valid.astype(bool)
  num = prompt.shape[1]
  on = jnp.ones((batch, num), bool)

  if placement == "prefix":
    x = jnp.concatenate([prompt, embedded], axis=1)
    mask = jnp.concatenate([on, valid], axis=1)
  elif placement == "after_bos":
    if length < 1:
      raise ConfigError("after_bos placement needs at least one input position")
    x = jnp.concatenate([embedded[:, :1], prompt, embedded[:, 1:]], axis=1)
    mask = jnp.concatenate([valid[:, :1], on, valid[:, 1:]], axis=1)
  else:
    x, mask = _insert_after_last_real(prompt, embedded, valid)
  return layers.constrain(x, ("batch", "length", "embed")), mask


def _insert_after_last_real(prompt: Array, embedded: Array, valid: Array) -> tuple[Array, Array]:
  """Suffix placement by a per-row gather (row lengths are traced, shapes static)."""
  num, length = prompt.shape[1], embedded.shape[1]
  positions = jnp.arange(length)
  ends = jnp.max(jnp.where(valid, positions[None] + 1, 0), axis=1)  # [B], one past last real
  out = jnp.arange(length + num)[None]  # [1, T + L]
  from_input = (out < ends[:, None]) | (out >= ends[:, None] + num)  # [B, T + L]
  input_idx = jnp.clip(jnp.where(out < ends[:, None], out, out - num), 0, length - 1)
  prompt_idx = jnp.clip(out - ends[:, None], 0, num - 1)
  x_in = jnp.take_along_axis(embedded, input_idx[..., None], axis=1)
  x_pr = jnp.take_along_axis(prompt, prompt_idx[..., None], axis=1)
  x = jnp.where(from_input[..., None], x_in, x_pr)
  mask = jnp.where(from_input, jnp.take_along_axis(valid, input_idx, axis=1), True)
  return x, mask
