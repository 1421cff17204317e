"""PEFT interop for decoder-only models (task_type CAUSAL_LM): a spot-jax soft prompt exported by
`spot_jax.serve.export.peft_causal` loads with `PeftModel.from_pretrained` on a tiny random
Llama and Gemma 3, and peft's forward log-likelihoods of the target tokens (right-padded batch,
labels)
equal spot-jax's `DecoderLM` with the same weights (float32, 1e-4): Prompt Tuning, the folded
Residual prompt, and prefix tuning (peft's [P, n*2*K*D] layout, K key/value heads). Adapters
round-trip to identical arrays; bad ones are refused in one line."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from spot_jax import prompts  # noqa: E402
from spot_jax.errors import ConfigError  # noqa: E402
from spot_jax.prompts import initializers  # noqa: E402
from spot_jax.serve.export import peft_causal  # noqa: E402
from tests.helpers import causal_models  # noqa: E402

decoder_hf = pytest.importorskip("spot_jax.backbones.decoder.hf")
decoder_network = pytest.importorskip("spot_jax.backbones.decoder.network")

TOL = 1e-4
LENGTH = 3


@pytest.fixture(scope="module", params=causal_models.FAMILIES)
def base(request, tmp_path_factory):
  """(family, DecoderConfig, spot-jax params, the torch model, its save_pretrained directory)."""
  family = request.param
  model = causal_models.hf_model(family)
  hf_dir = tmp_path_factory.mktemp(family) / "hf"
  model.save_pretrained(str(hf_dir))
  config = decoder_hf.config_from_hf(json.loads((hf_dir / "config.json").read_text()))
  state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  params = decoder_hf.params_from_hf(state, config)
  return family, config, params, model, hf_dir


def _load(hf_dir, adapter_dir):
  """A fresh torch base model from `hf_dir` with the adapter at `adapter_dir` (peft's loader)."""
  model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir)).eval()
  return peft.PeftModel.from_pretrained(model, str(adapter_dir)).eval()


def _peft_log_probs(model, tokens, labels, virtual: int):
  """peft's forward -> (log p of each label [B, T], peft's own mean loss over the labels)."""
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(tokens > 0).long(),
                labels=torch.tensor(labels))
  logits = out.logits.numpy()[:, virtual:]  # prompt tuning returns the prompt's rows too
  return causal_models.target_log_probs(logits, labels), float(out.loss)


def _spot_log_probs(config, params, tokens, labels, module=None, prefixes=None):
  model = decoder_network.DecoderLM(config, prompt=module)
  logits = np.asarray(model.apply({"params": params}, jnp.asarray(tokens),
                                  valid=jnp.asarray(tokens > 0), deterministic=True,
                                  prefixes=prefixes))
  return causal_models.target_log_probs(logits[:, logits.shape[1] - tokens.shape[1]:], labels)


def _compare(name, got, want, loss, labels):
  """got, want: [B, T] log-probs of the labels; loss: peft's mean NLL over them."""
  mask = labels[:, 1:] >= 0
  diff = float(np.abs(got - want)[:, 1:][mask].max())
  print(f"{name}: max |d log p(target)| {diff:.2e}, per-row sums {got.sum(1).round(4).tolist()}")
  assert diff < TOL, diff
  assert abs(-want[:, 1:][mask].mean() - loss) < TOL  # labels are aligned as peft aligns them


def test_prompt_tuning_log_likelihoods_equal_peft(base, tmp_path):
  family, config, params, _, hf_dir = base
  prompt = np.random.RandomState(0).normal(0.0, 1.0, (LENGTH, config.emb_dim)).astype(np.float32)
  peft_causal.export_prompt_adapter(prompt, config, str(tmp_path / "a"),
                                    base_model_name_or_path=str(hf_dir))
  model = _load(hf_dir, tmp_path / "a")
  assert isinstance(model.peft_config["default"], peft.PromptTuningConfig)
  assert model.peft_config["default"].base_model_name_or_path == str(hf_dir)
  tokens, labels = causal_models.right_padded()
  want, loss = _peft_log_probs(model, tokens, labels, LENGTH)
  module = prompts.PromptTuning(LENGTH)
  got = _spot_log_probs(config, {**params, "prompt": {"prompt": prompt}}, tokens, labels, module)
  _compare(f"{family} prompt tuning", got, want, loss, labels)
  bare = _spot_log_probs(config, params, tokens, labels)
  assert np.abs(bare - want).max() > 1e-2  # the prompt matters


