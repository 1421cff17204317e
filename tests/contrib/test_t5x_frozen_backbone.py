"""The contrib model under t5x's own Trainer computes no gradient for a frozen weight
(skips without t5x).

The step is what `t5x.train` compiles (`Trainer.compile_train`: t5x's `train_with_lr` under its
`PjitPartitioner`), for the model gin/t5x/models/common.gin builds. A frozen weight's gradient is
a matmul whose output has the weight's shape ([in, out] or its transpose); the test model's
widths are chosen so that no activation has such a shape, and the optimized HLO must hold none.
t5x's `WeightMetricsComputer` reads every gradient (RMS per parameter, global norm): with the
backbone's gradients stopped they are zeros and still cost no matmul, while the same model with
`freeze_backbone = False` computes them all, which shows the check can fail.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("t5x.trainer",
                    reason="t5x is not importable (install it from its repository: docs/t5x.md)")

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
from flax import traverse_util
from t5x import trainer as t5x_trainer

from spot_jax.backbones import t5
from benchmarks import common
from benchmarks.peers import t5x_train as t5x_bench
from spot_jax.contrib.t5x import optim
from spot_jax.contrib.t5x import partitioning
from spot_jax.errors import ConfigError

# Widths no activation shares: E=24, H*D=2*10, MLP=36, V=52; B*T = 2*(9+6) encoder, 2*5 decoder.
CONFIG = t5.config_by_name("t5_1_1_test", dropout_rate=0.1).replace(
    vocab_size=52, emb_dim=24, num_heads=2, head_dim=10, mlp_dim=36)
PROMPT_LENGTH = 6
MATMUL = re.compile(r"^\s*\S+ = f32\[([\d,]*)\]\S* (dot|convolution|custom-call)\(", re.M)


def _trainer(*, freeze: bool, weight_metrics: bool):
  bindings = [] if freeze else ["spot_t5x_models.PromptEncoderDecoderModel.freeze_backbone = False"]
  model = t5x_bench.build_contrib_model(CONFIG, PROMPT_LENGTH, *bindings)
  batch = {k: jnp.asarray(v) for k, v in common.numpy_batch(CONFIG.vocab_size, 2, 9, 5, 0).items()}
  batch["decoder_loss_weights"] = jnp.ones_like(batch["decoder_target_tokens"], jnp.float32)
  tr = t5x_bench.t5x_trainer(model, batch, partitioning.logical_axis_rules(),
                             weight_metrics_computer=(
                                 t5x_trainer.WeightMetricsComputer() if weight_metrics else None))
  tr.compile_train(batch)
  return tr, batch


def _frozen_kernel_shapes(params) -> dict[tuple[int, ...], list[str]]:
  shapes = {}
  for path, value in traverse_util.flatten_dict(params, sep="/").items():
    if value.ndim == 2 and not path.startswith("prompt/"):
      for shape in (value.shape, value.shape[::-1]):
        shapes.setdefault(tuple(shape), []).append(path)
  return shapes


def _gradient_matmuls(tr) -> list[tuple[int, ...]]:
  """Output shapes of the compiled step's matmuls that have a frozen kernel's shape."""
  hlo = tr._compiled_train_step.as_text()  # pylint: disable=protected-access
  kernels = _frozen_kernel_shapes(tr.train_state.params)
  found = [tuple(int(d) for d in m.group(1).split(",") if d) for m in MATMUL.finditer(hlo)]
  assert found, "no matmul found in the optimized HLO (has its text format changed?)"
  return [shape for shape in found if shape in kernels]


@pytest.fixture(scope="module")
def frozen_with_weight_metrics():
  return _trainer(freeze=True, weight_metrics=True)


def test_the_test_models_kernels_have_shapes_no_activation_has(frozen_with_weight_metrics):
  tr, _ = frozen_with_weight_metrics
  kernels = _frozen_kernel_shapes(tr.train_state.params)
  # Attention q/k/v/o, gated MLP wi_0/wi_1/wo and the output layer: all are checked.
  assert {(24, 20), (20, 24), (24, 36), (36, 24), (24, 52)} <= set(kernels)
  activations = {(2 * (9 + PROMPT_LENGTH), 24), (2 * 5, 24), (2 * (9 + PROMPT_LENGTH), 36),
                 (2 * 5, 52)}
  assert not activations & set(kernels)


def test_compiled_t5x_step_has_no_gradient_matmul_for_a_frozen_weight(frozen_with_weight_metrics):
  assert _gradient_matmuls(frozen_with_weight_metrics[0]) == []
  assert _gradient_matmuls(_trainer(freeze=True, weight_metrics=False)[0]) == []


def test_without_freeze_backbone_t5x_computes_frozen_gradients_the_check_sees():
  tr, _ = _trainer(freeze=False, weight_metrics=True)
  found = set(_gradient_matmuls(tr))
  # Every kind of frozen kernel (attention, MLP, output layer) gets its gradient matmul(s); XLA
  # may merge those sharing an operand (e.g. cross-attention key and value), so kinds, not counts.
  for shape in [(24, 20), (24, 36), (24, 52)]:
    assert {shape, shape[::-1]} & found, (shape, found)


def test_backbone_bit_identical_after_t5x_steps_and_its_gradients_are_zero(
    frozen_with_weight_metrics):
  tr, batch = frozen_with_weight_metrics
  before = jax.tree.map(np.asarray, traverse_util.flatten_dict(tr.train_state.params, sep="/"))
  summary = tr.train(iter([batch] * 3), 3).result()  # {name: clu Scalar}
  metrics = {k: float(v.value) for k, v in summary.items()}
  after = jax.tree.map(np.asarray, traverse_util.flatten_dict(tr.train_state.params, sep="/"))
  assert int(tr.train_state.step) == 3 and sorted(before) == sorted(after)
  backbone = [k for k in before if not k.startswith("prompt/")]
  assert len(backbone) > 20
  for name in backbone:
    np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    assert metrics[f"weight_gradient_rms/{name}"] == 0.0, name
  assert not np.allclose(after["prompt/prompt"], before["prompt/prompt"])
  assert metrics["weight_gradient_rms/prompt/prompt"] > 0.0
  assert np.isfinite(metrics["loss"])


def test_an_optimizer_of_the_backbone_is_refused_in_one_line_while_gradients_stop():
  shapes = {"encoder_input_tokens": (2, 9), "decoder_input_tokens": (2, 5),
            "decoder_target_tokens": (2, 5)}
  whole = ("from t5x import adafactor",  # t5x's Adafactor of every parameter
           "spot_t5x_models.PromptEncoderDecoderModel.optimizer_def = @adafactor.Adafactor()")
  model = t5x_bench.build_contrib_model(CONFIG, PROMPT_LENGTH, *whole)
  with pytest.raises(ConfigError) as info:
    model.get_initial_variables(jax.random.PRNGKey(0), shapes)
  message = str(info.value)
  assert "\n" not in message and message.startswith("the optimizer updates ")
  params = t5x_bench.build_contrib_model(CONFIG, PROMPT_LENGTH).get_initial_variables(
      jax.random.PRNGKey(0), shapes)["params"]
  backbone = sorted("/".join(k) for k in traverse_util.flatten_dict(params) if k[0] != "prompt")
  assert message.startswith(f"the optimizer updates {len(backbone)} backbone parameter(s) "
                            f"({backbone[0]}, ")
  assert optim.backbone_paths_updated(model.optimizer_def, params) == backbone
  # The prompt-only optimizer passes; so does any optimizer without the stop (t5x's own way).
  unfrozen = t5x_bench.build_contrib_model(
      CONFIG, PROMPT_LENGTH, *whole,
      "spot_t5x_models.PromptEncoderDecoderModel.freeze_backbone = False")
  assert "prompt" in unfrozen.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
