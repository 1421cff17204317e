"""Continuous batching: iteration-level scheduling of decoder-only generation over fixed slots.

One thread owns the slots (`model.slots`). Each cycle it (1) frees the slots of cancelled
sequences, (2) prefills every waiting sequence that fits a free slot, oldest first, in one
compiled call per kind (from the prompts' cached prefixes, or with their prompts), padded to a
batch bucket (powers of two up to S) and the longest member's length bucket, and inserts their
rows, (3) starts ONE compiled call of K decode steps (`decode_steps`) over all S slots, whatever
their prompts and sampling settings, (4) while it runs, hands the first tokens and the previous
cycle's tokens to their sequences' `emit` callbacks (the host's work hides behind the
device's) and, with a `prefill_device` of its own, prefills arrivals there at once (and step
(2)'s sequences too, after the call started, when slots were decoding), (5) books
the call's tokens: a sequence that ends inside the call drops its later tokens and frees its
slot for the next cycle. Compiled shapes: one prefill per (kind, batch bucket, length bucket),
one insert per batch bucket, one decode call (and one prefix computation), whatever the mix.

`submit` refuses with `QueueFull` once `max_queue` sequences wait, and with `Stopping` after
`close`; `stop` returns once every accepted sequence has finished.

Driven over HTTP by `python -m spot_jax.serve --engine=continuous --slots=S`; without HTTP (a
benchmark): `engine = Engine(catalog, slots=S, length_buckets=[...], max_tokens=N,
max_queue=Q, decode_steps=K)`, `engine.warm()`, `engine.start()`, then
`engine.submit([Sequence(name, ids, n, emit)])`, `emit` hearing ("token", id, logprob, top_ids,
top_logprobs) per token and ("end", reason) last; `engine.stop()`.
"""
from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time
from typing import Any, Optional, Sequence as Seq

import jax
import numpy as np

from spot_jax import vocabulary
from spot_jax.serve.scheduler.batcher import PromptGone, QueueFull, Stopping, bucket
from spot_jax.serve.scheduler.live_catalog import GREEDY
from spot_jax.serve.model import slots as slots_lib
from spot_jax.serve.model import prefix_cache
from spot_jax.serve.model.prefix_cache import PrefixCache
from spot_jax.serve.scheduler.sequence import Sequence

DECODE_STEPS = 4  # decode steps per compiled call by default (see `Engine.decode_steps`)


