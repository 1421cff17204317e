"""Batches examples through a `Server` and writes one JSONL record per input, in input order.

Records: {"id"?, "input", "prompt", "prediction", "score", "target"?}; with class labels also
"label_scores"; for an ensemble "prompt" is "ensemble(a,b,...)" with per-prompt "predictions"
and "scores" and the "votes". The last batch is padded to the batch size (no recompilation).
"""
from __future__ import annotations

import collections
import json
import sys
import time
from typing import IO, Any, Callable, Optional, Sequence

import numpy as np

from spot_jax.serve.model import ensemble, inputs
from spot_jax.serve.model.server import Server

Progress = Callable[[int, int, float], None]


class Phases:
  """Wall-clock marks of one command (`infer --timing`): one stderr line at the end.

  Attributes:
    on: whether to report at all.
    parts: (phase, seconds) marked so far.
  """

  def __init__(self, prog: str, on: bool):
    from spot_jax import runtime  # pylint: disable=g-import-not-at-top
    self.prog, self.on, self._last, self.parts = prog, on, time.perf_counter(), []
    start = runtime.seconds_since_start() if on else None
    if start is not None:
      self.parts.append(("process start to main", start))

  def mark(self, name: str) -> None:
    now = time.perf_counter()
    self.parts.append((name, now - self._last))
    self._last = now

  def report(self, first_prediction: Optional[float]) -> None:
    if not self.on:
      return
    line = ", ".join(f"{name} {sec:.2f} s" for name, sec in self.parts)
    if first_prediction is not None:
      line += f"; first prediction {first_prediction:.2f} s after process start"
    print(f"{self.prog}: timing: {line}", file=sys.stderr, flush=True)


