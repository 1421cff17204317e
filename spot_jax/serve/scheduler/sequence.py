"""A sequence the continuous engine generates: one choice of a request, its settings, and what
it has generated so far."""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import numpy as np


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

  def sampling(self) -> dict:
    """Its settings by `slots.Sampling` field, for a slot starting it (count 0)."""
    return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
            "seed": self.seed % 2**32, "choice": self.choice, "count": 0}

  def stamp(self, now: float) -> tuple[str, float]:
    """Notes a token handed out at `now` (time.monotonic()): ("ttft", seconds since it was
    enqueued) for the first, else ("itl", seconds since the last)."""
    gap = ("itl", now - self.last_at) if self.first_at else ("ttft", now - self.enqueued)
    self.first_at, self.last_at = self.first_at or now, now
    return gap
