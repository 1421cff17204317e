"""Deep prompts: what T5's attention layers receive in front of their own keys and values.

A deep prompt gives some of the three attention types (encoder self-attention, decoder
self-attention, decoder cross-attention) P extra key/value positions in every layer:

  keys   = [K_prefix; K_input],  values = [V_prefix; V_input]    (along the key axis)

Prefix positions are visible to every query (masked only where `visible` is False, which
serving uses for rows whose prompt is shorter or absent). In self-attention the prefix sits
just before the sequence: prefix key p (0 <= p < P) is at position p - P relative to the first
token, so query i sees it at relative distance p - P - i through the stack's relative-position
table, as transformers' T5 does for past key values (its `compute_bias` offsets the queries by
the P cached positions). Cross-attention has no position bias, for prefixes as for inputs.

A prefix is either given as keys and values (prefix tuning), or as prompt tokens [P, E] whose
keys and values come from the layer's own frozen pre-attention layer norm and key/value
projections (deep prompt tokens; self-attention only, see `spot_jax.prompts.ptuning_v2`).
Arrays lead with a batch axis b: 1 (one prompt for the whole batch) or B (one per row).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import jax

Array = jax.Array

ATTENTION_TYPES = ("encoder", "decoder", "cross")


class Prefix(NamedTuple):
  """One attention type's prefixes for every layer of its stack.

  Attributes:
    key: [b, layers, P, H, D] or None (then `tokens` is given).
    value: [b, layers, P, H, D] or None.
    tokens: [b, layers, P, E] deep prompt tokens, or None.
    visible: [b, P] bool, or None for all visible.
  """
  key: Optional[Array] = None
  value: Optional[Array] = None
  tokens: Optional[Array] = None
  visible: Optional[Array] = None

  @property
  def length(self) -> int:
    """P, the prefix positions."""
    return int((self.tokens if self.key is None else self.key).shape[2])

  def layer(self, i: int, bias: Optional[Array] = None) -> "LayerPrefix":
    """The prefix of layer i; `bias` [1, H, Q, P] is the stack's position bias of the prefix."""
    pick = lambda x: None if x is None else x[:, i]
    return LayerPrefix(pick(self.key), pick(self.value), pick(self.tokens), self.visible, bias)


class LayerPrefix(NamedTuple):
  """One layer's prefix, as the attention layer takes it.

  Attributes:
    key, value: [b, P, H, D] or None.
    tokens: [b, P, E] (already through the layer's pre-attention layer norm) or None.
    visible: [b, P] bool or None.
    bias: [1, H, Q, P] additive position bias of the prefix columns, or None (no bias).
  """
  key: Optional[Array] = None
  value: Optional[Array] = None
  tokens: Optional[Array] = None
  visible: Optional[Array] = None
  bias: Optional[Array] = None


class DeepPrompt(NamedTuple):
  """The prefixes of a model call, by attention type (None: that type gets none).

  Attributes:
    encoder: encoder self-attention.
    decoder: decoder self-attention.
    cross: decoder cross-attention (keys and values only).
  """
  encoder: Optional[Prefix] = None
  decoder: Optional[Prefix] = None
  cross: Optional[Prefix] = None


def check(deep: DeepPrompt, num_encoder_layers: int, num_decoder_layers: int) -> None:
  """Raises ValueError when a prefix does not fit the stacks (a programming error)."""
  for name in ATTENTION_TYPES:
    prefix = getattr(deep, name)
    if prefix is None:
      continue
    layers = num_encoder_layers if name == "encoder" else num_decoder_layers
    has_kv = prefix.key is not None and prefix.value is not None
    if has_kv == (prefix.tokens is not None):
      raise ValueError(f"the {name} prefix needs either key and value or tokens, not both/neither")
    if name == "cross" and prefix.tokens is not None:
      raise ValueError("cross-attention prefixes are keys and values; tokens have no layer norm "
                       "of their own there")
    lead = (prefix.tokens if prefix.key is None else prefix.key).shape
    if len(lead) < 4 or lead[1] != layers:
      raise ValueError(f"the {name} prefix has shape {lead}; expected [b, {layers}, P, ...]")
