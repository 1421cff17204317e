"""Prompt initialisers: plain functions `init(rng, shape, embedding) -> float32 array`.

Every initialiser fills an array of `shape` ([L, E] for a prompt, [k, l, E] for SMoP's
prompts); row-based initialisers (sampled vocabulary, class labels, text) treat the leading
axes as one axis of `prod(shape[:-1])` rows. `embedding` is the backbone's frozen [V, E]
token table (float32), handed to the prompt module through the input hook, so initialisers
see the loaded checkpoint's table when the prompt is created by
`model.apply({"params": frozen}, ..., mutable=["params"])`.

The factories validate their settings when called (at configuration time), so a bad setting
fails before any model is built. Nothing here reads the network or imports gin or seqio: a
vocabulary is any object with `.encode(str) -> list[int]`.
"""
from __future__ import annotations

import math
import numbers
import os
from typing import Any, Callable, Optional, Protocol, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import fileio
from spot_jax import validate
from spot_jax.errors import ConfigError

Array = jax.Array
Shape = Sequence[int]
Initializer = Callable[[Array, Shape, Array], Array]



def with_origin(init: Initializer, origin: str) -> Initializer:
  """`init`, carrying `origin`: where its values come from, in words, for a run's record."""
  init.origin = origin
  return init


def origin(init: Optional[Callable[..., Any]]) -> str:
  """Where an initialiser's values come from, as a run's record states it (`RunRecord.init`).

  Ours say it with their settings and sources ("run /runs/mnli, step 40 (prompts/
  prompt_step_40.npy)"); any other function is named by its name ("normal", "ones").
  """
  if init is None:
    return ""
  text = getattr(init, "origin", None)
  if text:
    return str(text)
  name = getattr(init, "__qualname__", None) or type(init).__name__
  return name.split(".<locals>")[0]


class Vocabulary(Protocol):
  """Anything that tokenizes a string (seqio's SentencePieceVocabulary qualifies)."""

  def encode(self, s: str) -> Sequence[int]:
    ...


def _rows(shape: Shape, who: str) -> tuple[int, int]:
  """(rows, E) of a prompt shape, validated."""
  shape = tuple(int(d) for d in shape)
  if len(shape) < 2 or any(d <= 0 for d in shape):
    raise ConfigError(f"{who}: prompt shape must be [..., length, embed] with positive sizes, "
                      f"got {shape}")
  return math.prod(shape[:-1]), shape[-1]


def _check_table(embedding: Array, embed: int, who: str) -> int:
  """Validates the [V, E] table against the prompt width; returns V."""
  if embedding is None or len(embedding.shape) != 2:
    raise ConfigError(f"{who}: needs the [vocab, embed] token table, got "
                      f"{None if embedding is None else embedding.shape}")
  if embedding.shape[1] != embed:
    raise ConfigError(f"{who}: prompt width {embed} differs from the embedding table width "
                      f"{embedding.shape[1]}")
  return int(embedding.shape[0])


def uniform(scale: float = 0.5) -> Initializer:
  """U[-scale, scale] entries (Lester et al. 2021 use scale 0.5).

  Args:
    scale: half-width of the range; must be >= 0.
  """
  if not isinstance(scale, numbers.Real) or isinstance(scale, bool) or scale < 0:
    raise ConfigError(f"uniform: scale must be a non-negative number, got {scale!r}")

  def init(rng: Array, shape: Shape, embedding: Array) -> Array:
    del embedding
    _rows(shape, "uniform")
    return jax.random.uniform(rng, tuple(shape), jnp.float32, -scale, scale)

  return with_origin(init, f"uniform(scale={scale})")


def sampled_vocab(num_most_frequent: int = 5000) -> Initializer:
  """Rows copied from the table's first `num_most_frequent` ids.

  SentencePiece orders T5's vocabulary by frequency, so the first 5,000 ids are the 5,000 most
  frequent tokens (Lester et al. 2021). Rows are drawn without replacement, with replacement
  only when the prompt has more rows than the candidates. A table smaller than
  `num_most_frequent` rows (test models) samples from the whole table.

  Args:
    num_most_frequent: how many leading ids are candidates; must be >= 1.
  """
  validate.positive_int(num_most_frequent, "sampled_vocab.num_most_frequent", example=5000)

  def init(rng: Array, shape: Shape, embedding: Array) -> Array:
    rows, embed = _rows(shape, "sampled_vocab")
    vocab = _check_table(embedding, embed, "sampled_vocab")
    candidates = min(int(num_most_frequent), vocab)
    ids = jax.random.choice(rng, candidates, (rows,), replace=rows > candidates)
    table = jnp.asarray(embedding, jnp.float32)
    return jnp.take(table, ids, axis=0).reshape(tuple(shape))

  return with_origin(init, f"sampled_vocab(num_most_frequent={num_most_frequent})")


