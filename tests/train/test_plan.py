"""The memory planner: its parts add up to XLA's analysis, FSDP divides the weights, and the
nearest setting is the one that changes least."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import jax
import numpy as np
import pytest

from spot_jax import models, partitioning, prompts
from spot_jax.backbones import decoder, quantization, t5
from spot_jax.train import footprint, optimizers, plan
from tests.helpers import REPO

LENGTHS = {"inputs": 24, "targets": 8}


def _model(kind: str):
  prompt = prompts.PromptTuning(length=4)
  if kind == "t5":
    return models.EncoderDecoderModel(t5.Transformer(t5.config_by_name("t5_1_1_test"),
                                                     prompt=prompt))
  return models.DecoderOnlyModel(decoder.DecoderLM(decoder.config_by_name("decoder_tiny_llama"),
                                                   prompt=prompt))


def _bytes(tree) -> int:
  return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("kind", ["t5", "decoder"])
def test_footprint_parts_are_the_weights_the_state_and_xla_temporaries(kind):
  model = _model(kind)
  mesh = partitioning.create_mesh(1, jax.devices()[:1])
  found = footprint.measure(model, optimizers.adamw(), LENGTHS, 4, mesh)
  dummy = model.dummy_batch(LENGTHS["inputs"], LENGTHS["targets"])
  frozen = models.unbox(jax.eval_shape(model.init_backbone, jax.random.PRNGKey(0), dummy))
  prompt = models.unbox(jax.eval_shape(model.init_prompt, jax.random.PRNGKey(0), frozen, dummy))
  assert found.frozen == _bytes(frozen)
  # AdamW: the prompt, its two moments, and a few scalars (step, counts, rng, data position)
  assert 3 * _bytes(prompt) <= found.trainable <= 3 * _bytes(prompt) + 64
  step, state, frozen_abs, batch = footprint.build(model, optimizers.adamw(), LENGTHS, 4, mesh)
  stats = footprint.compile_step(step, state, frozen_abs, batch, mesh).memory_analysis()
  assert found.frozen + found.trainable + found.batch == stats.argument_size_in_bytes
  assert found.temporaries >= stats.temp_size_in_bytes > 0
  assert found.total == sum((found.frozen, found.trainable, found.batch, found.temporaries))
  assert found.flops > 0


def test_alternatives_come_nearest_first():
  base = plan.Setting(weights="float32", remat="none", fsdp=False, batch_size=8)
  config = decoder.config_by_name("decoder_tiny_llama")
  ranked = plan.alternatives(base, 8, config)
  costs = [cost for cost, _ in ranked]
  assert costs == sorted(costs) and base not in [s for _, s in ranked]
  assert all(cost == s.cost(base) >= 1 for cost, s in ranked)
  assert plan.Setting("float32", "none", True, 8) in [s for c, s in ranked if c == 1]
  assert [s for _, s in ranked][-1].batch_size == 8  # quartering the batch: only with others
  halved = plan.Setting("float32", "none", False, 4)
  assert halved.cost(base) == 3 and halved.overrides(base) == "--gin.BATCH_SIZE=4"


def _plan(*flags):
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  return subprocess.run(
      [sys.executable, "-m", "spot_jax.plan", "--gin_file=gin/models/decoder_tiny_llama.gin",
       "--gin_file=gin/prompts/prompt_tuning_uniform.gin", "--gin_file=gin/runs/prompt_tune.gin",
       "--gin.PROMPT_LENGTH=4", "--gin.BATCH_SIZE=8",
       "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 8}", *flags],
      capture_output=True, text=True, cwd=REPO, env=env, timeout=600, check=False)


def test_fsdp_over_8_devices_holds_an_eighth_of_the_weights_per_device(tmp_path):
  one = _plan("--devices=1", f"--json={tmp_path / 'one.json'}")
  eight = _plan("--devices=8", "--gin.FSDP=True", f"--json={tmp_path / 'eight.json'}")
  assert one.returncode == 0 and eight.returncode == 0, one.stderr + eight.stderr
  assert "8 device(s) (data=8 x model=1)" in eight.stdout
  assert re.search(r"^  frozen weights +[0-9.]+ MiB$", one.stdout, re.M), one.stdout
  one, eight = (json.loads((tmp_path / f"{n}.json").read_text())["footprint"]
                for n in ("one", "eight"))
  # every weight of the tiny decoder has an "embed" axis: exactly an eighth on each device
  assert eight["frozen"] * 8 == one["frozen"] > 0
  assert eight["devices"] == 8 and eight["trainable"] == one["trainable"]


def test_int8_plans_fewer_weight_bytes_than_bfloat16_and_the_nearest_fit_names_it():
  # Llama-3.1-8B's shapes at 4 layers: its weights, not XLA:CPU's dequantization temporaries,
  # decide (at toy sizes the temporaries do)
  config = decoder.config_by_name("llama_3_1_8b").replace(num_layers=4)
  model = models.DecoderOnlyModel(decoder.DecoderLM(config, prompt=prompts.PromptTuning(4)))
  mesh = partitioning.create_mesh(1, jax.devices()[:1])
  planner = plan.Planner(model, optimizers.adamw(), LENGTHS, mesh)
  base = plan.Setting("bfloat16", "full", False, 2)
  int8 = plan.Setting.of_format("int8", "full", False, 2)
  assert int8 == plan.Setting("bfloat16", "full", False, 2, quantization="int8")
  weights = {f: planner.weights(plan.Setting.of_format(f, "full", False, 2))
             for f in ("float32", "bfloat16", "int8", "int4")}
  assert weights["int4"] < weights["int8"] < weights["bfloat16"] == weights["float32"] // 2
  # int8: a byte per kernel entry plus a scale per output channel; the embedding bfloat16
  inputs = footprint.step_inputs(plan.apply(model, int8), optimizers.adamw(), LENGTHS, 2, mesh)
  kernels = [x for x in jax.tree.leaves(inputs.frozen, is_leaf=quantization.is_quantized)
             if quantization.is_quantized(x)]
  assert kernels and all(k.qvalue.dtype == np.int8 for k in kernels)
  entries = sum(k.qvalue.size for k in kernels)
  table = config.vocab_size * config.emb_dim * 2
  assert entries + table < weights["int8"] < 1.01 * entries + table + (1 << 20)
  assert weights["int4"] < 0.51 * entries + table + (1 << 20)
  found, quantized = planner.measure(base), planner.measure(int8)
  assert quantized.frozen == weights["int8"] and quantized.total < found.total
  budget = (found.total + quantized.total) // 2
  setting, near = planner.nearest_fit(base, budget, found.trainable)
  assert setting == int8 and near.total == quantized.total
  assert setting.overrides(base) == "--gin.QUANTIZATION=\"'int8'\""


def test_the_suggested_quantization_is_valid_gin_and_a_bad_one_is_one_line():
  setting = plan.Setting.of_format("int4", "full", False, 8)
  good = _plan(*shlex.split(setting.overrides()))
  assert good.returncode == 0, good.stderr[-2000:]
  assert f"  setting: {setting.overrides()}" in good.stdout
  bad = _plan("--gin.QUANTIZATION='int3'")
  lines = [line for line in bad.stderr.splitlines() if "error" in line]
  assert bad.returncode == 2 and len(lines) == 1, bad.stderr[-2000:]
  assert "QUANTIZATION='int3'" in lines[0] and "valid: none, int8, int4, nf4" in lines[0]
