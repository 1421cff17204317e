"""Console progress lines and TensorBoard event files."""
from __future__ import annotations

import pathlib
import sys
import time
from typing import Mapping, Optional, TextIO


def format_duration(seconds: float) -> str:
  """1h02m, 3m05s, 12s."""
  seconds = max(0, int(round(seconds)))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  if h:
    return f"{h}h{m:02d}m"
  if m:
    return f"{m}m{s:02d}s"
  return f"{s}s"


class ProgressLogger:
  """Writes one readable line per logging period (when enabled) and scalars to TensorBoard
  (when given a folder).

  Attributes:
    total_steps: the run's last step.
    batch_size: global examples per step.
  """

  def __init__(self, total_steps: int, batch_size: int, tb_dir: Optional[pathlib.Path],
               stream: Optional[TextIO] = None, enabled: bool = True):
    self.total_steps, self.batch_size = total_steps, batch_size
    self._stream, self._enabled = stream, enabled
    self._last_time: Optional[float] = None
    self._last_step: Optional[int] = None
    self._writers: dict[str, object] = {}
    self._tb_dir = tb_dir

  def _writer(self, name: str):
    if self._tb_dir is None:
      return None
    if name not in self._writers:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      self._writers[name] = tf.summary.create_file_writer(str(self._tb_dir / name))
    return self._writers[name]

  def start(self, step: int) -> None:
    self._last_time, self._last_step = time.perf_counter(), step

  def compiled(self, step: int) -> None:
    """`step`, the process's first, has run: it compiled the step function, so rates and the ETA
    count from its end (a first line at `step` itself has no rate yet)."""
    self._last_time, self._last_step = time.perf_counter(), step

  def scalars(self, group: str, step: int, values: Mapping[str, float]) -> None:
    """Writes scalars to the TensorBoard run `group` ("train", "eval")."""
    writer = self._writer(group)
    if writer is None:
      return
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    with writer.as_default(step=step):
      for name, value in values.items():
        tf.summary.scalar(name, float(value))
    writer.flush()

  def train_line(self, step: int, values: Mapping[str, float], note: str = "") -> str:
    """Logs the progress line for `step` (values: loss, learning_rate, ...) and returns it.

    `note` follows the loss (e.g. the spread of K runs' losses).
    """
    now = time.perf_counter()
    steps_per_s = float("nan")
    if self._last_time is not None and step > self._last_step:
      steps_per_s = (step - self._last_step) / max(now - self._last_time, 1e-9)
    self._last_time, self._last_step = now, step
    timed = steps_per_s == steps_per_s and steps_per_s > 0
    rate = dict(values)
    if timed:
      rate["steps_per_sec"] = steps_per_s
      rate["examples_per_sec"] = steps_per_s * self.batch_size
    parts = [f"step {step}/{self.total_steps}", f"loss {values['loss']:.4f}{note}"]
    if "learning_rate" in values:
      parts.append(f"lr {values['learning_rate']:.3g}")
    if timed:
      parts.append(f"{steps_per_s:.2f} steps/s")
      parts.append(f"{rate['examples_per_sec']:.1f} ex/s")
      parts.append(f"ETA {format_duration((self.total_steps - step) / steps_per_s)}")
    else:  # only the compiling first step has run: no rate yet
      parts.append("ETA 0s" if step >= self.total_steps else "ETA after compile")
    line = " | ".join(parts)
    if self._enabled:
      print(line, file=self._stream or sys.stdout, flush=True)
    self.scalars("train", step, rate)
    return line

  def info(self, message: str) -> None:
    if self._enabled:
      print(message, file=self._stream or sys.stdout, flush=True)

  def close(self) -> None:
    for writer in self._writers.values():
      writer.close()
