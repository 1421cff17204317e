"""ULPT: the folded prompt against NumPy, what trains, the reduction to Prompt Tuning, folding
(on T5 and on the decoder-only backbone), the projection's record and refusals."""
from __future__ import annotations

import hashlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from spot_jax import prompts
from spot_jax.backbones.t5 import Transformer
from spot_jax.errors import ConfigError
from spot_jax.prompts import ulpt
from tests.helpers import prompt_train as util

N, R = 6, 4
E = util.TEST_CONFIG.emb_dim  # 32
TOKENS = np.array([[5, 6, 1, 0], [7, 8, 9, 1]], np.int32)


def _numpy_projection(seed: int, r: int, d: int) -> np.ndarray:
  """The paper's Xavier-uniform P, drawn here independently of the module."""
  limit = np.sqrt(6.0 / (r + d))
  return np.random.Generator(np.random.PCG64(seed)).uniform(-limit, limit, (r, d))


def _random_params(seed: int = 0, r: int = R) -> dict:
  rs = np.random.RandomState(seed)
  return {"z": rs.normal(0, 1, (N, r)).astype(np.float32),
          "scale": rs.normal(1, 0.3, (E,)).astype(np.float32),
          "shift": rs.normal(0, 0.3, (E,)).astype(np.float32)}


def _logits(module, prompt_params, seed: int = 0):
  model = Transformer(util.TEST_CONFIG, prompt=module)
  batch = util.synthetic_batch(seed, batch=4)
  return np.asarray(model.apply({"params": {**util.frozen_backbone(), "prompt": prompt_params}},
                                batch["encoder_input_tokens"], batch["decoder_input_tokens"],
                                enable_dropout=False))


def test_folded_prompt_is_z_p_diag_s_plus_b_against_numpy():
  params = _random_params()
  module = prompts.ULPT(N, rank=R, projection_seed=3)
  p = _numpy_projection(3, R, E)
  want = (params["z"].astype(np.float64) @ p) * params["scale"] + params["shift"]
  np.testing.assert_allclose(module.export_prompt(params), want, rtol=0, atol=1e-6)
  np.testing.assert_array_equal(module.export_arrays(params)["projection"], p.astype(np.float32))
  embedded = jnp.asarray(np.random.RandomState(3).normal(0, 1, TOKENS.shape + (E,)), jnp.float32)
  x, valid = module.apply({"params": params}, embedded, jnp.asarray(TOKENS),
                          embedding=jnp.zeros((10, E)), deterministic=True)
  for b in range(len(TOKENS)):
    np.testing.assert_allclose(np.asarray(x)[b, :N], want, rtol=0, atol=1e-6)
  assert np.asarray(valid)[:, :N].all() and x.shape == (2, N + TOKENS.shape[1], E)


def test_only_z_scale_and_shift_train_and_hold_optimizer_state():
  module = prompts.ULPT(N, rank=R)
  params = util.create_prompt_params(Transformer(util.TEST_CONFIG, prompt=module),
                                     util.frozen_backbone())
  shapes = {k: v.shape for k, v in params.items()}
  assert shapes == {"z": (N, R), "scale": (E,), "shift": (E,)}  # P is no parameter
  assert sum(v.size for v in params.values()) == N * R + 2 * E
  np.testing.assert_array_equal(params["scale"], 1.0)  # s = 1, b = 0 and Z ~ N(0, 1) at start
  np.testing.assert_array_equal(params["shift"], 0.0)
  assert 0.7 < float(np.std(params["z"])) < 1.3
  opt_state = optax.adamw(0.6, weight_decay=1e-5).init(params)
  state_shapes = {tuple(x.shape) for x in jax.tree_util.tree_leaves(opt_state) if x.ndim}
  assert state_shapes == {(N, R), (E,)}  # moments of z, scale, shift only: no [R, E] state
  batch = util.synthetic_batch(0, batch=4)
  model = Transformer(util.TEST_CONFIG, prompt=module)

  def loss(prompt):
    logits = model.apply({"params": {**util.frozen_backbone(), "prompt": prompt}},
                         batch["encoder_input_tokens"], batch["decoder_input_tokens"],
                         enable_dropout=False)
    return util.cross_entropy(logits, jnp.asarray(batch["decoder_target_tokens"]))

  grads = jax.grad(loss)(params)
  assert set(grads) == {"z", "scale", "shift"}
  assert all(float(jnp.abs(g).max()) > 0 for g in grads.values())


def test_rank_equal_width_with_identity_is_prompt_tuning_of_z():
  z = np.random.RandomState(1).normal(0, 1, (N, E)).astype(np.float32)
  module = prompts.ULPT(N, rank=E, projection_generator="identity")
  ulpt_params = {"z": z, "scale": np.ones(E, np.float32), "shift": np.zeros(E, np.float32)}
  got = _logits(module, ulpt_params)
  want = _logits(prompts.PromptTuning(N), {"prompt": z})
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("placement", ["prefix", "suffix"])
def test_fold_preserves_logits(placement):
  module = prompts.ULPT(N, rank=R, placement=placement)
  params = _random_params(2)
  got = _logits(module.folded_module(), module.fold(params))
  np.testing.assert_allclose(got, _logits(module, params), rtol=0, atol=1e-6)