def class_labels(label_token_ids: Sequence[Sequence[int]],
                 fallback: Optional[Initializer] = None) -> Initializer:
  """Row i is the mean embedding of label i's tokens; later rows come from `fallback`.

  Args:
    label_token_ids: one non-empty list of token ids per class label.
    fallback: initialiser of the rows after the labels (default: `sampled_vocab()`).
  """
  labels = [list(map(int, ids)) for ids in label_token_ids]
  if not labels:
    raise ConfigError("class_labels: needs at least one label")
  for i, ids in enumerate(labels):
    if not ids:
      raise ConfigError(f"class_labels: label {i} has no token ids")
    if min(ids) < 0:
      raise ConfigError(f"class_labels: label {i} has a negative token id: {ids}")
  fallback = sampled_vocab() if fallback is None else fallback

  def init(rng: Array, shape: Shape, embedding: Array) -> Array:
    rows, embed = _rows(shape, "class_labels")
    vocab = _check_table(embedding, embed, "class_labels")
    if len(labels) > rows:
      raise ConfigError(f"class_labels: {len(labels)} labels do not fit a prompt of {rows} rows; "
                        f"use a prompt length of at least {len(labels)}")
    for i, ids in enumerate(labels):
      if max(ids) >= vocab:
        raise ConfigError(f"class_labels: label {i} has token id {max(ids)} outside the "
                          f"embedding table of {vocab} rows")
    table = jnp.asarray(embedding, jnp.float32)
    means = jnp.stack([jnp.mean(jnp.take(table, jnp.asarray(ids), axis=0), axis=0)
                       for ids in labels])
    if len(labels) < rows:
      rest = fallback(rng, (rows - len(labels), embed), embedding)
      means = jnp.concatenate([means, jnp.asarray(rest, jnp.float32)], axis=0)
    return means.reshape(tuple(shape))

  return with_origin(init, f"class_labels(token ids {labels}), then {origin(fallback)}")


def _encode(vocabulary: Vocabulary, text: str, who: str) -> list[int]:
  if not hasattr(vocabulary, "encode"):
    raise ConfigError(f"{who}: vocabulary must have .encode(str) -> list[int], "
                      f"got {type(vocabulary).__name__}")
  return [int(i) for i in vocabulary.encode(text)]


def class_labels_from_strings(labels: Sequence[str], vocabulary: Vocabulary,
                              fallback: Optional[Initializer] = None) -> Initializer:
  """`class_labels` from label strings, tokenized as the model sees them in targets.

  Args:
    labels: the class label strings, e.g. ["entailment", "not_entailment"].
    vocabulary: any object with `.encode(str) -> list[int]` (e.g. seqio's
      SentencePieceVocabulary); every token of a label, including a leading "▁" piece, counts.
    fallback: initialiser of the rows after the labels (default: `sampled_vocab()`).
  """
  if isinstance(labels, str) or not labels:
    raise ConfigError(f"class_labels_from_strings: labels must be a non-empty list of strings, "
                      f"got {labels!r}")
  ids = []
  for i, label in enumerate(labels):
    if not isinstance(label, str):
      raise ConfigError(f"class_labels_from_strings: labels entry {i} ({label!r}) is not a string")
    if label in labels[:i]:
      raise ConfigError(f"class_labels_from_strings: labels entry {i} ({label!r}) repeats an "
                        f"earlier label; give each class once")
    tokens = _encode(vocabulary, label, "class_labels_from_strings")
    if not tokens:
      raise ConfigError(f"class_labels_from_strings: labels entry {i} ({label!r}) tokenizes to no "
                        f"tokens; give a label with visible text")
    ids.append(tokens)
  return class_labels(ids, fallback)


_FITS = ("exact", "truncate", "repeat")


def from_text(text: str, vocabulary: Vocabulary, fit: str = "exact") -> Initializer:
  """Rows are the embeddings of `text`'s tokens.

  Args:
    text: the string to embed.
    vocabulary: any object with `.encode(str) -> list[int]`.
    fit: how the n tokens meet a prompt of L rows: "exact" requires n == L; "truncate" keeps
      the first L tokens (n >= L required); "repeat" cycles the tokens to fill L rows (and
      keeps the first L when n > L).
  """
  if fit not in _FITS:
    raise ConfigError(f"from_text: fit must be one of {_FITS}, got {fit!r}")
  tokens = _encode(vocabulary, text, "from_text")
  if not tokens:
    raise ConfigError(f"from_text: text {text!r} tokenizes to no tokens")

  def init(rng: Array, shape: Shape, embedding: Array) -> Array:
    del rng
    rows, embed = _rows(shape, "from_text")
    vocab = _check_table(embedding, embed, "from_text")
    n = len(tokens)
    if (fit == "exact" and n != rows) or (fit == "truncate" and n < rows):
      raise ConfigError(f"from_text: the text has {n} tokens but the prompt has {rows} rows "
                        f"(fit={fit!r}); set the prompt length to {n} or use "
                        f"fit='repeat'" + ("" if n < rows else " or fit='truncate'"))
    if max(tokens) >= vocab:
      raise ConfigError(f"from_text: token id {max(tokens)} is outside the embedding table of "
                        f"{vocab} rows")
    ids = [tokens[i % n] for i in range(rows)]
    table = jnp.asarray(embedding, jnp.float32)
    return jnp.take(table, jnp.asarray(ids), axis=0).reshape(tuple(shape))

  return with_origin(init, f"from_text({text!r}, fit={fit!r})")