class Predictor:
  """Runs examples through a server.

  Attributes:
    server: the `Server` (its table's names are the prompts).
    vocab: the seqio vocabulary decoding predictions.
    batch_size: inputs per call (an ensemble call holds batch_size * N rows).
    labels: class label strings (None: decode), with label_tokens [C, S] their targets and
      label_valid [C, S] bool their validity (padding is marked, never read from an id).
    ensemble: run every input through all prompts and combine them.
    combine: "vote" or "logprob".
    progress: called as progress(done, total, start_time) after each batch.
  """

  def __init__(self, server: Server, vocab: Any, *, batch_size: int,
               labels: Optional[Sequence[str]] = None, label_tokens: Optional[np.ndarray] = None,
               label_valid: Optional[np.ndarray] = None,
               ensemble: bool = False,  # pylint: disable=redefined-outer-name
               combine: str = "vote",
               progress: Optional[Progress] = None):
    self.server, self.vocab, self.batch_size = server, vocab, batch_size
    self.labels, self.label_tokens, self.label_valid = labels, label_tokens, label_valid
    self.ensemble, self.combine = ensemble, combine
    self.progress = progress or (lambda done, total, start: None)
    self.prompts = server.table.names

  def run(self, examples: Sequence[inputs.Example], names: Sequence[str], tokens: np.ndarray,
          out: IO[str], valid: Optional[np.ndarray] = None) -> Optional[dict]:
    """Writes the records to `out`; returns the accuracy summary (None without targets).
    `valid` [N, T] bool marks the tokens of `tokens` [N, T] (None: ids > 0, T5's padding)."""
    if valid is None:
      valid = np.asarray(tokens) > 0
    b, total, start = self.batch_size, len(examples), time.time()
    per_prompt, combined = [], []
    for i, lo in enumerate(range(0, total, b)):
      chunk = slice(lo, min(lo + b, total))
      n = chunk.stop - chunk.start
      rows = np.zeros((b, tokens.shape[1]), np.int32)
      rows[:n] = tokens[chunk]
      mask = np.zeros((b, tokens.shape[1]), bool)
      mask[:n] = valid[chunk]
      rows[n:], mask[n:] = rows[0], mask[0]  # padding rows repeat the first (results dropped)
      batch_names = list(names[chunk]) + [self.prompts[0]] * (b - n)
      for ex, record in zip(examples[chunk], self._batch(batch_names, rows, mask, i)[:n]):
        record = {**({"id": ex.id} if ex.id is not None else {}), "input": ex.input, **record}
        if ex.target is not None:
          record["target"] = ex.target
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        if self.ensemble:
          per_prompt.append([record["predictions"][p] for p in self.prompts])
          combined.append(record["prediction"])
        else:
          per_prompt.append(record)
      self.progress(chunk.stop, total, start)
    if self.ensemble:
      return ensemble.report(self.prompts, per_prompt, combined, [e.target for e in examples])
    return accuracy_by_prompt(per_prompt)

  def _batch(self, names: list[str], rows: np.ndarray, valid: np.ndarray, index: int
             ) -> list[dict]:
    if self.ensemble:
      return self._ensemble(rows, valid, index)
    if self.labels is not None:
      scores = self.server.classify(names, rows, self.label_tokens, valid=valid,
                                    label_valid=self.label_valid)
      return [{"prompt": n, "prediction": self.labels[int(np.argmax(s))],
               "score": float(np.max(s)), "label_scores": dict(zip(self.labels, map(float, s)))}
              for n, s in zip(names, scores)]
    out, scores = self.server.generate(names, rows, index, valid=valid)
    return [{"prompt": n, "prediction": self._text(o), "score": float(s)}
            for n, o, s in zip(names, out, scores)]

  def _ensemble(self, rows: np.ndarray, valid: np.ndarray, index: int) -> list[dict]:
    if self.labels is not None:
      ll = ensemble.classify(self.server, self.prompts, rows, self.label_tokens, valid,
                             self.label_valid)  # [B, N, C]
      texts = [[self.labels[int(c)] for c in np.argmax(r, axis=-1)] for r in ll]
      scores = np.max(ll, axis=-1)
      if self.combine == "logprob":
        chosen = [self.labels[int(c)] for c in ensemble.mean_logprob_choice(ll)]
      else:
        chosen = [ensemble.majority_vote(t, s) for t, s in zip(texts, scores)]
    else:
      out, scores = ensemble.generate(self.server, self.prompts, rows, index,
                                      valid)  # [B, N, S]
      texts = [[self._text(o) for o in r] for r in out]
      if self.combine == "logprob":  # candidates: the N answers, scored under every prompt
        ll = ensemble.rescore(self.server, self.prompts, rows, out, valid)
        chosen = [t[int(c)] for t, c in zip(texts, ensemble.mean_logprob_choice(ll))]
      else:
        chosen = [ensemble.majority_vote(t, s) for t, s in zip(texts, scores)]
    label = f"ensemble({','.join(self.prompts)})"
    return [{"prompt": label, "prediction": c,
             "votes": dict(collections.Counter(t).most_common()),
             "predictions": dict(zip(self.prompts, t)),
             "scores": dict(zip(self.prompts, map(float, s)))}
            for c, t, s in zip(chosen, texts, scores)]

  def _text(self, ids: np.ndarray) -> str:
    return inputs.decode(self.vocab, ids, self.server.settings.eos_id)


def accuracy_by_prompt(records: Sequence[dict]) -> Optional[dict]:
  """Exact-match accuracy per prompt over the records that carry a target."""
  scored = [r for r in records if "target" in r]
  if not scored:
    return None
  by: dict[str, list[bool]] = {}
  for r in scored:
    by.setdefault(r["prompt"], []).append(r["prediction"] == r["target"])
  return {"num_scored": len(scored), "accuracy": {p: float(np.mean(v)) for p, v in by.items()}}


def tty_progress(prog: str) -> Progress:
  """A progress display on stderr ("prog: done/total inputs (rate/s)"), only on a terminal."""
  def show(done: int, total: int, start: float) -> None:
    if sys.stderr.isatty():
      rate = done / max(time.time() - start, 1e-9)
      print(f"\r{prog}: {done}/{total} inputs ({rate:.1f}/s)", end="\n" if done == total else "",
            file=sys.stderr, flush=True)
  return show