class Engine:
  """The continuous-batching loop (see the module docstring).

  Attributes:
    catalog: the served prompts (`catalog.Catalog`): the engine reads `snapshot(GREEDY)`.
    slots: S; length_buckets: padded input lengths (sorted); max_tokens: the largest
      max_tokens (N); max_queue: sequences waiting at most; eos_id: the end of sequence;
      stop_ids: it and the vocabulary's other end ids (a chat model's end of turn).
    prefixes: the `PrefixCache`; observe: a `metrics.Metrics` (its ttft_observed, itl,
      cancelled, step, prefill), or None.
    batch_buckets: the prefill's padded batch sizes (powers of two below S, and S);
      decode_steps: K, decode steps per compiled call (a call's tokens stream together).
    device: where the slots live and decode; prefill_device: where prefills run (default
      `device`; on another, beside the decode calls: a first token waits for no call).
    steps, calls, prefills, prefill_calls: decode steps and calls run, sequences prefilled,
      compiled prefills; prefills_during: sequences prefilled while a decode call ran.
    step_seconds: a moving average of a decode call's time.
  """

  def __init__(self, catalog: Any, *, slots: int, length_buckets: Seq[int], max_tokens: int,
               max_queue: int, eos_id: int = 1, stop_ids: Seq[int] = (), observe: Any = None,
               decode_steps: int = DECODE_STEPS, prefill_device: Optional[jax.Device] = None):
    self.catalog, self.slots, self.max_tokens = catalog, slots, max_tokens
    self.decode_steps, self.prefill_device = decode_steps, prefill_device
    self.length_buckets, self.max_queue, self.eos_id = sorted(length_buckets), max_queue, eos_id
    self.stop_ids, self.observe = frozenset((eos_id, *stop_ids)), observe
    self.params, self.device = slots_lib.one_device(catalog.params)
    self.prefill_device = self.prefill_device or self.device
    self._beside = self.device is not None and self.prefill_device != self.device
    self._prefill_params = (jax.device_put(self.params, self.prefill_device) if self._beside
                            else self.params)
    self.prefixes = PrefixCache(catalog.model, self._prefill_params, catalog.placement)
    self.batch_buckets = sorted({min(2**i, slots) for i in range(slots.bit_length() + 1)})
    self.steps = self.calls = self.prefills = self.prefill_calls = self.prefills_during = 0
    self.step_seconds = 0.0
    self._waiting: collections.deque[Sequence] = collections.deque()
    self._active: list[Optional[Sequence]] = [None] * slots
    self._pending: list[tuple[Sequence, tuple]] = []  # booked events not yet handed out
    self._staged: list[tuple[np.ndarray, Any]] = []  # prefilled rows not yet in the slots
    self._calls: queue.SimpleQueue = queue.SimpleQueue()  # decode calls to watch
    self._cond = threading.Condition()
    self._closing = self._stopping = False
    self._table_key = self._shape = self._arrays = self._table = None
    self._state: Optional[slots_lib.SlotState] = None
    self._sampling = {k: np.zeros(slots, t) for k, t in (
        ("temperature", np.float32), ("top_k", np.int32), ("top_p", np.float32),
        ("seed", np.uint32), ("choice", np.int32), ("count", np.int32))}
    self._thread = threading.Thread(target=self._loop, name="spot_jax.serve engine", daemon=True)
    if self._beside:
      threading.Thread(target=self._watch, name="spot_jax.serve calls", daemon=True).start()

  def start(self) -> None:
    self._thread.start()

  def running(self) -> int:
    """Sequences holding a slot."""
    return sum(s is not None for s in self._active)

  def waiting(self) -> int:  # sequences waiting for a slot
    return len(self._waiting)

  def submit(self, sequences: Seq[Sequence]) -> None:
    """Queues a request's sequences together.

    Raises:
      QueueFull: `max_queue` sequences wait already; Stopping: after `close`.
    """
    with self._cond:
      if self._closing:
        raise Stopping()
      if self._waiting and len(self._waiting) + len(sequences) > self.max_queue:
        per = max(self.step_seconds / self.decode_steps, 0.01) * self.max_tokens / self.slots
        raise QueueFull(max(1, int(np.ceil(per * (len(self._waiting) + 1)))))
      self._waiting.extend(sequences)
      self._cond.notify_all()

  def cancel(self, sequence: Sequence) -> None:
    """Ends `sequence` early: dropped if it waits, its slot freed before the next step."""
    with self._cond:
      if sequence.finish is None and not sequence.cancelled:
        sequence.cancelled, sequence.cancelled_at_step = True, self.calls
        self._cond.notify_all()

  def close(self) -> None:
    """Takes no new sequences; the accepted ones go on."""
    with self._cond:
      self._closing = True
      self._cond.notify_all()

  def stop(self, timeout: Optional[float] = None) -> None:
    """Takes no new sequences; returns when every accepted one has finished."""
    with self._cond:
      self._closing = self._stopping = True
      self._cond.notify_all()
    if self._thread.is_alive():
      self._thread.join(timeout)

  def warm(self) -> int:
    """Compiles the prefix computation, every prefill (each kind the prompts need, batch bucket
    and length bucket) and the decode call; the shapes."""
    table = self.catalog.table
    kinds = {prefix_cache.cacheable(e): e.name for e in table.entries}  # one prompt of each
    done, observe, self.observe = [], self.observe, None
    for width in self.length_buckets * 2:  # twice: outputs' shardings may differ from inputs'
      for name in kinds.values():
        for size in self.batch_buckets:
          self._refresh()
          self._cycle([(Sequence(name, np.asarray([self.eos_id] * width, np.int32), 2,
                                 lambda *event: done.append(event)), slot)
                       for slot in range(size)])
          self._flush()
          self._active = [None] * self.slots
    self.prefixes.hits = self.prefixes.misses = 0
    self.steps = self.calls = self.prefills = self.prefill_calls = self.prefills_during = 0
    self.observe = observe
    return len(self.length_buckets) * len(kinds) * len(self.batch_buckets) + 2

  # ---------------------------------------------------------------------------- the loop

  def _loop(self) -> None:
    while True:
      with self._cond:
        while not self._waiting and not self.running():
          if self._stopping:
            return
          self._cond.wait(0.5)
      try:
        self._iterate()
      except Exception as e:  # pylint: disable=broad-except  (every sequence hears of it)
        self._fail(e)

  def _iterate(self) -> None:
    """Frees cancelled slots, admits the waiting sequences that fit free slots, runs a cycle."""
    self._free_cancelled()
    self._cycle(self._take(admit=self._refresh()))

  def _take(self, in_call: bool = False, admit: bool = True) -> list[tuple[Sequence, int]]:
    """Drops cancelled sequences first in line; with `admit`, [(sequence, free slot)] oldest
    first (during a call, `in_call`, none whose prompt the table lacks yet: next cycle's)."""
    free = [i for i, s in enumerate(self._active) if s is None] if admit else []
    admitted = []
    while True:
      with self._cond:
        head = self._waiting[0] if self._waiting else None
        if head is None or not (head.cancelled or free) or (in_call and not head.cancelled
                                                            and head.name not in self._table.names):
          break
        seq = self._waiting.popleft()
      if seq.cancelled:
        seq.emit("end", "cancelled")
      elif seq.name not in self._table.names:
        seq.emit("error", PromptGone(seq.name))
      else:
        admitted.append((seq, free.pop(0)))
    return admitted

  def _cycle(self, admitted: list[tuple[Sequence, int]]) -> None:
    """Prefills `admitted` [(sequence, free slot)], starts the decode call, hands out the first
    tokens and then the previous cycle's tokens while it runs (the host's share overlaps the
    device's), prefills arrivals on `prefill_device` meanwhile, then books the call's tokens:
    ends found and slots freed before the next cycle. With a `prefill_device` of its own and
    slots decoding, `admitted` prefill there during the call instead (their slots idle in it)
    while the previous cycle's tokens go out."""
    earlier, self._pending = self._pending, []
    beside = self._beside and self.running()
    if not beside:
      self._book_first(self._launch(admitted), during=False)
      self._insert()
    self._pending += earlier  # first tokens first: nobody's earlier tokens are among them
    call = self._dispatch() if self.running() else None
    if beside:  # after the dispatch: the call must not see them in their slots
      started = self._launch(admitted)
      self._flush()  # the earlier tokens while the prefills run
      self._book_first(started, during=True)
    self._flush()
    if call is not None:
      if self._beside:
        self._admit_during(call[0])
      self._book_call(*call)
      self._insert()
    if not self.running():  # nothing runs to hide them behind
      self._flush()

  def _admit_during(self, chosen: Any) -> None:
    """Until the decode call that returns `chosen` is done, prefills each arrival that fits a
    free slot and hands out its first token at once."""
    done, more = threading.Event(), True
    self._calls.put((chosen, done))
    while True:
      with self._cond:
        while not (ready := more and self._waiting and None in self._active) and not done.is_set():
          self._cond.wait()
      if not ready:
        return
      admitted = self._take(in_call=True)
      more = bool(admitted)
      self._book_first(self._launch(admitted), during=True)
      self._flush()

  def _watch(self) -> None:
    """Wakes the engine when each watched decode call is done."""
    while True:
      chosen, done = self._calls.get()
      with contextlib.suppress(Exception):  # booking the call raises it
        jax.block_until_ready(chosen)
      with self._cond:
        done.set()
        self._cond.notify_all()

  def _insert(self) -> None:
    """Puts the staged prefilled rows into their slots."""
    for where, rows in self._staged:
      self._state = slots_lib.insert(self._state, where, jax.device_put(rows, self.device))
    self._staged = []

  def _refresh(self) -> bool:
    """Follows the catalog's table; False while slots must finish before the state changes."""
    table, server = self.catalog.snapshot(GREEDY)
    fresh = server is not self._table_key
    if fresh:
      self._arrays = jax.device_put(server.table.arrays, self.prefill_device)
      self._table_key, self._table = server, table
      self.prefixes.retain(table.entries)
    shape = big_p, big_l = slots_lib.sizes(self._arrays)
    if shape != self._shape:
      if self.running():
        return False
      self.prefixes.clear()
      fresh = True
      length = big_p + 2 * (big_l + 1) + max(self.length_buckets) + self.max_tokens
      self._state = slots_lib.empty_state(self.catalog.model, self.slots, length, self.device)
      self._shape = shape
    if fresh:  # every prompt's prefix now, not in a request's time to first token
      for name in table.names:
        self.prefixes.head(table, self._arrays, name, count=False)
    return True

  def _launch(self, admitted: list[tuple[Sequence, int]]) -> list:
    """Starts prefilling each (sequence, free slot), which then holds it, in one call per kind
    (cached prefix or not) and batch bucket; [(part, cached, its unfetched `Chosen`)]."""
    kinds: dict[bool, list] = {}
    for seq, slot in admitted:
      head, cached = self.prefixes.head(self._table, self._arrays, seq.name)
      kinds.setdefault(cached, []).append((seq, slot, head))
    started = []
    for cached, group in kinds.items():
      while group:
        size = bucket(self.batch_buckets, len(group))
        part, group = group[:size], group[size:]
        started.append((part, cached, self._prefill(part, size, cached)))
    return started

  def _book_first(self, started: list, during: bool) -> None:
    """Fetches and books the first tokens of `_launch`'s prefills."""
    for part, cached, chosen in started:
      chosen = slots_lib.Chosen(*jax.device_get(tuple(chosen)))
      self.prefills_during += len(part) if during else 0
      for row, (seq, slot, _) in enumerate(part):
        if self.observe is not None:
          self.observe.prefill(cached, during)
        self._book(slot, seq, chosen, row)

  def _prefill(self, part: list, size: int, cached: bool) -> slots_lib.Chosen:
    """Starts one compiled prefill of `part` [(sequence, slot, head)], padded to `size` rows
    (copies of the first, written nowhere), staging its rows for `_insert`; its `Chosen`."""
    width = max(bucket(self.length_buckets, len(seq.tokens)) for seq, _, _ in part)
    for seq, slot, _ in part:
      for key, value in seq.sampling().items():
        self._sampling[key][slot] = value
    rows = part + part[:1] * (size - len(part))
    tokens, valid = vocabulary.right_padded([seq.tokens for seq, _, _ in rows], width)
    index = np.asarray([self._table.index(seq.name) for seq, _, _ in rows], np.int32)
    where = np.asarray([slot for _, slot, _ in part] + [self.slots] * (size - len(part)),
                       np.int32)  # padding rows write nowhere
    taken = np.asarray([slot for _, slot, _ in rows])
    sampling = slots_lib.Sampling(**{k: v[taken] for k, v in self._sampling.items()})
    heads = tuple(head for _, _, head in rows)
    rows, chosen = slots_lib.prefill(
        self.catalog.model, self._prefill_params, self._arrays, index, tokens, valid, heads,
        sampling, length=self._state.k_index.shape[1], placement=self.catalog.placement,
        cached=cached)
    self._staged.append((where, rows))
    self.prefills, self.prefill_calls = self.prefills + len(part), self.prefill_calls + 1
    for seq, slot, _ in part:
      self._active[slot] = seq
      self._sampling["count"][slot] = 1  # the first token is drawn at 0
    return chosen

  def _dispatch(self) -> tuple[Any, list, float]:
    """Starts K decode steps of every slot in one call; (its `Chosen`, not yet fetched, each
    slot's sequence then, the start time)."""
    start = time.monotonic()
    # copies: the call may still read its inputs while booking updates the counts
    sampling = slots_lib.Sampling(**{k: v.copy() for k, v in self._sampling.items()})
    self._state, chosen = slots_lib.decode_steps(self.catalog.model, self.params, self._state,
                                                 sampling, steps=self.decode_steps)
    self.steps, self.calls = self.steps + self.decode_steps, self.calls + 1
    if self.observe is not None:
      self.observe.step(self.decode_steps)
    return chosen, list(self._active), start

  def _book_call(self, chosen: Any, active: list, start: float) -> None:
    """Books a decode call's tokens in order; a sequence that ends inside the call frees its
    slot, and its later tokens are dropped."""
    chosen = slots_lib.Chosen(*jax.device_get(tuple(chosen)))
    self.step_seconds = 0.8 * self.step_seconds + 0.2 * (time.monotonic() - start)
    for j in range(self.decode_steps):
      step = slots_lib.Chosen(*(a[j] for a in chosen))
      for slot, seq in enumerate(active):
        if seq is not None and seq.finish is None and not seq.cancelled:
          self._book(slot, seq, step, slot)

  def _book(self, slot: int, seq: Sequence, chosen: slots_lib.Chosen, row: int) -> None:
    """Gives `seq` its next token (row `row` of `chosen`), handed out at the next `_flush`;
    frees the slot when it ends."""
    token = int(chosen.token[row])
    seq.generated.append(token)
    self._sampling["count"][slot] = len(seq.generated)
    self._pending.append((seq, ("token", token, float(chosen.logprob[row]), chosen.top_ids[row],
                                chosen.top_logprobs[row])))
    stopped = token in self.stop_ids or (seq.stop and seq.text is not None and any(
        s in seq.text(seq.generated) for s in seq.stop))
    finish = "stop" if stopped else "length" if len(seq.generated) >= seq.max_tokens else None
    if finish:
      seq.finish = finish
      self._active[slot] = None
      self._pending.append((seq, ("end", finish)))

  def _flush(self) -> None:
    """Hands out the booked events, in order."""
    pending, self._pending = self._pending, []
    for seq, event in pending:
      if event[0] == "token":
        kind, seconds = seq.stamp(time.monotonic())
        if self.observe is not None:
          (self.observe.itl if kind == "itl" else self.observe.ttft_observed)(seconds)
      seq.emit(*event)

  def _free_cancelled(self) -> None:
    for slot, seq in enumerate(self._active):
      if seq is not None and seq.cancelled:
        self._active[slot] = None
        if self.observe is not None:
          self.observe.cancelled(self.calls - seq.cancelled_at_step)
        self._pending.append((seq, ("end", "cancelled")))

  def _fail(self, error: Exception) -> None:
    self._flush()
    for slot, seq in enumerate(self._active):
      if seq is not None:
        self._active[slot] = None
        seq.emit("error", error)
    self._shape, self._staged = None, []  # the state may be gone (donated): rebuild it
