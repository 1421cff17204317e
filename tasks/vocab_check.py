"""How a vocabulary spells texts and label words: pieces per text, and the characters it lacks.

`python -m tasks vocab` prints it (docs/tasks.md, "Checking label words against the vocabulary"). A
label word the model must write costs one decoding step per piece, and a character the
vocabulary lacks becomes <unk>, which decodes to nothing: a label holding one can never be
written back as itself.

  vocabulary(name)           "embedded" (the toy T5's), "t5" (tasks.vocab's: $SPOT_JAX_VOCAB or
                             the public file), "byte", or a SentencePiece model file
  spell(vocab, text)         a `Spelling`: the pieces, and which of them are unknown
  text_lines(vocab, texts)   one line per text, then the targets length the longest needs
  file_lines(vocab, ...)     a file's texts summed up: the longest, the costliest words, unknowns
"""
from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any, Optional, Sequence

from spot_jax import vocabulary as vocabulary_lib
from spot_jax.errors import ConfigError
from tasks import user

NAMES = ("embedded", "t5", "byte")
WORDS_SHOWN = 15


@dataclasses.dataclass(frozen=True)
class Spelling:
  """A text as the vocabulary spells it.

  Attributes:
    text: the text.
    pieces: its pieces in order ("▁" marks a word start); an unknown one is the text it covers.
    unknown: the characters of the pieces the vocabulary maps to <unk>, in order, once each.
  """
  text: str
  pieces: tuple[str, ...]
  unknown: tuple[str, ...]

  def shown(self) -> str:
    return " ".join(f"<unk:{p}>" if p in self.unknown else p for p in self.pieces)


def vocabulary(name: str) -> Any:
  """The vocabulary `--vocab` names (see the module docstring); errors are one line."""
  if name == "embedded":
    from spot_jax import embedded  # pylint: disable=g-import-not-at-top
    return vocabulary_lib.SentencePiece(embedded.VOCAB_PATH, vocabulary_lib.T5_EXTRA_IDS)
  if name != "t5" and name != "byte" and "://" not in name and not os.path.isfile(name):
    raise ConfigError(f"--vocab={name}: no such file; give {', '.join(NAMES)} or a SentencePiece "
                      f"model file")
  vocab = vocabulary_lib.get(None if name == "t5" else name)
  if not isinstance(vocab, (vocabulary_lib.SentencePiece, vocabulary_lib.Byte)):
    try:  # a remote file, read through TensorFlow's file systems: read it now
      vocab.tokenizer  # pylint: disable=pointless-statement
    except Exception as e:  # pylint: disable=broad-except
      where = f"${vocabulary_lib.T5_VOCAB_ENV} or " if name == "t5" else ""
      raise ConfigError(f"cannot read the vocabulary {vocab.sentencepiece_model_file} "
                        f"({type(e).__name__}); give {where}--vocab a local copy of the file"
                        ) from None
  return vocab


def describe(name: str, vocab: Any) -> str:
  """"vocabulary embedded (<path>): 178 pieces + 100 sentinels"."""
  if name == "byte":
    return "vocabulary byte: 256 bytes, each one piece"
  path = getattr(vocab, "path", None) or getattr(vocab, "sentencepiece_model_file", name)
  extra = getattr(vocab, "extra_ids", 0) or getattr(vocab, "_extra_ids", 0)
  size = vocab.vocab_size - extra
  label = name if name in NAMES else "file"
  return f"vocabulary {label} ({path}): {size} pieces" + (f" + {extra} sentinels" if extra else "")


def _processor(vocab: Any) -> Any:
  """The sentencepiece processor of a vocabulary (ours, or seqio's for a remote file)."""
  return getattr(vocab, "_sp", None) or vocab.tokenizer


def spell(vocab: Any, text: str) -> Spelling:
  """How `vocab` spells `text` (bytes for the byte vocabulary, which lacks nothing)."""
  if isinstance(vocab, vocabulary_lib.Byte):
    return Spelling(text, tuple(ch for ch in text for _ in ch.encode("utf-8")), ())
  sp = _processor(vocab)
  pieces, ids = sp.EncodeAsPieces(text), sp.EncodeAsIds(text)
  unknown = [p for p, i in zip(pieces, ids) if i == sp.unk_id()]
  return Spelling(text, tuple(pieces), tuple(dict.fromkeys(unknown)))


