"""The prompt library on disk.

  <root>/library.json            {"format", "fingerprint", "embed_dim"}: the one frozen model
                                 every entry belongs to (written by the first `add`)
  <root>/entries/<id>.json       one entry: task, run id, seed, fingerprint, score, metric,
                                 shapes and sha256 of its two arrays
  <root>/arrays/<id>.prompt.npy     the best prompt by validation [L, E]
  <root>/arrays/<id>.embedding.npy  the task embedding (the prompt at an early step) [L', E]
  <root>/.lock                   fcntl lock serialising writers

Every file is written to a temporary name and renamed into place; an entry's arrays are written
before its json, which commits it. Writers hold the lock while they check and write, so two
processes adding at once lose nothing, and a refused `add` (wrong embedding size, another frozen
model, unreadable .npy, duplicate id, unknown task) writes nothing. Reading validates every
entry; a corrupt or foreign one is reported and skipped, never used.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import json
import os
import pathlib
from typing import Iterator, Optional

import numpy as np

from spot_jax import fileio
from spot_jax.errors import ConfigError
from spot_jax import backbone as backbone_lib
from spot_jax import validate

FORMAT = "spot_jax.library/1"
ENTRY_FORMAT = "spot_jax.library.entry/1"


@dataclasses.dataclass(frozen=True)
class Entry:
  """One library entry (arrays loaded and checked).

  Attributes:
    id: unique name within the library.
    task: the source task.
    run_id: the training run it came from (its directory name or a given id).
    seed: the run's seed.
    fingerprint: the frozen model's fingerprint.
    score: best validation score of the prompt.
    metric: the metric of `score`.
    embedding_step: the step of the task embedding (None if unknown).
    prompt: best prompt [L, E] float32.
    embedding: task embedding [L', E] float32.
  """
  id: str
  task: str
  run_id: str
  seed: int
  fingerprint: dict
  score: Optional[float]
  metric: str
  embedding_step: Optional[int]
  prompt: np.ndarray
  embedding: np.ndarray


def load_npy(path: str | os.PathLike, what: str) -> np.ndarray:
  """A float [L, E] array from a .npy, or a one-line ConfigError (missing, truncated, pickled)."""
  path = validate.existing_file(path, what, "a .npy prompt file")
  try:
    array = np.load(path, allow_pickle=False)
  except (ValueError, EOFError, OSError) as e:
    raise ConfigError(f"{what} {str(path)!r} is truncated or not a .npy array "
                      f"({str(e).splitlines()[0][:120] if str(e) else type(e).__name__}); "
                      f"give an intact prompt saved by np.save") from None
  if (not isinstance(array, np.ndarray) or array.ndim != 2
      or not np.issubdtype(array.dtype, np.floating)):
    raise ConfigError(f"{what} {str(path)!r} holds a {getattr(array, 'dtype', '?')} array of shape "
                      f"{getattr(array, 'shape', '?')}; a prompt is a float [length, embed] array")
  if not np.all(np.isfinite(array)):
    raise ConfigError(f"{what} {str(path)!r} contains NaN or infinity; give a finite prompt")
  return array.astype(np.float32)


def _npy_bytes(array: np.ndarray) -> bytes:
  buf = io.BytesIO()
  np.save(buf, np.asarray(array, np.float32), allow_pickle=False)
  return buf.getvalue()


class Library:
  """A prompt library directory.

  Attributes:
    root: the library directory.
  """

  def __init__(self, root: str | os.PathLike):
    self.root = pathlib.Path(root)

  # --- paths and locking ---------------------------------------------------------------------

  def _entry_path(self, entry_id: str) -> pathlib.Path:
    return self.root / "entries" / f"{entry_id}.json"

  def _array_path(self, entry_id: str, kind: str) -> pathlib.Path:
    return self.root / "arrays" / f"{entry_id}.{kind}.npy"

  @contextlib.contextmanager
  def _locked(self) -> Iterator[None]:
    self.root.mkdir(parents=True, exist_ok=True)
    with open(self.root / ".lock", "a+b") as lock:
      fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
      try:
        yield
      finally:
        fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

  def header(self) -> Optional[dict]:
    """library.json, or None for a new library; a damaged one is an error."""
    path = self.root / "library.json"
    if not path.is_file():
      return None
    try:
      header = json.loads(path.read_text())
      if header.get("format") != FORMAT:
        raise ValueError(f"format {header.get('format')!r}")
      return header
    except (ValueError, AttributeError) as e:
      raise ConfigError(f"{str(path)!r} is not a spot_jax library header ({e}); give the "
                        f"directory of a library made by `python -m "
                        f"spot_jax.library add`") from None

  # --- writing ---------------------------------------------------------------------------

  def add(self, *, entry_id: str, task: str, run_id: str, seed: int, fingerprint: dict,
          prompt: np.ndarray, embedding: np.ndarray, score: Optional[float], metric: str,
          embedding_step: Optional[int] = None, embed_dim: Optional[int] = None) -> Entry:
    """Adds an entry, or raises a one-line ConfigError and writes nothing.

    Args:
      entry_id: a new id ([A-Za-z0-9][A-Za-z0-9_.-]*).
      task: the task (the caller checks that it is registered).
      run_id: the source run's id.
      seed: its seed.
      fingerprint: its frozen model's fingerprint.
      prompt: best prompt [L, E].
      embedding: task embedding [L', E].
      score: its best validation score.
      metric: the score's metric.
      embedding_step: the embedding's training step.
      embed_dim: the frozen model's embedding size, when known (checked against the arrays).
    """
    if not isinstance(entry_id, str) or not fileio.SAFE_NAME.match(entry_id):
      raise ConfigError(f"entry id {entry_id!r} is not valid; use letters, digits, '_', '.', '-' "
                        f"(starting with a letter or digit, at most 128 characters)")
    prompt, embedding = np.asarray(prompt, np.float32), np.asarray(embedding, np.float32)
    for name, array in (("prompt", prompt), ("embedding", embedding)):
      if array.ndim != 2 or array.shape[0] < 1:
        raise ConfigError(f"the {name} has shape {array.shape}; a prompt is [length, embed]")
    if prompt.shape[1] != embedding.shape[1]:
      raise ConfigError(f"the prompt's embedding size {prompt.shape[1]} differs from the task "
                        f"embedding's {embedding.shape[1]}; give arrays of one frozen model")
    if embed_dim is not None and prompt.shape[1] != embed_dim:
      raise ConfigError(f"the prompt's embedding size is {prompt.shape[1]} but the frozen model's "
                        f"is {embed_dim}; give a prompt trained with this model")
    with self._locked():
      header = self.header()
      if header is not None:
        if not backbone_lib.same_model(header["fingerprint"], fingerprint):
          raise ConfigError(f"the entry was made with another frozen model "
                            f"({backbone_lib.describe(fingerprint)}) than this library's "
                            f"({backbone_lib.describe(header['fingerprint'])}); use a library "
                            f"for that model")
        if prompt.shape[1] != header["embed_dim"]:
          raise ConfigError(f"the prompt's embedding size is {prompt.shape[1]} but this library's "
                            f"is {header['embed_dim']}; give a prompt of its frozen model")
      if self._entry_path(entry_id).exists():
        raise ConfigError(f"entry id {entry_id!r} already exists in {str(self.root)!r}; choose "
                          f"another --id or remove the old entry first")
      if header is None:
        header = {"format": FORMAT, "fingerprint": dict(fingerprint),
                  "embed_dim": int(prompt.shape[1])}
        fileio.atomic_write_bytes(self.root / "library.json", json.dumps(header, indent=1).encode())
      record = {"format": ENTRY_FORMAT, "id": entry_id, "task": task, "run_id": str(run_id),
                "seed": int(seed), "fingerprint": dict(fingerprint),
                "score": None if score is None else float(score), "metric": metric,
                "embedding_step": None if embedding_step is None else int(embedding_step)}
      for kind, array in (("prompt", prompt), ("embedding", embedding)):
        data = _npy_bytes(array)
        fileio.atomic_write_bytes(self._array_path(entry_id, kind), data)
        record[f"{kind}_shape"] = list(array.shape)
        record[f"{kind}_sha256"] = hashlib.sha256(data).hexdigest()
      fileio.atomic_write_bytes(self._entry_path(entry_id), json.dumps(record, indent=1).encode())
    return Entry(id=entry_id, task=task, run_id=str(run_id), seed=int(seed),
                 fingerprint=dict(fingerprint), score=record["score"], metric=metric,
                 embedding_step=record["embedding_step"], prompt=prompt, embedding=embedding)

  def remove(self, entry_id: str) -> None:
    """Removes an entry (its json first, so a crash never leaves a half entry in use)."""
    with self._locked():
      path = self._entry_path(entry_id)
      if not fileio.SAFE_NAME.match(str(entry_id)) or not path.exists():
        raise ConfigError(f"no entry {entry_id!r} in {str(self.root)!r}; valid: "
                          f"{', '.join(self.ids()) or '(the library is empty)'}")
      path.unlink()
      for kind in ("prompt", "embedding"):
        self._array_path(entry_id, kind).unlink(missing_ok=True)

  # --- reading ---------------------------------------------------------------------------

  def ids(self) -> list[str]:
    folder = self.root / "entries"
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []

  def _load_entry(self, path: pathlib.Path, header: dict) -> Entry:
    """One entry, fully checked; ValueError with the reason otherwise."""
    try:
      record = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
      raise ValueError(f"unreadable json ({e})") from None
    if not isinstance(record, dict) or record.get("format") != ENTRY_FORMAT:
      raise ValueError("not a spot_jax library entry")
    if record.get("id") != path.stem:
      raise ValueError(f"its id {record.get('id')!r} does not match the file name")
    if not backbone_lib.same_model(record.get("fingerprint"), header["fingerprint"]):
      raise ValueError(f"foreign: made with another frozen model "
                       f"({backbone_lib.describe(record.get('fingerprint') or {})})")
    arrays = {}
    for kind in ("prompt", "embedding"):
      file = self._array_path(path.stem, kind)
      try:
        data = file.read_bytes()
      except OSError:
        raise ValueError(f"its {kind} file {file.name} is missing") from None
      if hashlib.sha256(data).hexdigest() != record.get(f"{kind}_sha256"):
        raise ValueError(f"its {kind} file {file.name} is corrupt (checksum mismatch)")
      array = np.load(io.BytesIO(data), allow_pickle=False)
      if list(array.shape) != record.get(f"{kind}_shape") or array.shape[-1] != header["embed_dim"]:
        raise ValueError(f"its {kind} has shape {array.shape}, expected "
                         f"{record.get(f'{kind}_shape')}")
      arrays[kind] = array
    return Entry(id=record["id"], task=record["task"], run_id=record["run_id"], seed=record["seed"],
                 fingerprint=record["fingerprint"], score=record["score"], metric=record["metric"],
                 embedding_step=record.get("embedding_step"), prompt=arrays["prompt"],
                 embedding=arrays["embedding"])

  def load(self) -> tuple[list[Entry], list[str]]:
    """(valid entries sorted by id, one problem line per skipped entry)."""
    header = self.header()
    if header is None:
      return [], []
    entries, problems = [], []
    for entry_id in self.ids():
      path = self._entry_path(entry_id)
      try:
        entries.append(self._load_entry(path, header))
      except (ValueError, KeyError, TypeError, OSError) as e:
        problems.append(f"skipped entry {path.name}: {e}")
    return entries, problems

  def get(self, entry_id: str) -> Entry:
    header = self.header()
    path = self._entry_path(entry_id)
    if header is None or not fileio.SAFE_NAME.match(str(entry_id)) or not path.is_file():
      raise ConfigError(f"no entry {entry_id!r} in {str(self.root)!r}; valid: "
                        f"{', '.join(self.ids()) or '(the library is empty)'}")
    try:
      return self._load_entry(path, header)
    except (ValueError, KeyError, TypeError, OSError) as e:
      raise ConfigError(f"entry {entry_id!r} is unusable: {e}; remove it and "
                        "add it again") from None
