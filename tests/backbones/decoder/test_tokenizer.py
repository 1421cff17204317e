"""Decoder tokenizers: a SentencePiece model and HF tokenizer.json files built here, round trips,
the special ids of an HF directory, and the refusal of a tokenizer larger than the table."""
from __future__ import annotations

import json
import types

import pytest

from spot_jax.backbones.decoder import tokenizer as tokenizer_lib
from spot_jax.errors import ConfigError

LINES = ["the quick brown fox jumps over the lazy dog", "hello world, this is a test",
         "soft prompts for frozen decoder models", "numbers 123 and symbols !?"] * 25
TEXT = "hello world, the lazy fox"
SPECIALS = ["<pad>", "</s>", "<s>", "<unk>"]  # ids 0..3, as the SentencePiece model below


@pytest.fixture(scope="module")
def sp_path(tmp_path_factory) -> str:
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  prefix = tmp_path_factory.mktemp("sp") / "tiny"
  spm.SentencePieceTrainer.train(sentence_iterator=iter(LINES), model_prefix=str(prefix),
                                 vocab_size=80, model_type="bpe", pad_id=0, eos_id=1, bos_id=2,
                                 unk_id=3, hard_vocab_limit=False, minloglevel=2)
  return f"{prefix}.model"


def _bpe_tokenizer():
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(LINES, trainer)
  return tok


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """An HF model directory: a BPE tokenizer.json, tokenizer_config naming the tokens and a
  generation_config with a second EOS id (as chat models have)."""
  folder = tmp_path_factory.mktemp("hf_tok")
  _bpe_tokenizer().save(str(folder / "tokenizer.json"))
  (folder / "tokenizer_config.json").write_text(json.dumps(
      {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "pad_token": "<pad>",
       "unk_token": "<unk>"}))
  (folder / "generation_config.json").write_text(json.dumps(
      {"bos_token_id": 2, "eos_token_id": [1, 7]}))
  return folder


def test_sentencepiece_round_trip_and_ids(sp_path):
  tok = tokenizer_lib.load_tokenizer(sp_path)
  assert isinstance(tok, tokenizer_lib.SentencePieceTokenizer)
  assert (tok.pad_id, tok.eos_id, tok.bos_id, tok.unk_id) == (0, 1, 2, 3)
  assert tok.vocab_size == 80
  ids = tok.encode(TEXT)
  assert ids and tok.bos_id not in ids and tok.eos_id not in ids
  assert tok.encode(TEXT, add_bos=True) == [tok.bos_id] + ids
  assert tok.decode(ids) == TEXT
  # BOS and padding vanish, the text ends at the first EOS, out-of-table ids are UNK.
  assert tok.decode([tok.bos_id] + ids + [tok.eos_id] + ids + [0, 0]) == TEXT
  assert tok.decode(ids + [10_000]) == tok.decode(ids + [tok.unk_id])


def test_hf_directory_reads_the_special_ids_of_its_files(hf_dir):
  tok = tokenizer_lib.load_tokenizer(str(hf_dir))
  assert isinstance(tok, tokenizer_lib.HFTokenizer)
  assert (tok.pad_id, tok.eos_id, tok.bos_id, tok.unk_id) == (0, 1, 2, 3)
  assert tok.eos_ids == (1, 7)  # tokenizer_config's first, then generation_config's others
  assert tok.vocab_size == 300
  ids = tok.encode(TEXT)
  assert tok.decode(ids) == TEXT
  assert tok.encode(TEXT, add_bos=True) == [2] + ids
  assert tok.decode([2] + ids + [7] + ids) == TEXT  # the second EOS id ends the text too
  assert tokenizer_lib.load_tokenizer(str(hf_dir / "tokenizer.json")).eos_ids == (1, 7)


