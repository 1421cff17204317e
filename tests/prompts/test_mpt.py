"""MPT: P_k = P* o (U_k V_k) against NumPy, folding, parameter counts, prompt distillation."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import models, prompts
from spot_jax.errors import ConfigError
from spot_jax.spot import distill
from spot_jax.backbones.t5 import Transformer
from tests.helpers import prompt_train as util

CONFIG = util.TEST_CONFIG
L, K, R = 4, 3, 2


def _params(k=K, r=R, seed=0, shared=True) -> dict:
  rs = np.random.RandomState(seed)
  out = {"task_cols": rs.normal(0, 1, (k, L, r)).astype(np.float32),
         "task_rows": rs.normal(0, 1, (k, r, CONFIG.emb_dim)).astype(np.float32)}
  if shared:
    out["shared"] = rs.normal(0, 1, (L, CONFIG.emb_dim)).astype(np.float32)
  return out


def _batch(seed=0, batch=6):
  b = {k: jnp.asarray(v) for k, v in util.synthetic_batch(seed, batch=batch).items()}
  b["task_index"] = jnp.asarray(np.arange(batch) % K, jnp.int32)
  return b


def _logits(module, prompt_params, batch, task_index=None):
  return np.asarray(Transformer(CONFIG, prompt=module).apply(
      {"params": {**util.frozen_backbone(CONFIG), "prompt": prompt_params}},
      batch["encoder_input_tokens"], batch["decoder_input_tokens"], batch["decoder_target_tokens"],
      enable_dropout=False, task_index=task_index))


def test_each_row_gets_its_tasks_prompt():
  module = prompts.MultitaskPrompt(L, num_tasks=K, rank=R, default_task=1)
  params = _params()
  tokens = np.array([[5, 1, 0], [6, 7, 1], [8, 1, 0], [9, 9, 1]], np.int32)
  embedded = np.random.RandomState(1).normal(0, 1,
                                             tokens.shape + (CONFIG.emb_dim,)).astype(np.float32)
  for task_index, rows_tasks in ((jnp.asarray([2, 0, 1, 2]), [2, 0, 1, 2]), (None, [1, 1, 1, 1])):
    x, valid = module.apply({"params": params}, jnp.asarray(embedded), jnp.asarray(tokens),
                            embedding=jnp.zeros((4, CONFIG.emb_dim)), deterministic=True,
                            task_index=task_index)
    for b, k in enumerate(rows_tasks):
      want = params["shared"].astype(np.float64) * (params["task_cols"][k].astype(np.float64)
                                                    @ params["task_rows"][k].astype(np.float64))
      np.testing.assert_allclose(np.asarray(x)[b, :L], want, rtol=0, atol=1e-5)
      np.testing.assert_array_equal(np.asarray(x)[b, L:], embedded[b])
    assert np.asarray(valid)[:, :L].all()


@pytest.mark.parametrize("frozen", [False, True])
def test_parameter_count_is_the_papers(frozen):
  """Trainable: L*E (P*) + K*r*(L + E) (the factors); with a frozen P*, the factors only."""
  shared = np.ones((L, CONFIG.emb_dim), np.float32) if frozen else None
  module = prompts.MultitaskPrompt(L, num_tasks=K, rank=R, frozen_shared=shared)
  params = util.create_prompt_params(Transformer(CONFIG, prompt=module),
                                     util.frozen_backbone(CONFIG))
  count = sum(int(np.size(v)) for v in jax.tree_util.tree_leaves(params))
  factors = K * R * (L + CONFIG.emb_dim)
  assert count == (factors if frozen else L * CONFIG.emb_dim + factors)
  assert ("shared" in params) is not frozen
  # The factors start at one: every task's prompt starts as P* itself.
  assert (np.all(np.asarray(params["task_cols"]) == 1)
          and np.all(np.asarray(params["task_rows"]) == 1))


@pytest.mark.parametrize("frozen", [False, True])
def test_folded_target_serves_like_the_factored_one(frozen):
  """A trained target (K = 1) folds to the plain prompt P* o (u v^T): logits equal at 1e-6."""
  params = _params(k=1, r=1, seed=3, shared=not frozen)
  shared = np.random.RandomState(4).normal(0, 1, (L, CONFIG.emb_dim)) if frozen else None
  module = prompts.MultitaskPrompt(L, num_tasks=1, rank=1, frozen_shared=shared)
  batch = _batch()
  unfolded = _logits(module, params, batch)
  folded = module.fold(params)
  assert folded["prompt"].shape == (L, CONFIG.emb_dim)
  np.testing.assert_array_equal(prompts.effective_prompt(module, params),
                                np.asarray(folded["prompt"]))
  served = _logits(module.folded_module(), folded, batch)
  np.testing.assert_allclose(served, unfolded, rtol=0, atol=1e-6)
  # Multi-task: each task folds to its own prompt; the export stacks them [K, L, E].
  multi = prompts.MultitaskPrompt(L, num_tasks=K, rank=R)
  params = _params()
  assert prompts.effective_prompt(multi, params).shape == (K, L, CONFIG.emb_dim)
  want = _logits(multi, params, batch, batch["task_index"])
  for k in range(K):
    rows = np.asarray(batch["task_index"]) == k
    got = _logits(multi.folded_module(), multi.fold(params, k), batch)
    np.testing.assert_allclose(got[rows], want[rows], rtol=0, atol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    ({"length": 0}, "MultitaskPrompt.length=0 must be a positive integer"),
    ({"length": 4, "rank": 0}, "MultitaskPrompt.rank=0 must be a positive integer"),
    ({"length": 4, "num_tasks": 2, "default_task": 2}, "valid: 0..1"),
    ({"length": 4, "frozen_shared": np.zeros((3, 8))}, "give the shared prompt [4, E]"),
])
def test_bad_settings_are_one_line_errors(kwargs, message):
  with pytest.raises(ValueError) as e:
    prompts.MultitaskPrompt(**kwargs)
  assert message in str(e.value) and "\n" not in str(e.value)


def _distill_model(teachers, weight=0.9, temperature=1.0):
  module = Transformer(CONFIG, prompt=prompts.MultitaskPrompt(L, num_tasks=K, rank=R))
  return distill.PromptDistillationModel(module, teacher_prompts=teachers, distill_weight=weight,
                                         kl_temperature=temperature)


def test_distillation_loss_is_task_loss_plus_the_papers_terms():
  backbone = util.frozen_backbone(CONFIG)
  student = _params()
  teachers = np.random.RandomState(7).normal(0, 1, (K, L, CONFIG.emb_dim)).astype(np.float32)
  model = _distill_model(teachers, weight=0.9, temperature=2.0)
  batch = _batch()
  params = {**backbone, "prompt": student}
  loss, metrics = model.loss_fn(params, batch, None, enable_dropout=False)
  base = models.EncoderDecoderModel(model.module)
  task_loss, _ = base.loss_fn(params, batch, None, enable_dropout=False)
  np.testing.assert_allclose(float(metrics["task_loss"]), float(task_loss), rtol=1e-6)
  np.testing.assert_allclose(float(loss), float(task_loss) + 0.9 * (
      float(metrics["distill_kl"]) + float(metrics["distill_hidden"])), rtol=1e-6)
  # The terms in NumPy (float64): KL(teacher || student) at tau = 2 times tau^2, and the MSE of
  # the encoder outputs over real positions, from independent forward passes.
  teacher_module = prompts.PromptTuning(L)
  s_logits = _logits(model.module.prompt, student, batch, batch["task_index"]).astype(np.float64)
  t_logits = np.stack([_logits(teacher_module, {"prompt": teachers[k]}, batch)[b]
                       for b, k in enumerate(np.asarray(batch["task_index"]))]).astype(np.float64)
  logsm = lambda x: x - np.log(np.sum(np.exp(x - x.max(-1, keepdims=True)), -1,
                                      keepdims=True)) - x.max(-1, keepdims=True)
  t, s = logsm(t_logits / 2), logsm(s_logits / 2)
  w = np.asarray(batch["decoder_target_tokens"]) > 0
  kl = (np.sum(np.exp(t) * (t - s), -1) * 4 * w).sum() / w.sum()
  np.testing.assert_allclose(float(metrics["distill_kl"]), kl, rtol=1e-5)

  def encoded(module, prompt, task_index):
    return np.asarray(Transformer(CONFIG, prompt=module).apply(
        {"params": {**backbone, "prompt": prompt}}, batch["encoder_input_tokens"],
        enable_dropout=False, task_index=task_index, method=Transformer.encode)[0], np.float64)

  h_s = encoded(model.module.prompt, student, batch["task_index"])
  h_t = np.stack([encoded(teacher_module, {"prompt": teachers[k]}, None)[b]
                  for b, k in enumerate(np.asarray(batch["task_index"]))])
  valid = np.concatenate([np.ones((len(w), L), bool),
                          np.asarray(batch["encoder_input_tokens"]) > 0], 1)
  mse = np.square(h_s - h_t)[valid].mean()
  np.testing.assert_allclose(float(metrics["distill_hidden"]), mse, rtol=1e-5)
  assert kl > 1e-3 and mse > 1e-3


def test_students_equal_to_their_teachers_add_nothing():
  backbone = util.frozen_backbone(CONFIG)
  student = _params()
  teachers = prompts.MultitaskPrompt(L, num_tasks=K, rank=R).task_prompts(student)
  model = _distill_model(teachers)
  params = {**backbone, "prompt": student}
  loss, metrics = model.loss_fn(params, _batch(), None, enable_dropout=False)
  assert abs(float(metrics["distill_kl"])) < 1e-6 and float(metrics["distill_hidden"]) < 1e-10
  np.testing.assert_allclose(float(loss), float(metrics["task_loss"]), rtol=1e-6)


def test_distillation_trains_the_student_towards_its_teachers():
  backbone = util.frozen_backbone(CONFIG)
  teachers = np.random.RandomState(7).normal(0, 1, (K, L, CONFIG.emb_dim)).astype(np.float32)
  model = _distill_model(teachers, weight=5.0)
  student = util.create_prompt_params(model.module, backbone)
  first = None
  for _, _, metrics, _ in util.model_adam_steps(model, backbone, student, _batch(batch=12), 25):
    first = first or {k: float(v) for k, v in metrics.items() if np.ndim(v) == 0}
  assert float(metrics["distill_hidden"]) < 0.7 * first["distill_hidden"]
  assert float(metrics["distill_kl"]) < 0.7 * first["distill_kl"]


def test_distillation_needs_a_multitask_student_fitting_teachers_and_task_index():
  teachers = np.zeros((K, L, CONFIG.emb_dim), np.float32)
  with pytest.raises(ConfigError, match="do not fit a student of 3 tasks and 4 tokens"):
    _distill_model(teachers[:2])
  with pytest.raises(ConfigError, match="trains a MultitaskPrompt student, not PromptTuning"):
    distill.PromptDistillationModel(Transformer(CONFIG, prompt=prompts.PromptTuning(L)),
                                    teacher_prompts=teachers)
  model = _distill_model(teachers)
  batch = dict(_batch())
  del batch["task_index"]
  with pytest.raises(ConfigError, match="set the DatasetConfig's task_names"):
    model.loss_fn({**util.frozen_backbone(CONFIG), "prompt": _params()}, batch, None)


def test_distillation_per_example_losses_do_not_depend_on_padding():
  """What length buckets change (the padding columns of the inputs) leaves every example's
  distillation loss unchanged: task loss, logit KL and hidden-state MSE are masked."""
  backbone = util.frozen_backbone(CONFIG)
  teachers = np.random.RandomState(7).normal(0, 1, (K, L, CONFIG.emb_dim)).astype(np.float32)
  model = _distill_model(teachers)
  params = {**backbone, "prompt": _params()}
  batch = _batch(batch=6)
  wide = dict(batch, encoder_input_tokens=jnp.pad(batch["encoder_input_tokens"], [(0, 0), (0, 7)]))

  @jax.jit
  def per_example(b):
    def one(row):
      loss, metrics = model.loss_fn(params, jax.tree.map(lambda v: v[None], row), None,
                                    enable_dropout=False)
      return jnp.stack([loss, metrics["distill_kl"], metrics["distill_hidden"]])
    return jax.vmap(one)(b)

  narrow, padded = np.asarray(per_example(batch)), np.asarray(per_example(wide))
  assert np.all(np.isfinite(narrow)) and np.ptp(narrow[:, 0]) > 0
  np.testing.assert_allclose(padded, narrow, rtol=0, atol=1e-5)
