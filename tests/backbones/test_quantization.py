"""Weight-only quantization of the frozen backbone (QUANTIZATION, qwix) on the embedded models.

Invariants: a quantized backbone's logits equal the float network's on the dequantized kernels
(qwix does the matmuls; nothing else changes); its logits are close to float32's, int8 closer
than int4; the prompt's gradient stays finite and close; the compiled step's frozen argument
shrinks, and with its temporaries stays well under float32's without remat; the abstract tree
(the planner's) is the loaded one's shapes; without qwix the line names the pip command.
"""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

qwix = pytest.importorskip("qwix")

from spot_jax import backbone as backbone_lib  # noqa: E402
from spot_jax import embedded, models, partitioning  # noqa: E402
from spot_jax.backbones import quantization  # noqa: E402
from spot_jax.backbones.decoder.network import DecoderLM  # noqa: E402
from spot_jax.backbones.t5 import config as t5_config  # noqa: E402
from spot_jax.backbones.t5.network import Transformer  # noqa: E402
from spot_jax.embedded import decoder_config  # noqa: E402
from spot_jax.errors import ConfigError  # noqa: E402
from spot_jax.prompts.prompt_tuning import PromptTuning  # noqa: E402
from tests.helpers import REPO  # noqa: E402

MESH = partitioning.create_mesh(1)
RULES = partitioning.logical_rules()


def _model(kind: str, q: str, prompt=None):
  if kind == "decoder":
    cfg = decoder_config.toy_config(quantization=q)
    return models.DecoderOnlyModel(DecoderLM(cfg, prompt)), embedded.DECODER_CHECKPOINT_PATH
  cfg = t5_config.config_by_name("t5_1_1_toy", dropout_rate=0.0, quantization=q)
  return models.EncoderDecoderModel(Transformer(cfg, prompt)), embedded.CHECKPOINT_PATH


def _batch(model, batch_size=4):
  rng = np.random.RandomState(0)
  batch = {k: jnp.asarray(rng.randint(3, 170, v.shape), jnp.int32)
           for k, v in model.dummy_batch(24, 8, batch_size).items()}
  for k in batch:
    if k.endswith("loss_weights"):
      batch[k] = jnp.ones_like(batch[k])
  return batch


def _logits(model, params, batch):
  if model.kind == "decoder":
    return jax.jit(lambda p, b: model.logits(p, b))(params, batch)
  fn = lambda p, b: model.module.apply({"params": p}, b["encoder_input_tokens"],
                                       b["decoder_input_tokens"], b["decoder_target_tokens"])
  return jax.jit(fn)(params, batch)


_CACHE = {}


def _loaded(kind, q):
  if (kind, q) not in _CACHE:
    model, ckpt = _model(kind, q)
    params, shardings = backbone_lib.load_backbone(model, model.dummy_batch(8, 4), ckpt, 0, MESH,
                                                   RULES, info=lambda _: None)
    _CACHE[kind, q] = (model, params, shardings)
  return _CACHE[kind, q]


@pytest.mark.parametrize("kind", ["decoder", "t5"])
def test_kernels_quantized_embeddings_float(kind):
  _, params, _ = _loaded(kind, "int8")
  flat = traverse_util.flatten_dict(params)
  kernels = {p: v for p, v in flat.items() if p[-1] == "kernel"}
  assert kernels and all(quantization.is_quantized(v) for v in kernels.values())
  assert all(v.qvalue.dtype == jnp.int8 for v in kernels.values())
  rest = [v for p, v in flat.items() if p[-1] != "kernel"]
  assert rest and not any(quantization.is_quantized(v) for v in rest)
  assert any("embedding" in p[-1] for p in flat)


@pytest.mark.parametrize("kind", ["decoder", "t5"])
@pytest.mark.parametrize("q", ["int8", "int4", "nf4"])
def test_quantized_logits_are_the_float_network_on_dequantized_kernels(kind, q):
  model, params, _ = _loaded(kind, q)
  batch = _batch(model)
  dequantized = jax.tree.map(lambda x: qwix.dequantize(x) if quantization.is_quantized(x) else x,
                             params, is_leaf=quantization.is_quantized)
  float_model, _, _ = _loaded(kind, "none")
  np.testing.assert_allclose(_logits(model, params, batch),
                             _logits(float_model, dequantized, batch), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["decoder", "t5"])
