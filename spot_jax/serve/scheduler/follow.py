"""Several processes, one backbone: process 0 serves HTTP, the others repeat its calls.

On a pod (`jax.distributed`), the backbone's parameters span every process's devices (the
`Server`'s mesh), so every jitted call must be made by all processes together. Process 0 runs
the HTTP front and the batching loop; before each forward pass, and before each prompt added
or removed, it broadcasts what it is about to do (`Mirror.send`), and every other process
(`follow`) does the same on its own copy of the catalog. Sends and the calls after them happen
under one lock (`Mirror.turn`), so every process sees the same order. Prompt paths must be
readable on every host.
"""
from __future__ import annotations

import contextlib
import json
import threading
from typing import Any, Iterator, Sequence

import numpy as np

GENERATE, CLASSIFY, ADD, REMOVE, STOP = 1, 2, 3, 4, 5
_MAX_ARRAYS = 4


class Mirror:
  """Process 0's side: broadcasts each operation before it runs (nothing on one process).

  Attributes:
    on: whether other processes follow (more than one process).
  """

  def __init__(self, on: bool):
    self.on = on
    self._lock = threading.RLock()

  @contextlib.contextmanager
  def turn(self) -> Iterator[None]:
    """Holds the order: a send and the calls it announces, as one step."""
    with self._lock:
      yield

  def send(self, op: int, meta: dict, arrays: Sequence[np.ndarray] = ()) -> None:
    if self.on:
      _exchange(op, meta, arrays)


def _broadcast(x: np.ndarray) -> np.ndarray:
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return np.asarray(multihost_utils.broadcast_one_to_all(x))


def _exchange(op: int = 0, meta: Any = None, arrays: Sequence[np.ndarray] = ()
              ) -> tuple[int, Any, list[np.ndarray]]:
  """Process 0's (op, meta, int32 arrays), on every process (the others pass nothing)."""
  payload = np.frombuffer(json.dumps(meta).encode(), np.uint8)
  header = np.zeros(2 + 2 * _MAX_ARRAYS, np.int32)
  header[:2] = op, payload.size
  for i, a in enumerate(arrays):
    header[2 + 2 * i:4 + 2 * i] = a.shape
  header = _broadcast(header)
  op, length = int(header[0]), int(header[1])
  # few payload shapes (powers of two): each shape compiles a broadcast once
  padded = np.zeros(1 << max(int(length - 1).bit_length(), 6), np.uint8)
  if payload.size <= padded.size:  # only process 0's is broadcast
    padded[:payload.size] = payload
  meta = json.loads(bytes(_broadcast(padded)[:length]).decode())
  out = []
  for i in range(_MAX_ARRAYS):
    shape = tuple(int(d) for d in header[2 + 2 * i:4 + 2 * i])
    if not all(shape):
      break
    local = np.asarray(arrays[i], np.int32) if i < len(arrays) else np.zeros(shape, np.int32)
    out.append(_broadcast(local))
  return op, meta, out


def follow(catalog: Any) -> int:
  """The loop of every process but 0: repeats process 0's operations until it stops."""
  while True:
    op, meta, arrays = _exchange()
    if op == STOP:
      return 0
    if op == ADD:
      catalog.add(meta["name"], meta["path"])
    elif op == REMOVE:
      catalog.remove(meta["name"])
    elif op == GENERATE:
      _, server = catalog.snapshot(tuple(meta["key"]))
      server.generate(meta["names"], arrays[0], meta["index"], valid=arrays[1] > 0)
    elif op == CLASSIFY:
      _, server = catalog.snapshot(tuple(meta["key"]))
      server.classify(meta["names"], arrays[0], arrays[2], valid=arrays[1] > 0,
                      label_valid=arrays[3] > 0)
