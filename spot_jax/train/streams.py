"""Each run's training data stream, as the global batches of the job's train step.

One run: the stream of `spot_jax.data.train_batches`, each process keeping its rows of the
global batch (as the trainer always did). K runs: every process reads each run's whole stream
(its own task and seed, positioned by the shared data position) and stacks the K batches into
one [K, B, ...] global batch; with length buckets the runs' inputs (a decoder-only model's
sequences) are padded to the widest bucket of the step (padding is masked, so each run's losses
do not change). Inputs and targets
longer than TASK_FEATURE_LENGTHS are truncated by the pipeline and counted here.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import jax
import numpy as np

from spot_jax import data as data_lib
from spot_jax import partitioning
from spot_jax.data import replay

# The features length buckets cut, by whether the batches are encoder-decoder ones (True).
_BUCKETED = {True: ("encoder_input_tokens",),
             False: ("decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights")}


class Streams:
  """The job's data streams and the truncation counts.

  Attributes:
    truncated: examples whose inputs / targets were truncated so far, and examples seen.
  """

  def __init__(self, plan, log: Any):
    self.plan = plan
    self._info: Callable[[str], None] = log.info
    self.truncated = {"inputs": 0, "targets": 0, "seen": 0}
    self._warned: set[str] = set()

  def _count(self, host: dict) -> dict:
    self.truncated["inputs"] += int(np.sum(host.pop("inputs_truncated")))
    self.truncated["targets"] += int(np.sum(host.pop("targets_truncated")))
    self.truncated["seen"] += len(host["decoder_target_tokens"])
    return host

  def global_batches(self, start_position: int, sharding: jax.sharding.Sharding) -> Iterator[dict]:
    """Endless global batches from `start_position` batches into each run's stream."""
    if not self.plan.stacked:
      yield from self._one(start_position, sharding)
      return
    # Every process reads every run's whole stream; one read by an earlier job of this process
    # (another method on the same task and seed) is replayed, not read again.
    streams = [replay.replayed_train_batches(cfg, start_position=start_position)
               for cfg in self.plan.train_cfgs]
    while True:
      hosts = [self._count(next(s)) for s in streams]
      padded = _BUCKETED["encoder_input_tokens" in hosts[0]]
      width = max(h[padded[0]].shape[1] for h in hosts)
      stacked = {}
      for name in hosts[0]:
        rows = [h[name] for h in hosts]
        if name in padded and any(r.shape[1] != width for r in rows):
          rows = [np.pad(r, ((0, 0), (0, width - r.shape[1]))) for r in rows]
        stacked[name] = partitioning.global_batch(np.stack(rows), sharding)
      yield stacked

  def _one(self, start_position: int, sharding: jax.sharding.Sharding) -> Iterator[dict]:
    batches = data_lib.train_batches(self.plan.train_cfgs[0], start_position=start_position,
                                     shard_id=jax.process_index(), num_shards=jax.process_count())
    for host in batches:
      host = self._count(host)
      yield {k: jax.make_array_from_process_local_data(sharding, v) for k, v in host.items()}

  def warn_truncation(self) -> None:
    """Warns once per feature when examples have been truncated so far."""
    lengths = self.plan.train_cfgs[0].task_feature_lengths
    for key in ("inputs", "targets"):
      if self.truncated[key] and key not in self._warned:
        self._warned.add(key)
        self._info(f"warning: {self.truncated[key]} of {self.truncated['seen']} training examples "
                   f"so far had {key} longer than TASK_FEATURE_LENGTHS[{key!r}]={lengths[key]} and "
                   f"were truncated")

  def report_truncation(self) -> None:
    if self.truncated["inputs"] or self.truncated["targets"]:
      self._info(f"truncated in this run: {self.truncated['inputs']} inputs and "
                 f"{self.truncated['targets']} targets of {self.truncated['seen']} examples")
