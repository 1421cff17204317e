"""Inputs to serve and the predictions file.

Inputs: a text file (one input per non-empty line), a JSONL file (`.jsonl`/`.json`: one object
per line with "input" and optionally "prompt", "target", "id"), stdin ("-", text or JSONL by
the first character), or a seqio task split (its tokenized inputs and target strings).
Predictions: JSONL written to a temporary file and renamed when complete, so a failed run
leaves no half-written output.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from typing import IO, Any, Iterator, Optional, Sequence

import numpy as np

from spot_jax import fileio, validate, vocabulary
from spot_jax.errors import ConfigError


@dataclasses.dataclass
class Example:
  """One input. `tokens` is set for seqio inputs (already tokenized), else None; `line` is its
  line of the --input file (or stdin), None for task inputs."""
  input: str
  prompt: Optional[str] = None
  target: Optional[str] = None
  id: Any = None
  tokens: Optional[np.ndarray] = None
  line: Optional[int] = None


def read_examples(path: str, stdin: Optional[IO[str]] = None) -> list[Example]:
  """Examples from a text/JSONL file or stdin ("-").

  Raises:
    ConfigError: a missing, unreadable, empty or malformed file (the message names the line).
  """
  where = "stdin" if path == "-" else path
  try:
    if path == "-":
      text = (stdin or sys.stdin).read()
    else:
      with open(path, encoding="utf-8") as f:
        text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    why = getattr(e, "strerror", None) or type(e).__name__
    raise ConfigError(f"cannot read --input {where} ({why}); give a UTF-8 text or JSONL file, "
                      f"or - for stdin") from None
  lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
  if not lines:
    raise ConfigError(f"--input {where} holds no inputs; give one input per line (text) or one "
                      f"JSON object per line with an \"input\" field (JSONL)")
  is_jsonl = path.endswith((".jsonl", ".json")) or (path == "-" and lines[0][1].lstrip()[:1] == "{")
  if not is_jsonl:
    return [Example(line.strip(), line=n) for n, line in lines]
  return [_example(where, n, line) for n, line in lines]


def _example(where: str, n: int, line: str) -> Example:
  try:
    obj = json.loads(line)
  except ValueError as e:
    raise ConfigError(f"{where} line {n} is not valid JSON ({e.msg}); each line must be an object "
                      f"like {{\"input\": \"...\", \"prompt\": \"name\"}}") from None
  if not isinstance(obj, dict) or not isinstance(obj.get("input"), str):
    raise ConfigError(f"{where} line {n} has no string \"input\" field; each line must be an "
                      f"object like {{\"input\": \"...\", \"prompt\": \"name\"}}")
  for key in ("prompt", "target"):
    if obj.get(key) is not None and not isinstance(obj[key], str):
      raise ConfigError(f"{where} line {n}: \"{key}\" must be a string, got {obj[key]!r}")
  return Example(obj["input"], obj.get("prompt"), obj.get("target"), obj.get("id"), line=n)


def task_examples(task_name: str, split: str, input_length: int, module: Optional[str] = None,
                  num_examples: Optional[int] = None) -> tuple[list[Example], Any]:
  """(examples, vocabulary) of a seqio task split; inputs come tokenized as the task makes them."""
  from spot_jax import data as data_lib  # pylint: disable=g-import-not-at-top
  data_lib.import_modules(module)
  task = data_lib.get_mixture_or_task(task_name, split, "--split", ("--task_module", module))
  ds = task.get_dataset({"inputs": input_length, "targets": 512}, split=split, shuffle=False)
  if num_examples:
    ds = ds.take(num_examples)
  vocab = task.output_features["inputs"].vocabulary
  out = []
  for i, ex in enumerate(ds.as_numpy_iterator()):
    text = ex.get("inputs_pretokenized")
    target = ex.get("targets_pretokenized")
    tokens = np.asarray(ex["inputs"], np.int32)[:input_length]
    out.append(Example(text.decode() if text is not None else vocab.decode(tokens.tolist()),
                       target=target.decode() if target is not None else None, id=i,
                       tokens=tokens))
  if not out:
    raise ConfigError(f"task {task_name!r} split {split!r} is empty")
  return out, vocab


def get_vocabulary(name: Optional[str]) -> Any:
  """"byte", a SentencePiece model path, or None for T5's: `spot_jax.vocabulary.get` (no
  TensorFlow; the same ids as seqio's vocabularies)."""
  from spot_jax import vocabulary  # pylint: disable=g-import-not-at-top
  return vocabulary.get(name)


