"""Reading XLA's optimized HLO text: the copies and transposes of an array of a given size."""
from __future__ import annotations

import math
import re

_OP = re.compile(r"= \w+\[([\d,]*)\]\S* (copy|transpose)\(")


def relayouts(hlo: str, elements: int) -> list[str]:
  """The copy and transpose instructions (fused ones included) whose result holds `elements`
  elements: an array of that size moved into another layout."""
  found = []
  for line in hlo.splitlines():
    m = _OP.search(line)
    if m and math.prod(int(d) for d in m.group(1).split(",") if d) == elements:
      found.append(line.strip()[:160])
  return found
