"""Length buckets: regroup a window of fixed-padded examples into batches padded to their bucket.

Inside a window the examples are grouped by the smallest bucket boundary that holds their input
(stable, so stream order is kept within a bucket), cut into batches, and the batches put in a
seeded random order. Each batch's encoder_input_tokens are cut to its bucket's boundary instead
of TASK_FEATURE_LENGTHS['inputs']; every example of the window appears exactly once, with the
same content. Targets keep their fixed length (a short, fixed decoder side; the prompt changes
only the encoder). Decoder-only batches (inputs and targets as one sequence of T + S positions)
are cut to their bucket's boundary plus S, so the targets always fit. Packing stays refused:
the model prepends the prompt to each row, so one row must be one example. Pure numpy;
`spot_jax.data` applies it to the training stream.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import numpy as np

from spot_jax.errors import ConfigError

AUTO_BUCKETS = "auto"
AUTO_SMALLEST = 16


def boundaries(buckets: Union[None, str, Sequence[int]], length: int, window: int = 1
               ) -> Optional[tuple[int, ...]]:
  """The bucket boundaries of LENGTH_BUCKETS `buckets` for input length `length`, or None (off).

  Args:
    buckets: None, "auto" or increasing lengths in 1..length.
    length: TASK_FEATURE_LENGTHS['inputs'], always the last boundary.
    window: the bucketing window in batches (checked to be positive).

  Raises:
    ConfigError: one line for malformed buckets or window.
  """
  if buckets is None:
    return None
  if not isinstance(window, int) or isinstance(window, bool) or window < 1:
    raise ConfigError(f"bucket_window={window!r}; give a positive number of batches, e.g. 64")
  valid = (f"valid: None, 'auto' or increasing input lengths in 1..{length} "
           f"(TASK_FEATURE_LENGTHS['inputs']), e.g. LENGTH_BUCKETS=(32, 64, 128)")
  if isinstance(buckets, str):
    if buckets != AUTO_BUCKETS:
      raise ConfigError(f"LENGTH_BUCKETS={buckets!r}; {valid}")
    return auto_buckets(length)
  try:
    values = list(buckets)
  except TypeError:
    raise ConfigError(f"LENGTH_BUCKETS={buckets!r}; {valid}") from None
  if not values:
    raise ConfigError(f"LENGTH_BUCKETS={buckets!r}; {valid}")
  for i, v in enumerate(values):
    where = f"LENGTH_BUCKETS={tuple(values)}: entry {i} ({v!r})"
    if not isinstance(v, int) or isinstance(v, bool):
      raise ConfigError(f"{where} is not an integer; {valid}")
    if i and v <= values[i - 1]:
      raise ConfigError(f"{where} is not above entry {i - 1} ({values[i - 1]}): the buckets are "
                        f"not strictly increasing; {valid}")
    if v < 1:
      raise ConfigError(f"{where} is a bucket of {v} tokens; input lengths exclude the prompt "
                        f"(the model adds it) and count at least the EOS; {valid}")
    if v > length:
      raise ConfigError(f"{where} goes beyond TASK_FEATURE_LENGTHS['inputs']={length}; {valid}")
  return tuple(values) + (() if values[-1] == length else (length,))


def auto_buckets(length: int) -> tuple[int, ...]:
  """LENGTH_BUCKETS='auto': 16, 32, 64, ... below `length`, then `length`."""
  out, b = [], AUTO_SMALLEST
  while b < length:
    out.append(b)
    b *= 2
  return tuple(out) + (length,)


def window_rng(seed: Optional[int], index: int) -> np.random.RandomState:
  """The generator that orders the batches of bucketing window `index` (a pure function)."""
  state = np.random.SeedSequence([0 if seed is None else int(seed), index]).generate_state(1)[0]
  return np.random.RandomState(state)


def input_lengths(tokens: np.ndarray) -> np.ndarray:
  """Real tokens per row of right-padded [N, T] tokens (one past the last non-zero), [N]."""
  nonzero = np.asarray(tokens) != 0
  last = tokens.shape[1] - np.argmax(nonzero[:, ::-1], axis=1)
  return np.where(nonzero.any(axis=1), last, 0)


def bucket_batches(window: Mapping[str, np.ndarray], batch_size: int, boundaries: Sequence[int],
                   rng: np.random.RandomState) -> list[dict[str, np.ndarray]]:
  """Regroups a window of fixed-padded examples into length-bucketed global batches.

  Args:
    window: features of N = k * batch_size consecutive examples ([N, T] / [N, S] / [N]).
    batch_size: global batch size.
    boundaries: increasing bucket lengths, the last one T.
    rng: orders the batches (so lengths do not rise through the window).

  Returns:
    k batches; every example of the window in exactly one, unchanged except that
    encoder_input_tokens is cut to [batch_size, boundary of the batch's longest input] (the
    decoder-only layout's sequence features: to that boundary plus the target length).
  """
  if "encoder_input_tokens" in window:
    cut, tokens, extra = ("encoder_input_tokens",), window["encoder_input_tokens"], 0
  else:  # decoder-only: a row fits boundary + S when its inputs and targets together do
    cut = ("decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights")
    tokens = window["decoder_target_tokens"]
    if "decoder_target_valid" in window:  # id 0 may be a token: lengths from the validity
      cut, tokens = cut + ("decoder_target_valid",), window["decoder_target_valid"]
    extra = tokens.shape[1] - int(boundaries[-1])
  n = tokens.shape[0]
  if n % batch_size:
    raise ValueError(f"a window of {n} examples is not a whole number of batches of {batch_size}")
  edges = np.asarray(boundaries) + extra
  bucket = np.searchsorted(edges, input_lengths(tokens), side="left")
  order = np.argsort(bucket, kind="stable").reshape(-1, batch_size)
  out = []
  for b in rng.permutation(len(order)):
    rows = order[b]
    length = int(edges[int(bucket[rows].max())])
    batch = {k: v[rows] for k, v in window.items()}
    for name in cut:
      batch[name] = batch[name][:, :length]
    out.append(batch)
  return out
