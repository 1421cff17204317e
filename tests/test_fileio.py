"""fileio: output files checked before the work, and files that appear whole or not at all."""
import os

import pytest

from spot_jax import fileio
from spot_jax.errors import ConfigError


def test_output_file_accepts_a_new_or_existing_file_and_leaves_it_alone(tmp_path):
  assert fileio.output_file(tmp_path / "new.json", "--json") == tmp_path / "new.json"
  assert not (tmp_path / "new.json").exists()
  (tmp_path / "old.json").write_text("kept")
  fileio.output_file(tmp_path / "old.json", "--json")
  assert (tmp_path / "old.json").read_text() == "kept"
  assert sorted(os.listdir(tmp_path)) == ["old.json"]  # the probe is gone


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing" / "x.json", "missing' does not exist; give a file in an existing directory"),
    (lambda d: d, "is a directory; give a file path"),
    (lambda d: d / "plain.txt" / "x.json", "plain.txt' is not a directory"),
])
def test_output_file_rejects_in_one_line_naming_the_flag(tmp_path, make, message):
  (tmp_path / "plain.txt").write_text("x")
  with pytest.raises(ConfigError) as e:
    fileio.output_file(make(tmp_path), "--markdown")
  text = str(e.value)
  assert text.startswith("--markdown ") and message in text and "\n" not in text
  assert not (tmp_path / "missing").exists()


def test_output_file_rejects_a_folder_that_takes_no_files():
  if not os.path.isdir("/proc/self"):
    pytest.skip("needs /proc, a folder where nobody (root included) can create files")
  with pytest.raises(ConfigError, match=r"^--json '/proc/self/x.json': cannot write in '/proc/self' "):
    fileio.output_file("/proc/self/x.json", "--json")


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
  with pytest.raises(ConfigError, match=r"^--output_dir '.*plain.txt' is a file, not a directory; give a directory"):
    fileio.writable_dir(tmp_path / "plain.txt", "--output_dir")
  with pytest.raises(ConfigError, match=r"^--output_dir '.*plain.txt/r' is not writable \(Not a directory\)"):
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
