"""The planner agrees with reality: a real step's peak memory is within 20% of the planned total.

`benchmarks.plan_check` runs each setting in a fresh process on one CPU device: the planner's
per-device total (XLA's analysis of the compiled step) against the peak resident memory of one
real step minus the memory before its weights existed. A decoder of a few hundred MB, so the
step's memory dominates the process's own.
"""
from __future__ import annotations

import pytest

from benchmarks import plan_check

SHAPE = dict(bos_id=1, eos_id=2, vocab_size=16384, emb_dim=512, mlp_dim=2048, num_heads=8,
             num_kv_heads=4, head_dim=64)
SETTINGS = [("float32", "none"), ("float32", "full"), ("bfloat16", "none"), ("bfloat16", "full")]


@pytest.mark.parametrize("weights,remat", SETTINGS)
def test_real_peak_within_20_percent_of_the_plan(weights, remat):
  row, = plan_check.check("llama_3_2_1b", [(weights, remat)], num_layers=2, batch_size=8,
                          input_length=256, target_length=64, prompt_length=20,
                          overrides=SHAPE)
  planned = row["planned"]["total"]
  assert planned > 200 << 20, row  # the step's memory dominates the process's baseline
  assert abs(row["real"] - planned) <= plan_check.TOLERANCE * planned, row