def test_folded_residual_prompt_equals_peft(base, tmp_path):
  family, config, params, _, hf_dir = base
  module = prompts.ResidualPrompt(LENGTH, bottleneck=8, prompt_init=initializers.uniform(1.0))
  tokens, labels = causal_models.right_padded()
  variables = decoder_network.DecoderLM(config, prompt=module).init(
      {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)},
      jnp.asarray(tokens), valid=jnp.asarray(tokens > 0), deterministic=True)
  residual = jax.tree_util.tree_map(np.asarray, variables["params"]["prompt"])
  peft_causal.export_prompt_adapter(prompts.effective_prompt(module, residual), config,
                                    str(tmp_path / "r"), base_model_name_or_path=str(hf_dir))
  want, loss = _peft_log_probs(_load(hf_dir, tmp_path / "r"), tokens, labels, LENGTH)
  got = _spot_log_probs(config, {**params, "prompt": residual}, tokens, labels, module)
  _compare(f"{family} residual (unfolded in spot-jax, folded in peft)", got, want, loss, labels)


def test_left_padded_row_is_peft_row_alone(base, tmp_path):
  """spot-jax's positions skip left padding; peft's prompt-tuning forward counts it (see
  docs/serving.md), so a left-padded spot-jax row is compared with peft's unpadded row."""
  family, config, params, _, hf_dir = base
  if "sliding" in config.layer_types:
    pytest.skip("the prompt goes before the padding (placements are for right-padded batches), "
                "so a sliding window loses prompt rows to it")
  prompt = np.random.RandomState(0).normal(0.0, 1.0, (LENGTH, config.emb_dim)).astype(np.float32)
  peft_causal.export_prompt_adapter(prompt, config, str(tmp_path / "a"))
  alone = np.array([[5, 9, 13, 7, 11]])
  padded = np.concatenate([np.zeros((1, 3), alone.dtype), alone], axis=1)
  with torch.no_grad():
    want = _load(hf_dir, tmp_path / "a")(input_ids=torch.tensor(alone)).logits.numpy()[0, LENGTH:]
  got = np.asarray(decoder_network.DecoderLM(config, prompt=prompts.PromptTuning(LENGTH)).apply(
      {"params": {**params, "prompt": {"prompt": prompt}}}, jnp.asarray(padded),
      valid=jnp.asarray(padded > 0)))[0, -alone.shape[1]:]
  diff = float(np.abs(got - want).max())
  print(f"{family}: left-padded spot-jax row vs peft's row alone: max |dlogit| {diff:.2e}")
  assert diff < TOL, diff


def _random_prefixes(config, seed=0):
  """kv [n, 2, P, K, D] ~ N(0, 1)."""
  shape = (config.num_layers, 2, LENGTH, config.num_kv_heads, config.head_dim)
  return np.random.RandomState(seed).normal(0.0, 1.0, shape).astype(np.float32)


def test_prefix_tuning_log_likelihoods_equal_peft(base, tmp_path):
  family, config, params, torch_model, hf_dir = base
  kv = _random_prefixes(config)
  peft_causal.export_prefix_adapter(kv, config, str(tmp_path / "p"),
                                    base_model_name_or_path=str(hf_dir))
  model = _load(hf_dir, tmp_path / "p")
  assert isinstance(model.peft_config["default"], peft.PrefixTuningConfig)
  tokens, labels = causal_models.right_padded()
  want, loss = _peft_log_probs(model, tokens, labels, 0)
  # The layout, checked in torch alone: the base model given kv as its cache computes the same.
  cache = transformers.DynamicCache(config=torch_model.config)
  for i, (key, value) in enumerate(kv):
    cache.update(torch.tensor(key).transpose(0, 1)[None].expand(len(tokens), -1, -1, -1),
                 torch.tensor(value).transpose(0, 1)[None].expand(len(tokens), -1, -1, -1), i)
  mask = torch.cat([torch.ones(len(tokens), LENGTH, dtype=torch.long),
                    torch.tensor(tokens > 0).long()], 1)
  with torch.no_grad():
    cached = torch_model(input_ids=torch.tensor(tokens), attention_mask=mask, cache=cache)
  by_cache = causal_models.target_log_probs(cached.logits.numpy(), labels)
  assert np.abs(by_cache - want)[:, 1:][labels[:, 1:] >= 0].max() < 1e-5
  got = _spot_log_probs(config, params, tokens, labels,
                        prefixes=peft_causal.decoder_prefixes(kv))
  _compare(f"{family} prefix tuning", got, want, loss, labels)
  bare = _spot_log_probs(config, params, tokens, labels)
  assert np.abs(bare - want).max() > 1e-2  # the prefixes matter


