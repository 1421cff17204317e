"""Model-level generation for `backbones.t5.Transformer`: encode once, then search the decoder.

The encoder runs once (through the prompt hook, if the model has one); the decoder runs one
position per step against an incremental key/value cache in the "cache" collection, and reads
its cross-attention keys and values, projected once per sequence, from `layers.FIXED_KV`. The search
itself lives in `spot_jax.backbones.t5.decoding`. `generate` is jitted with the model and the search
settings static, so it compiles once per (model, input shape, settings).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import decoding, layers
from spot_jax.backbones.t5.network import Transformer

Array = jax.Array
PyTree = Any

METHODS = ("greedy", "beam", "sample")


def encode(model: Transformer, params: PyTree, encoder_input_tokens: Array) -> tuple[Array, Array]:
  """Deterministic encoder pass: [B, T] ids -> (encoded [B, T', E], valid [B, T'] bool)."""
  return model.apply({"params": params}, encoder_input_tokens, enable_dropout=False,
                     method=Transformer.encode)


def init_cache(model: Transformer, params: PyTree, encoded: Array, encoder_valid: Array,
               max_decode_length: int, prefixes: Optional[PyTree] = None) -> PyTree:
  """The empty decoder cache for batch B = encoded.shape[0] and `max_decode_length` positions."""
  return init_decoder_state(model, params, encoded, encoder_valid, max_decode_length,
                            prefixes)[0]


def init_decoder_state(model: Transformer, params: PyTree, encoded: Array, encoder_valid: Array,
                       max_decode_length: int, prefixes: Optional[PyTree] = None
                       ) -> tuple[PyTree, PyTree]:
  """(empty self-attention cache, cross-attention keys/values of `encoded`) for decoding.

  Built the way t5x builds its cache: one decode-mode call on a [B, L] zero input creates the
  cache variables (its logits are discarded, so under jit they cost nothing). The same call
  projects the encoder output's keys and values for every decoder layer (`layers.FIXED_KV`):
  the steps read them instead of projecting [B, T', E] again per generated token.
  """
  dummy = jnp.zeros((encoded.shape[0], max_decode_length), jnp.int32)
  _, variables = model.apply({"params": params}, encoded, encoder_valid, dummy,
                             enable_dropout=False, decode=True,
                             max_decode_length=max_decode_length,
                             mutable=["cache", layers.FIXED_KV], method=Transformer.decode,
                             prefixes=prefixes)
  return variables["cache"], variables[layers.FIXED_KV]


def make_tokens_to_logits(model: Transformer, params: PyTree, encoded: Array,
                          encoder_valid: Array, max_decode_length: int,
                          prefixes: Optional[PyTree] = None,
                          fixed_kv: Optional[PyTree] = None
                          ) -> Callable[[Array, PyTree], tuple[Array, PyTree]]:
  """The one-step decoder function used by `decoding`: ([N, 1] ids, cache) -> ([N, V], cache).

  `encoded` [N, T', E] and `encoder_valid` [N, T'] must already have the decoder's batch N
  (repeated per beam for beam search), as must per-row deep `prefixes` (a `DeepPrompt`; None:
  the model's own deep prompt, if any) and `fixed_kv` (from `init_decoder_state`; None:
  projected here from `encoded`, once, outside the step).
  """
  if fixed_kv is None:
    fixed_kv = init_decoder_state(model, params, encoded, encoder_valid, max_decode_length,
                                  prefixes)[1]

  def tokens_to_logits(tokens: Array, cache: PyTree) -> tuple[Array, PyTree]:
    logits, variables = model.apply(
        {"params": params, "cache": cache, layers.FIXED_KV: fixed_kv}, encoded, encoder_valid,
        tokens, enable_dropout=False, decode=True, max_decode_length=max_decode_length,
        mutable=["cache"], method=Transformer.decode, prefixes=prefixes)
    return logits[:, 0, :], variables["cache"]

  return tokens_to_logits


def generate(model: Transformer, params: PyTree, encoder_input_tokens: Array, *,
             max_decode_length: int, method: str = "greedy", num_beams: int = 4,
             alpha: float = 0.6, temperature: float = 1.0, top_k: int = 0,
             rng: Optional[Array] = None, eos_id: int = 1, return_all_beams: bool = False
             ) -> tuple[Array, Array]:
  """Generates decoder outputs for a padded batch of encoder inputs.

  Args:
    model: the `Transformer` (with or without a prompt module).
    params: its parameter tree (including `prompt/` when the model has a prompt).
    encoder_input_tokens: [B, T] int ids, 0 = padding.
    max_decode_length: L, the most tokens generated per row, EOS included (static).
    method: "greedy" (argmax), "beam" or "sample" (temperature sampling) (static).
    num_beams: K for beam search (static).
    alpha: beam search length-penalty exponent, ((5 + len) / 6) ** alpha; 0 = plain log-prob.
    temperature: sampling temperature (0 behaves as greedy).
    top_k: if > 0, sample among the k most likely tokens only (static).
    rng: PRNG key, required for "sample".
    eos_id: end-of-sequence id (static).
    return_all_beams: beam search only: return all K beams, best first (static).

  Returns:
    tokens [B, L] int32, 0 after EOS, and scores [B]: the sum of token log-probabilities for
    greedy and sampling (temperature 1, before top-k), the length-normalised log-probability
    for beam search. With `return_all_beams`: [B, K, L] and [B, K], best first.

  Raises:
    ValueError: for an unknown method or out-of-range setting.
  """
  if jnp.ndim(encoder_input_tokens) != 2 or not jnp.issubdtype(
      jnp.result_type(encoder_input_tokens), jnp.integer):
    raise ValueError("encoder_input_tokens must be a [batch, length] integer array, got shape "
                     f"{jnp.shape(encoder_input_tokens)} dtype "
                     f"{jnp.result_type(encoder_input_tokens)}")
  dynamic, static = search_settings(
      model, max_decode_length=max_decode_length, method=method, num_beams=num_beams, alpha=alpha,
      temperature=temperature, top_k=top_k, rng=rng, eos_id=eos_id,
      return_all_beams=return_all_beams)
  tokens = jnp.asarray(encoder_input_tokens, jnp.int32)
  return _generate(model, params, tokens, *dynamic, **static)


def search_settings(model: Transformer, *, max_decode_length: int, method: str = "greedy",
                    num_beams: int = 4, alpha: float = 0.6, temperature: float = 1.0,
                    top_k: int = 0, rng: Optional[Array] = None, eos_id: int = 1,
                    return_all_beams: bool = False) -> tuple[tuple, dict[str, Any]]:
  """Checks `generate`'s search settings and normalises the ones a method ignores.

  Returns:
    ((rng, alpha, temperature) to pass as traced arguments, {static keyword arguments of
    `search`}); settings irrelevant to `method` get fixed values so they never recompile.

  Raises:
    ValueError: for an unknown method or out-of-range setting.
  """
  if not isinstance(model, Transformer):
    raise ValueError(f"generate needs a spot_jax.backbones.t5.Transformer, got "
                     f"{type(model).__name__}")
  validate.one_of(method, "method", METHODS)
  validate.positive_int(max_decode_length, "max_decode_length")
  if not isinstance(eos_id, int) or not 0 < eos_id < model.config.vocab_size:
    raise ConfigError(f"eos_id must be an integer in [1, vocab_size={model.config.vocab_size}), "
                      f"got {eos_id!r}")
  if method == "beam":
    validate.positive_int(num_beams, "num_beams")
  else:
    if return_all_beams:
      raise ConfigError(f"return_all_beams applies to method='beam' only, not {method!r}")
    num_beams = 1  # irrelevant here; normalised so it never triggers a recompile
  if method == "sample":
    if rng is None:
      raise ConfigError("method='sample' needs rng=jax.random.PRNGKey(...)")
    if isinstance(temperature, (int, float)) and temperature < 0:
      raise ConfigError(f"temperature must be >= 0, got {temperature}")
    if not isinstance(top_k, int) or not 0 <= top_k <= model.config.vocab_size:
      raise ConfigError(f"top_k must be an integer in [0, vocab_size={model.config.vocab_size}], "
                        f"got {top_k!r}")
  else:
    rng, temperature, top_k = None, 0.0, 0
  if method != "beam":
    alpha = 0.0
  # numpy scalars: jnp.asarray would compile a conversion of its own at every start-up.
  dynamic = (rng, np.asarray(alpha, np.float32), np.asarray(temperature, np.float32))
  static = dict(max_decode_length=max_decode_length, method=method, num_beams=num_beams,
                top_k=top_k, eos_id=eos_id, return_all_beams=return_all_beams)
  return dynamic, static


@functools.partial(jax.jit, static_argnames=("model", "max_decode_length", "method", "num_beams",
                                             "top_k", "eos_id", "return_all_beams"))
def _generate(model: Transformer, params: PyTree, encoder_input_tokens: Array,
              rng: Optional[Array], alpha: Array, temperature: Array, *, max_decode_length: int,
              method: str, num_beams: int, top_k: int, eos_id: int, return_all_beams: bool
              ) -> tuple[Array, Array]:
  encoded, valid = encode(model, params, encoder_input_tokens)
  return search(model, params, encoded, valid, rng, alpha, temperature,
                max_decode_length=max_decode_length, method=method, num_beams=num_beams,
                top_k=top_k, eos_id=eos_id, return_all_beams=return_all_beams)


def search(model: Transformer, params: PyTree, encoded: Array, encoder_valid: Array,
           rng: Optional[Array], alpha: Array, temperature: Array, *, max_decode_length: int,
           method: str, num_beams: int, top_k: int, eos_id: int, return_all_beams: bool,
           prefixes: Optional[PyTree] = None) -> tuple[Array, Array]:
  """The decoder search of `generate` from an already-encoded batch (call inside jit).

  Args:
    model, params: as `generate` (the prompt subtree is not used here).
    encoded: [B, T', E] encoder output; encoder_valid: [B, T'] bool.
    rng, alpha, temperature: as `generate`, already checked and normalised.
    max_decode_length, method, num_beams, top_k, eos_id, return_all_beams: static settings.
    prefixes: per-row deep prompts (a `spot_jax.backbones.t5.prefixes.DeepPrompt` whose arrays
      lead with 1 or B); None: the model's own deep prompt, if any.

  Returns:
    As `generate`.
  """
  batch = encoded.shape[0]
  valid = encoder_valid
  cache, fixed_kv = init_decoder_state(model, params, encoded, valid, max_decode_length, prefixes)
  if method == "beam":
    beams = lambda x: decoding.expand_beams(x, num_beams)
    per_beam = lambda x: x if x.shape[0] == 1 else beams(x)  # prefixes may lead with 1
    step = make_tokens_to_logits(model, params, beams(encoded), beams(valid), max_decode_length,
                                 jax.tree_util.tree_map(per_beam, prefixes),
                                 jax.tree_util.tree_map(beams, fixed_kv))
    seqs, scores = decoding.beam_search(step, cache, batch_size=batch, num_beams=num_beams,
                                        max_decode_length=max_decode_length, alpha=alpha,
                                        eos_id=eos_id)
    return (seqs, scores) if return_all_beams else (seqs[:, 0], scores[:, 0])
  step = make_tokens_to_logits(model, params, encoded, valid, max_decode_length, prefixes,
                               fixed_kv)
  return decoding.temperature_sample(
      step, cache, batch_size=batch, max_decode_length=max_decode_length, rng=rng,
      temperature=0.0 if method == "greedy" else temperature, top_k=top_k, eos_id=eos_id)
