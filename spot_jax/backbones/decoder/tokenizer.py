"""Tokenizers of decoder-only models, without TensorFlow or transformers at run time.

Two kinds, one face (the method names of `spot_jax.vocabulary`, plus what a decoder needs):

  SentencePieceTokenizer  a SentencePiece `.model` file (Llama 2, Gemma) through `sentencepiece`
  HFTokenizer             a Hugging Face `tokenizer.json` through the `tokenizers` package; the
                          BOS/EOS/PAD ids come from `tokenizer_config.json`, then
                          `generation_config.json`, then `config.json` beside it

Both have `encode(text, add_bos=False) -> ids`, `decode(ids) -> text`, `bos_id`, `eos_id`,
`eos_ids` (every id that ends a sequence), `pad_id`, `unk_id` and `vocab_size` (one more than
the largest id). `decode` follows `spot_jax.vocabulary`: ids outside the tokenizer's table become
UNK (dropped when it has none), the ids are cut at the first end id, and special tokens
vanish. `load_tokenizer(path)` takes a `.model` file, a `tokenizer.json` or a model directory.
`check_matches(tokenizer, config)` refuses a tokenizer with more ids than the embedding table.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Optional, Sequence

from spot_jax.errors import ConfigError

# Where an HF model directory records its special tokens, most specific first.
_ID_FILES = ("tokenizer_config.json", "generation_config.json", "config.json")


def _clean(ids: Iterable[int], size: int, unk_id: Optional[int],
           end_ids: Sequence[int]) -> list[int]:
  """Out-of-table ids -> UNK (or dropped), cut before the first end id (an end id may be an
  ordinary token, e.g. generation_config's second EOS, whose text must not show)."""
  clean = []
  for i in ids:
    i = int(i)
    if i in end_ids:
      break
    if not 0 <= i < size:
      if unk_id is None:
        continue  # nothing to show it as; a padded embedding table's rows have no text
      i = unk_id
    clean.append(i)
  return clean


class SentencePieceTokenizer:
  """A SentencePiece model file.

  Attributes:
    path: the model file.
    vocab_size: the model's pieces.
    bos_id, eos_id, unk_id: the model's ids (None when it defines none).
    pad_id: the model's pad id, else its EOS id (what HF's `generate` pads with): padding sits
      after the end and is never attended to, so any id works.
  """

  def __init__(self, path: str):
    import sentencepiece  # pylint: disable=g-import-not-at-top
    path = os.fspath(path)
    try:
      with open(path, "rb") as f:
        proto = f.read()
    except OSError as e:
      raise ConfigError(f"cannot read the tokenizer {path} ({e.strerror}); give a SentencePiece "
                        f".model file, a tokenizer.json or a Hugging Face model directory"
                        ) from None
    self._sp = sentencepiece.SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(proto)
    except Exception:  # pylint: disable=broad-except  (sentencepiece raises RuntimeError/OSError)
      raise ConfigError(f"{path} is not a SentencePiece model; give a .model file made by "
                        f"sentencepiece, or a tokenizer.json") from None
    self.path = path
    self.vocab_size = self._sp.GetPieceSize()
    self.bos_id, self.eos_id, self.unk_id = (_defined(self._sp.bos_id()),
                                             _defined(self._sp.eos_id()),
                                             _defined(self._sp.unk_id()))
    pad = _defined(self._sp.pad_id())
    self.pad_id = self.eos_id if pad is None else pad
    self.eos_ids = () if self.eos_id is None else (self.eos_id,)

  def encode(self, text: str, add_bos: bool = False) -> list[int]:
    """Ids of `text`, with the BOS id first when `add_bos`; never an EOS."""
    return _with_bos(self._sp.EncodeAsIds(text), add_bos, self.bos_id, self.path)

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` up to the first EOS; BOS, EOS and PAD decode to nothing."""
    return self._sp.DecodeIds(_clean(ids, self.vocab_size, self.unk_id, self.eos_ids))

  def __repr__(self) -> str:
    return f"SentencePieceTokenizer({self.path!r})"


class HFTokenizer:
  """A Hugging Face `tokenizer.json`, with the special ids of the directory it came from.

  Attributes:
    path: the tokenizer.json file.
    vocab_size: one more than the largest id, added tokens included.
    bos_id, eos_id, unk_id: None when neither the tokenizer nor its directory names one.
    eos_ids: every id that ends a sequence (generation_config's list, e.g. Llama 3 chat's).
    pad_id: the named pad id, else the EOS id (as `SentencePieceTokenizer.pad_id`).
  """

  def __init__(self, path: str, bos_id: Optional[int] = None, eos_ids: Sequence[int] = (),
               pad_id: Optional[int] = None, unk_id: Optional[int] = None):
    import tokenizers  # pylint: disable=g-import-not-at-top
    path = os.fspath(path)
    try:
      self._tok = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # pylint: disable=broad-except  (tokenizers raises its own Exception)
      why = "it does not exist" if not os.path.exists(path) else str(e).splitlines()[0]
      raise ConfigError(f"cannot read the tokenizer {path} ({why}); give the tokenizer.json of a "
                        f"Hugging Face model, or a SentencePiece .model file") from None
    self.path = path
    vocab = self._tok.get_vocab(with_added_tokens=True)
    self.vocab_size = max(vocab.values(), default=-1) + 1
    self.bos_id, self.unk_id = bos_id, unk_id
    self.eos_ids = tuple(dict.fromkeys(int(i) for i in eos_ids))
    self.eos_id = self.eos_ids[0] if self.eos_ids else None
    self.pad_id = self.eos_id if pad_id is None else pad_id

  @classmethod
  def from_directory(cls, directory: str) -> "HFTokenizer":
    """The tokenizer.json of an HF model directory with the special ids its files name."""
    import tokenizers  # pylint: disable=g-import-not-at-top
    path = os.path.join(directory, "tokenizer.json")
    vocab = tokenizers.Tokenizer.from_file(path).get_vocab(with_added_tokens=True) \
        if os.path.isfile(path) else {}
    ids = _special_ids(directory, vocab)
    return cls(path, bos_id=ids["bos"], eos_ids=ids["eos"], pad_id=ids["pad"], unk_id=ids["unk"])

  def encode(self, text: str, add_bos: bool = False) -> list[int]:
    """Ids of `text` (the tokenizer's own template is not applied), BOS first when `add_bos`."""
    ids = self._tok.encode(text, add_special_tokens=False).ids
    return _with_bos(ids, add_bos, self.bos_id, self.path)

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` up to the first end id; special tokens decode to nothing."""
    clean = _clean(ids, self.vocab_size, self.unk_id, self.eos_ids)
    return self._tok.decode(clean, skip_special_tokens=True)

  def __repr__(self) -> str:
    return f"HFTokenizer({self.path!r})"


Tokenizer = SentencePieceTokenizer | HFTokenizer


def _defined(i: int) -> Optional[int]:
  return None if i < 0 else int(i)  # sentencepiece says -1 for an id it does not define


def _with_bos(ids: list[int], add_bos: bool, bos_id: Optional[int], path: str) -> list[int]:
  if not add_bos:
    return list(ids)
  if bos_id is None:
    raise ConfigError(f"the tokenizer {path} defines no BOS token; encode with add_bos=False")
  return [bos_id] + list(ids)


def _special_ids(directory: str, vocab: dict[str, int]) -> dict[str, Any]:
  """{"bos", "pad", "unk": id or None, "eos": [ids]} from the directory's JSON files.

  tokenizer_config.json names tokens (strings or {"content": ...}) and wins; the other files
  name ids. Every EOS id of every file is kept: chat models stop on several.
  """
  found: dict[str, Any] = {"bos": None, "pad": None, "unk": None, "eos": []}
  for name in _ID_FILES:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
      continue
    try:
      with open(path, encoding="utf-8") as f:
        data = json.load(f)
    except (OSError, ValueError) as e:
      raise ConfigError(f"cannot read {path} ({e}); give the file as the model came with it, "
                        "or remove it") from None
    if not isinstance(data, dict):
      continue
    for kind in found:
      if name == "tokenizer_config.json":
        token = data.get(f"{kind}_token")
        token = token.get("content") if isinstance(token, dict) else token
        ids = [vocab[token]] if isinstance(token, str) and token in vocab else []
      else:
        value = data.get(f"{kind}_token_id")
        ids = value if isinstance(value, list) else [] if value is None else [value]
      if kind == "eos":
        found["eos"] += [int(i) for i in ids]
      elif found[kind] is None and ids:
        found[kind] = int(ids[0])
  return found


def load_tokenizer(path: str) -> Tokenizer:
  """The tokenizer at `path`: a SentencePiece `.model` file, a `tokenizer.json`, or a model
  directory (its tokenizer.json with the special ids of its config files, else its
  tokenizer.model).

  Raises:
    ConfigError: `path` is none of those, or cannot be read.
  """
  path = os.fspath(path)
  if os.path.isdir(path):
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
      return HFTokenizer.from_directory(path)
    if os.path.isfile(os.path.join(path, "tokenizer.model")):
      return SentencePieceTokenizer(os.path.join(path, "tokenizer.model"))
    raise ConfigError(f"{path} holds no tokenizer; give a directory with tokenizer.json or "
                      f"tokenizer.model, or the file itself")
  if path.endswith(".json"):
    directory = os.path.dirname(path) or "."
    if os.path.basename(path) == "tokenizer.json":
      return HFTokenizer.from_directory(directory)
    return HFTokenizer(path)
  if not os.path.exists(path):
    raise ConfigError(f"the tokenizer {path} does not exist; give a SentencePiece .model file, a "
                      f"tokenizer.json or a Hugging Face model directory")
  return SentencePieceTokenizer(path)


def check_matches(tokenizer: Tokenizer, config: Any) -> None:
  """Refuses a tokenizer with ids the model's embedding table has no row for.

  A smaller tokenizer is fine: tables are often padded (Gemma 2's has 256128 rows for 256000
  tokens).

  Raises:
    ConfigError: one line naming both sizes.
  """
  rows = int(config.vocab_size)
  if tokenizer.vocab_size > rows:
    raise ConfigError(f"the tokenizer {tokenizer.path} has {tokenizer.vocab_size} ids but the "
                      f"model's embedding table has {rows} rows (vocab_size={rows}); use the "
                      f"tokenizer that came with the checkpoint (at most {rows} ids)")