def test_word_level_tokenizer_json_alone(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  words = ["<unk>", "hello", "world", "fox"]
  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  path = tmp_path / "words.json"
  tok.save(str(path))
  loaded = tokenizer_lib.load_tokenizer(str(path))
  assert loaded.encode("hello fox world") == [1, 3, 2]
  assert loaded.vocab_size == 4 and loaded.bos_id is None and loaded.pad_id is None
  with pytest.raises(ConfigError, match="defines no BOS token; encode with add_bos=False"):
    loaded.encode("hello", add_bos=True)


def test_check_matches_refuses_a_larger_vocabulary(sp_path, hf_dir):
  sp = tokenizer_lib.load_tokenizer(sp_path)
  hf = tokenizer_lib.load_tokenizer(str(hf_dir))
  tokenizer_lib.check_matches(sp, types.SimpleNamespace(vocab_size=80))
  tokenizer_lib.check_matches(sp, types.SimpleNamespace(vocab_size=128))  # a padded table
  with pytest.raises(ConfigError) as info:
    tokenizer_lib.check_matches(hf, types.SimpleNamespace(vocab_size=256))
  message = str(info.value)
  assert "\n" not in message
  assert "has 300 ids but the model's embedding table has 256 rows" in message
  assert "at most 256 ids" in message


@pytest.mark.parametrize("name, expected", [
    ("missing.model", "does not exist"),
    ("not_a_model.model", "is not a SentencePiece model"),
    ("broken.json", "cannot read the tokenizer"),
    ("empty_dir", "holds no tokenizer; give a directory with tokenizer.json or tokenizer.model"),
])
def test_unreadable_tokenizers_are_one_line(tmp_path, name, expected):
  (tmp_path / "not_a_model.model").write_bytes(b"\x00garbage")
  (tmp_path / "broken.json").write_text("{")
  (tmp_path / "empty_dir").mkdir()
  with pytest.raises(ConfigError) as info:
    tokenizer_lib.load_tokenizer(str(tmp_path / name))
  assert expected in str(info.value) and "\n" not in str(info.value)


def test_a_directory_written_by_transformers(tmp_path):
  transformers = pytest.importorskip("transformers")
  reference = transformers.PreTrainedTokenizerFast(
      tokenizer_object=_bpe_tokenizer(), bos_token="<s>", eos_token="</s>", pad_token="<pad>",
      unk_token="<unk>")
  reference.save_pretrained(str(tmp_path))
  tok = tokenizer_lib.load_tokenizer(str(tmp_path))
  assert (tok.pad_id, tok.eos_id, tok.bos_id, tok.unk_id) == (0, 1, 2, 3)
  assert tok.encode(TEXT) == reference.encode(TEXT, add_special_tokens=False)
  ids = tok.encode(TEXT, add_bos=True)
  assert tok.decode(ids + [1, 0]) == reference.decode(ids, skip_special_tokens=True) == TEXT


def test_a_task_in_the_models_own_tokenizer(hf_dir):
  """tasks.vocab.TokenizerVocabulary: a seqio task tokenized by an HF tokenizer.json gives the
  tokenizer's ids and its EOS, in tf.data as in Python; the decoder-only batches hold them."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import seqio  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from spot_jax import data  # pylint: disable=g-import-not-at-top
  from tasks.vocab import TokenizerVocabulary  # pylint: disable=g-import-not-at-top
  vocab = TokenizerVocabulary(str(hf_dir))
  tok = tokenizer_lib.load_tokenizer(str(hf_dir))
  assert vocab.vocab_size == 300 and vocab.eos_id == 1
  assert vocab.encode(TEXT) == tok.encode(TEXT) and vocab.decode(tok.encode(TEXT)) == TEXT
  assert vocab.encode_tf(tf.constant(TEXT)).numpy().tolist() == tok.encode(TEXT)
  pairs = [("hello world", "yes"), ("the lazy dog", "no")] * 8
  name = "test_hf_tokenizer_task"
  seqio.TaskRegistry.remove(name)
  features = {k: seqio.Feature(vocab, add_eos=True) for k in ("inputs", "targets")}

  def source(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    return tf.data.Dataset.from_tensor_slices({"inputs": [p[0] for p in pairs],
                                               "targets": [p[1] for p in pairs]})

  seqio.TaskRegistry.add(
      name, seqio.FunctionDataSource(source, splits=["train"]),
      preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
      output_features=features)
  cfg = data.DatasetConfig(name, {"inputs": 8, "targets": 4}, batch_size=2, shuffle=False,
                           feature_layout="decoder_only")
  batch = next(data.train_batches(cfg))
  row = batch["decoder_target_tokens"][0].tolist()
  want = tok.encode("hello world") + [1] + tok.encode("yes") + [1]
  assert row[:len(want)] == want and not any(row[len(want):])
  weights = np.asarray(batch["decoder_loss_weights"][0])
  assert weights.tolist()[:len(want)] == [0] * (len(want) - len(tok.encode("yes")) - 1) + [1] * (
      len(tok.encode("yes")) + 1)

