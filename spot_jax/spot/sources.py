"""Library prompts as constants of a prompt method: ATTEMPT's sources, MPT's teachers.

`library_prompts` stacks library entries' best prompts into one [N, L, E] float32 array, chosen
one of three ways (gin calls it, e.g. `SOURCES = @sources.library_prompts()`):

  references  "LIBRARY_DIR#ENTRY_ID" strings (as `infer --prompt` takes them)
  retrieval   a `spot_jax.retrieve` report (<output_dir>/retrieval-<key>.json): a strategy's chosen
              entries, or the top `k` of its ranking
  tasks       for each task name, the entry of that task with the best score (MPT's teachers:
              row k is task k's, in the order of TASK_NAMES)

All entries come from libraries of one frozen model (each library records its own) and must
share [L, E]; the backbone they are used with must be that model (serve checks it with the
fingerprint; a training run cannot see its backbone's fingerprint from gin, so it checks only
the width, when the prompt module is built).
"""
from __future__ import annotations

import json
import pathlib
from typing import Optional, Sequence

import numpy as np

from spot_jax import backbone as backbone_lib
from spot_jax.errors import ConfigError
from spot_jax.spot.library import Entry, Library

SEPARATOR = "#"


def _by_reference(reference: str) -> Entry:
  root, sep, entry_id = str(reference).rpartition(SEPARATOR)
  if not sep or not root or not entry_id:
    raise ConfigError(f"library reference {reference!r} is malformed; give LIBRARY_DIR#ENTRY_ID")
  return Library(root).get(entry_id)


def _from_retrieval(library: str, report_path: str, strategy: Optional[str],
                    k: Optional[int]) -> list[Entry]:
  try:
    report = json.loads(pathlib.Path(report_path).read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    raise ConfigError(f"{report_path} is not a readable retrieval report ({type(e).__name__}); "
                      f"give a retrieval-<key>.json that `python -m "
                      f"spot_jax.retrieve` wrote") from None
  lib = Library(library)
  if strategy is not None:
    results = {r.get("strategy"): r for r in report.get("results", [])}
    if strategy not in results:
      raise ConfigError(f"{report_path} has no strategy {strategy!r}; valid: "
                        f"{', '.join(sorted(map(str, results))) or '(none)'}")
    ids = list(results[strategy].get("chosen", []))
  else:
    ids = [r["id"] for r in report.get("ranking", [])]
  if k is not None:
    if not isinstance(k, int) or k < 1:
      raise ConfigError(f"k={k!r}; give a positive number of entries")
    ids = ids[:k]
  if not ids:
    raise ConfigError(f"{report_path} chose no library entries (strategy {strategy!r}); give a "
                      f"strategy that chose some, or strategy=None for the ranking")
  return [lib.get(i) for i in ids]


def _best_of_tasks(library: str, tasks: Sequence[str]) -> list[Entry]:
  entries, _ = Library(library).load()
  chosen = []
  for task in tasks:
    of_task = [e for e in entries if e.task == task]
    if not of_task:
      known = sorted({e.task for e in entries})
      raise ConfigError(f"library {library!r} has no entry of task {task!r}; its tasks: "
                        f"{', '.join(known) or '(none)'}")
    chosen.append(max(of_task, key=lambda e: (e.score is not None, e.score or 0.0, e.id)))
  return chosen


def library_prompts(library: Optional[str] = None, references: Sequence[str] = (),
                    retrieval: Optional[str] = None, strategy: Optional[str] = None,
                    k: Optional[int] = None, tasks: Sequence[str] = ()) -> np.ndarray:
  """The best prompts of the chosen library entries, stacked: [N, L, E] float32.

  Args:
    library: the library directory (for `retrieval` and `tasks`).
    references: "LIBRARY_DIR#ENTRY_ID" strings.
    retrieval: a retrieval report; `strategy` picks its chosen entries (None: the ranking),
      `k` keeps the first k.
    strategy, k: see `retrieval`.
    tasks: one entry per task, the best-scoring one, in this order.

  Raises:
    ConfigError: none or several ways given, an unknown entry or task, entries of different
      shapes or of different frozen models.
  """
  ways = [bool(references), retrieval is not None, bool(tasks)]
  if sum(ways) != 1:
    raise ConfigError("library_prompts: give exactly one of references (LIBRARY_DIR#ID, ...), "
                      "retrieval (a retrieval-<key>.json) or tasks (task names)")
  if (retrieval is not None or tasks) and not library:
    raise ConfigError("library_prompts: retrieval and tasks need the library directory (library=)")
  if isinstance(references, str) or isinstance(tasks, str):
    raise ConfigError("library_prompts: references and tasks are lists, e.g. ['/lib#mnli.p0']")
  if references:
    entries = [_by_reference(r) for r in references]
  elif retrieval is not None:
    entries = _from_retrieval(library, retrieval, strategy, k)
  else:
    entries = _best_of_tasks(library, tasks)
  shapes = {e.prompt.shape for e in entries}
  if len(shapes) != 1:
    raise ConfigError(f"library entries {[e.id for e in entries]} have prompts of shapes "
                      f"{sorted(shapes)}; the stacked prompts must share [L, E]")
  first = entries[0]
  for e in entries[1:]:
    if not backbone_lib.same_model(e.fingerprint, first.fingerprint):
      raise ConfigError(f"library entries {first.id!r} and {e.id!r} were trained against "
                        f"different frozen models; give entries of one model")
  return np.stack([e.prompt for e in entries]).astype(np.float32)