def test_projection_is_a_named_numpy_draw_with_a_stable_hash():
  p = ulpt.projection(ulpt.XAVIER, 5, R, E)
  np.testing.assert_array_equal(p, _numpy_projection(5, R, E).astype(np.float32))
  assert not p.flags.writeable
  record = ulpt.projection_record(ulpt.XAVIER, 5, R, E)
  want = hashlib.sha256(f"{(R, E)}".encode() + p.tobytes()).hexdigest()
  assert record == {"generator": ulpt.XAVIER, "seed": 5, "rank": R, "width": E, "sha256": want}
  assert ulpt.projection_record(ulpt.XAVIER, 6, R, E)["sha256"] != want
  np.testing.assert_array_equal(ulpt.check_record(record, "run", stored=p), p)


@pytest.mark.parametrize("make, message", [
    (lambda: prompts.ULPT(N, rank=0), r"^ULPT.rank=0 must be a positive integer"),
    (lambda: prompts.ULPT(N, rank=-2), r"^ULPT.rank=-2 must be a positive integer"),
    (lambda: prompts.ULPT(0, rank=2), r"^ULPT.length=0 must be a positive integer"),
    (lambda: prompts.ULPT(N, projection_generator="torch"),
     r"^ULPT.projection_generator='torch'.*valid"),
    (lambda: prompts.ULPT(N, projection_sha256="abc"), r"^ULPT.projection_sha256='abc' is not"),
])
def test_bad_settings_are_refused_in_one_line(make, message):
  with pytest.raises(ConfigError, match=message) as info:
    make()
  assert "\n" not in str(info.value)


@pytest.mark.parametrize("module, message", [
    (prompts.ULPT(N, rank=E + 1), rf"^ULPT.rank={E + 1} does not fit the embedding width {E}; "
                                  rf"give 1 <= rank <= {E}"),
    (prompts.ULPT(N, rank=R, projection_generator="identity"),
     rf"^ULPT.projection_generator='identity' needs rank = the embedding width \({E}\)"),
    (prompts.ULPT(N, rank=R, projection_sha256="0" * 64),
     r"^ULPT projection .* rebuilds to sha256"),
])
def test_settings_that_do_not_fit_the_width_are_refused_at_init(module, message):
  model = Transformer(util.TEST_CONFIG, prompt=module)
  with pytest.raises(ConfigError, match=message) as info:
    util.create_prompt_params(model, util.frozen_backbone())
  assert "\n" not in str(info.value)


def test_a_projection_that_does_not_rebuild_is_refused():
  record = ulpt.projection_record(ulpt.XAVIER, 0, R, E)
  stored = np.array(ulpt.projection(ulpt.XAVIER, 0, R, E))
  stored[0, 0] += 1e-3  # what another generator (or NumPy) would have drawn
  with pytest.raises(ConfigError, match=r"^run: ULPT projection .* seed 0 \[4, 32\] rebuilds to "):
    ulpt.check_record(record, "run", stored=stored)
  with pytest.raises(ConfigError, match=r"rebuilds to sha256 \w+, not the recorded 000000000000"):
    ulpt.check_record(dict(record, sha256="0" * 64), "run")


def test_a_run_directory_keeping_another_projection_is_refused(tmp_path):
  (tmp_path / "prompts").mkdir()
  np.save(tmp_path / "prompts" / "projection_step_5.npy", ulpt.projection(ulpt.XAVIER, 0, R, E))
  prompts.ULPT(N, rank=R).check_run_dir(tmp_path)  # the same P: resumes
  prompts.ULPT(N, rank=R).check_run_dir(tmp_path / "fresh")  # nothing kept yet
  for module in (prompts.ULPT(N, rank=R, projection_seed=1), prompts.ULPT(N, rank=R + 1)):
    with pytest.raises(ConfigError, match=r"projection_step_5.npy: the run kept projection "
                                          r"\[4, 32\] sha256 \w+, but ULPT") as info:
      module.check_run_dir(tmp_path)
    assert "\n" not in str(info.value)


def test_on_the_decoder_only_backbone_the_fold_keeps_the_logits():
  """The decoder-only backbone calls prompt modules through the same input hook."""
  from spot_jax.backbones.decoder.config import config_by_name  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.decoder.network import DecoderLM  # pylint: disable=g-import-not-at-top
  config = config_by_name("decoder_tiny_llama")
  module = prompts.ULPT(N, rank=R, projection_seed=4)
  tokens = jnp.asarray(np.random.RandomState(0).randint(2, config.vocab_size, (2, 5)), jnp.int32)
  variables = DecoderLM(config, module).init(jax.random.PRNGKey(0), tokens)
  params = jax.tree_util.tree_map(np.asarray, nn.meta.unbox(variables["params"]))
  params["prompt"] = {k: v + np.random.RandomState(1).normal(0, 0.5, v.shape).astype(np.float32)
                      for k, v in params["prompt"].items()}
  assert sorted(params["prompt"]) == ["scale", "shift", "z"]
  got = DecoderLM(config, module).apply({"params": params}, tokens)
  folded = {**params, "prompt": module.fold(params["prompt"])}
  want = DecoderLM(config, module.folded_module()).apply({"params": folded}, tokens)
  assert got.shape[1] == N + tokens.shape[1]
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5)
