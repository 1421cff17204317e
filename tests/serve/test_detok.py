"""Streamed text equals the whole decode: random ids (partial UTF-8 bytes, ids that decode to
nothing, out-of-table ids, end ids) in random chunks through `detok.Detokenizer` and through
the OpenAI surface's `Choice.delta` (stop strings cut as the whole text cut at the first one),
for each vocabulary kind served: SentencePiece (T5's with sentinels, the toy decoder's), Byte,
and a Llama-3-style Hugging Face tokenizer.json."""
from __future__ import annotations

import numpy as np
import pytest

from spot_jax import embedded, vocabulary
from spot_jax.backbones.decoder import tokenizer as tokenizer_lib
from spot_jax.serve.http import detok, generation, openai
from spot_jax.serve.model import inputs
from tests.helpers import bang_token

TEXTS = ["héllo wörld", "€ 5 – ok", "日本語のテキスト", "emoji 🙂🚀 done", "a  b\tc\nd", "!!no!"]
SEQUENCES = 60


@pytest.fixture(scope="module", params=["t5", "toy_decoder", "byte", "hf"])
def vocab(request, tmp_path_factory):
  """(vocabulary, EOS id) of one served kind."""
  if request.param == "t5":
    path = request.getfixturevalue("t5_vocab_path")
    v = vocabulary.SentencePiece(path, extra_ids=vocabulary.T5_EXTRA_IDS)
    return v, v.eos_id
  if request.param == "toy_decoder":
    v = tokenizer_lib.load_tokenizer(embedded.DECODER_VOCAB_PATH)
    return v, v.eos_id
  if request.param == "byte":
    return vocabulary.Byte(extra_ids=3), vocabulary.EOS_ID
  folder = bang_token.write_tokenizer(tmp_path_factory.mktemp("hf"))
  v = tokenizer_lib.HFTokenizer.from_directory(str(folder))
  return v, v.eos_id


def _ids(vocab, eos_id: int, rs: np.random.RandomState) -> list[int]:
  """Random pieces of text (multi-byte characters cut anywhere), random ids (out of the table
  too), the end id now and then (what follows it is padding)."""
  ids: list[int] = []
  while len(ids) < rs.randint(1, 60):
    kind = rs.randint(4)
    if kind == 0:
      text = TEXTS[rs.randint(len(TEXTS))]
      ids += vocab.encode(text[rs.randint(len(text)):])
    elif kind == 1 and isinstance(vocab, vocabulary.Byte):
      ids += [b + 3 for b in "日🙂é".encode()[rs.randint(9):]]
    elif kind == 2 and rs.rand() < 0.1:
      ids.append(eos_id)
    else:
      ids += [int(i) for i in rs.randint(0, vocab.vocab_size + 4, size=rs.randint(1, 4))]
  return ids


def _chunks(ids: list[int], rs: np.random.RandomState):
  i = 0
  while i < len(ids):
    n = rs.randint(1, 6)
    yield ids[i:i + n]
    i += n


def test_concatenated_text_is_the_whole_decode(vocab):
  v, eos = vocab
  rs = np.random.RandomState(0)
  for _ in range(SEQUENCES):
    ids = _ids(v, eos, rs)
    whole = inputs.decode(v, np.asarray(ids, np.int32), eos)
    d = detok.Detokenizer(v, eos)
    engine_text = openai.engine_text(v, eos)
    seen: list[int] = []
    for chunk in _chunks(ids, rs):
      d.extend(chunk)
      seen += chunk
      so_far = inputs.decode(v, np.asarray(seen, np.int32), eos)
      assert d.peek() == so_far == engine_text(seen), seen
      assert whole.startswith(d.text), (ids, d.text, whole)
      assert not d.text.endswith("\ufffd") or whole.startswith(d.text)
    assert d.finish() == whole, ids
    assert d.redecodes == 0, ids  # the offsets method held: no whole decode was needed


def _gen(stop: tuple[str, ...]) -> generation.Generation:
  return generation.Generation(model="p", tokens=[[3]], texts=["x"], chat=False, echo=False,
                               stream=True, max_tokens=64, temperature=0.0, top_p=1.0, top_k=0,
                               seed=0, n=1, stop=stop, logprobs=None, include_usage=False)


@pytest.mark.parametrize("stop", [(), ("o",), ("ö", "!!"), ("ld", "テキ", "🙂")])
def test_streamed_deltas_are_the_whole_decode_cut_at_the_first_stop(vocab, stop):
  v, eos = vocab
  rs = np.random.RandomState(1)
  for _ in range(SEQUENCES):
    ids = _ids(v, eos, rs)
    whole = inputs.decode(v, np.asarray(ids, np.int32), eos)
    cuts = [whole.find(s) for s in stop if s in whole]
    expected = whole[:min(cuts)] if cuts else whole
    choice = openai.Choice(0, "", v, _gen(stop), eos)
    streamed = ""
    for chunk in _chunks(ids, rs):
      choice.ids.extend(chunk)
      streamed += choice.delta()
      assert expected.startswith(streamed), (ids, streamed, expected)
    choice.finish = "length"
    streamed += choice.delta()
    assert streamed == expected == choice.text(), ids
