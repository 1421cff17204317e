"""Serving prompts on a decoder-only backbone (a tiny random Gemma 3: sliding and full layers).

Invariants: in one mixed batch of Prompt Tuning, SMoP, folded Residual, folded ULPT, prefix
tuning, P-tuning v2 (folded by the server), DePT and ATTEMPT prompts, every row decodes token
for token, and scores (its greedy completion, given targets, class labels) within 1e-5, like that
prompt served alone and like its prompt module applied alone in `DecoderLM` (the trainer's
model); any mix compiles once.
"""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import models, prompts
from spot_jax.backbones.decoder.config import config_by_name
from spot_jax.backbones.decoder.network import DecoderLM
from spot_jax.errors import ConfigError
from spot_jax.prompts import initializers
from spot_jax.serve import assemble
from spot_jax.serve.model import mixed_decoder
from spot_jax.serve.scheduler import live_catalog
from spot_jax.serve.catalog import prompt_loaders
from spot_jax.serve.model.server import DecodeSettings, Server
from spot_jax.serve.catalog.table import PromptTable

CONFIG = config_by_name("decoder_tiny_gemma3")
EOS = 1  # the tasks' (seqio's) end of sequence; BOS is the config's (2)
DECODE = 6
LENGTHS = [9, 3, 6, 2, 9, 5, 7, 4, 8]
TARGETS = np.array([[40, 41, EOS, 0], [50, EOS, 0, 0]], np.int32)


def _modules():
  init = initializers.uniform(1.0)
  return {
      "pt": prompts.PromptTuning(3, prompt_init=init),
      "smop": prompts.SMoP(num_prompts=3, length=2, prompt_init=init,
                           router_init=jax.nn.initializers.normal(3.0)),
      "residual": prompts.ResidualPrompt(4, bottleneck=8, prompt_init=init),
      "ulpt": prompts.ULPT(5, rank=4, prompt_init=init),
      "prefix": prompts.PrefixTuning(2, attention=("decoder",)),
      "ptuning_v2": prompts.PTuningV2(2, stacks=("decoder",)),
      "dept": prompts.DePT(2, max_length=16, rank=2, prompt_init=init),
      "attempt": prompts.Attempt(source_prompts=np.random.RandomState(3).normal(
          0, 1, (2, 3, CONFIG.emb_dim)).astype(np.float32), bottleneck=4, prompt_init=init),
  }


def _model(prompt=None):
  return models.DecoderOnlyModel(DecoderLM(CONFIG, prompt=prompt), eos_id=EOS)


@pytest.fixture(scope="module")
def setup():
  """(backbone, modules, prompt params by name, table, rows [8, 10])."""
  return build_setup()


def build_setup():
  """`setup`'s value (also built in subprocesses)."""
  dummy = _model().dummy_batch(4, 2)
  backbone = jax.device_get(models.unbox(_model().init_backbone(jax.random.PRNGKey(0), dummy)))
  modules, params, entries = _modules(), {}, []
  for i, (name, module) in enumerate(modules.items()):
    raw = models.unbox(_model(module).init_prompt(jax.random.PRNGKey(i + 1), backbone, dummy))
    rs = np.random.RandomState(i)  # every leaf off its initial value (DePT's B is zero at first)
    params[name] = jax.tree.map(
        lambda v, rs=rs: np.asarray(v) + rs.normal(0, 0.3, v.shape).astype(np.float32),
        raw["prompt"])
    if isinstance(module, prompts.PrefixTuning):
      entries.append(prompt_loaders.from_deep(
          name, module.export_parts(params[name], CONFIG), CONFIG, name))
    elif isinstance(module, prompts.PTuningV2):  # the server folds its tokens into prefixes
      entries.append(prompt_loaders.from_deep(
          name, {"decoder_tokens": np.asarray(params[name]["decoder_tokens"])}, CONFIG, name))
    else:
      entries.append(prompt_loaders.from_module(name, module, params[name]))
  rs = np.random.RandomState(0)
  rows = rs.randint(3, CONFIG.vocab_size, size=(len(LENGTHS), 10)).astype(np.int32)
  for r, n in enumerate(LENGTHS):
    rows[r, n - 1], rows[r, n:] = EOS, 0
  return backbone, modules, params, PromptTable(entries, CONFIG.emb_dim), rows


def _server(backbone, table, method="greedy"):
  return Server(DecoderLM(CONFIG), backbone, table,
                settings=DecodeSettings(DECODE, method, eos_id=EOS, temperature=0.8, top_k=5))


def _alone(setup, name):
  backbone, _, _, table, _ = setup
  return _server(backbone, PromptTable([table.entries[table.index(name)]], CONFIG.emb_dim))


def _module_params(setup, name):
  backbone, modules, params, _, _ = setup
  return _model(modules[name]), {**backbone, "prompt": params[name]}


def _mix(table, seed):
  return list(np.random.RandomState(seed).choice(table.names, len(LENGTHS)))


