"""Dynamic batching: one thread owns the model and runs queued requests of any prompts together.

Requests arrive already checked (see `api`), as `Work`: rows of token ids, each naming its
prompt. The loop takes the oldest request and every later one of the same kind and setting
(decoding at one temperature and top-k, or scoring one label set), up to `max_batch` rows, once
`max_batch` rows wait or the oldest has waited `max_wait` seconds. It pads the rows to the
smallest length bucket that holds the longest (no longer than a DePT prompt's offset in the
batch) and the batch to a batch-size bucket, copying its first row, so a few shapes serve
every mix of prompts; then one mixed forward pass, and each request gets its rows back.

The queue holds at most `max_queue` requests; beyond that `submit` raises `QueueFull`. A
request cancelled while it waits (its client went away, its time ran out) is dropped before it
reaches a batch. `stop` stops taking requests and returns once every accepted one is answered.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import threading
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from spot_jax import vocabulary
from spot_jax.serve.scheduler import follow

Done = Callable[[Any], None]  # called once with the result, or with an Exception


class QueueFull(Exception):
  """The queue holds `max_queue` requests; retry after `retry_after` seconds."""

  def __init__(self, retry_after: int):
    super().__init__(f"the request queue is full; retry after {retry_after} s")
    self.retry_after = retry_after


class Stopping(Exception):
  """The service is shutting down and takes no new requests."""


class PromptGone(Exception):
  """The prompt a request named was removed before its batch ran."""


@dataclasses.dataclass(eq=False)
class Work:
  """One request's rows.

  Attributes:
    kind: "generate" or "classify".
    key: rows of one key share a batch: the decoding setting, or the label strings.
    names: each row's prompt.
    tokens: each row's ids (EOS included, no padding).
    done: receives a list of per-row results (generate: (ids [S], score); classify: [C] log
      likelihoods) or an Exception.
    labels: classify's label token rows [C, S], label_valid their validity [C, S] bool (both
      given: an id 0 may be a real token).
    enqueued: time.monotonic() at submission.
  """
  kind: str
  key: Any
  names: Sequence[str]
  tokens: Sequence[np.ndarray]
  done: Done
  labels: Optional[np.ndarray] = None
  label_valid: Optional[np.ndarray] = None
  enqueued: float = dataclasses.field(default_factory=time.monotonic)

  @property
  def rows(self) -> int:
    return len(self.names)


def bucket(buckets: Sequence[int], n: int) -> Optional[int]:
  """The smallest of sorted `buckets` >= n, or None."""
  i = bisect.bisect_left(buckets, n)
  return buckets[i] if i < len(buckets) else None


class Batcher:
  """The batching loop (see the module docstring).

  Attributes:
    catalog: the served prompts and their servers: `.table` (names, `offset_lengths()`) and
      `.snapshot(key)` -> (table, server), as `catalog.Catalog` has (torch peers have their own).
    max_batch: rows per forward pass; max_wait: seconds the oldest request waits for company.
    max_queue: requests waiting at most.
    batch_buckets, length_buckets: the padded batch sizes and input lengths (sorted).
    observe: called after each batch as observe(kind, rows, padded_rows, seconds, results).
    mirror: a `follow.Mirror`: other processes repeat each forward pass (on a pod).
    batches: forward passes run.
  """

  def __init__(self, catalog: Any, *, max_batch: int, max_wait: float, max_queue: int,
               batch_buckets: Sequence[int], length_buckets: Sequence[int],
               observe: Optional[Callable[..., None]] = None, mirror: Any = None):
    self.catalog, self.max_batch, self.max_wait, self.max_queue = (catalog, max_batch, max_wait,
                                                                    max_queue)
    self.batch_buckets, self.length_buckets = sorted(batch_buckets), sorted(length_buckets)
    self.observe = observe or (lambda *args: None)
    self.mirror = mirror or follow.Mirror(False)
    self.batches, self.seconds_per_batch = 0, 0.0
    self._queue: collections.deque[Work] = collections.deque()
    self._cond = threading.Condition()
    self._stopping = self._flushing = False
    self._thread = threading.Thread(target=self._loop, name="spot_jax.serve batcher", daemon=True)

  def start(self) -> None:
    self._thread.start()

  def depth(self) -> int:
    """Requests waiting."""
    return len(self._queue)

  def submit(self, work: Work) -> None:
    """Queues `work`.

    Raises:
      QueueFull: `max_queue` requests wait already.
      Stopping: after `stop`.
    """
    with self._cond:
      if self._stopping:
        raise Stopping()
      if len(self._queue) >= self.max_queue:
        passes = len(self._queue) / self.max_batch + 1  # at least, when every batch is full
        raise QueueFull(max(1, int(np.ceil(passes * max(self.seconds_per_batch, 0.05)))))
      self._queue.append(work)
      self._cond.notify_all()

  def cancel(self, work: Work) -> bool:
    """Drops `work` if it still waits (True); False once its batch has started."""
    with self._cond:
      try:
        self._queue.remove(work)
      except ValueError:
        return False
      return True

  def flush(self) -> None:
    """From now on, runs whatever waits at once instead of waiting `max_wait` for company."""
    with self._cond:
      self._flushing = True
      self._cond.notify_all()

  def stop(self, timeout: Optional[float] = None) -> None:
    """Takes no new requests; returns when every queued one has run."""
    with self._cond:
      self._stopping = True
      self._cond.notify_all()
    if self._thread.is_alive():
      self._thread.join(timeout)

  def _loop(self) -> None:
    while True:
      batch = self._next_batch()
      if batch is None:
        return
      self._run(batch)

  def _next_batch(self) -> Optional[list[Work]]:
    """The next batch's requests (removed from the queue); None once stopped and drained."""
    with self._cond:
      while True:
        if not self._queue:
          if self._stopping:
            return None
          self._cond.wait()
          continue
        first = self._queue[0]
        waiting = sum(w.rows for w in self._queue if w.key == first.key and w.kind == first.kind)
        left = first.enqueued + self.max_wait - time.monotonic()
        if waiting >= self.max_batch or left <= 0 or self._stopping or self._flushing:
          batch = self._take(first)
          for w in batch:
            self._queue.remove(w)
          return batch
        self._cond.wait(left)

  def _take(self, first: Work) -> list[Work]:
    """The oldest requests like `first` that fit one batch together."""
    offsets = self.catalog.table.offset_lengths()
    batch, rows, longest, cap = [], 0, 0, None
    for w in self._queue:
      if w.kind != first.kind or w.key != first.key or rows + w.rows > self.max_batch:
        continue
      need = max(longest, *(len(t) for t in w.tokens))
      caps = [c for c in (cap, *(offsets.get(n) for n in w.names)) if c]
      new_cap = min(caps) if caps else None
      if batch and self._width(need, new_cap) is None:
        continue  # a DePT row's offset is shorter than this request's input: a later batch
      batch.append(w)
      rows, longest, cap = rows + w.rows, need, new_cap
    return batch

  def _width(self, longest: int, cap: Optional[int]) -> Optional[int]:
    """The padded input length for rows of `longest` ids, at most `cap` (None: no width)."""
    buckets = self.length_buckets if cap is None else sorted(
        {b for b in self.length_buckets if b <= cap} | {cap})
    return bucket(buckets, longest)

  def _run(self, batch: list[Work]) -> None:
    start = time.monotonic()
    kind, key = batch[0].kind, batch[0].key
    setting = key if kind == "generate" else ("greedy", 0.0, 0)
    with self.mirror.turn():  # the table and the call, in the order every process sees them
      table, server = self.catalog.snapshot(setting)
      known = set(table.names)
      ready = []
      for w in batch:
        if all(n in known for n in w.names):
          ready.append(w)
        else:
          w.done(PromptGone(next(n for n in w.names if n not in known)))
      if not ready:
        return
      count = sum(w.rows for w in ready)
      names, rows, valid = self._pad(ready, table.offset_lengths())
      meta = {"key": list(setting), "names": names, "index": self.batches}
      try:
        if kind == "generate":
          self.mirror.send(follow.GENERATE, meta, [rows, valid])
          out, scores = server.generate(names, rows, self.batches, valid=valid)
          results = list(zip(out, scores))
        else:
          labels, label_valid = ready[0].labels, ready[0].label_valid
          self.mirror.send(follow.CLASSIFY, meta, [rows, valid, labels, label_valid])
          results = list(server.classify(names, rows, labels, valid=valid,
                                         label_valid=label_valid))
      except Exception as e:  # pylint: disable=broad-except  (every request hears of it)
        for w in ready:
          w.done(e)
        return
    self.batches += 1
    seconds = time.monotonic() - start
    self.seconds_per_batch = 0.8 * self.seconds_per_batch + 0.2 * seconds
    at = 0
    for w in ready:
      w.done(results[at:at + w.rows])
      at += w.rows
    self.observe(kind, count, len(names), seconds, results[:count])

  def _pad(self, ready: list[Work], offsets: dict[str, int]
           ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The batch's prompt names, token rows [size, width] padded to the buckets (extra rows
    repeat the first, so they end when it does) and their validity [size, width] bool (the
    padding is marked, never read from an id)."""
    names = [n for w in ready for n in w.names]
    tokens = [t for w in ready for t in w.tokens]
    caps = [offsets[n] for n in names if offsets.get(n)]
    width = self._width(max(len(t) for t in tokens), min(caps) if caps else None)
    size = bucket(self.batch_buckets, len(names)) or len(names)
    rows, valid = vocabulary.right_padded(
        [tokens[i] if i < len(tokens) else tokens[0] for i in range(size)], width)
    return names + [names[0]] * (size - len(names)), rows, valid