def eos_of(vocab: Any) -> int:
  """The id a vocabulary ends sequences with (T5's and the byte vocabulary's: 1)."""
  eos_id = getattr(vocab, "eos_id", None)
  return eos_id if isinstance(eos_id, int) else 1


def tokenize(vocab: Any, texts: Sequence[str], length: int, eos_id: Optional[int] = None
             ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
  """[N, length] int32 right-padded ids ending in EOS (the vocabulary's unless `eos_id`), their
  validity [N, length] bool, and (index, ids with EOS) of each text that was longer and was
  cut."""
  eos_id = eos_of(vocab) if eos_id is None else eos_id
  rows, truncated = [], []
  for i, text in enumerate(texts):
    ids = list(vocab.encode(text))
    if len(ids) > length - 1:
      truncated.append((i, len(ids) + 1))
      ids = ids[:length - 1]
    rows.append(ids + [eos_id])
  tokens, valid = vocabulary.right_padded(rows, length)
  return tokens, valid, truncated


def label_rows(vocab: Any, labels: Sequence[str], length: int) -> tuple[np.ndarray, np.ndarray]:
  """([N, length] tokens, [N, length] validity) of the --label strings, each checked (empty,
  repeated, too long)."""
  for i, label in enumerate(labels):
    if not label.strip() or label in labels[:i]:
      what = "is empty" if not label.strip() else "repeats an earlier label"
      raise ConfigError(f"--label entry {i} ({label!r}) {what}; give distinct class labels")
  tokens, valid, cut = tokenize(vocab, labels, length)
  if cut:
    i = cut[0][0]
    raise ConfigError(f"--label entry {i} ({labels[i]!r}) is longer than --target_length={length} "
                      f"tokens (EOS included); raise --target_length")
  return tokens, valid


def valid_to_eos(rows: np.ndarray, eos_id: int) -> np.ndarray:
  """[N, S] bool: each decoded row's ids up to and including its first EOS (all of a row that
  has none); what follows the EOS is padding, whatever its id."""
  rows = np.asarray(rows)
  ended = np.cumsum(rows == eos_id, axis=-1)
  return (ended == 0) | ((ended == 1) & (rows == eos_id))


def decode(vocab: Any, ids: np.ndarray, eos_id: int = 1) -> str:
  """Text of a decoded row: its ids up to the first EOS (what follows it is padding; every id
  before it is a token, 0 too: T5's vocabularies decode their pad id 0 to nothing)."""
  row = [int(t) for t in ids]
  if eos_id in row:
    row = row[:row.index(eos_id)]
  return vocab.decode(row)


@contextlib.contextmanager
def atomic_jsonl(path: str) -> Iterator[IO[str]]:
  """A text file at `path` that appears only if the block completes (temp file + rename)."""
  validate.output_file(path, "--output")
  with fileio.atomic_open(path, "w", encoding="utf-8") as f:
    yield f


def truncation_warning(examples: Sequence[Example], cut: Sequence[tuple[int, int]], length: int,
                       where: str, shown: int = 10) -> str:
  """The warning naming each input `tokenize` cut (its line, id and length), so the answers
  that may be wrong can be found."""
  def name(i: int, n: int) -> str:
    ex = examples[i]
    place = f"line {ex.line}" if ex.line is not None else f"input {i + 1}"
    return f"{place}{f' (id {ex.id!r})' if ex.id is not None else ''}: {n} tokens"
  listed = "; ".join(name(i, n) for i, n in cut[:shown])
  more = f"; and {len(cut) - shown} more" if len(cut) > shown else ""
  return (f"warning: {len(cut)} of {len(examples)} inputs of {where} were longer than "
          f"--input_length={length} tokens (EOS included) and were cut, so their answers may be "
          f"wrong: {listed}{more}; --input_length={max(n for _, n in cut)} keeps them whole")