def _unknown_line(spellings: Sequence[Spelling]) -> str:
  lacking = {s.text: s.unknown for s in spellings if s.unknown}
  if not lacking:
    return "unknown: none (every character is in the vocabulary)"
  shown = ", ".join(f"{t!r} ({' '.join(u)})" for t, u in list(lacking.items())[:WORDS_SHOWN])
  more = f" and {len(lacking) - WORDS_SHOWN} more" if len(lacking) > WORDS_SHOWN else ""
  return (f"unknown: {len(lacking)} text(s) hold characters the vocabulary lacks, read as <unk> "
          f"and never written back: {shown}{more}")


def text_lines(vocab: Any, texts: Sequence[str]) -> list[str]:
  """One line per text (pieces, spelling), the unknown characters, the targets length needed."""
  if not texts:
    raise ConfigError("no text to check; give words (python -m tasks vocab yes no), "
                      "--labels=a,b or --file=PATH")
  spellings = [spell(vocab, t) for t in texts]
  width = max(len(t) for t in texts)
  lines = [f"{'text':{width}s}  pieces  spelled"]
  lines += [f"{s.text:{width}s}  {len(s.pieces):6d}  {s.shown()}" for s in spellings]
  longest = max(len(s.pieces) for s in spellings)
  lines.append(f"longest: {longest} piece{'s' * (longest != 1)}; as targets: "
               f"TASK_FEATURE_LENGTHS['targets'] >= {longest + 1} (EOS included)")
  lines.append(_unknown_line(spellings))
  return lines


def read_texts(path: str, column: Optional[str]) -> list[tuple[str, str]]:
  """(where, text) of each text of a file: a column of a TSV/CSV/JSONL file, or each line."""
  if not os.path.isfile(path):
    raise ConfigError(f"--file={path}: no such file; give a text file (one text a line) or a "
                      f"TSV/CSV/JSONL file with --column")
  name = os.path.basename(path)
  table = path.endswith((".tsv", ".csv", ".jsonl"))
  if column is None and not table:
    with open(path, encoding="utf-8") as f:
      return [(f"{name} line {n}", line.rstrip("\n")) for n, line in enumerate(f, 1)
              if line.strip()]
  if not table:
    raise ConfigError(f"--column applies to .tsv, .csv and .jsonl files, not {name}; drop "
                      f"--column to read one text a line")
  rows = user._rows(path)  # pylint: disable=protected-access
  if column is None:
    columns = ", ".join(dict.fromkeys(str(c) for _, row in rows for c in row))
    raise ConfigError(f"--file={path} is a table; give --column, one of: {columns}")
  texts = []
  for number, row in rows:
    if column not in row:
      raise ConfigError(f"{name} line {number} has no column {column!r} (its columns: "
                        f"{', '.join(map(str, row))}); give --column one of them")
    texts.append((f"{name} line {number}", str(row[column] or "")))
  return texts


def file_lines(vocab: Any, path: str, column: Optional[str] = None) -> list[str]:
  """A file's texts summed up: pieces per text (the longest), distinct words by pieces, unknowns."""
  texts = read_texts(path, column)
  if not texts:
    raise ConfigError(f"--file={path} holds no text; give a file with one text a line")
  lengths = [(len(spell(vocab, text).pieces), where) for where, text in texts]
  longest, where = max(lengths)
  mean = sum(n for n, _ in lengths) / len(lengths)
  counts = collections.Counter(w for _, text in texts for w in text.split())
  words = sorted((spell(vocab, w) for w in counts), key=lambda s: (-len(s.pieces), s.text))
  what = f"column {column!r} of {path}" if column else path
  lines = [f"{what}: {len(texts)} texts, {len(counts)} distinct words",
           f"pieces per text: mean {mean:.1f}, longest {longest} ({where}); as inputs: "
           f"TASK_FEATURE_LENGTHS['inputs'] >= {longest + 1} keeps every text whole (EOS "
           f"included)",
           f"words by pieces (the {min(WORDS_SHOWN, len(words))} costliest of {len(words)}):"]
  width = max(len(s.text) for s in words[:WORDS_SHOWN])
  lines += [f"  {s.text:{width}s}  {len(s.pieces):3d}  {s.shown()}  (x{counts[s.text]})"
            for s in words[:WORDS_SHOWN]]
  lines.append(_unknown_line(words))
  return lines


def label_list(value: str) -> list[str]:
  """--labels=a,b,c as label words (whitespace around each kept out, empties refused)."""
  from spot_jax.cli import flags  # pylint: disable=g-import-not-at-top
  return list(flags.name_list("--labels", value))