def test_a_mixed_batch_decodes_and_scores_each_row_as_alone(setup):
  backbone, _, _, table, rows = setup
  server = _server(backbone, table)
  names = table.names + table.names[:1]  # every method once, in one batch
  out, scores = server.generate(names, rows)
  for r, name in enumerate(names):
    model, params = _module_params(setup, name)
    ref = np.asarray(model.predict_batch(params, jnp.asarray(rows[r:r + 1]), DECODE))[0]
    np.testing.assert_array_equal(out[r], ref, err_msg=name)
    alone_out, alone_scores = _alone(setup, name).generate([name], rows[r:r + 1])
    np.testing.assert_array_equal(out[r], alone_out[0], err_msg=name)
    np.testing.assert_allclose(scores[r], alone_scores[0], atol=1e-5, err_msg=name)
  assert len(set(map(tuple, out.tolist()))) > 3  # the prompts really differ


def test_greedy_scores_are_the_completions_log_likelihoods(setup):
  """For an input-independent prompt, decoding's score is score_batch of its own completion."""
  backbone, _, _, table, rows = setup
  out, scores = _server(backbone, table).generate(["pt"] * len(rows), rows)
  model, params = _module_params(setup, "pt")
  want = model.score_batch(params, {"encoder_input_tokens": jnp.asarray(rows),
                                    "decoder_target_tokens": jnp.asarray(out)})
  np.testing.assert_allclose(scores, np.asarray(want), atol=1e-5)


def test_scores_and_labels_equal_the_module_alone(setup):
  """A label's score is the model's score of that label as the target (`score_batch`)."""
  backbone, _, _, table, rows = setup
  server = _server(backbone, table)
  names = table.names[::-1] + table.names[:1]  # every method, on other rows than above
  targets = np.tile(TARGETS, (len(rows) // 2 + 1, 1))[:len(rows)]
  scored = server.score(names, rows, targets)
  classes = server.classify(names, rows, TARGETS)
  for r, name in enumerate(names):
    model, params = _module_params(setup, name)
    inputs = jnp.asarray(rows[r:r + 1])
    score = lambda t, m=model, p=params, i=inputs: float(np.asarray(m.score_batch(
        p, {"encoder_input_tokens": i, "decoder_target_tokens": jnp.asarray(t[None])}))[0])
    np.testing.assert_allclose(scored[r], score(targets[r]), atol=1e-5, err_msg=name)
    np.testing.assert_allclose(classes[r], [score(label) for label in TARGETS], atol=1e-5,
                               err_msg=name)


def test_labels_read_one_cache_of_the_inputs_as_whole_sequences_score(setup):
  """A table of prompts that do not read the row (Prompt Tuning, folded Residual and ULPT,
  prefixes) scores labels from one cache of [BOS, inputs] per row: each label's score is
  still `score_batch` of inputs ++ label, on sliding and full layers."""
  backbone, _, _, table, rows = setup
  plain = ["pt", "residual", "ulpt", "prefix", "ptuning_v2"]
  server = _server(backbone, PromptTable([table.entries[table.index(n)] for n in plain],
                                         CONFIG.emb_dim))
  names = plain + plain[:4]
  classes = server.classify(names, rows, TARGETS)
  for r, name in enumerate(names):
    model, params = _module_params(setup, name)
    want = [float(np.asarray(model.score_batch(params, {
        "encoder_input_tokens": jnp.asarray(rows[r:r + 1]),
        "decoder_target_tokens": jnp.asarray(label[None])}))[0]) for label in TARGETS]
    np.testing.assert_allclose(classes[r], want, atol=1e-5, err_msg=name)


def test_any_mix_compiles_once(setup):
  backbone, _, _, table, rows = setup
  server = _server(backbone, table)
  server.generate(_mix(table, 2), rows)
  before = mixed_decoder.generate_mixed._cache_size()  # pylint: disable=protected-access
  for seed in (3, 4, 5):
    server.generate(_mix(table, seed), rows)
  assert mixed_decoder.generate_mixed._cache_size() == before  # pylint: disable=protected-access


def test_the_batch_servers_warm_up_compiles_what_requests_run(setup):
  """Requests carry validity masks (a decoder's id 0 is a token): warm-up compiles with them,
  so no request compiles."""
  backbone, _, _, table, rows = setup
  catalog = live_catalog.Catalog(DecoderLM(CONFIG), backbone, table.entries,
                                 emb_dim=CONFIG.emb_dim, target_length=DECODE, load=None,
                                 eos_id=EOS)
  assemble._warm(types.SimpleNamespace(catalog=catalog), [2], [10])  # pylint: disable=protected-access
  before = mixed_decoder.generate_mixed._cache_size()  # pylint: disable=protected-access
  catalog.server().generate(_mix(table, 3)[:2], rows[:2], 1, valid=rows[:2] > 0)
  assert mixed_decoder.generate_mixed._cache_size() == before  # pylint: disable=protected-access


def test_a_t5_deep_prompt_and_beam_search_are_refused_in_one_line(setup):
  backbone, _, _, table, _ = setup
  t5_like = prompt_loaders.ServedPrompt(
      "enc", np.zeros((1, 0, CONFIG.emb_dim), np.float32), source="x.npy",
      deep={"encoder": np.zeros((2, 2, 3, 4, 8), np.float32)})
  with pytest.raises(ConfigError, match="'encoder' prefixes; a decoder-only model") as info:
    _server(backbone, PromptTable([t5_like], CONFIG.emb_dim))
  assert "\n" not in str(info.value)
  with pytest.raises(ConfigError, match="--method=beam is not available on a decoder-only"):
    _server(backbone, table, "beam")
  with pytest.raises(ConfigError, match="--placement=suffix"):
    Server(DecoderLM(CONFIG), backbone, table, placement="suffix")

