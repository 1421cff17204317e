"""`python -m tasks vocab`: the pieces a vocabulary spells words with, and the characters it lacks.

Checked against the toy T5's SentencePiece model itself (the `sentencepiece` package, not our
code): every count printed is the length of its encoding, every unknown character encodes to
the unknown id, and the targets length printed holds the longest label plus EOS.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import sentencepiece

from spot_jax import embedded
from spot_jax.errors import ConfigError
from tasks import vocab_check
from tests.helpers import REPO

WORDS = ["yes", "no", "colour", "yellow", "good", "café"]


@pytest.fixture(scope="module")
def toy_sp():
  sp = sentencepiece.SentencePieceProcessor()
  sp.Load(embedded.VOCAB_PATH)
  return sp


def _rows(lines: list[str]) -> dict[str, int]:
  """{text: pieces} from the table of `text_lines` (header first, then one row a text)."""
  rows = {}
  for line in lines[1:]:
    found = re.match(r"^(\S+)\s+(\d+)  ", line)
    if found is None:
      break
    rows[found[1]] = int(found[2])
  return rows


def test_command_prints_each_words_pieces_and_the_unknown_ones(tmp_path, toy_sp):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  proc = subprocess.run([sys.executable, "-m", "tasks", "vocab", *WORDS[:3],
                         f"--labels={','.join(WORDS[3:])}"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and proc.stderr == "", proc.stderr
  lines = proc.stdout.splitlines()
  assert lines[0].startswith("vocabulary embedded (") and "100 sentinels" in lines[0]
  rows = _rows(lines[1:])
  assert rows == {w: len(toy_sp.EncodeAsIds(w)) for w in WORDS}
  assert rows["yes"] == 4 and rows["colour"] == 5 and rows["good"] == 1
  longest = max(rows.values())
  assert f"TASK_FEATURE_LENGTHS['targets'] >= {longest + 1}" in proc.stdout
  assert toy_sp.unk_id() in toy_sp.EncodeAsIds("é")
  unknown = [line for line in lines if line.startswith("unknown:")]
  assert unknown == [unknown[0]] and "'café' (é)" in unknown[0] and "'yes'" not in unknown[0]


def test_file_column_summary_matches_the_model(tmp_path, toy_sp):
  data = tmp_path / "train.tsv"
  texts = ["text: the soup was good", "text: the café was awful", "text: a very long yellow film"]
  data.write_text("review\trating\n" + "".join(f"{t}\tpositive\n" for t in texts))
  vocab = vocab_check.vocabulary("embedded")
  lines = vocab_check.file_lines(vocab, str(data), "review")
  pieces = [len(toy_sp.EncodeAsIds(t)) for t in texts]
  longest_line = 2 + pieces.index(max(pieces))
  words = {w for t in texts for w in t.split()}
  assert lines[0] == f"column 'review' of {data}: 3 texts, {len(words)} distinct words"
  assert f"longest {max(pieces)} (train.tsv line {longest_line})" in lines[1]
  assert f"TASK_FEATURE_LENGTHS['inputs'] >= {max(pieces) + 1}" in lines[1]
  costliest = re.match(r"^  (\S+)\s+(\d+)  ", lines[3])
  assert int(costliest[2]) == max(len(toy_sp.EncodeAsIds(w)) for w in words)
  assert "'café' (é)" in lines[-1]


def test_other_vocabularies_and_refusals(tmp_path):
  byte = vocab_check.vocabulary("byte")
  assert _rows(vocab_check.text_lines(byte, ["café", "no"])) == {"café": 5, "no": 2}
  as_file = vocab_check.vocabulary(embedded.VOCAB_PATH)  # the file itself: no sentinels
  assert vocab_check.describe(embedded.VOCAB_PATH, as_file).startswith("vocabulary file (")
  assert (vocab_check.spell(as_file, "colour")
          == vocab_check.spell(vocab_check.vocabulary("embedded"), "colour"))
  with pytest.raises(ConfigError, match=r"--vocab=nope.model: no such file; give embedded, t5"):
    vocab_check.vocabulary("nope.model")
  table = tmp_path / "t.jsonl"
  table.write_text('{"question": "is it?", "answer": "yes"}\n')
  with pytest.raises(ConfigError, match=r"is a table; give --column, one of: question, answer$"):
    vocab_check.file_lines(byte, str(table))
  with pytest.raises(ConfigError, match=r"t.jsonl line 1 has no column 'label'"):
    vocab_check.file_lines(byte, str(table), "label")
  with pytest.raises(ConfigError, match=r"entry 1 is empty"):
    vocab_check.label_list("yes,,no")
