"""Logical axis rules for t5x's PjitPartitioner: t5x's standard table plus the prompt axes.

The prompt axes (`prompt`, `prompt_embed`, `prompts`, `prompt_mlp`) and `relpos_buckets` take
their mesh axis from spot-jax's own rule table (`spot_jax.partitioning.DEFAULT_RULES`), so the
two trainers place a prompt the same way: replicated by default.
"""
from __future__ import annotations

from typing import Optional, Sequence

from t5x import adafactor
from t5x import partitioning as t5x_partitioning

from spot_jax import partitioning

PROMPT_AXES = ("prompt", "prompt_embed", "prompts", "prompt_mlp")
_EXTRA_AXES = PROMPT_AXES + ("relpos_buckets",)


def prompt_axis_rules(shard_prompt_embed: bool = False) -> tuple[tuple[str, Optional[str]], ...]:
  """(logical, mesh axis) rules for the prompt axes (and `relpos_buckets`)."""
  table = dict(partitioning.logical_rules(shard_prompt_embed))
  return tuple((name, table[name]) for name in _EXTRA_AXES)


def logical_axis_rules(shard_prompt_embed: bool = False,
                       base: Optional[Sequence[tuple[str, Optional[str]]]] = None
                       ) -> tuple[tuple[str, Optional[str]], ...]:
  """t5x's rules (`base`, default `standard_logical_axis_rules()`) plus `prompt_axis_rules`.

  Args:
    shard_prompt_embed: map `prompt_embed` to "model" (the largest models only).
    base: the rule table to extend; its own entries for the prompt axes, if any, win.
  """
  base = tuple(t5x_partitioning.standard_logical_axis_rules() if base is None else base)
  present = {name for name, _ in base}
  return base + tuple(r for r in prompt_axis_rules(shard_prompt_embed) if r[0] not in present)


def adafactor_factor_rules():
  """t5x Adafactor's factorisation rules with the prompt axes never factored."""
  rules = dict(adafactor.standard_logical_factor_rules())
  for name in _EXTRA_AXES:
    rules[name] = adafactor.FactorDim.NONE
  return rules
