"""spot_jax.vocabulary gives seqio's ids and texts without TensorFlow: the real T5 vocabulary
(with and without its 100 sentinels), the embedded toy's, and bytes; encode, decode (EOS cut,
out-of-table ids, sentinels, padding) and the vocabulary size."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import seqio

from spot_jax import embedded, vocabulary
from spot_jax.errors import ConfigError
from tests.helpers import REPO


TEXTS = [
    "", " ", "hello world", "The quick brown fox jumps over the lazy dog.",
    "sst2 sentence: it 's a charming and often affecting journey .",
    "rte sentence1: A man is playing. sentence2: Someone plays. <extra_id_0> x <extra_id_99>",
    "<extra_id_0> at the start and <extra_id_1>ly glued", "jel<extra_id_3> sandwiches",
    "Übergrößenträger naïve café — 日本語のテキスト 🙂", "  leading and trailing  ",
    "tabs\tand\nnewlines", "numbers 12345 67.89 -1e10", "UPPER lower MiXeD", "a" * 300,
    "unknown chars: \u0000 \u200b \ufffd", "sentiment: the movie was great",
]


def _id_rows(size: int, seed: int = 0) -> list[list[int]]:
  """Id sequences with EOS in the middle, padding, sentinels and out-of-table ids."""
  rs = np.random.RandomState(seed)
  rows = [[int(i) for i in rs.randint(0, size + 40, n)] for n in (1, 3, 8, 20, 64)
          for _ in range(6)]
  rows += [[], [0], [1], [2], [0, 0, 5, 1, 7], [size - 1, size - 2, 1, size - 1],
           [size, size + 5, 3], list(range(3, 40)) + [1] + list(range(40, 60))]
  return rows


def _check(ours, theirs, texts, size):
  assert ours.vocab_size == theirs.vocab_size == size
  assert ours.eos_id == theirs.eos_id and ours.unk_id == theirs.unk_id
  for text in texts:
    assert ours.encode(text) == list(theirs.encode(text)), text
  for row in _id_rows(size) + [list(theirs.encode(t)) for t in texts]:
    assert ours.decode(row) == theirs.decode(row), row


@pytest.mark.parametrize("extra_ids", [0, 100])
def test_t5_sentencepiece_matches_seqio(extra_ids, t5_vocab_path):
  ours = vocabulary.SentencePiece(t5_vocab_path, extra_ids)
  theirs = seqio.SentencePieceVocabulary(t5_vocab_path, extra_ids=extra_ids)
  _check(ours, theirs, TEXTS, 32000 + extra_ids)
  if extra_ids:  # sentinels: "<extra_id_0>" is the top id and decodes back to itself
    assert ours.encode("<extra_id_0>")[-1] == 32099
    assert ours.decode([32099, 32098]).split() == ["<extra_id_0>", "<extra_id_1>"]


@pytest.mark.parametrize("extra_ids", [0, 100])
def test_toy_sentencepiece_matches_seqio(extra_ids):
  ours = vocabulary.SentencePiece(embedded.VOCAB_PATH, extra_ids)
  theirs = seqio.SentencePieceVocabulary(embedded.VOCAB_PATH, extra_ids=extra_ids)
  _check(ours, theirs, TEXTS, 178 + extra_ids)


@pytest.mark.parametrize("extra_ids", [0, 5])
def test_bytes_match_seqio(extra_ids):
  _check(vocabulary.Byte(extra_ids), seqio.ByteVocabulary(extra_ids), TEXTS, 259 + extra_ids)
  # A multi-byte character cut in half decodes without it, as seqio's (errors="ignore").
  ids = vocabulary.Byte().encode("é!")
  assert vocabulary.Byte().decode(ids[1:]) == seqio.ByteVocabulary().decode(ids[1:]) == "!"


def test_get_resolves_flags(monkeypatch, tmp_path):
  assert isinstance(vocabulary.get("byte"), vocabulary.Byte)
  toy = vocabulary.get(embedded.VOCAB_PATH)
  assert isinstance(toy, vocabulary.SentencePiece) and toy.extra_ids == 0
  monkeypatch.setenv(vocabulary.T5_VOCAB_ENV, embedded.VOCAB_PATH)
  default = vocabulary.get(None)
  assert default.extra_ids == vocabulary.T5_EXTRA_IDS and default.vocab_size == 278
  with pytest.raises(ConfigError, match=r"^--vocab .*missing.model does not exist; give 'byte'"):
    vocabulary.get(str(tmp_path / "missing.model"))
  (tmp_path / "bad.model").write_bytes(b"\x00\xffnot a model")
  with pytest.raises(ConfigError, match="is not a SentencePiece model"):
    vocabulary.get(str(tmp_path / "bad.model"))
  monkeypatch.setenv(vocabulary.T5_VOCAB_ENV, str(tmp_path / "gone.model"))
  with pytest.raises(ConfigError, match=r"^\$SPOT_JAX_VOCAB .*gone.model does not exist"):
    vocabulary.get(None)


def test_tasks_read_the_same_t5_vocabulary_settings(monkeypatch):
  import tasks  # pylint: disable=import-outside-toplevel
  from tasks import vocab  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv(vocabulary.T5_VOCAB_ENV, embedded.VOCAB_PATH)
  theirs = tasks.get_vocabulary()
  assert theirs.sentencepiece_model_file == vocabulary.t5_path()
  assert theirs.extra_ids == vocabulary.T5_EXTRA_IDS
  monkeypatch.delenv(vocabulary.T5_VOCAB_ENV)
  assert vocab.vocabulary_path() == vocabulary.t5_path() == vocabulary.T5_DEFAULT_PATH


def test_no_tensorflow_import():
  code = ("import sys; from spot_jax import vocabulary, embedded; "
          "v = vocabulary.get(embedded.VOCAB_PATH); v.decode(v.encode('a b')); "
          "vocabulary.get('byte').encode('x'); print('tensorflow' in sys.modules)")
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=REPO, check=True)
  assert out.stdout.strip() == "False"
