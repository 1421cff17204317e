"""Training streams read once per process: a stream one job read is replayed to the next job.

`train_batches` is deterministic in its configuration, so two jobs of one process that train
the same (task, seed, lengths, batch size) read the same batches. The embedded demo's five
target jobs all read the same 20 streams (each method's run of seed s shares seed s's data
order), and building a seqio pipeline and pulling its batches cost about a tenth of such a
job. `replayed_train_batches` keeps the batches a reader pulled (up to `BUDGET_BYTES` for the
whole process) and gives them to the next reader of the same stream; a reader that goes past
them opens its own pipeline at that position, exactly as a resumed run does. Nothing about the
batches changes: a replayed stream is the stream.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Iterator

import numpy as np

from spot_jax.data import pipeline

# What the process keeps at most (a demo keeps about 10 MB; past the budget streams are read
# without being kept).
BUDGET_BYTES = 256 << 20


@dataclasses.dataclass
class _Kept:
  source: Any  # the seqio task or mixture read (kept alive, so its id names it)
  batches: list = dataclasses.field(default_factory=list)


_kept: dict[tuple, _Kept] = {}
_kept_bytes = 0
_lock = threading.Lock()


def _key(cfg: pipeline.DatasetConfig, source: Any) -> tuple:
  fields = dataclasses.asdict(cfg)
  fields["task_feature_lengths"] = tuple(sorted((k, int(v)) for k, v in
                                                cfg.task_feature_lengths.items()))
  fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
  # The registered object, not only its name: a task registered again is another stream.
  return (id(source),) + tuple(sorted(fields.items()))


def clear() -> None:
  """Forgets every kept stream."""
  global _kept_bytes
  with _lock:
    _kept.clear()
    _kept_bytes = 0


def kept_bytes() -> int:
  return _kept_bytes


def replayed_train_batches(cfg: pipeline.DatasetConfig, start_position: int = 0
                           ) -> Iterator[dict[str, np.ndarray]]:
  """`pipeline.train_batches(cfg, start_position=...)` (whole batches, one host's view of all
  rows), replaying what an earlier reader of the same stream in this process pulled."""
  global _kept_bytes
  pipeline.validate(cfg)
  pipeline.import_modules(cfg.module)
  source = pipeline.get_mixture_or_task(cfg.mixture_or_task_name)
  key = _key(cfg, source)
  with _lock:
    kept = _kept.setdefault(key, _Kept(source))
  position, live = start_position, None
  while True:
    if position < len(kept.batches):
      yield dict(kept.batches[position])  # a copy of the dict: readers pop their own keys
      position += 1
      continue
    if live is None:
      live = pipeline.train_batches(cfg, start_position=position)
    batch = next(live)
    size = sum(np.asarray(v).nbytes for v in batch.values())
    with _lock:
      if position == len(kept.batches) and _kept_bytes + size <= BUDGET_BYTES:
        kept.batches.append(dict(batch))
        _kept_bytes += size
    yield batch
    position += 1
