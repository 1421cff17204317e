"""Serving ULPT as its folded prompt: in mixed batches each row decodes and scores like its own
unfolded module alone (one compilation); a run directory serves its exported prompt; the PEFT
PROMPT_TUNING adapter of the folded prompt gives the unfolded module's log-likelihoods (1e-4)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import cli, fileio, infer, prompts
from spot_jax.backbones.t5 import Transformer, config_by_name, generate
from spot_jax.backbones.t5.generation import search_settings
from spot_jax.prompts import PromptTuning, ULPT, initializers
from spot_jax.run_dir import RunDir, companion_file
from spot_jax.serve.model import mixed
from spot_jax.serve.catalog import prompt_loaders
from tests.helpers.serve import mixed_setup, trained_looking_params

CONFIG = config_by_name("t5_1_1_test", dropout_rate=0.0)
DECODE = 6
WIDTH = 10
TOL = 1e-4


def _trained_looking(module, backbone, seed):
  return trained_looking_params(CONFIG, module, backbone, seed)


@pytest.fixture(scope="module")
def setup():
  modules = {"pt": PromptTuning(3, prompt_init=initializers.uniform(2.0)),
             "ulpt_a": ULPT(4, rank=2, projection_seed=1),
             "ulpt_b": ULPT(5, rank=8, projection_seed=2)}
  return mixed_setup(CONFIG, modules, _trained_looking, [10, 4, 7, 2, 10, 5], WIDTH)


def _log_likelihoods(module, params, backbone, tokens, targets):
  decoder_input = np.concatenate([np.zeros((len(targets), 1), np.int32), targets[:, :-1]], 1)
  logits = Transformer(CONFIG, prompt=module).apply(
      {"params": {**backbone, "prompt": params}}, jnp.asarray(tokens), jnp.asarray(decoder_input),
      enable_dropout=False)
  logp = np.asarray(jax.nn.log_softmax(logits), np.float64)
  return np.take_along_axis(logp, targets[..., None], -1)[..., 0].sum(-1)


def test_mixed_batches_equal_each_unfolded_module_alone(setup):
  backbone, modules, params, table, tokens = setup
  entry = table.entries[table.names.index("ulpt_b")]
  np.testing.assert_array_equal(entry.prompts[0], modules["ulpt_b"].export_prompt(params["ulpt_b"]))
  dynamic, static = search_settings(Transformer(CONFIG), max_decode_length=DECODE)
  before = mixed.generate_mixed._cache_size()  # pylint: disable=protected-access
  for mix in ([1, 2, 0, 2, 1, 0], [2, 2, 2, 1, 1, 1]):
    served, _ = mixed.generate_mixed(Transformer(CONFIG), backbone, table.arrays,
                                     jnp.asarray(mix, jnp.int32), jnp.asarray(tokens), *dynamic,
                                     placement="prefix", **static)
    for row, index in enumerate(mix):
      name = table.names[index]
      alone, _ = generate(Transformer(CONFIG, prompt=modules[name]),
                          {**backbone, "prompt": params[name]}, jnp.asarray(tokens[row][None]),
                          max_decode_length=DECODE)
      np.testing.assert_array_equal(np.asarray(served[row]), np.asarray(alone[0]),
                                    err_msg=f"mix {mix} row {row} ({name})")
  assert mixed.generate_mixed._cache_size() - before == 1  # pylint: disable=protected-access
  targets = np.random.RandomState(3).randint(2, CONFIG.vocab_size, (6, 4)).astype(np.int32)
  mix = np.array([1, 2, 0, 2, 1, 2], np.int32)
  scores = np.asarray(mixed.score_mixed(Transformer(CONFIG), backbone, table.arrays,
                                        jnp.asarray(mix), jnp.asarray(tokens),
                                        jnp.asarray(targets), placement="prefix"))
  for row, index in enumerate(mix):
    name = table.names[index]
    want = _log_likelihoods(modules[name], params[name], backbone, tokens[row:row + 1],
                            targets[row:row + 1])[0]
    assert abs(scores[row] - want) <= TOL, (name, scores[row], want)


def _export_run(path, module, params) -> RunDir:
  """A run directory as the trainer exports a ULPT run: the folded prompt, P beside it."""
  run = RunDir(path)
  prompt_file = run.prompt_path("best")
  for name, array in prompts.export_arrays(module, params).items():
    fileio.save_npy(companion_file(prompt_file, name), array)
  fileio.save_npy(prompt_file, prompts.effective_prompt(module, params))
  return run


def test_a_run_directory_serves_its_folded_prompt(setup, tmp_path):
  _, modules, params, _, _ = setup
  module, p = modules["ulpt_a"], params["ulpt_a"]
  run = _export_run(tmp_path / "run", module, p)
  got = prompt_loaders.load("u", str(run.path))
  np.testing.assert_array_equal(got.prompts, prompt_loaders.from_module("u", module, p).prompts)
  assert got.offset is None and got.source.endswith("prompt_best.npy")
  np.testing.assert_array_equal(np.load(run.prompts / "projection_best.npy"),
                                module.projection(CONFIG.emb_dim))


def test_peft_adapter_of_the_folded_prompt_scores_like_the_module(tmp_path_factory):
  torch = pytest.importorskip("torch")
  peft = pytest.importorskip("peft")
  transformers = pytest.importorskip("transformers")
  from tests.helpers.peft_models import padded_batch, peft_base  # pylint: disable=g-import-not-at-top
  config, root, backbone, hf_dir = peft_base("t5_1_1_test", tmp_path_factory)
  module = ULPT(4, rank=8, projection_seed=5)
  params = trained_looking_params(config, module, backbone, 3)
  run = _export_run(root / "run", module, params)
  assert cli.run(infer.main, ["--model=t5_1_1_test", f"--prompt=u={run.path}",
                              f"--export_peft={root / 'adapter'}", f"--base_model={hf_dir}"],
                 infer.PROG) == 0
  enc, dec_in, tgt = padded_batch(config.vocab_size)
  logits = Transformer(config, prompt=module).apply(
      {"params": {**backbone, "prompt": params}}, jnp.asarray(enc), jnp.asarray(dec_in),
      enable_dropout=False)
  logp = np.asarray(jax.nn.log_softmax(logits), np.float64)
  base = transformers.T5ForConditionalGeneration.from_pretrained(str(hf_dir)).eval()
  model = peft.PeftModel.from_pretrained(base, str(root / "adapter")).eval()
  assert isinstance(model.peft_config["default"], peft.PromptTuningConfig)
  with torch.no_grad():
    ref = torch.log_softmax(model(input_ids=torch.tensor(enc),
                                  attention_mask=torch.tensor(enc > 0).long(),
                                  decoder_input_ids=torch.tensor(dec_in)).logits.double(), -1)
  ref = ref.numpy()
  mask = tgt > 0
  got = (np.take_along_axis(logp, tgt[..., None], -1)[..., 0] * mask).sum(-1)
  want = (np.take_along_axis(ref, tgt[..., None], -1)[..., 0] * mask).sum(-1)
  np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
  with torch.no_grad():  # the prompt matters: the bare base model scores otherwise
    bare = torch.log_softmax(base(input_ids=torch.tensor(enc),
                                  attention_mask=torch.tensor(enc > 0).long(),
                                  decoder_input_ids=torch.tensor(dec_in)).logits.double(), -1)
  bare = (np.take_along_axis(bare.numpy(), tgt[..., None], -1)[..., 0] * mask).sum(-1)
  assert np.abs(bare - want).max() > 1e-2
