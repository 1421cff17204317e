"""A frozen backbone plus a prompt table, decoding and scoring named rows in fixed-size batches.

Every call runs one jitted function (`generate_mixed`, `score_mixed` or `classify_mixed`) on a
batch padded to `batch_size` rows, so a job compiles once per function whatever its prompt
mix; `forward_passes` counts the calls (the ensemble asserts it makes one). The backbone's kind
picks the functions: `mixed` for a T5 `Transformer`, `mixed_decoder` for a decoder-only
`DecoderLM` (`spot_jax.backbones.kinds`); everything above the server is the same for both.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import numpy as np

from spot_jax import partitioning
from spot_jax.backbones import kinds
from spot_jax.errors import ConfigError
from spot_jax.serve.catalog.table import PromptTable


@dataclasses.dataclass
class DecodeSettings:
  """How to decode (see `spot_jax.backbones.t5.generate`; a decoder-only backbone decodes
  greedily or samples, and `eos_id` is its vocabulary's end of sequence)."""
  max_decode_length: int = 32
  method: str = "greedy"
  num_beams: int = 4
  alpha: float = 0.6
  temperature: float = 1.0
  top_k: int = 0
  seed: int = 0
  eos_id: int = 1


class Server:
  """Serves the prompts of `table` on a frozen T5 or decoder-only model.

  Attributes:
    model: the prompt-less `Transformer` or `DecoderLM`.
    kind: its kind, "t5" or "decoder".
    params: its frozen parameters.
    table: the `PromptTable`.
    placement: where prompts go ("prefix", "after_bos", "suffix").
    settings: the `DecodeSettings`.
    mesh: the mesh `params` live on when they span several processes (None: one process);
      every process then makes the same calls, and each gets the whole result.
    forward_passes: jitted calls made so far.
  """

  def __init__(self, model: Any, params: Any, table: PromptTable, *,
               placement: str = "prefix", settings: Optional[DecodeSettings] = None,
               mesh: Optional[jax.sharding.Mesh] = None):
    if model.prompt is not None:
      raise ConfigError(f"Server needs the prompt-less backbone {type(model).__name__}(config)")
    self.kind = kinds.kind_of(model.config)
    # pylint: disable=g-import-not-at-top  (a job on one kind never imports the other)
    if self.kind == "decoder":
      from spot_jax.serve.model import mixed_decoder as mixed_lib
      mixed_lib.check_placement(placement)
      search_settings = mixed_lib.search_settings
      _check_decoder_table(table, model.config)
    else:
      from spot_jax.serve.model import mixed as mixed_lib
      from spot_jax.backbones.t5.generation import search_settings
    # pylint: enable=g-import-not-at-top
    if table.has_tokens:  # P-tuning v2: the backbone's projections give the plain prefixes
      from spot_jax.prompts import deep  # pylint: disable=g-import-not-at-top
      table = table.fold_tokens(lambda t, stack: deep.fold_tokens(t, params, model.config, stack))
    self.model, self.params, self.table, self.placement = model, params, table, placement
    self._mixed = mixed_lib
    self.settings = settings or DecodeSettings()
    s = self.settings
    rng = jax.random.PRNGKey(s.seed) if s.method == "sample" else None
    self._dynamic, self._static = search_settings(
        model, max_decode_length=s.max_decode_length, method=s.method, num_beams=s.num_beams,
        alpha=s.alpha, temperature=s.temperature, top_k=s.top_k, rng=rng, eos_id=s.eos_id)
    self.mesh = mesh
    self._arrays = jax.tree_util.tree_map(self._place, table.arrays)
    self.forward_passes = 0

  def _place(self, value: Any) -> jax.Array:
    """A host value as an array every device of the job can use (replicated over the mesh)."""
    if self.mesh is None:
      # device_put, not jnp.asarray: the latter compiles a small copy per new shape (~50 ms each
      # at start-up, on every command).
      return jax.device_put(value)
    return partitioning.global_batch(np.asarray(value), partitioning.replicated(self.mesh))

  def _fetch(self, value: Any) -> np.ndarray:
    return np.asarray(value) if self.mesh is None else partitioning.fetch(value)

  def _rows(self, names: Sequence[str], tokens: np.ndarray) -> tuple[jax.Array, jax.Array]:
    tokens = np.asarray(tokens, np.int32)
    if tokens.ndim != 2 or len(names) != tokens.shape[0]:
      raise ConfigError(f"{len(names)} prompt names for token rows of shape {tokens.shape}")
    self.table.check_input_length(names, tokens.shape[1])
    return self._place(self.table.indices(names)), self._place(tokens)

  def _valid(self, **masks: Optional[np.ndarray]) -> dict[str, jax.Array]:
    """The validity masks given, placed: a decoder-only backbone reads them (None: ids > 0); T5
    reads its padding id 0, which its vocabularies never give a token, so it drops them."""
    if self.kind != "decoder":
      return {}
    return {k: self._place(np.asarray(v, bool)) for k, v in masks.items() if v is not None}

  def generate(self, names: Sequence[str], tokens: np.ndarray, batch_index: int = 0,
               valid: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """Decodes row b with prompt names[b]: (tokens [B, S] int32, 0 after EOS; scores [B]).
    `valid` [B, T] bool marks the tokens (None: ids > 0); decoder-only backbones only."""
    index, tokens = self._rows(names, tokens)
    rng, alpha, temperature = self._dynamic
    if rng is not None:
      rng = jax.random.fold_in(rng, batch_index)
    self.forward_passes += 1
    out, scores = self._mixed.generate_mixed(self.model, self.params, self._arrays, index,
                                             tokens, rng, alpha, temperature,
                                             placement=self.placement, **self._static,
                                             **self._valid(valid=valid))
    return self._fetch(out), self._fetch(scores)

  def score(self, names: Sequence[str], tokens: np.ndarray, targets: np.ndarray,
            valid: Optional[np.ndarray] = None, target_valid: Optional[np.ndarray] = None
            ) -> np.ndarray:
    """Log-likelihood [B] of targets [B, S] (EOS included, 0 = padding unless `valid` /
    `target_valid` mark the tokens: decoder-only backbones) under row prompts."""
    index, tokens = self._rows(names, tokens)
    self.forward_passes += 1
    return self._fetch(self._mixed.score_mixed(
        self.model, self.params, self._arrays, index, tokens,
        self._place(np.asarray(targets, np.int32)), placement=self.placement,
        **self._valid(valid=valid, target_valid=target_valid)))

  def classify(self, names: Sequence[str], tokens: np.ndarray, labels: np.ndarray,
               valid: Optional[np.ndarray] = None, label_valid: Optional[np.ndarray] = None
               ) -> np.ndarray:
    """Log-likelihoods [B, C] of C label token rows labels [C, S]: one pass (T5: each input
    encoded once and its C labels scored, B * C decoder rows; a decoder-only backbone: B * C
    rows of input and label)."""
    index, tokens = self._rows(names, tokens)
    self.forward_passes += 1
    return self._fetch(self._mixed.classify_mixed(
        self.model, self.params, self._arrays, index, tokens,
        self._place(np.asarray(labels, np.int32)), placement=self.placement,
        **self._valid(valid=valid, label_valid=label_valid)))



def _check_decoder_table(table: PromptTable, config: Any) -> None:
  """Refuses, in one line, entries a decoder-only backbone cannot serve."""
  from spot_jax.serve.catalog import prompt_loaders  # pylint: disable=g-import-not-at-top
  for e in table.entries:
    if e.deep:
      prompt_loaders.check_decoder_prefixes(e.deep, config, f"prompt {e.name!r} ({e.source})")
