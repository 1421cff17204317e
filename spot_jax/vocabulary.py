"""Vocabularies for serving text without TensorFlow: seqio's encode/decode, id for id.

seqio's vocabularies import TensorFlow (about 3-5 s of a process's start), but serving a file of
text only needs Python-side tokenization. These two classes give exactly what
`seqio.SentencePieceVocabulary` and `seqio.ByteVocabulary` give from their Python methods
(tests/core/test_vocabulary.py checks both on the real T5 vocabulary and the toy's):

  SentencePiece  the model file through the `sentencepiece` package; `extra_ids` sentinels are
                 added to the model as seqio adds them (user-defined pieces "▁<extra_id_N>",
                 numbered from the top of the table down), so "<extra_id_0>" in a text encodes
                 to the last id and decodes back to its text.
  Byte           UTF-8 bytes shifted by 3 (0 pad, 1 EOS, 2 UNK), as ByT5.

`decode` follows seqio's `Vocabulary.decode`: ids at or above the table size become UNK, the ids
are cut after the first EOS, then decoded (pad, EOS and, for bytes, UNK and sentinels, vanish).

`get` resolves a `--vocab` value: "byte", a local SentencePiece file (no sentinels, as
`seqio.SentencePieceVocabulary(path)`), or the T5 vocabulary (`$SPOT_JAX_VOCAB` with
T5_EXTRA_IDS sentinels, as `tasks.get_vocabulary()`). A remote path ("gs://...") needs
TensorFlow's file system: those go through seqio.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from spot_jax.errors import ConfigError

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
# The T5 vocabulary of `tasks` (tasks/vocab.py reads these): its path is $SPOT_JAX_VOCAB, else
# the public file, with 100 sentinel ids.
T5_VOCAB_ENV = "SPOT_JAX_VOCAB"
T5_DEFAULT_PATH = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
T5_EXTRA_IDS = 100


def _clean(ids: Iterable[int], table_size: int, eos_id: int) -> list[int]:
  """seqio's Vocabulary.decode before `_decode`: out-of-table ids -> UNK, cut after the EOS."""
  clean = [UNK_ID if int(i) >= table_size else int(i) for i in ids]
  if eos_id in clean:
    clean = clean[:clean.index(eos_id) + 1]
  return clean


class SentencePiece:
  """A SentencePiece model file, with seqio's sentinel ids.

  Attributes:
    path: the model file.
    extra_ids: sentinels appended to the table ("<extra_id_0>" is the last id).
    vocab_size: the model's pieces plus the sentinels.
  """

  def __init__(self, path: str, extra_ids: int = 0):
    import sentencepiece  # pylint: disable=g-import-not-at-top
    from sentencepiece import sentencepiece_model_pb2 as model_pb2  # pylint: disable=g-import-not-at-top
    try:
      with open(path, "rb") as f:
        proto = model_pb2.ModelProto.FromString(f.read())
    except OSError as e:
      raise ConfigError(f"cannot read the vocabulary {path} ({e.strerror}); give a SentencePiece "
                        f"model file") from None
    except Exception:  # pylint: disable=broad-except  (protobuf's DecodeError)
      raise ConfigError(f"{path} is not a SentencePiece model; give a .model file made by "
                        f"sentencepiece (or --vocab=byte)") from None
    user_defined = model_pb2.ModelProto.SentencePiece.USER_DEFINED
    for i in reversed(range(extra_ids)):  # seqio's reverse_extra_ids=True
      proto.pieces.add(piece=f"\u2581<extra_id_{i}>", score=0.0, type=user_defined)
    self._sp = sentencepiece.SentencePieceProcessor()
    self._sp.LoadFromSerializedProto(proto.SerializeToString())
    self.path, self.extra_ids = path, extra_ids
    self.vocab_size = self._sp.GetPieceSize()

  @property
  def eos_id(self) -> int:
    return self._sp.eos_id()

  @property
  def unk_id(self) -> int:
    return self._sp.unk_id()

  def encode(self, text: str) -> list[int]:
    """Ids of `text`, without EOS."""
    return self._sp.EncodeAsIds(text)

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` up to the first EOS."""
    return self._sp.DecodeIds(_clean(ids, self.vocab_size, self.eos_id))

  def __repr__(self) -> str:
    return f"SentencePiece({self.path!r}, extra_ids={self.extra_ids})"


class Byte:
  """UTF-8 bytes as ids 3..258 (seqio.ByteVocabulary).

  Attributes:
    extra_ids: sentinel ids after the 259 (they decode to nothing).
    vocab_size: 259 + extra_ids.
  """
  _SPECIAL, _BYTES = 3, 256
  eos_id, unk_id = EOS_ID, UNK_ID

  def __init__(self, extra_ids: int = 0):
    self.extra_ids = extra_ids
    self.vocab_size = self._SPECIAL + self._BYTES + extra_ids

  def encode(self, text: str) -> list[int]:
    return [b + self._SPECIAL for b in text.encode("utf-8")]

  def decode(self, ids: Iterable[int]) -> str:
    top = self._SPECIAL + self._BYTES
    data = bytes(i - self._SPECIAL for i in _clean(ids, top, self.eos_id)
                 if self._SPECIAL <= i < top)
    return data.decode("utf-8", errors="ignore")

  def __repr__(self) -> str:
    return f"Byte(extra_ids={self.extra_ids})"


def right_padded(rows: Sequence[Sequence[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
  """[N, width] int32 ids right-padded with 0 and their validity [N, width] bool: padding is
  marked by the mask, never by an id (a decoder's tokenizer may give "!" id 0)."""
  tokens = np.zeros((len(rows), width), np.int32)
  valid = np.zeros((len(rows), width), bool)
  for i, ids in enumerate(rows):
    tokens[i, :len(ids)], valid[i, :len(ids)] = ids, True
  return tokens, valid


def t5_path() -> str:
  """The T5 vocabulary's path: `$SPOT_JAX_VOCAB`, else the public file."""
  return os.environ.get(T5_VOCAB_ENV) or T5_DEFAULT_PATH


def get(name: Optional[str]) -> Any:
  """The vocabulary a `--vocab` value names.

  Args:
    name: "byte"; a SentencePiece model path (no sentinels); or None for the T5 vocabulary
      (`t5_path()` with T5_EXTRA_IDS sentinels).

  Returns:
    A `Byte` or `SentencePiece`, or a seqio vocabulary for a remote ("scheme://") path.

  Raises:
    ConfigError: a local path that does not exist or is no SentencePiece model.
  """
  if name == "byte":
    return Byte()
  path, extra_ids = (name, 0) if name else (t5_path(), T5_EXTRA_IDS)
  if "://" in path:
    import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow's file systems)
    return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)
  if not os.path.isfile(path):
    where = "--vocab" if name else f"${T5_VOCAB_ENV}"
    raise ConfigError(f"{where} {path} does not exist; give 'byte' or a SentencePiece model file")
  return SentencePiece(path, extra_ids)

