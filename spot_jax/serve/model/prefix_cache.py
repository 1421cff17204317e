"""The KV prefix cache: per served prompt, the start of every request's slot row, computed once.

A prompt that does not read its input (Prompt Tuning, folded Residual, MPT and ULPT, DePT's
prompt, deep prompts: one prompt per entry and no attention over prompts) puts the same key/values
at every layer for its positions and BOS, whatever the request: `slots.compute_head` computes
them when the prompt is first served, and each request's prefill starts from them, so the
prompt's length costs nothing per request. Prompts that route or attend on their input (SMoP
with several prompts, ATTEMPT) cannot be cached: their head holds only deep prefixes (if any),
and their prefill runs the prompt too. Entries are keyed by name and by the served entry
itself, so a replaced prompt (removed, then added under the same name) is computed again.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from spot_jax.serve.model import slots
from spot_jax.serve.catalog.table import ServedPrompt


def cacheable(entry: ServedPrompt) -> bool:
  """Whether the entry's input-hook positions are the same for every request."""
  return entry.num_prompts == 1 and entry.attention is None


class PrefixCache:
  """Each served prompt's `slots.Head`, computed on first use after a table change.

  Attributes:
    model, params, placement: the backbone, its frozen parameters, the prompts' placement.
    hits: requests started from a cached prompt prefix; misses: requests whose prefill ran
      their prompt (prompts that read their input).
    computed: heads computed so far.
  """

  def __init__(self, model: Any, params: Any, placement: str):
    self.model, self.params, self.placement = model, params, placement
    self.hits = self.misses = self.computed = 0
    self._heads: dict[tuple[str, int], slots.Head] = {}
    self._lock = threading.Lock()

  def retain(self, entries: list[ServedPrompt]) -> None:
    """Drops the heads of entries no longer served (or replaced)."""
    keep = {(e.name, id(e)) for e in entries}
    with self._lock:
      self._heads = {k: v for k, v in self._heads.items() if k in keep}

  def clear(self) -> None:
    """Drops every head (the table's widths changed)."""
    with self._lock:
      self._heads = {}

  def head(self, table: Any, arrays: Any, name: str, count: bool = True
           ) -> tuple[slots.Head, bool]:
    """Prompt `name`'s head in `table` (a `PromptTable`) whose placed arrays are `arrays`; with
    `count`, a request's: counted as a hit (a cached prefix) or a miss (its prompt prefills).
    Returns (the head, whether it holds the prompt)."""
    i = table.index(name)
    entry = table.entries[i]
    key = (name, id(entry))
    cached = cacheable(entry)
    with self._lock:
      head = self._heads.get(key)
    if head is None:
      head = slots.compute_head(self.model, self.params, arrays, np.asarray([i], np.int32),
                                placement=self.placement, cached=cached)
      with self._lock:
        self._heads[key] = head
        self.computed += 1
    if count:
      if cached:
        self.hits += 1
      else:
        self.misses += 1
    return head, cached
