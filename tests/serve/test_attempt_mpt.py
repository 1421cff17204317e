"""Serving ATTEMPT and MPT from the prompt table: a batch mixing their tasks with Prompt Tuning
and SMoP rows scores and decodes like each row alone with its own module and task."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import models
from spot_jax.errors import ConfigError
from spot_jax.prompts import Attempt, MultitaskPrompt, PromptTuning, SMoP, initializers, mpt
from spot_jax.serve.model import mixed
from spot_jax.serve.catalog import prompt_loaders
from spot_jax.serve.catalog.table import PromptTable
from spot_jax.backbones.t5 import Transformer, config_by_name, generate
from spot_jax.backbones.t5.generation import search_settings
from tests.helpers.prompt_train import create_prompt_params, frozen_backbone

CONFIG = config_by_name("t5_1_1_test", dropout_rate=0.0)
DECODE = 5


@pytest.fixture(scope="module")
def setup():
  backbone = frozen_backbone(CONFIG, 0)
  rs = np.random.RandomState(0)
  sources = rs.normal(0, 2, (3, 4, CONFIG.emb_dim)).astype(np.float32)
  modules = {
      "attempt": Attempt(sources, num_targets=2, bottleneck=6, temperature=3.0,
                         prompt_init=initializers.uniform(2.0)),
      "mpt": MultitaskPrompt(3, num_tasks=3, rank=2, shared_init=initializers.uniform(2.0),
                             rows_init=mpt.normal(1.0), cols_init=mpt.normal(1.0)),
      "pt": PromptTuning(2, prompt_init=initializers.uniform(2.0)),
      "smop": SMoP(num_prompts=2, length=3, prompt_init=initializers.uniform(2.0),
                   router_init=jax.nn.initializers.normal(3.0)),
  }
  params = {n: create_prompt_params(Transformer(CONFIG, prompt=m), backbone, i + 1)
            for i, (n, m) in enumerate(modules.items())}
  # A trained-looking attention network: far from its initial (near-uniform) attention.
  params["attempt"] = dict(params["attempt"], attention=jax.tree.map(
      lambda x: jnp.asarray(rs.normal(0, 3, x.shape), jnp.float32), params["attempt"]["attention"]))
  entries = {"attempt/0": ("attempt", 0), "attempt/1": ("attempt", 1), "mpt/2": ("mpt", 2),
             "mpt/0": ("mpt", 0), "pt": ("pt", None), "smop": ("smop", None)}
  table = PromptTable([prompt_loaders.from_module(n, modules[m], params[m], task=t)
                       for n, (m, t) in entries.items()], CONFIG.emb_dim)
  tokens = rs.randint(2, CONFIG.vocab_size, size=(8, 9)).astype(np.int32)
  for row, n in enumerate([9, 4, 7, 2, 9, 5, 8, 3]):
    tokens[row, n:] = 0
  return backbone, modules, params, entries, table, tokens


def _row_model(modules, entries, name):
  module, task = entries[name]
  prompt = modules[module]
  if task is not None:  # generation passes no task index: the row's task as the default
    prompt = prompt.clone(default_task=task, parent=None)
  return models.EncoderDecoderModel(Transformer(CONFIG, prompt=prompt)), module


def test_mixed_scores_equal_each_rows_module_and_task(setup):
  backbone, modules, params, entries, table, tokens = setup
  mix = np.array([0, 1, 2, 3, 4, 5, 1, 0], np.int32)
  targets = np.random.RandomState(1).randint(2, CONFIG.vocab_size, size=(8, 4)).astype(np.int32)
  targets[:, 3] = 0
  served = np.asarray(mixed.score_mixed(Transformer(CONFIG), backbone, table.arrays,
                                        jnp.asarray(mix), jnp.asarray(tokens),
                                        jnp.asarray(targets), placement="prefix"))
  batch = {"encoder_input_tokens": tokens, "decoder_target_tokens": targets,
           "decoder_input_tokens": np.concatenate([np.zeros((8, 1), np.int32), targets[:, :-1]], 1),
           "task_index": np.array([entries[table.names[e]][1] or 0 for e in mix], np.int32)}
  for module in modules:  # each module scores every row with the row's task; keep its own rows
    model = models.EncoderDecoderModel(Transformer(CONFIG, prompt=modules[module]))
    want = np.asarray(jax.jit(model.score_batch)({**backbone, "prompt": params[module]}, batch))
    rows = [r for r, e in enumerate(mix) if entries[table.names[e]][0] == module]
    np.testing.assert_allclose(served[rows], want[rows], rtol=0, atol=1e-5, err_msg=module)
  # The ATTEMPT rows really mix: their weights vary across inputs and sum to 2 (1 on the target).
  embedded = jnp.asarray(backbone["token_embedder"]["embedding"])[tokens]
  from spot_jax.prompts import common  # pylint: disable=g-import-not-at-top
  weights = np.asarray(mixed.attempt_weights(table.arrays, jnp.zeros((8,), jnp.int32),
                                             common.max_pool(embedded, jnp.asarray(tokens > 0))))
  np.testing.assert_allclose(weights.sum(axis=1), 2.0, atol=1e-6)
  assert np.ptp(weights[:, :3], axis=0).max() > 0.05, weights


def test_mixed_greedy_decoding_equals_per_example(setup):
  backbone, modules, params, entries, table, tokens = setup
  mix = np.array([1, 0, 2, 4, 3, 5, 0, 1], np.int32)
  dynamic, static = search_settings(Transformer(CONFIG), max_decode_length=DECODE)
  served, _ = mixed.generate_mixed(Transformer(CONFIG), backbone, table.arrays, jnp.asarray(mix),
                                   jnp.asarray(tokens), *dynamic, placement="prefix", **static)
  for row in (0, 2):  # an ATTEMPT target and an MPT task (one reference compile each)
    name = table.names[mix[row]]
    model, module = _row_model(modules, entries, name)
    ref, _ = generate(model.module, {**backbone, "prompt": params[module]},
                      jnp.asarray(tokens[row][None]), max_decode_length=DECODE)
    np.testing.assert_array_equal(np.asarray(served)[row], np.asarray(ref[0]), err_msg=name)


def test_tables_without_attempt_pay_nothing_and_entries_are_checked(setup):
  _, modules, params, _, table, _ = setup
  plain = PromptTable([prompt_loaders.from_module("pt", modules["pt"], params["pt"])],
                      CONFIG.emb_dim)
  assert (plain.arrays.attn_down.shape == (1, CONFIG.emb_dim, 0)
          and list(plain.arrays.target) == [-1])
  assert table.arrays.attn_down.shape == (6, CONFIG.emb_dim, 6)
  assert list(table.arrays.target) == [3, 3, -1, -1, -1, -1]
  with pytest.raises(ConfigError, match="task 2 is not one of its targets"):
    prompt_loaders.from_module("a", modules["attempt"], params["attempt"], task=2)
  with pytest.raises(ConfigError, match="task 3 is not in 0..2"):
    prompt_loaders.from_module("m", modules["mpt"], params["mpt"], task=3)
