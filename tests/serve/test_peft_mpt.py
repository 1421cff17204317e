"""PEFT MULTITASK_PROMPT_TUNING interop: spot-jax MPT prompts exported as peft adapters give
spot-jax's logits in PyTorch (float32, 1e-4) on T5.1.1 (untied) and original T5 (tied), each
example with its own task; peft-written adapters import to the same logits; targets start from a
source as peft's AVERAGE_SOURCE_TASKS / EXACT_SOURCE_TASK do."""
from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from spot_jax import cli, infer  # noqa: E402
from spot_jax.errors import ConfigError  # noqa: E402
from spot_jax.prompts import MultitaskPrompt  # noqa: E402
from spot_jax.serve.export import peft_io, peft_mpt  # noqa: E402
from spot_jax.serve.catalog import prompt_loaders  # noqa: E402
from spot_jax.backbones.t5 import Transformer  # noqa: E402
from tests.helpers.peft_models import peft_base, padded_batch  # noqa: E402
from tests.helpers.prompt_train import create_prompt_params, frozen_backbone  # noqa: E402

TOL = 1e-4
L, K, R = 4, 3, 2


def _batch(vocab):
  """A padded batch of 4 rows and each row's task."""
  return padded_batch(vocab, rows=4) + (np.array([2, 0, 1, 2]),)


@pytest.fixture(scope="module", params=["t5_1_1_test", "t5_test"])
def exported(request, tmp_path_factory):
  """(config, backbone, module, params, hf dir, adapter dir)."""
  name = request.param
  config, root, backbone, _ = peft_base(name, tmp_path_factory)
  rs = np.random.RandomState(1)
  params = {"shared": rs.normal(0, 1, (L, config.emb_dim)).astype(np.float32),
            "task_cols": rs.normal(0, 1, (K, L, R)).astype(np.float32),
            "task_rows": rs.normal(0, 1, (K, R, config.emb_dim)).astype(np.float32)}
  module = MultitaskPrompt(L, num_tasks=K, rank=R)
  peft_mpt.export_adapter(module.shared_and_factors(params), config, str(root / "adapter"),
                          base_model_name_or_path=str(root / "hf"))
  return config, backbone, module, params, root / "hf", root / "adapter"


def _spot_logits(config, backbone, module, params, enc, dec_in, tgt, task):
  return np.asarray(Transformer(config, prompt=module).apply(
      {"params": {**backbone, "prompt": params}}, jnp.asarray(enc), jnp.asarray(dec_in),
      jnp.asarray(tgt), enable_dropout=False, task_index=jnp.asarray(task, jnp.int32)))


def _peft_logits(model, enc, tgt, task):
  # peft 0.21.2's seq2seq forward for MULTITASK_PROMPT_TUNING with one transformer submodule
  # passes only inputs_embeds and kwargs to the base model, dropping decoder_input_ids: the
  # decoder input must come from `labels` (T5 shifts them right: [0, tgt[:-1]], our dec_in).
  with torch.no_grad():
    return model(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0).long(),
                 labels=torch.tensor(tgt), task_ids=torch.tensor(task)).logits.numpy()


def test_peft_logits_equal_spot_jax_per_task(exported):
  config, backbone, module, params, hf_dir, adapter_dir = exported
  enc, dec_in, tgt, task = _batch(config.vocab_size)
  base = transformers.T5ForConditionalGeneration.from_pretrained(str(hf_dir)).eval()
  model = peft.PeftModel.from_pretrained(base, str(adapter_dir)).eval()
  assert isinstance(model.peft_config["default"], peft.MultitaskPromptTuningConfig)
  ref = _peft_logits(model, enc, tgt, task)
  got = _spot_logits(config, backbone, module, params, enc, dec_in, tgt, task)
  diff = float(np.abs(got - ref)[tgt > 0].max())
  print(f"{config.logits_via_embedding=} peft MPT vs spot-jax max abs logit diff {diff:.2e}")
  assert diff < TOL, diff
  # The task matters: the same rows under other tasks give other logits (not vacuous).
  other = _peft_logits(model, enc, tgt, (task + 1) % K)
  assert np.abs(other - ref)[tgt > 0].max() > 1e-2