def test_round_trip_and_peft_written_adapters(base, tmp_path):
  """spot-jax -> adapter -> spot-jax is exact; peft's own save_pretrained adapters read to its
  tensors, and spot-jax writes the config peft writes (but for the base model's name)."""
  _, config, _, _, hf_dir = base
  prompt = np.random.RandomState(1).normal(size=(LENGTH, config.emb_dim)).astype(np.float32)
  kv = _random_prefixes(config, seed=2)
  peft_causal.export_prompt_adapter(prompt, config, str(tmp_path / "a"))
  peft_causal.export_prefix_adapter(kv, config, str(tmp_path / "p"))
  back = peft_causal.read_prompt_adapter(str(tmp_path / "a"), config)
  assert back.dtype == np.float32 and np.array_equal(back, prompt)
  init = peft_causal.initializer(str(tmp_path / "a"), config)
  assert np.array_equal(np.asarray(init(None, prompt.shape, None)), prompt)
  back = peft_causal.read_prefix_adapter(str(tmp_path / "p"), config)
  assert back.dtype == np.float32 and np.array_equal(back, kv)
  for name, pc, read in [
      ("a", peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=LENGTH),
       peft_causal.read_prompt_adapter),
      ("p", peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=LENGTH),
       peft_causal.read_prefix_adapter),
      ("mlp", peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=LENGTH,
                                      prefix_projection=True, encoder_hidden_size=8),
       peft_causal.read_prefix_adapter)]:
    torch.manual_seed(0)
    made = peft.get_peft_model(
        transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir)), pc)
    made.save_pretrained(str(tmp_path / f"peft_{name}"))
    tensor = made.get_prompt_embedding_to_save("default").numpy()
    array = read(str(tmp_path / f"peft_{name}"), config)
    if name == "a":
      assert np.array_equal(array, tensor)
    else:
      assert np.array_equal(peft_causal.prefix_embeddings(array, config), tensor)
    if name == "mlp":  # saved folded: the MLP's output, read like plain prefixes
      continue
    ours = json.loads((tmp_path / name / "adapter_config.json").read_text())
    theirs = json.loads((tmp_path / f"peft_{name}" / "adapter_config.json").read_text())
    assert ours == {**theirs, "base_model_name_or_path": None}


def _one_line(call, match):
  with pytest.raises(ConfigError, match=match) as info:
    call()
  assert "\n" not in str(info.value), str(info.value)


def test_bad_adapters_are_refused_in_one_line(base, tmp_path):
  _, config, _, _, _ = base
  prompt = np.zeros((LENGTH, config.emb_dim), np.float32)
  peft_causal.export_prompt_adapter(prompt, config, str(tmp_path / "a"))
  peft_causal.export_prefix_adapter(_random_prefixes(config), config, str(tmp_path / "p"))
  deeper = config.replace(num_layers=config.num_layers + 1,
                          layer_types=config.layer_types + ("full",) * bool(config.layer_types))
  _one_line(lambda: peft_causal.read_prompt_adapter(str(tmp_path / "a"), deeper),
            rf"another base model: num_layers={config.num_layers} \(model: {deeper.num_layers}\)")
  wider = config.replace(emb_dim=config.emb_dim * 2)
  _one_line(lambda: peft_causal.read_prompt_adapter(str(tmp_path / "a"), wider),
            rf"token_dim={config.emb_dim} \(model: {wider.emb_dim}\)")
  more_kv = config.replace(num_kv_heads=config.num_heads)
  _one_line(lambda: peft_causal.read_prefix_adapter(str(tmp_path / "p"), more_kv),
            rf"num_attention_heads={config.num_kv_heads} \(model: {config.num_heads}\)")
  _one_line(lambda: peft_causal.read_prefix_adapter(str(tmp_path / "a"), config),
            "is a PROMPT_TUNING adapter, not PREFIX_TUNING")
  _one_line(lambda: peft_causal.read_prompt_adapter(str(tmp_path / "p"), config),
            "is a PREFIX_TUNING adapter, not PROMPT_TUNING")
  for name, change in [("seq2seq", {"task_type": "SEQ_2_SEQ_LM"}), ("lora", {"peft_type": "LORA"})]:
    folder = tmp_path / name
    folder.mkdir()
    cfg = peft_causal.prompt_adapter_config(LENGTH, config)
    (folder / "adapter_config.json").write_text(json.dumps({**cfg, **change}))
    _one_line(lambda f=folder: peft_causal.read_prompt_adapter(str(f), config),
              "is a SEQ_2_SEQ_LM adapter; a decoder-only" if name == "seq2seq" else
              "is a LORA adapter, not PROMPT_TUNING")
  _one_line(lambda: peft_causal.export_prompt_adapter(prompt, config, str(tmp_path / "a")),
            "exists; pass --overwrite")
  _one_line(lambda: peft_causal.export_prefix_adapter(np.zeros((1, 2, 3, 4, 5)), config,
                                                      str(tmp_path / "q")),
            "do not fit the model")
