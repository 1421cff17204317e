"""Continuous batching: iteration-level scheduling of decoder-only generation over fixed slots.

One thread owns the slots (`model.slots`). Each cycle it (1) frees the slots of cancelled
sequences, (2) prefills every waiting sequence that fits a free slot, oldest first,
in one compiled call per kind (from the prompts' cached prefixes, or with their prompts), padded
to a batch bucket (powers of two up to S) and the longest member's length bucket, (3) starts ONE
compiled call of K decode steps (`decode_steps`) over all S slots, whatever their prompts and
sampling settings, (4) while it runs, hands the prefills' first tokens and the previous
cycle's tokens to their sequences' `emit` callbacks (the host's work hides behind the
device's), then (5) books the call's tokens: a sequence that ends inside the call drops its
later tokens and frees its slot for the next cycle. Compiled shapes: one prefill per (kind, batch
bucket, length bucket), one decode call (and one prefix computation), whatever the mix.

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
import dataclasses
import threading
import time
from typing import Any, Callable, Optional, Sequence as Seq

import jax
import numpy as np

from spot_jax.serve.scheduler.batcher import PromptGone, QueueFull, Stopping, bucket
from spot_jax.serve.scheduler.live_catalog import GREEDY
from spot_jax.serve.model import slots as slots_lib
from spot_jax.serve.model import prefix_cache
from spot_jax.serve.model.prefix_cache import PrefixCache

DECODE_STEPS = 4  # decode steps per compiled call by default (see `Engine.decode_steps`)


@dataclasses.dataclass(eq=False)
class Sequence:
  """One generated sequence (a request's choice).

  Attributes:
    name: the prompt; tokens: its input ids (EOS included, no padding).
    max_tokens: tokens to generate at most (EOS included).
    temperature, top_k, top_p, seed, choice: its sampling settings (see `slots.Sampling`).
    emit: called from the engine thread with ("token", id, logprob, top_ids, top_logprobs),
      then once with ("end", finish_reason) or ("error", exception).
    stop: strings that end it; text: ids -> text (needed with `stop`).
    generated: ids so far; cancelled: set by `cancel`; finish: "stop", "length" or None.
    enqueued, first_at, last_at: time.monotonic() of submission, first and last token.
  """
  name: str
  tokens: np.ndarray
  max_tokens: int
  emit: Callable[..., None]
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  choice: int = 0
  stop: tuple[str, ...] = ()
  text: Optional[Callable[[list[int]], str]] = None
  generated: list = dataclasses.field(default_factory=list)
  cancelled: bool = False
  cancelled_at_step: int = -1  # the engine's decode calls when cancelled
  finish: Optional[str] = None
  enqueued: float = dataclasses.field(default_factory=time.monotonic)
  first_at: float = 0.0
  last_at: float = 0.0


def _one_device(params: Any) -> Any:
  """`params` on one device when they live on one (a mesh of 1): the slots' state then keeps
  one sharding from call to call, so nothing recompiles after warm-up."""
  devices = {d for leaf in jax.tree_util.tree_leaves(params) if hasattr(leaf, "devices")
             for d in leaf.devices()}
  if len(devices) > 1:
    return params
  return jax.device_put(params, next(iter(devices)) if devices else jax.devices()[0])


class Engine:
  """The continuous-batching loop (see the module docstring).

  Attributes:
    catalog: the served prompts (`catalog.Catalog`): the engine reads `snapshot(GREEDY)`.
    slots: S; length_buckets: padded input lengths (sorted); max_tokens: the largest
      max_tokens (N); max_queue: sequences waiting at most; eos_id: the end of sequence;
      stop_ids: it and the vocabulary's other end ids (a chat model's end of turn).
    prefixes: the `PrefixCache`.
    observe: a `metrics.Metrics` (its ttft_observed, itl, cancelled, step, prefill), or None.
    batch_buckets: the prefill's padded batch sizes (powers of two below S, and S).
    decode_steps: K, decode steps per compiled call (a call's tokens stream together).
    steps, calls, prefills, prefill_calls: decode steps and calls run, sequences prefilled,
      compiled prefills.
    step_seconds: a moving average of a decode call's time.
  """

  def __init__(self, catalog: Any, *, slots: int, length_buckets: Seq[int], max_tokens: int,
               max_queue: int, eos_id: int = 1, stop_ids: Seq[int] = (), observe: Any = None,
               decode_steps: int = DECODE_STEPS):
    self.catalog, self.slots, self.max_tokens = catalog, slots, max_tokens
    self.decode_steps = decode_steps
    self.length_buckets, self.max_queue, self.eos_id = sorted(length_buckets), max_queue, eos_id
    self.stop_ids = frozenset((eos_id, *stop_ids))
    self.observe = observe
    self.params = _one_device(catalog.params)
    self.prefixes = PrefixCache(catalog.model, self.params, catalog.placement)
    self.batch_buckets = sorted({min(2**i, slots) for i in range(slots.bit_length() + 1)})
    self.steps = self.calls = self.prefills = self.prefill_calls = 0
    self.step_seconds = 0.0
    self._waiting: collections.deque[Sequence] = collections.deque()
    self._active: list[Optional[Sequence]] = [None] * slots
    self._pending: list[tuple[Sequence, tuple]] = []  # booked events not yet handed out
    self._cond = threading.Condition()
    self._closing = self._stopping = False
    self._table_key: Any = None
    self._shape: Any = None
    self._state: Optional[slots_lib.SlotState] = None
    self._arrays: Any = None
    self._table: Any = None
    self._sampling = {k: np.zeros(slots, t) for k, t in (
        ("temperature", np.float32), ("top_k", np.int32), ("top_p", np.float32),
        ("seed", np.uint32), ("choice", np.int32), ("count", np.int32))}
    self._thread = threading.Thread(target=self._loop, name="spot_jax.serve engine", daemon=True)

  # ---------------------------------------------------------------------------- the surface

  def start(self) -> None:
    self._thread.start()

  def running(self) -> int:
    """Sequences holding a slot."""
    return sum(s is not None for s in self._active)

  def waiting(self) -> int:
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
    self.steps = self.calls = self.prefills = self.prefill_calls = 0
    self.observe = observe
    return len(self.length_buckets) * len(kinds) * len(self.batch_buckets) + 2

  # ---------------------------------------------------------------------------- the loop

  def _loop(self) -> None:
    while True:
      with self._cond:
        while not self._work():
          if self._stopping and not self._waiting:
            return
          self._cond.wait(0.5)
      try:
        self._iterate()
      except Exception as e:  # pylint: disable=broad-except  (every sequence hears of it)
        self._fail(e)

  def _work(self) -> bool:
    return bool(self._waiting) or self.running() > 0

  def _iterate(self) -> None:
    """Frees cancelled slots, admits the waiting sequences that fit free slots, runs a cycle."""
    self._free_cancelled()
    ready = self._refresh()
    with self._cond:
      while self._waiting and self._waiting[0].cancelled:
        self._waiting.popleft().emit("end", "cancelled")
    free = [i for i, s in enumerate(self._active) if s is None]
    admitted = []
    while ready and free:
      with self._cond:
        if not self._waiting:
          break
        seq = self._waiting.popleft()
      if seq.cancelled:
        seq.emit("end", "cancelled")
        continue
      if seq.name not in self._table.names:
        seq.emit("error", PromptGone(seq.name))
        continue
      admitted.append((seq, free.pop(0)))
    self._cycle(admitted)

  def _cycle(self, admitted: list[tuple[Sequence, int]]) -> None:
    """Prefills `admitted` [(sequence, free slot)], starts the decode call, hands out the first
    tokens and then the previous cycle's tokens while it runs (the host's share overlaps the
    device's), then books the call's: ends found and slots freed before the next cycle."""
    earlier, self._pending = self._pending, []
    for part, cached, chosen in (self._admit(admitted) if admitted else []):
      chosen = slots_lib.Chosen(*jax.device_get(tuple(chosen)))
      for row, (seq, slot, _) in enumerate(part):
        if self.observe is not None:
          self.observe.prefill(cached)
        self._book(slot, seq, chosen, row)
    self._pending += earlier  # first tokens first: nobody's earlier tokens are among them
    call = self._dispatch() if self.running() else None
    self._flush()
    if call is not None:
      self._book_call(*call)
    if not self.running():  # nothing runs to hide them behind
      self._flush()

  def _refresh(self) -> bool:
    """Follows the catalog's table; False while slots must finish before the state changes."""
    table, server = self.catalog.snapshot(GREEDY)
    fresh = server is not self._table_key
    if fresh:
      self._arrays = jax.device_put(server.table.arrays)
      self._table_key, self._table = server, table
      self.prefixes.retain(table.entries)
    big_p, big_l = slots_lib.sizes(self._arrays)
    shape = (big_p, big_l)
    if shape != self._shape:
      if self.running():
        return False
      self.prefixes.clear()
      fresh = True
      length = big_p + 2 * (big_l + 1) + max(self.length_buckets) + self.max_tokens
      self._state = slots_lib.empty_state(self.catalog.model, self.slots, length)
      self._shape = shape
    if fresh:  # every prompt's prefix now, not in a request's time to first token
      for name in table.names:
        self.prefixes.head(table, self._arrays, name, count=False)
    return True

  def _admit(self, admitted: list[tuple[Sequence, int]]) -> list[tuple[list, bool, Any]]:
    """Starts the prefill of each (sequence, free slot), which then holds it: one compiled
    call per kind (cached prefix or not) and batch bucket; [(part, cached, first tokens'
    `Chosen`)]."""
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

  def _prefill(self, part: list, size: int, cached: bool) -> slots_lib.Chosen:
    """Starts one compiled prefill of `part` [(sequence, slot, head)], padded to `size` rows
    (copies of the first, written nowhere); its first tokens' `Chosen` (not yet fetched)."""
    width = max(bucket(self.length_buckets, len(seq.tokens)) for seq, _, _ in part)
    for seq, slot, _ in part:
      for key, value in (("temperature", seq.temperature), ("top_k", seq.top_k),
                         ("top_p", seq.top_p), ("seed", seq.seed % 2**32),
                         ("choice", seq.choice), ("count", 0)):
        self._sampling[key][slot] = value
    rows = part + part[:1] * (size - len(part))
    tokens = np.zeros((size, width), np.int32)
    for row, (seq, _, _) in enumerate(rows):
      tokens[row, :len(seq.tokens)] = seq.tokens
    valid = np.arange(width)[None] < np.asarray([len(seq.tokens) for seq, _, _ in rows])[:, None]
    index = np.asarray([self._table.index(seq.name) for seq, _, _ in rows], np.int32)
    where = np.asarray([slot for _, slot, _ in part] + [self.slots] * (size - len(part)),
                       np.int32)  # padding rows write nowhere
    taken = np.asarray([slot for _, slot, _ in rows])
    sampling = slots_lib.Sampling(**{k: v[taken] for k, v in self._sampling.items()})
    heads = tuple(head for _, _, head in rows)
    self._state, chosen = slots_lib.prefill(
        self.catalog.model, self.params, self._arrays, self._state, where, index, tokens, valid,
        heads, sampling, placement=self.catalog.placement, cached=cached)
    self.prefills += len(part)
    self.prefill_calls += 1
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
    self.steps += self.decode_steps
    self.calls += 1
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
        now = time.monotonic()
        if self.observe is not None:
          if seq.first_at:
            self.observe.itl(now - seq.last_at)
          else:
            self.observe.ttft_observed(now - seq.enqueued)
        seq.first_at = seq.first_at or now
        seq.last_at = now
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
    self._shape = None  # the state may be gone (donated): rebuild it
