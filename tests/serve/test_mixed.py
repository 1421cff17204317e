"""Mixed-task serving: a batch mixing Prompt Tuning, folded Residual and SMoP prompts decodes
token for token like each row alone with its own prompt module, with one compilation."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax.prompts import PromptTuning, ResidualPrompt, SMoP, initializers
from spot_jax.serve.model import mixed
from spot_jax.serve.catalog.table import PromptTable, ServedPrompt
from spot_jax.backbones.t5 import Transformer, config_by_name, generate
from spot_jax.backbones.t5.generation import search_settings
from tests.helpers.prompt_train import create_prompt_params
from tests.helpers.serve import mixed_setup

CONFIG = config_by_name("t5_1_1_test", dropout_rate=0.0)
DECODE = 6


def _prompt_params(module, backbone, seed):
  return create_prompt_params(Transformer(CONFIG, prompt=module), backbone, seed)


@pytest.fixture(scope="module")
def setup():
  init = initializers.uniform(2.0)
  modules = {
      "pt": PromptTuning(3, prompt_init=init),
      "residual": ResidualPrompt(5, bottleneck=16, prompt_init=init),
      "smop": SMoP(num_prompts=3, length=2, prompt_init=init,
                   router_init=jax.nn.initializers.normal(3.0)),
  }
  return mixed_setup(CONFIG, modules, _prompt_params, [10, 4, 7, 2, 10, 5, 8, 3, 6], 10)


def _reference(backbone, module, prompt_params, row):
  tokens, _ = generate(Transformer(CONFIG, prompt=module), {**backbone, "prompt": prompt_params},
                       jnp.asarray(row[None]), max_decode_length=DECODE)
  return np.asarray(tokens[0])


def _serve(backbone, table, index, tokens, method="greedy"):
  dynamic, static = search_settings(Transformer(CONFIG), max_decode_length=DECODE, method=method,
                                    num_beams=2)
  out, _ = mixed.generate_mixed(Transformer(CONFIG), backbone, table.arrays, jnp.asarray(index),
                                jnp.asarray(tokens), *dynamic, placement="prefix", **static)
  return np.asarray(out)


def test_table_pads_and_checks_widths():
  a = ServedPrompt("a", np.ones((3, 4)))
  b = ServedPrompt("b", np.ones((2, 5, 4)), np.ones((4, 2)), "linear")
  table = PromptTable([a, b], 4)
  assert table.arrays.prompts.shape == (2, 2, 5, 4)
  assert list(table.arrays.lengths) == [3, 5] and list(table.arrays.num_prompts) == [1, 2]
  assert np.all(table.arrays.prompts[0, 1] == 0) and np.all(table.arrays.prompts[0, 0, 3:] == 0)
  with pytest.raises(ValueError, match="width 4 but the model's embedding width is 8"):
    PromptTable([a], 8)
  with pytest.raises(ValueError, match="unknown prompt name 'c'; valid: a, b"):
    table.index("c")


def test_mixed_batch_equals_per_example_and_compiles_once(setup):
  backbone, modules, params, table, tokens = setup
  names = table.names
  mixes = [[0, 1, 2, 2, 1, 0, 2, 2, 1], [2, 2, 2, 0, 0, 1, 1, 2, 0], [1] * 9]
  before = mixed.generate_mixed._cache_size()  # pylint: disable=protected-access
  for mix in mixes:
    served = _serve(backbone, table, np.array(mix, np.int32), tokens)
    for row, entry in enumerate(mix):
      ref = _reference(backbone, modules[names[entry]], params[names[entry]], tokens[row])
      np.testing.assert_array_equal(served[row], ref, err_msg=f"mix {mix} row {row}")
  # Three different mixes, one compilation.
  assert mixed.generate_mixed._cache_size() - before == 1  # pylint: disable=protected-access


def test_smop_routes_per_example(setup):
  """The SMoP rows really take different prompts (so the parity above covers routing)."""
  backbone, modules, params, table, tokens = setup
  embedded = jnp.asarray(backbone["token_embedder"]["embedding"])[tokens]
  from spot_jax.prompts import common  # pylint: disable=g-import-not-at-top
  features = common.mean_embedding(embedded, jnp.asarray(tokens > 0))
  weights = mixed.route(table.arrays, jnp.full((9,), 2, jnp.int32), features)
  chosen = np.argmax(np.asarray(weights), axis=1)
  assert len(set(chosen.tolist())) >= 2, chosen
  # Plain prompts get weight exactly 1 on their single prompt.
  plain = np.asarray(mixed.route(table.arrays, jnp.zeros((9,), jnp.int32), features))
  assert np.all(plain[:, 0] == 1.0) and np.all(plain[:, 1:] == 0.0)


def test_mixed_beam_search_matches_per_example(setup):
  backbone, modules, params, table, tokens = setup
  mix = np.array([2, 0], np.int32)  # SMoP and Prompt Tuning rows (one reference compile each)
  served = _serve(backbone, table, mix, tokens[:2], method="beam")
  for row, entry in enumerate(mix):
    name = table.names[entry]
    ref, _ = generate(Transformer(CONFIG, prompt=modules[name]),
                      {**backbone, "prompt": params[name]}, jnp.asarray(tokens[row][None]),
                      max_decode_length=DECODE, method="beam", num_beams=2)
    np.testing.assert_array_equal(served[row], np.asarray(ref[0]))


@pytest.mark.parametrize("placement", ["after_bos", "suffix"])
def test_other_placements_match_per_example(setup, placement):
  """Prompts of different lengths, placed after the first token or after the last real one."""
  backbone, _, _, _, tokens = setup
  rs = np.random.RandomState(5)
  values = {"short": rs.normal(0, 2, (2, CONFIG.emb_dim)),
            "long": rs.normal(0, 2, (4, CONFIG.emb_dim))}
  table = PromptTable([ServedPrompt(n, v) for n, v in values.items()], CONFIG.emb_dim)
  mix = np.array([0, 1, 1, 0], np.int32)
  dynamic, static = search_settings(Transformer(CONFIG), max_decode_length=DECODE)
  served, _ = mixed.generate_mixed(Transformer(CONFIG), backbone, table.arrays, jnp.asarray(mix),
                                   jnp.asarray(tokens[:4]), *dynamic, placement=placement, **static)
  for row, entry in enumerate(mix):
    value = values[table.names[entry]]
    module = PromptTuning(value.shape[0], placement=placement)
    ref, _ = generate(Transformer(CONFIG, prompt=module),
                      {**backbone, "prompt": {"prompt": jnp.asarray(value, jnp.float32)}},
                      jnp.asarray(tokens[row][None]), max_decode_length=DECODE)
    np.testing.assert_array_equal(np.asarray(served[row]), np.asarray(ref[0]))


def test_classify_encodes_once_and_equals_scoring_each_label(setup):
  """Class-label scoring encodes each row once and scores its C labels as segments of one decoder
  row: the same log-likelihoods as scoring every (input, label) pair as its own row, with
  per-row prompts."""
  backbone, modules, _, table, tokens = setup
  del modules
  index = jnp.asarray(np.array([0, 1, 2, 2, 1, 0, 2, 2, 1], np.int32))
  labels = np.array([[5, 1, 0, 0], [9, 12, 7, 1], [3, 1, 0, 0]], np.int32)
  got = np.asarray(mixed.classify_mixed(Transformer(CONFIG), backbone, table.arrays, index,
                                        jnp.asarray(tokens), jnp.asarray(labels),
                                        placement="prefix"))
  pairs = np.asarray(mixed.score_mixed(
      Transformer(CONFIG), backbone, table.arrays, jnp.repeat(index, 3),
      jnp.asarray(np.repeat(tokens, 3, 0)), jnp.asarray(np.tile(labels, (9, 1))),
      placement="prefix")).reshape(9, 3)
  assert got.shape == (9, 3) and np.all(got < 0)
  np.testing.assert_allclose(got, pairs, atol=1e-5, rtol=0)
