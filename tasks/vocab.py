"""The T5 vocabulary and the output features every spot-jax task uses; `TokenizerVocabulary`
for tasks in a decoder-only model's own tokenizer.

The vocabulary path is `$SPOT_JAX_VOCAB` when set, else the public T5 path
`gs://t5-data/vocabs/cc_all.32000/sentencepiece.model`. Registration never reads
the file: the tasks hold a `DeferredVocabulary` that looks the path up only when
a dataset is first tokenized, so setting `SPOT_JAX_VOCAB` after `import tasks`
still works (tests rely on this, whatever the import order).

Attributes:
  DEFAULT_VOCAB_PATH: the public T5 SentencePiece model (cc_all.32000).
  VOCAB_ENV: environment variable that overrides the vocabulary path.
  EXTRA_IDS: number of sentinel ids appended to the vocabulary (T5 uses 100).
"""
from __future__ import annotations

from typing import Mapping

import seqio

from spot_jax import vocabulary as _serving_vocabulary

# One owner of these settings: spot_jax.vocabulary (which serves text without seqio).
DEFAULT_VOCAB_PATH = _serving_vocabulary.T5_DEFAULT_PATH
VOCAB_ENV = _serving_vocabulary.T5_VOCAB_ENV
EXTRA_IDS = _serving_vocabulary.T5_EXTRA_IDS


def vocabulary_path() -> str:
  """Returns the SentencePiece model path: `$SPOT_JAX_VOCAB` or the public T5 one."""
  return _serving_vocabulary.t5_path()


class TokenizerVocabulary(seqio.Vocabulary):
  """A decoder-only model's own tokenizer as a seqio vocabulary, for tasks in its ids: a Hugging
  Face `tokenizer.json` (Llama 3, Qwen) or a model directory holding one with its special ids,
  or a SentencePiece `.model` (Gemma's works with `seqio.SentencePieceVocabulary` too).

  EOS is the tokenizer's (its directory's `generation_config.json` first); inside tf.data the
  tokenizer runs through `tf.py_function`. Every id is a token (Llama 3's "!" is 0): the
  decoder-only pipeline records validity before padding (`decoder_target_valid`).
  """

  def __init__(self, path: str):
    from spot_jax.backbones.decoder import tokenizer  # pylint: disable=g-import-not-at-top
    from spot_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
    self.path = path
    self._tokenizer = tokenizer.load_tokenizer(path)
    if self._tokenizer.eos_id is None:
      raise ConfigError(f"the tokenizer {path} names no end-of-sequence id; give a model "
                        f"directory whose tokenizer_config.json or generation_config.json names "
                        f"one")
    super().__init__(extra_ids=0)

  @property
  def eos_id(self) -> int:
    return int(self._tokenizer.eos_id)

  @property
  def unk_id(self):
    return self._tokenizer.unk_id

  @property
  def _base_vocab_size(self) -> int:
    return int(self._tokenizer.vocab_size)

  def _encode(self, s: str) -> list[int]:
    return list(self._tokenizer.encode(s))

  def _decode(self, ids) -> str:
    return self._tokenizer.decode([int(i) for i in ids])

  def _encode_tf(self, s):
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    ids = tf.py_function(lambda x: np.asarray(self._encode(x.numpy().decode("utf-8")), np.int32),
                         [s], tf.int32)
    ids.set_shape([None])
    return ids

  def _decode_tf(self, ids):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    text = tf.py_function(lambda x: self._decode(x.numpy().tolist()), [ids], tf.string)
    text.set_shape([])
    return text

  def __eq__(self, other) -> bool:
    return isinstance(other, TokenizerVocabulary) and other.path == self.path

  def __hash__(self) -> int:
    return hash(("TokenizerVocabulary", self.path))


def get_vocabulary() -> seqio.SentencePieceVocabulary:
  """Returns the T5 vocabulary (32,000 pieces + 100 sentinels), loaded lazily.

  Returns:
    `seqio.SentencePieceVocabulary(vocabulary_path(), extra_ids=100)`; the file is
    read on first use, not here.
  """
  return seqio.SentencePieceVocabulary(vocabulary_path(), extra_ids=EXTRA_IDS)


class DeferredVocabulary(seqio.SentencePieceVocabulary):
  """A `SentencePieceVocabulary` whose path is looked up when it is first loaded.

  Until the model is loaded, `sentencepiece_model_file` follows
  `vocabulary_path()`; from the first load on it is frozen to the file read.
  It compares equal to any `SentencePieceVocabulary` with the same file and ids.
  """

  def __init__(self, extra_ids: int = EXTRA_IDS):
    super().__init__(sentencepiece_model_file="", extra_ids=extra_ids)
    self._sentencepiece_model_file = None

  @property
  def sentencepiece_model_file(self) -> str:
    return self._sentencepiece_model_file or vocabulary_path()

  def _model_context(self):
    if self._model is None and self._sentencepiece_model_file is None:
      self._sentencepiece_model_file = vocabulary_path()
    return super()._model_context()

  def __setstate__(self, state):
    super().__setstate__(state)
    if self._model is None:
      # An unpickled copy resolves the path again in its own process.
      self._sentencepiece_model_file = None

  def _key(self) -> tuple:
    return (self.sentencepiece_model_file, self._extra_ids,
            self._reverse_extra_ids, self._normalizer_spec_overrides)

  def __eq__(self, other):
    if not isinstance(other, seqio.SentencePieceVocabulary):
      return False
    other_key = (other.sentencepiece_model_file, other._extra_ids,  # pylint: disable=protected-access
                 other._reverse_extra_ids, other._normalizer_spec_overrides)  # pylint: disable=protected-access
    return self._key() == other_key

  def __hash__(self):
    return hash((self._extra_ids, self._reverse_extra_ids))

  def __str__(self) -> str:
    return f"DeferredVocabulary(file={self.sentencepiece_model_file}, extra_ids={self._extra_ids})"


_VOCABULARY = DeferredVocabulary()


def output_features() -> Mapping[str, seqio.Feature]:
  """The "inputs"/"targets" features shared by every task (same vocab, EOS added)."""
  return {
      "inputs": seqio.Feature(vocabulary=_VOCABULARY, add_eos=True, required=False),
      "targets": seqio.Feature(vocabulary=_VOCABULARY, add_eos=True),
  }
