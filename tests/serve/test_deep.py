"""Serving deep prompts: prefix-tuning and P-tuning v2 entries share batches with input prompts.

Each row of a mixed batch (Prompt Tuning, prefix tuning of every attention type, a shorter
decoder-only prefix, P-tuning v2 tokens folded with the backbone) decodes and scores like that
row alone under its own prompt module, greedy and beam, with one compilation per function.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import prompts
from spot_jax.errors import ConfigError
from spot_jax.prompts import PromptTuning, deep, initializers
from spot_jax.serve.catalog import prompt_loaders
from spot_jax.serve.model.server import DecodeSettings, Server
from spot_jax.serve.catalog.table import PromptTable, ServedPrompt
from spot_jax.backbones.t5 import Transformer, config_by_name, generate
from tests.helpers.prompt_train import create_prompt_params, frozen_backbone

CONFIG = config_by_name("t5_1_1_test", dropout_rate=0.0)
DECODE = 5


def _random(module, backbone, seed, scale=1.0):
  params = create_prompt_params(Transformer(CONFIG, prompt=module), backbone, seed, full_model=True)
  rs = np.random.RandomState(seed)
  return jax.tree_util.tree_map(lambda x: scale
                                * rs.standard_normal(np.shape(x)).astype(np.float32),
                                params)


@pytest.fixture(scope="module")
def setup():
  backbone = frozen_backbone(CONFIG, 0)
  modules = {
      "pt": PromptTuning(3, prompt_init=initializers.uniform(2.0)),
      "prefix": prompts.PrefixTuning(4, projection=True, projection_dim=6),
      "dec2": prompts.PrefixTuning(2, attention=("decoder",)),
      "ptv2": prompts.PTuningV2(3, stacks=("encoder", "decoder")),
  }
  params = {"pt": create_prompt_params(Transformer(CONFIG, prompt=modules["pt"]), backbone, 1)}
  params.update({n: _random(modules[n], backbone, i + 2) for i, n in enumerate(
      ["prefix", "dec2", "ptv2"])})
  entries = [prompt_loaders.from_module("pt", modules["pt"], params["pt"])]
  for n in ("prefix", "dec2", "ptv2"):
    record = prompts.effective_prompt(modules[n], params[n], CONFIG)
    entries.append(prompt_loaders.from_deep(n, deep.from_record(record), CONFIG, n))
  table = PromptTable(entries, CONFIG.emb_dim)
  rng = np.random.RandomState(0)
  tokens = rng.randint(2, CONFIG.vocab_size, size=(8, 9)).astype(np.int32)
  for row, n in enumerate([9, 4, 7, 2, 9, 5, 8, 3]):
    tokens[row, n:] = 0
  names = ["pt", "prefix", "dec2", "ptv2", "ptv2", "dec2", "prefix", "pt"]
  return backbone, modules, params, table, tokens, names


def test_table_stacks_prefixes_right_aligned(setup):
  _, _, _, table, _, _ = setup
  assert table.has_tokens  # P-tuning v2 until the server folds it
  arrays = table.arrays
  assert sorted(arrays.deep) == ["cross", "decoder", "encoder"]
  assert arrays.deep["decoder"].kv.shape == (4, 2, 2, 4, CONFIG.num_heads, CONFIG.head_dim)
  np.testing.assert_array_equal(arrays.deep["decoder"].lengths, [0, 4, 2, 0])
  assert not arrays.deep["decoder"].kv[2, :, :, :2].any()  # the shorter prefix: zeros in front
  folded = table.fold_tokens(lambda t, s: deep.fold_tokens(t,
                                                           frozen_backbone(CONFIG, 0), CONFIG, s))
  assert not folded.has_tokens
  np.testing.assert_array_equal(folded.arrays.deep["encoder"].lengths, [0, 4, 0, 3])
  np.testing.assert_array_equal(folded.arrays.deep["decoder"].lengths, [0, 4, 2, 3])
  assert arrays.prompts.shape[2] == 3 and table.entries[1].length == 0  # no input prompt


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_mixed_batch_decodes_like_each_row_alone(setup, method):
  backbone, modules, params, table, tokens, names = setup
  server = Server(Transformer(CONFIG), backbone, table,
                  settings=DecodeSettings(max_decode_length=DECODE, method=method, num_beams=2,
                                          alpha=0.0))
  got, scores = server.generate(names, tokens)
  for row, name in enumerate(names):
    want, want_score = generate(Transformer(CONFIG, prompt=modules[name]),
                                {**backbone, "prompt": params[name]},
                                jnp.asarray(tokens[row:row + 1]),
                                max_decode_length=DECODE, method=method, num_beams=2, alpha=0.0)
    np.testing.assert_array_equal(got[row], np.asarray(want[0]), err_msg=f"row {row} ({name})")
    np.testing.assert_allclose(scores[row], float(want_score[0]), atol=1e-4, rtol=0)
  assert len({tuple(r) for r in got}) > 3  # the prompts differ in what they decode


def test_mixed_batch_scores_like_each_row_alone(setup):
  backbone, modules, params, table, tokens, names = setup
  server = Server(Transformer(CONFIG), backbone, table)
  targets = np.random.RandomState(1).randint(2, CONFIG.vocab_size, size=(8, 4)).astype(np.int32)
  targets[::3, 2:] = 0
  got = server.score(names, tokens, targets)
  assert server.forward_passes == 1
  dec_in = np.concatenate([np.zeros((8, 1), np.int32), targets[:, :-1]], axis=1)
  for row, name in enumerate(names):
    logits = Transformer(CONFIG, prompt=modules[name]).apply(
        {"params": {**backbone, "prompt": params[name]}}, tokens[row:row + 1], dec_in[row:row + 1],
        targets[row:row + 1], enable_dropout=False)
    logp = np.asarray(jax.nn.log_softmax(logits))[0]
    want = sum(logp[i, t] for i, t in enumerate(targets[row]) if t > 0)
    np.testing.assert_allclose(got[row], want, atol=1e-4, rtol=0, err_msg=f"row {row} ({name})")


def test_deep_entries_are_checked(setup):
  _, _, _, table, _, _ = setup
  parts = table.entries[1].deep
  other = CONFIG.replace(num_decoder_layers=3)
  with pytest.raises(ConfigError, match="does not fit the model"):
    prompt_loaders.from_deep("x", parts, other, "x.npy")
  with pytest.raises(ConfigError, match="serving it needs the model's config"):
    prompt_loaders.from_deep("x", parts, None, "x.npy")
  with pytest.raises(ConfigError, match="expected \\[L, E\\]"):
    ServedPrompt("x", np.zeros((1, 0, CONFIG.emb_dim), np.float32))  # empty without a deep prompt