def test_round_trips_both_ways(exported, tmp_path):
  config, backbone, module, params, hf_dir, adapter_dir = exported
  back = peft_mpt.read_adapter(str(adapter_dir), config)
  assert sorted(back) == ["shared", "task_cols", "task_rows"]
  assert all(back[k].dtype == np.float32 and np.array_equal(back[k], params[k]) for k in back)
  # An adapter peft wrote itself (its own random init) imports to peft's logits.
  base = transformers.T5ForConditionalGeneration.from_pretrained(str(hf_dir))
  pc = peft.MultitaskPromptTuningConfig(task_type="SEQ_2_SEQ_LM", num_virtual_tokens=L,
                                        num_transformer_submodules=1, num_tasks=K, num_ranks=R)
  made = peft.get_peft_model(base, pc).eval()
  with torch.no_grad():  # peft's N(0, 0.02) factors make a near-zero prompt; scale them up
    made.prompt_encoder["default"].prefix_task_cols.mul_(50.0)
    made.prompt_encoder["default"].prefix_task_rows.mul_(50.0)
  made.save_pretrained(str(tmp_path / "peft_made"))
  arrays = peft_mpt.read_adapter(str(tmp_path / "peft_made"), config)
  enc, dec_in, tgt, task = _batch(config.vocab_size)
  ref = _peft_logits(made, enc, tgt, task)
  got = _spot_logits(config, backbone, module, arrays, enc, dec_in, tgt, task)
  assert float(np.abs(got - ref)[tgt > 0].max()) < TOL
  # ... and writes back to the same tensors.
  peft_mpt.export_adapter(arrays, config, str(tmp_path / "again"))
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  a = load_file(str(tmp_path / "peft_made" / "adapter_model.safetensors"))
  b = load_file(str(tmp_path / "again" / "adapter_model.safetensors"))
  assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
  cfg_a = json.loads((tmp_path / "peft_made" / "adapter_config.json").read_text())
  cfg_b = json.loads((tmp_path / "again" / "adapter_config.json").read_text())
  assert {k: cfg_b[k] for k in cfg_a if k != "base_model_name_or_path"} == {
      k: v for k, v in cfg_a.items() if k != "base_model_name_or_path"}


def test_served_tasks_are_the_folded_prompts(exported):
  config, _, module, params, _, adapter_dir = exported
  entries = prompt_loaders.load_all("m", str(adapter_dir), config=config)
  assert [e.name for e in entries] == ["m/0", "m/1", "m/2"]
  for k, e in enumerate(entries):
    np.testing.assert_array_equal(e.prompts[0], module.task_prompts(params)[k])


@pytest.mark.parametrize("factors, peft_init", [("average", "AVERAGE_SOURCE_TASKS"),
                                                ("task", "EXACT_SOURCE_TASK")])
def test_target_starts_like_peft(exported, factors, peft_init):
  """A K = 1 target from the source adapter: the same prompt as peft's own initialisation."""
  config, backbone, _, _, hf_dir, adapter_dir = exported
  start = {part: peft_mpt.initializer(str(adapter_dir), part, factors, task=1)
           for part in ("shared", "task_cols", "task_rows")}
  target = MultitaskPrompt(L, num_tasks=1, rank=R, shared_init=start["shared"],
                           cols_init=start["task_cols"], rows_init=start["task_rows"])
  params = create_prompt_params(Transformer(config, prompt=target), frozen_backbone(config, 0))
  base = transformers.T5ForConditionalGeneration.from_pretrained(str(hf_dir))
  pc = peft.MultitaskPromptTuningConfig(
      task_type="SEQ_2_SEQ_LM", num_virtual_tokens=L, num_transformer_submodules=1, num_tasks=1,
      num_ranks=R, prompt_tuning_init=peft_init, prompt_tuning_init_task=1,
      prompt_tuning_init_state_dict_path=str(adapter_dir / "adapter_model.safetensors"))
  model = peft.get_peft_model(base, pc).eval()
  enc, dec_in, tgt, _ = _batch(config.vocab_size)
  zeros = np.zeros(len(enc), np.int64)
  ref = _peft_logits(model, enc, tgt, zeros)
  got = _spot_logits(config, backbone, target, params, enc, dec_in, tgt, zeros)
  assert float(np.abs(got - ref)[tgt > 0].max()) < TOL


def test_cli_export_and_bad_adapters(exported, tmp_path):
  config, _, _, params, _, adapter_dir = exported
  name = "t5_test" if config.logits_via_embedding else "t5_1_1_test"
  assert cli.run(infer.main, [f"--model={name}", f"--prompt=m={adapter_dir}",
                              f"--export_peft_mpt={tmp_path / 'copy'}"], infer.PROG) == 0
  back = peft_mpt.read_adapter(str(tmp_path / "copy"), config)
  assert all(np.array_equal(back[k], params[k]) for k in params)
  with pytest.raises(ConfigError, match="made for another base model: num_layers"):
    peft_mpt.read_adapter(str(adapter_dir), config.replace(num_encoder_layers=3))
  with pytest.raises(ConfigError, match="is a MULTITASK_PROMPT_TUNING adapter; only PROMPT_TUNING"):
    peft_io.read_adapter(str(adapter_dir))
  with pytest.raises(ConfigError, match="exists; pass --overwrite"):
    peft_mpt.export_adapter(params, config, str(adapter_dir))
  with pytest.raises(ConfigError, match="task 3 is not one"):
    prompt_loaders.load("m", str(adapter_dir), config=config, task=3)
