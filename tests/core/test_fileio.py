"""fileio: files and folders that appear whole or not at all, and output folders checked."""
import os

import pytest

from spot_jax import fileio
from spot_jax.errors import ConfigError


def test_atomic_open_keeps_the_previous_file_when_the_block_fails(tmp_path):
  target = tmp_path / "out.json"
  target.write_text("previous")
  with pytest.raises(RuntimeError):
    with fileio.atomic_open(target, "w", encoding="utf-8") as f:
      f.write("half")
      raise RuntimeError("stop")
  assert target.read_text() == "previous" and os.listdir(tmp_path) == ["out.json"]
  with fileio.atomic_open(target, "w", encoding="utf-8") as f:
    f.write("new")
  assert target.read_text() == "new" and os.listdir(tmp_path) == ["out.json"]


def test_writable_dir_creates_the_folder_or_says_why_not_in_one_line(tmp_path):
  assert fileio.writable_dir(tmp_path / "a" / "b", "--output_dir") == tmp_path / "a" / "b"
  assert (tmp_path / "a" / "b").is_dir() and os.listdir(tmp_path / "a" / "b") == []
  (tmp_path / "plain.txt").write_text("x")
  with pytest.raises(ConfigError, match=r"^--output_dir '.*plain.txt' is a file, not a directory; "
                                        r"give a directory"):
    fileio.writable_dir(tmp_path / "plain.txt", "--output_dir")
  with pytest.raises(ConfigError,
                     match=r"^--output_dir '.*plain.txt/r' is not writable \(Not a directory\)"):
    fileio.writable_dir(tmp_path / "plain.txt" / "r", "--output_dir")
  assert (tmp_path / "plain.txt").read_text() == "x"


def test_creatable_dir_checks_what_writable_dir_would_refuse_and_makes_nothing(tmp_path):
  before = sorted(tmp_path.rglob("*"))
  assert fileio.creatable_dir(tmp_path / "a" / "b", "OUTPUT_DIR") == tmp_path / "a" / "b"
  assert fileio.creatable_dir(tmp_path, "OUTPUT_DIR") == tmp_path
  assert sorted(tmp_path.rglob("*")) == before  # neither folder nor probe left
  (tmp_path / "plain.txt").write_text("x")
  for path in (tmp_path / "plain.txt", tmp_path / "plain.txt" / "r" / "s"):
    with pytest.raises(ConfigError, match=r"^OUTPUT_DIR '.*' cannot be a directory"):
      fileio.creatable_dir(path, "OUTPUT_DIR")
    with pytest.raises(ConfigError):
      fileio.writable_dir(path, "OUTPUT_DIR")
  if os.path.isdir("/proc/self"):
    with pytest.raises(ConfigError, match=r"^OUTPUT_DIR '/proc/self/x' is not writable"):
      fileio.creatable_dir("/proc/self/x", "OUTPUT_DIR")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt"]