def test_logit_error_against_float32(kind):
  float_model, float_params, _ = _loaded(kind, "none")
  batch = _batch(float_model)
  ref = np.asarray(_logits(float_model, float_params, batch))
  errors = {}
  for q in ("int8", "int4"):
    model, params, _ = _loaded(kind, q)
    diff = np.abs(np.asarray(_logits(model, params, batch)) - ref)
    errors[q] = (float(diff.max()), float(diff.mean()))
    print(f"{kind} {q}: max |logit error| {diff.max():.4f}, mean {diff.mean():.4f} "
          f"(mean |logit| {np.abs(ref).mean():.3f})")
  assert 0 < errors["int8"][1] < 0.02 * np.abs(ref).mean()
  assert errors["int8"][1] < errors["int4"][1] < 0.25 * np.abs(ref).mean()
  # argmax mostly kept at int8
  model, params, _ = _loaded(kind, "int8")
  same = np.mean(np.argmax(_logits(model, params, batch), -1) == np.argmax(ref, -1))
  assert same > 0.95


@pytest.mark.parametrize("kind", ["decoder", "t5"])
def test_prompt_gradient_finite_and_close(kind):
  grads = {}
  for q in ("none", "int8"):
    model, _ = _model(kind, q, PromptTuning(length=5))
    backbone, _ = _loaded(kind, q)[1:]
    batch = _batch(model)
    prompt = model.init_prompt(jax.random.PRNGKey(1), backbone, batch)
    prompt = models.unbox(prompt)
    loss = lambda p: model.loss_fn(models.merge_params(backbone, p), batch, None, False)[0]
    grad = jax.jit(jax.grad(loss))(prompt)
    grads[q] = np.concatenate([np.ravel(g) for g in jax.tree.leaves(grad)])
    print(f"{kind} {q}: prompt gradient norm {np.linalg.norm(grads[q]):.4g}")
  assert np.all(np.isfinite(grads["int8"])) and np.abs(grads["int8"]).sum() > 0
  cosine = grads["int8"] @ grads["none"] / np.linalg.norm(grads["int8"]) / np.linalg.norm(
      grads["none"])
  assert cosine > 0.95, cosine


@pytest.mark.parametrize("kind", ["decoder", "t5"])
def test_abstract_tree_is_the_loaded_one_and_smaller(kind):
  model, params, shardings = _loaded(kind, "int8")
  boxed = jax.eval_shape(model.init_backbone, jax.random.PRNGKey(0), model.dummy_batch(8, 4))
  abstract = quantization.abstract(boxed, model.config)
  shape = lambda t: jax.tree.map(lambda x: (x.shape, x.dtype), t)
  assert shape(abstract) == shape(params)
  assert jax.tree.structure(shardings) == jax.tree.structure(params)

  def argument_bytes(tree):
    compiled = jax.jit(lambda p: jax.tree.leaves(p)[0], keep_unused=True).lower(tree).compile()
    return compiled.memory_analysis().argument_size_in_bytes

  def kernels(tree):
    return {p: v for p, v in traverse_util.flatten_dict(tree).items() if p[-1] == "kernel"}

  float_model, float_params, _ = _loaded(kind, "none")
  float_kernels = argument_bytes(jax.eval_shape(lambda: kernels(float_params)))
  by_q = {}
  for q in ("int8", "int4"):
    q_abstract = quantization.abstract(boxed, model.config.replace(quantization=q))
    by_q[q] = argument_bytes(kernels(q_abstract))
    print(f"{kind} {q}: kernels {by_q[q]} bytes vs float32 {float_kernels}")
  assert by_q["int8"] < 0.3 * float_kernels  # int8 values (1/4) plus per-channel scales
  assert by_q["int4"] <= by_q["int8"]


def test_tile_must_divide_the_contracted_axis():
  cfg = decoder_config.toy_config(quantization="int4", quantization_tile=48)
  model = models.DecoderOnlyModel(DecoderLM(cfg))
  with pytest.raises(ConfigError, match="QUANTIZATION_TILE=48 does not divide"):
    backbone_lib.load_backbone(model, model.dummy_batch(8, 4), None, 0, MESH, RULES,
                               info=lambda _: None)


