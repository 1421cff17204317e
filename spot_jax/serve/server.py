"""A frozen backbone plus a prompt table, decoding and scoring named rows in fixed-size batches.

Every call runs one jitted function (`mixed.generate_mixed` or `mixed.score_mixed`) on a
batch padded to `batch_size` rows, so a job compiles once per function whatever its prompt
mix; `forward_passes` counts the calls (the ensemble asserts it makes one).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import numpy as np

from spot_jax.errors import ConfigError
from spot_jax.serve import mixed
from spot_jax.serve.table import PromptTable
from spot_jax.t5 import generation
from spot_jax.t5.network import Transformer


@dataclasses.dataclass
class DecodeSettings:
  """How to decode (see `spot_jax.t5.generate`)."""
  max_decode_length: int = 32
  method: str = "greedy"
  num_beams: int = 4
  alpha: float = 0.6
  temperature: float = 1.0
  top_k: int = 0
  seed: int = 0
  eos_id: int = 1


class Server:
  """Serves the prompts of `table` on a frozen T5.

  Attributes:
    model: the prompt-less `Transformer`.
    params: its frozen parameters.
    table: the `PromptTable`.
    placement: where prompts go ("prefix", "after_bos", "suffix").
    settings: the `DecodeSettings`.
    forward_passes: jitted calls made so far.
  """

  def __init__(self, model: Transformer, params: Any, table: PromptTable, *,
               placement: str = "prefix", settings: Optional[DecodeSettings] = None):
    if model.prompt is not None:
      raise ConfigError("Server needs the prompt-less backbone Transformer(config)")
    self.model, self.params, self.table, self.placement = model, params, table, placement
    self.settings = settings or DecodeSettings()
    s = self.settings
    rng = jax.random.PRNGKey(s.seed) if s.method == "sample" else None
    self._dynamic, self._static = generation.search_settings(
        model, max_decode_length=s.max_decode_length, method=s.method, num_beams=s.num_beams,
        alpha=s.alpha, temperature=s.temperature, top_k=s.top_k, rng=rng, eos_id=s.eos_id)
    # device_put, not jnp.asarray: the latter compiles a small copy per new shape (~50 ms each
    # at start-up, on every command).
    self._arrays = jax.device_put(table.arrays)
    self.forward_passes = 0

  def _rows(self, names: Sequence[str], tokens: np.ndarray) -> tuple[jax.Array, jax.Array]:
    tokens = np.asarray(tokens, np.int32)
    if tokens.ndim != 2 or len(names) != tokens.shape[0]:
      raise ConfigError(f"{len(names)} prompt names for token rows of shape {tokens.shape}")
    return jax.device_put(self.table.indices(names)), jax.device_put(tokens)

  def generate(self, names: Sequence[str], tokens: np.ndarray, batch_index: int = 0
               ) -> tuple[np.ndarray, np.ndarray]:
    """Decodes row b with prompt names[b]: (tokens [B, S] int32, 0 after EOS; scores [B])."""
    index, tokens = self._rows(names, tokens)
    rng, alpha, temperature = self._dynamic
    if rng is not None:
      rng = jax.random.fold_in(rng, batch_index)
    self.forward_passes += 1
    out, scores = mixed.generate_mixed(self.model, self.params, self._arrays, index, tokens, rng,
                                       alpha, temperature, placement=self.placement,
                                       **self._static)
    return np.asarray(out), np.asarray(scores)

  def score(self, names: Sequence[str], tokens: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Log-likelihood [B] of targets [B, S] (EOS included, 0 = padding) under row prompts."""
    index, tokens = self._rows(names, tokens)
    self.forward_passes += 1
    return np.asarray(mixed.score_mixed(self.model, self.params, self._arrays, index, tokens,
                                        jax.device_put(np.asarray(targets, np.int32)),
                                        placement=self.placement))

  def classify(self, names: Sequence[str], tokens: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Log-likelihoods [B, C] of C label token rows labels [C, S]: one pass that encodes each of
    the B inputs once and scores its C labels (B * C decoder rows)."""
    index, tokens = self._rows(names, tokens)
    self.forward_passes += 1
    return np.asarray(mixed.classify_mixed(self.model, self.params, self._arrays, index, tokens,
                                           jax.device_put(np.asarray(labels, np.int32)),
                                           placement=self.placement))
