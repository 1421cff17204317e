"""PEFT / Hugging Face interoperability: a spot-jax prompt exported as a peft prompt-tuning
adapter on a base model converted by `spot_jax.convert --checkpoint`, run in PyTorch, gives
spot-jax's logits (float32, 1e-4) for T5.1.1 (untied) and original T5 (tied + scaled)."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from spot_jax import cli, convert, infer, prompts  # noqa: E402
from spot_jax import fileio  # noqa: E402
from spot_jax.run_dir import RunDir  # noqa: E402
from spot_jax.errors import ConfigError  # noqa: E402
from spot_jax.prompts import ResidualPrompt, initializers  # noqa: E402
from spot_jax.serve.export import peft_io  # noqa: E402
from spot_jax.backbones.t5 import Transformer, checkpoints, config_by_name  # noqa: E402
from tests.helpers.peft_models import peft_base, padded_batch  # noqa: E402
from tests.helpers.prompt_train import create_prompt_params, frozen_backbone  # noqa: E402

TOL = 1e-4
LENGTH = 4


@pytest.fixture(scope="module", params=["t5_1_1_test", "t5_test"])
def exported(request, tmp_path_factory):
  """(name, config, backbone, residual module, its params, folded prompt, hf dir, adapter dir)."""
  name = request.param
  config, root, backbone, _ = peft_base(name, tmp_path_factory)
  module = ResidualPrompt(LENGTH, bottleneck=8, prompt_init=initializers.uniform(1.0))
  params = create_prompt_params(Transformer(config, prompt=module), frozen_backbone(config, 0))
  # What a run exports (trainer._export: the effective, folded prompt), then the command line.
  folded = prompts.effective_prompt(module, params)
  fileio.save_npy(RunDir(root / "run").prompt_path("best"), folded)
  assert cli.run(infer.main, [f"--model={name}", f"--prompt=r={root / 'run'}",
                              f"--export_peft={root / 'adapter'}", f"--base_model={root / 'hf'}"],
                 infer.PROG) == 0
  return name, config, backbone, module, params, folded, root / "hf", root / "adapter"


def test_converted_config_and_tying(exported):
  name, config, _, _, _, _, hf_dir, _ = exported
  cfg = json.loads((hf_dir / "config.json").read_text())
  assert cfg["tie_word_embeddings"] is config.logits_via_embedding
  from spot_jax.backbones.t5.hf import config_from_hf  # pylint: disable=g-import-not-at-top
  assert config_from_hf(cfg) == config.replace(dropout_rate=cfg["dropout_rate"])
  model = transformers.T5ForConditionalGeneration.from_pretrained(str(hf_dir))
  tied = model.lm_head.weight.data_ptr() == model.shared.weight.data_ptr() or torch.equal(
      model.lm_head.weight, model.shared.weight)
  assert tied is config.logits_via_embedding, name
  assert bool(model.config.scale_decoder_outputs) is config.logits_via_embedding


def test_peft_logits_equal_spot_jax(exported):
  _, config, backbone, module, params, folded, hf_dir, adapter_dir = exported
  enc, dec_in, tgt = padded_batch(config.vocab_size)
  # spot-jax: the unfolded Residual module on the original (T5X) parameters.
  logits = Transformer(config, prompt=module).apply(
      {"params": {**backbone, "prompt": params}}, jnp.asarray(enc), jnp.asarray(dec_in),
      jnp.asarray(tgt), enable_dropout=False)
  base = transformers.T5ForConditionalGeneration.from_pretrained(str(hf_dir)).eval()
  model = peft.PeftModel.from_pretrained(base, str(adapter_dir)).eval()
  assert isinstance(model.peft_config["default"], peft.PromptTuningConfig)
  with torch.no_grad():
    ref = model(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0).long(),
                decoder_input_ids=torch.tensor(dec_in)).logits.numpy()
  diff = float(np.abs(np.asarray(logits) - ref)[tgt > 0].max())
  print(f"{config.logits_via_embedding=} peft vs spot-jax max abs logit diff {diff:.2e}")
  assert diff < TOL, diff
  # The prompt matters: without it PyTorch's logits differ (the comparison is not vacuous).
  with torch.no_grad():
    bare = base(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0).long(),
                decoder_input_ids=torch.tensor(dec_in)).logits.numpy()
  assert np.abs(bare - ref)[tgt > 0].max() > 1e-2


def test_reimport_gives_identical_prompt(exported, tmp_path):
  _, config, _, _, _, folded, _, adapter_dir = exported
  back = peft_io.read_adapter(str(adapter_dir), config)
  assert back.dtype == np.float32 and np.array_equal(back, folded)
  init = peft_io.initializer(str(adapter_dir), config)
  assert np.array_equal(np.asarray(init(None, folded.shape, None)), folded)
  peft_io.export_npy(folded, str(tmp_path / "p.npy"))
  assert np.array_equal(np.load(tmp_path / "p.npy"), folded)


def test_peft_written_adapter_reads(exported, tmp_path):
  """An adapter written by peft itself (not by spot-jax) imports to its prompt_embeddings."""
  _, config, _, _, _, _, hf_dir, _ = exported
  base = transformers.T5ForConditionalGeneration.from_pretrained(str(hf_dir))
  pc = peft.PromptTuningConfig(task_type="SEQ_2_SEQ_LM", num_virtual_tokens=3,
                               num_transformer_submodules=1)
  model = peft.get_peft_model(base, pc)
  model.save_pretrained(str(tmp_path / "peft_made"))
  want = model.get_prompt_embedding_to_save("default").detach().numpy()
  assert np.array_equal(peft_io.read_adapter(str(tmp_path / "peft_made"), config), want)


def test_adapter_for_other_model_or_type_is_refused(exported, tmp_path):
  _, config, _, _, _, folded, _, adapter_dir = exported
  other = config.replace(num_encoder_layers=config.num_encoder_layers + 1)
  with pytest.raises(ConfigError, match="made for another base model: num_layers"):
    peft_io.read_adapter(str(adapter_dir), other)
  wider = config.replace(emb_dim=config.emb_dim * 2)
  with pytest.raises(ConfigError, match="another base model: token_dim"):
    peft_io.read_adapter(str(adapter_dir), wider)
  lora = tmp_path / "lora"
  lora.mkdir()
  (lora / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
  with pytest.raises(ConfigError, match="is a LORA adapter; only PROMPT_TUNING"):
    peft_io.read_adapter(str(lora))
  two = tmp_path / "two"
  two.mkdir()
  cfg = peft_io.adapter_config(LENGTH, config)
  cfg["num_transformer_submodules"] = 2
  (two / "adapter_config.json").write_text(json.dumps(cfg))
  with pytest.raises(ConfigError, match="encoder-only"):
    peft_io.read_adapter(str(two))
  with pytest.raises(ConfigError, match="exists; pass --overwrite"):
    peft_io.export_adapter(folded, config, str(adapter_dir))


@pytest.mark.parametrize("argv, message", [
    (["--checkpoint", "{ckpt}", "--output_dir", "{out}"], "--checkpoint needs --model"),
    (["--checkpoint", "{ckpt}", "--model", "t5_nope", "--output_dir", "{out}"],
     "unknown T5 config 't5_nope'"),
    (["--checkpoint", "{ckpt}", "--model", "t5_test", "--output_dir", "{out}"],
     "does not fit the model config"),  # a T5.1.1 checkpoint for a T5 config: strict load
    (["--checkpoint", "{ckpt}", "--hf_dir", "{ckpt}", "--output_dir", "{out}"], "exactly one of"),
])
def test_convert_to_hf_bad_input(tmp_path, capsys, argv, message):
  ckpt = tmp_path / "checkpoint_0"
  backbone = jax.tree_util.tree_map(np.asarray, frozen_backbone(config_by_name("t5_1_1_test"), 0))
  checkpoints.save_checkpoint(backbone, str(ckpt), format="t5x")
  argv = [a.format(ckpt=ckpt, out=tmp_path / "out") for a in argv]
  status = cli.run(convert.main, argv, "spot_jax.convert")
  err = capsys.readouterr().err
  assert status == 2 and len(err.strip().splitlines()) == 1, err
  assert err.startswith("spot_jax.convert: error: "), err
  assert message in err, err
  assert not (tmp_path / "out").exists()
  assert [p for p in os.listdir(tmp_path) if p.startswith(".out")] == []


def test_orbax_checkpoint_converts_to_the_same_hf_tensors(exported, tmp_path):
  name, config, backbone, _, _, _, hf_dir, _ = exported
  checkpoints.save_checkpoint(backbone, str(tmp_path / "orbax"), format="orbax")
  assert convert.main(["--checkpoint", str(tmp_path / "orbax"), "--model", name,
                       "--output_dir", str(tmp_path / "hf")]) == 0
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  a = load_file(str(hf_dir / "model.safetensors"))
  b = load_file(str(tmp_path / "hf" / "model.safetensors"))
  assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
  assert ("lm_head.weight" in a) is (not config.logits_via_embedding)
  # Converting back (HF -> T5X) returns the original parameters exactly.
  assert convert.main(["--hf_dir", str(tmp_path / "hf"), "--output_dir", str(tmp_path / "t5x"),
                       "--model", name]) == 0
  again = checkpoints.load_checkpoint(str(tmp_path / "t5x"), config)
  flat = lambda t: {"/".join(str(k.key) for k in p): np.asarray(v)
                    for p, v in jax.tree_util.tree_flatten_with_path(t)[0]}
  want, got = flat(backbone), flat(again)
  assert sorted(want) == sorted(got) and all(np.array_equal(want[k], got[k]) for k in want)