def test_sub_channel_int4_is_closer_than_per_channel():
  float_model, float_params, _ = _loaded("decoder", "none")
  batch = _batch(float_model)
  ref = np.asarray(_logits(float_model, float_params, batch))
  cfg = decoder_config.toy_config(quantization="int4", quantization_tile=32)
  model = models.DecoderOnlyModel(DecoderLM(cfg))
  params, _ = backbone_lib.load_backbone(model, model.dummy_batch(8, 4),
                                         embedded.DECODER_CHECKPOINT_PATH, 0, MESH, RULES)
  tiled = np.abs(np.asarray(_logits(model, params, batch)) - ref).mean()
  _, per_channel, _ = _loaded("decoder", "int4")
  assert tiled < np.abs(np.asarray(_logits(model, per_channel, batch)) - ref).mean()


def test_unknown_quantization_is_one_line():
  with pytest.raises(ConfigError, match="quantization='int3'"):
    decoder_config.toy_config(quantization="int3")


def test_without_qwix_the_line_names_the_pip_command(tmp_path):
  shim = tmp_path / "shim"
  shim.mkdir()
  (shim / "sitecustomize.py").write_text("import sys\nsys.modules['qwix'] = None\n")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shim), str(REPO)]), JAX_PLATFORMS="cpu")
  model_dir = tmp_path / "run"
  args = [sys.executable, "-m", "spot_jax.train", "--gin_file=gin/models/decoder_toy.gin",
          "--gin_file=gin/prompts/prompt_tuning_sampled_vocab.gin",
          "--gin_file=gin/runs/prompt_tune.gin", f"--gin.MODEL_DIR='{model_dir}'",
          "--gin.MIXTURE_OR_TASK_NAME='spot_toy_sentiment_travel_taskless_v100'",
          "--gin.MIXTURE_OR_TASK_MODULE='tasks.embedded'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 8}",
          "--gin.INITIAL_CHECKPOINT_PATH='spot_jax/embedded/toy_decoder/checkpoint'",
          "--gin.PROMPT_LENGTH=5", "--gin.TRAIN_STEPS=2", "--gin.QUANTIZATION='int8'"]
  proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if "error" in l]
  assert len(lines) == 1 and "pip install 'spot-jax[quant]'" in lines[0], proc.stderr[-2000:]
  assert not model_dir.exists()


def test_step_inputs_hold_the_quantized_frozen_tree():
  from spot_jax.train import footprint, optimizers  # pylint: disable=g-import-not-at-top
  model, ckpt = _model("decoder", "int8", PromptTuning(length=5))
  inputs = footprint.step_inputs(model, optimizers.adamw(), {"inputs": 8, "targets": 4}, 2,
                                 MESH, initial_checkpoint_path=ckpt)
  kernels = [v for p, v in traverse_util.flatten_dict(inputs.frozen).items() if p[-1] == "kernel"]
  assert kernels and all(quantization.is_quantized(k) and k.qvalue.dtype == jnp.int8
                         for k in kernels)
  assert all(k.qvalue.sharding is not None for k in kernels)


@pytest.mark.parametrize("kind", ["decoder", "t5"])
def test_an_int8_step_without_remat_takes_fewer_bytes_than_float32(kind):
  """Each layer's kernel is dequantized when its input (forward) or its output's cotangent
  (backward) is there, not all at once: weights plus temporaries of the compiled int8 step are
  well under float32's (at 4 layers of Llama-3.2-1B's and T5.1.1-large's widths)."""
  from spot_jax import prompts  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones import decoder  # pylint: disable=g-import-not-at-top
  from spot_jax.train import optimizers, plan  # pylint: disable=g-import-not-at-top
  if kind == "decoder":
    cfg = decoder.config_by_name("llama_3_2_1b").replace(num_layers=4, vocab_size=4096,
                                                         bos_id=1, eos_id=2)
    model = models.DecoderOnlyModel(DecoderLM(cfg, prompt=prompts.PromptTuning(4)))
  else:
    cfg = t5_config.config_by_name("t5_1_1_large").replace(num_encoder_layers=4,
                                                           num_decoder_layers=4)
    model = models.EncoderDecoderModel(Transformer(cfg, prompts.PromptTuning(4)))
  planner = plan.Planner(model, optimizers.adamw(), {"inputs": 32, "targets": 8}, MESH)
  step = {q: planner.measure(plan.Setting("float32", "none", False, 2, quantization=q))
          for q in ("none", "int8")}
  total = {q: f.frozen + f.temporaries for q, f in step.items()}
  print(kind, {q: (f.frozen >> 20, f.temporaries >> 20) for q, f in step.items()}, "MiB")
  assert total["int8"] < 0.7 * total["none"]
