"""`SizedTable`: a prompt table padded to power-of-two room decodes every row exactly as the
unpadded table does, keeps its shapes while prompts that fit come and go, and grows (once) for
one that does not."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax.prompts import DePT, PromptTuning, SMoP, initializers
from spot_jax.serve.model import mixed
from spot_jax.serve.catalog.capacity import Capacity, SizedTable, next_power_of_two
from spot_jax.serve.catalog.table import ServedPrompt
from spot_jax.backbones.t5 import Transformer, config_by_name
from spot_jax.backbones.t5.generation import search_settings
from tests.helpers.serve import mixed_setup, trained_looking_params

CONFIG = config_by_name("t5_1_1_test", dropout_rate=0.0)
WIDTH = 10


def _params(module, backbone, seed):
  return trained_looking_params(CONFIG, module, backbone, seed)


@pytest.fixture(scope="module")
def setup():
  init = initializers.uniform(2.0)
  modules = {"pt": PromptTuning(3, prompt_init=init),
             "smop": SMoP(num_prompts=3, length=2, prompt_init=init,
                          router_init=jax.nn.initializers.normal(3.0)),
             "dept": DePT(5, max_length=WIDTH, rank=2, prompt_init=init)}
  return mixed_setup(CONFIG, modules, _params, [10, 4, 7, 2, 9, 5], WIDTH)


def test_padded_table_decodes_every_row_as_the_unpadded_one(setup):
  backbone, _, _, table, tokens = setup
  sized = SizedTable(table.entries, CONFIG.emb_dim, Capacity(16, 0, 0, 0, 0))
  assert sized.capacity == Capacity(16, 4, 8, 16, 0)
  assert sized.arrays.prompts.shape == (16, 4, 8, CONFIG.emb_dim)
  assert sized.arrays.offsets.shape == (16, 16, CONFIG.emb_dim)
  assert table.arrays.prompts.shape == (3, 3, 5, CONFIG.emb_dim)
  mix = jnp.asarray([0, 1, 2, 1, 0, 2], jnp.int32)
  dynamic, static = search_settings(Transformer(CONFIG), max_decode_length=6)
  run = lambda arrays: mixed.generate_mixed(Transformer(CONFIG), backbone, arrays, mix,
                                            jnp.asarray(tokens), *dynamic, placement="prefix",
                                            **static)
  (want, want_scores), (got, got_scores) = run(table.arrays), run(sized.arrays)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  np.testing.assert_allclose(np.asarray(got_scores), np.asarray(want_scores), atol=1e-5)
  # scoring through padded tables: tests/serve/test_http.py compares the server's with infer's


def test_prompts_that_fit_keep_the_shapes_and_one_that_does_not_grows_them(setup):
  _, _, _, table, _ = setup
  sized = SizedTable(table.entries, CONFIG.emb_dim)
  shapes = jax.tree.map(np.shape, sized.arrays)
  rs = np.random.RandomState(0)
  fits = ServedPrompt("fits", rs.normal(size=(7, CONFIG.emb_dim)))
  bigger = SizedTable(sized.entries + [fits], CONFIG.emb_dim, sized.capacity)
  assert bigger.capacity == sized.capacity and jax.tree.map(np.shape, bigger.arrays) == shapes
  smaller = SizedTable(bigger.entries[1:], CONFIG.emb_dim, bigger.capacity)
  assert jax.tree.map(np.shape, smaller.arrays) == shapes  # removing never shrinks
  assert smaller.names == ["smop", "dept", "fits"] and smaller.index("fits") == 2
  long = ServedPrompt("long", rs.normal(size=(9, CONFIG.emb_dim)))
  grown = SizedTable(bigger.entries + [long], CONFIG.emb_dim, bigger.capacity)
  assert grown.capacity == Capacity(8, 4, 16, 16, 0) != bigger.capacity
  np.testing.assert_array_equal(grown.arrays.prompts[4, 0, :9], long.prompts[0])
  assert grown.arrays.lengths.tolist() == [3, 2, 5, 7, 9, 0, 0, 0]
  assert grown.arrays.num_prompts[5:].tolist() == [1, 1, 1]  # unused rows: one empty prompt
  assert [next_power_of_two(n) for n in (0, 1, 2, 3, 5, 8, 9)] == [0, 1, 2, 4, 8, 8, 16]
