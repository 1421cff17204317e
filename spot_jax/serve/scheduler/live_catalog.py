"""The prompts a running service holds: added and removed while it serves, on one backbone.

The catalog keeps the served entries in a `SizedTable` (see `capacity`): a prompt that fits the
table's capacity changes no array shape, so the batches after it reuse every compiled call. It
hands the batching loop one `Server` per decoding setting (greedy, or sampling at a temperature
and top-k), built on the current table when first asked for and dropped when the table changes.
Adding and removing run in request threads; the loop reads a consistent (table, server) pair.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence

from spot_jax.errors import ConfigError
from spot_jax.serve.scheduler import follow
from spot_jax.serve.catalog.capacity import Capacity, SizedTable
from spot_jax.serve.model.server import DecodeSettings, Server
from spot_jax.serve.catalog.table import ServedPrompt

# (method, temperature, top_k): "greedy" rows share batches; sampled rows share them by setting.
DecodeKey = tuple[str, float, int]
GREEDY: DecodeKey = ("greedy", 0.0, 0)
Loader = Callable[[str, str], list[ServedPrompt]]


class Catalog:
  """Named prompts on one frozen backbone, with a server per decoding setting.

  Attributes:
    model, params, mesh, placement: the `Server` arguments every server shares.
    emb_dim: the backbone's width (prompts of another width are refused).
    target_length: decoded tokens per row (EOS included), every setting's.
    seed: sampling's seed.
    eos_id: the vocabulary's end of sequence (decoding stops there).
    load: (name, path) -> the entries a prompt path holds (refusing another backbone's).
    growths: how often the capacity grew since start-up.
    mirror: a `follow.Mirror`: other processes repeat each addition and removal (on a pod).
  """

  def __init__(self, model: Any, params: Any, entries: Sequence[ServedPrompt], *,
               emb_dim: int, target_length: int, load: Loader, placement: str = "prefix",
               mesh: Any = None, seed: int = 0, capacity: Optional[Capacity] = None,
               mirror: Optional[follow.Mirror] = None, eos_id: int = 1):
    self.model, self.params, self.mesh, self.placement = model, params, mesh, placement
    self.emb_dim, self.target_length, self.seed, self.load = emb_dim, target_length, seed, load
    self.growths, self.eos_id = 0, eos_id
    self.mirror = mirror or follow.Mirror(False)
    self._lock = threading.Lock()
    self._table = SizedTable(entries, emb_dim, capacity)
    self._servers: dict[DecodeKey, Server] = {}

  @property
  def table(self) -> SizedTable:
    return self._table

  @property
  def capacity(self) -> Capacity:
    return self._table.capacity

  def server(self, key: DecodeKey = GREEDY) -> Server:
    """The server of the current table for decoding setting `key`."""
    with self._lock:
      if key not in self._servers:
        method, temperature, top_k = key
        settings = DecodeSettings(self.target_length, method, temperature=temperature,
                                  top_k=top_k, seed=self.seed, eos_id=self.eos_id)
        self._servers[key] = Server(self.model, self.params, self._table,
                                    placement=self.placement, settings=settings, mesh=self.mesh)
      return self._servers[key]

  def add(self, name: str, path: str) -> list[str]:
    """Loads `path` as prompt `name` (a multi-task one as NAME/<k>); returns the names added.

    Raises:
      ConfigError: a name already served, or a prompt that cannot be loaded or served here.
    """
    with self._lock:
      taken = set(self._table.names)
    if name in taken or any(n.startswith(name + "/") for n in taken):
      raise ConfigError(f"prompt {name!r} is already served; DELETE /v1/prompts/{name} first or "
                        f"choose another name")
    entries = self.load(name, path)  # file reads and checks, outside the lock
    with self.mirror.turn(), self._lock:
      clash = sorted(set(e.name for e in entries) & set(self._table.names))
      if clash:
        raise ConfigError(f"prompt {clash[0]!r} is already served; choose another name")
      self.mirror.send(follow.ADD, {"name": name, "path": path})
      self._swap(self._table.entries + list(entries))
    return [e.name for e in entries]

  def remove(self, name: str) -> list[str]:
    """Stops serving `name` (and a multi-task prompt's NAME/<k>); returns the names removed.

    Raises:
      KeyError: no such prompt.
      ConfigError: it is the last one (a table holds at least one prompt).
    """
    with self.mirror.turn(), self._lock:
      gone = [n for n in self._table.names if n == name or n.startswith(name + "/")]
      if not gone:
        raise KeyError(name)
      kept = [e for e in self._table.entries if e.name not in gone]
      if not kept:
        raise ConfigError(f"{name!r} is the last prompt served; add another before removing it")
      self.mirror.send(follow.REMOVE, {"name": name})
      self._swap(kept)
    return gone

  def _swap(self, entries: list[ServedPrompt]) -> None:
    """The table of `entries` in the current capacity (grown if needed); servers rebuilt lazily."""
    table = SizedTable(entries, self.emb_dim, self._table.capacity)
    if table.capacity != self._table.capacity:
      self.growths += 1
    self._table, self._servers = table, {}

  def snapshot(self, key: DecodeKey) -> tuple[SizedTable, Server]:
    """(the table, its server for `key`), consistent with each other."""
    server = self.server(key)
    return server.table, server