def from_array(value: Union[np.ndarray, Any], source: str = "array") -> Initializer:
  """The given array, exactly; the prompt shape must equal its shape.

  Args:
    value: the prompt values ([L, E], or [k, l, E] for SMoP).
    source: a name for error messages (e.g. the file path).
  """
  value = np.asarray(value)
  if not np.issubdtype(value.dtype, np.floating):
    raise ConfigError(f"{source}: prompt values must be floating point, got dtype {value.dtype}")
  if not np.all(np.isfinite(value)):
    raise ConfigError(f"{source}: prompt values contain NaN or infinity")
  value = value.astype(np.float32)

  def init(rng: Array, shape: Shape, embedding: Array) -> Array:
    del rng, embedding
    if tuple(shape) != value.shape:
      raise ConfigError(f"{source}: expected a prompt of shape {tuple(shape)}, found "
                        f"{value.shape}")
    return jnp.asarray(value)

  init.value = value  # read by the trainer: runs starting from arrays of one shape share a trace
  return with_origin(init, source)


def from_file(path: Union[str, os.PathLike]) -> Initializer:
  """A prompt saved with `np.save`, of exactly the prompt's shape ([L, E]; [k, l, E] for SMoP).

  Args:
    path: a local .npy file.
  """
  path = os.path.abspath(os.fspath(path))
  if not os.path.isfile(path):
    raise ConfigError(f"from_file: no prompt file at {path!r}")
  init = from_array(fileio.read_npy(path, "from_file: the prompt file"),
                    source=f"from_file({path!r})")
  return with_origin(init, f"file {path}")


def exported_prompt_path(model_dir: Union[str, os.PathLike],
                         step: Union[int, str, None] = None) -> str:
  """The exported prompt of a run: `<run dir>/prompts/prompt_step_<N>.npy` or `prompt_best.npy`.

  Args:
    model_dir: the source run's directory.
    step: a step number, "best", or None for the latest exported step.
  """
  from spot_jax.run_dir import RunDir  # pylint: disable=g-import-not-at-top
  run_dir = RunDir(model_dir)
  if step is None:
    latest = run_dir.latest_prompt_step()
    if latest is None:
      raise ConfigError("from_checkpoint: no prompts/prompt_step_<N>.npy in "
                        f"{str(run_dir.path)!r}; is it the directory of a finished run?")
    path = run_dir.prompt_path(latest)
  elif (step == "best"
        or (isinstance(step, numbers.Integral) and not isinstance(step, bool) and step >= 0)):
    path = run_dir.prompt_path(step)
  else:
    raise ConfigError(f"from_checkpoint: step must be a non-negative integer, 'best' or None, "
                      f"got {step!r}")
  if not path.is_file():
    raise ConfigError(f"from_checkpoint: no exported prompt at {str(path)!r}")
  return str(path)


def from_checkpoint(model_dir: Union[str, os.PathLike],
                    step: Union[int, str, None] = None) -> Initializer:
  """SPoT transfer: start from the prompt another run exported.

  The trainer exports the *effective* prompt of a run as .npy: the prompt itself for Prompt
  Tuning, the folded prompt P' for Residual Prompt Tuning (so it loads into a PromptTuning of
  the same length; loaded into a ResidualPrompt it is reparameterised again), and SMoP's
  [k, l, E] prompts (the router is not exported, so it loads into an SMoP of the same k and l).

  Args:
    model_dir: the source run's model directory (local path).
    step: a step number, "best" for `prompt_best.npy`, or None for the latest step.
  """
  path = exported_prompt_path(model_dir, step)
  init = from_array(fileio.read_npy(path, "from_checkpoint: the exported prompt"),
                    source=f"from_checkpoint({path!r})")
  return with_origin(init, exported_prompt_origin(path))


def exported_prompt_origin(path: Union[str, os.PathLike]) -> str:
  """"run <dir>, step <N> (prompts/<file>)" for a prompt a run exported; the best prompt names
  the step of the evaluation that chose it when best/metric.json records one."""
  from spot_jax.run_dir import RunDir  # pylint: disable=g-import-not-at-top
  path = os.path.abspath(os.fspath(path))
  run_dir = RunDir(os.path.dirname(os.path.dirname(path)))
  name = os.path.basename(path)
  if name == run_dir.prompt_path("best").name:
    try:
      best = run_dir.best_metric()
    except ConfigError:
      best = None
    step = "best" if best is None else f"best, step {best.step}"
  else:
    step = f"step {name[len('prompt_step_'):-len('.npy')]}"
  return f"run {run_dir.path}, {step} (prompts/{name})"
