"""Room to grow: a `PromptTable` whose arrays are padded to a capacity.

A running service adds and removes prompts. The jitted calls take the table's arrays as
arguments, so they compile again only when an array's shape changes. `SizedTable` pads every
array to a `Capacity` (rows N, prompts per entry K, prompt length L, offset length S, ATTEMPT
width R, prefix length P of each deep attention type), each dimension a power of two at least
what the entries need. Adding a prompt that fits keeps every shape; one that does not grows the
dimensions it needs to their next power of two, and the next calls compile once for the new
shapes. Padded rows and positions are zeros that no row selects (see `table`), so a padded
table serves every entry as the unpadded one does.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import numpy as np

from spot_jax.serve.catalog.table import DeepArrays, PromptTable, ServedPrompt, TableArrays


def next_power_of_two(n: int) -> int:
  """The smallest power of two >= n (0 stays 0)."""
  return 0 if n <= 0 else 1 << (int(n) - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class Capacity:
  """The padded shape of a table's arrays.

  Attributes:
    rows: N, entries the arrays hold.
    num_prompts: K; length: L; offset_length: S; attention_width: R.
    deep: (attention type, (layers, P, H, D)) of every deep attention type, sorted by type.
  """
  rows: int
  num_prompts: int
  length: int
  offset_length: int
  attention_width: int
  deep: tuple[tuple[str, tuple[int, int, int, int]], ...] = ()

  @classmethod
  def of(cls, arrays: TableArrays) -> "Capacity":
    """The capacity `arrays` have."""
    n, k, length, _ = arrays.prompts.shape
    deep = tuple(sorted((name, (a.kv.shape[1], a.kv.shape[3], a.kv.shape[4], a.kv.shape[5]))
                        for name, a in arrays.deep.items()))
    return cls(n, k, length, arrays.offsets.shape[1], arrays.attn_down.shape[2], deep)

  def covering(self, need: "Capacity") -> "Capacity":
    """This capacity where it holds `need`; each dimension it lacks, grown to a power of two."""
    fit = lambda have, want: have if have >= want else next_power_of_two(want)
    deep = dict(self.deep)
    for name, (layers, p, heads, depth) in need.deep:
      have = deep.get(name, (layers, 0, heads, depth))[1]
      deep[name] = (layers, fit(have, p), heads, depth)
    return Capacity(fit(self.rows, need.rows), fit(self.num_prompts, need.num_prompts),
                    fit(self.length, need.length), fit(self.offset_length, need.offset_length),
                    fit(self.attention_width, need.attention_width), tuple(sorted(deep.items())))


def pad_arrays(arrays: TableArrays, capacity: Capacity) -> TableArrays:
  """`arrays` zero-padded to `capacity` (which must hold them); unused rows select nothing."""
  have = Capacity.of(arrays)
  n = capacity.rows - have.rows
  k, length = capacity.num_prompts - have.num_prompts, capacity.length - have.length
  s = capacity.offset_length - have.offset_length
  r = capacity.attention_width - have.attention_width

  def pad(x: np.ndarray, *widths: int, value=0) -> np.ndarray:
    return np.pad(x, [(0, w) for w in widths] + [(0, 0)] * (x.ndim - len(widths)),
                  constant_values=value)

  deep = {}
  for name, (layers, p, heads, depth) in capacity.deep:
    if name in arrays.deep:
      kv, lengths = arrays.deep[name]
      front = p - kv.shape[3]  # prefixes are right-aligned along P: pad in front
      kv = np.pad(kv, [(0, n), (0, 0), (0, 0), (front, 0), (0, 0), (0, 0)])
      deep[name] = DeepArrays(kv, pad(lengths, n))
    else:
      deep[name] = DeepArrays(np.zeros((capacity.rows, layers, 2, p, heads, depth), np.float32),
                              np.zeros((capacity.rows,), np.int32))
  return TableArrays(
      prompts=pad(arrays.prompts, n, k, length), router=pad(arrays.router, n, 0, k),
      num_prompts=pad(arrays.num_prompts, n, value=1), lengths=pad(arrays.lengths, n),
      routing=pad(arrays.routing, n), offsets=pad(arrays.offsets, n, s),
      offset_lengths=pad(arrays.offset_lengths, n), keys=pad(arrays.keys, n, k),
      attn_down=pad(arrays.attn_down, n, 0, r), attn_up=pad(arrays.attn_up, n, r),
      attn_scale=pad(arrays.attn_scale, n), attn_bias=pad(arrays.attn_bias, n),
      target=pad(arrays.target, n, value=-1), deep=deep)


class SizedTable(PromptTable):
  """A `PromptTable` whose arrays are padded to `capacity`.

  Attributes:
    capacity: the arrays' `Capacity`: the one given where it holds the entries, grown where it
      does not (see `Capacity.covering`); without one given, the entries' own shapes rounded up
      to powers of two.
  """

  def __init__(self, entries: Sequence[ServedPrompt], emb_dim: Optional[int] = None,
               capacity: Optional[Capacity] = None):
    super().__init__(entries, emb_dim)
    need = Capacity.of(self.arrays)
    self.capacity = (capacity or Capacity(0, 0, 0, 0, 0)).covering(need)
    self.arrays = pad_arrays(self.arrays, self.capacity)

  def fold_tokens(self, fold: Callable[[np.ndarray, str], np.ndarray]) -> "SizedTable":
    """`PromptTable.fold_tokens`, keeping (or growing) the capacity."""
    return SizedTable(super().fold_tokens(fold).entries, self._emb_dim, self.capacity)

  def offset_lengths(self) -> dict[str, int]:
    """{name: s} of the entries offsetting their first s input positions (DePT)."""
    return {e.name: e.offset_length for e in self.entries if e.offset is not None}
