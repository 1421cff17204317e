"""Log-likelihoods of target rows given an encoder output: scoring and rank classification.

`label_log_likelihoods` scores C label rows for each of B inputs from one encoder output per
input: B encoder rows and B decoder rows of C label segments (never B * C encoder rows), the
encoder output's cross-attention keys and values projected once per input. Serving
(`spot_jax.serve.model.mixed`) and the prompted model (`spot_jax.models.EncoderDecoderModel.
classify_batch`) both score labels here.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from spot_jax.backbones.t5 import prefixes as prefixes_lib
from spot_jax.backbones.t5.network import Transformer

Array = jax.Array
PyTree = Any


def sequence_log_likelihood(logits: Array, targets: Array) -> Array:
  """Sum of log-probabilities [N] of targets [N, S] (0 = padding) under logits [N, S, V]."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
  token_lp = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  return jnp.sum(token_lp * (targets > 0), axis=-1)


def _shifted(targets: Array) -> Array:
  """Decoder inputs [N, S]: each row of targets [N, S] shifted right behind a 0 (start) id."""
  return jnp.concatenate([jnp.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)


def target_log_likelihood(model: Transformer, params: PyTree, encoded: Array, valid: Array,
                          targets: Array,
                          prefixes: Optional[prefixes_lib.DeepPrompt] = None) -> Array:
  """Sum of log-probabilities [N] of targets [N, S] (0 = padding) given the encoder output.

  Args:
    model: the network that encoded (with its prompt module, or prompt-less when serving).
    params: its parameters.
    encoded: [N, T, E] encoder output; valid: [N, T] bool.
    targets: [N, S] ids, EOS included.
    prefixes: the rows' deep prompts (leading axis N or 1); None: the model's own, if any.
  """
  logits = model.apply({"params": params}, encoded, valid, _shifted(targets), targets,
                       enable_dropout=False, prefixes=prefixes, method=Transformer.decode)
  return sequence_log_likelihood(logits, targets)


def label_log_likelihoods(model: Transformer, params: PyTree, encoded: Array, valid: Array,
                          labels: Array,
                          prefixes: Optional[prefixes_lib.DeepPrompt] = None) -> Array:
  """Log-likelihoods [B, C] of every label row labels [C, S] for every encoded input.

  Each input's decoder row holds its C labels one after another as C segments (see
  `network.Decoder`): each label is scored as if alone, while the encoder output's keys and
  values are projected once per input.

  Args:
    model, params: as `target_log_likelihood`'s.
    encoded: [B, T, E] encoder output, one row per input; valid: [B, T] bool.
    labels: [C, S] label ids (EOS included, 0 = padding).
    prefixes: per-row deep prompts (leading axis B or 1); None: the model's own, if any.
  """
  batch, (num_labels, length) = encoded.shape[0], labels.shape
  row = lambda x: jnp.tile(x.reshape(1, num_labels * length), (batch, 1))  # [B, C * S]
  logits = model.apply({"params": params}, encoded, valid, row(_shifted(labels)), row(labels),
                       enable_dropout=False, prefixes=prefixes, segments=num_labels,
                       method=Transformer.decode)
  logits = logits.reshape(batch * num_labels, length, -1)
  targets = jnp.tile(labels, (batch, 1))
  return sequence_log_likelihood(logits, targets).reshape(batch, num_labels)
