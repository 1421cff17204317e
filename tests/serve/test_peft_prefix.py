"""PEFT interop for prefix tuning: spot-jax's PrefixTuning(layout='peft') computes what peft 0.21.2
computes for T5 (SEQ_2_SEQ_LM, transformers 5) with the same weights and prefix parameters,
plain and with peft's prefix_projection MLP, on T5.1.1 (untied) and original T5 (tied) models,
and prefix adapters round-trip both ways (float32, 1e-4)."""
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
from spot_jax.prompts import deep  # noqa: E402
from spot_jax.serve.export import peft_io  # noqa: E402
from spot_jax.backbones.t5 import Transformer, config_by_name, generate, hf_export  # noqa: E402
from tests.helpers.peft_models import padded_batch  # noqa: E402
from tests.helpers.prompt_train import frozen_backbone  # noqa: E402

TOL = 1e-4
LENGTH = 3
HIDDEN = 10  # peft's encoder_hidden_size (the projection MLP's width)
# name -> config: T5.1.1 (2 layers: peft's layout shares slots), original T5, and a T5.1.1 with
# heads x head_dim != width and 3 layers (every peft slot used once)
CONFIGS = {
    "t5_1_1_test": config_by_name("t5_1_1_test", dropout_rate=0.0),
    "t5_test": config_by_name("t5_test", dropout_rate=0.0),
    "t5_1_1_test_3x6": config_by_name("t5_1_1_test", dropout_rate=0.0).replace(
        head_dim=6, num_encoder_layers=3, num_decoder_layers=3),
}


def _batch(vocab):
  return padded_batch(vocab, target_length=6, target_padding=4)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def base(request, tmp_path_factory):
  """(config, spot-jax backbone, Hugging Face directory of the same weights)."""
  config = CONFIGS[request.param]
  backbone = jax.tree_util.tree_map(np.asarray, frozen_backbone(config, 0))
  hf_dir = tmp_path_factory.mktemp(request.param) / "hf"
  hf_export.export_hf(backbone, config, str(hf_dir))
  return config, backbone, hf_dir


def _torch_model(hf_dir):
  return transformers.T5ForConditionalGeneration.from_pretrained(str(hf_dir)).eval()


def _peft_logits(model, enc, dec_in):
  with torch.no_grad():
    return model(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0).long(),
                 decoder_input_ids=torch.tensor(dec_in)).logits.numpy()


def _spot_logits(config, params, module, enc, dec_in, tgt, prefixes=None):
  return np.asarray(Transformer(config, prompt=module).apply(
      {"params": params}, jnp.asarray(enc), jnp.asarray(dec_in), jnp.asarray(tgt),
      enable_dropout=False, prefixes=prefixes))


@pytest.mark.parametrize("projection", [False, True])
def test_spot_jax_logits_equal_peft(base, projection):
  """Same weights, same prefix parameters (peft's random init copied over): same logits."""
  config, backbone, hf_dir = base
  width = config.num_heads * config.head_dim
  torch.manual_seed(0)
  pc = peft.PrefixTuningConfig(task_type="SEQ_2_SEQ_LM", num_virtual_tokens=LENGTH,
                               token_dim=width, prefix_projection=projection,
                               encoder_hidden_size=HIDDEN)
  model = peft.get_peft_model(_torch_model(hf_dir), pc).eval()
  encoder = model.prompt_encoder["default"]
  t = lambda x: x.detach().numpy().astype(np.float32)
  if projection:
    params = {"embedding": t(encoder.embedding.weight),
              "hidden": {"kernel": t(encoder.transform[0].weight).T,
                         "bias": t(encoder.transform[0].bias)},
              "out": {"kernel": t(encoder.transform[2].weight).T,
                      "bias": t(encoder.transform[2].bias)}}
  else:
    params = {"prefix": t(encoder.embedding.weight)}
  module = prompts.PrefixTuning(LENGTH, attention=("decoder",), layout="peft",
                                projection=projection, projection_dim=HIDDEN)
  # the trainable parameter count is peft's
  assert sum(np.size(x) for x in jax.tree_util.tree_leaves(params)) == \
      model.get_nb_trainable_parameters()[0]
  enc, dec_in, tgt = _batch(config.vocab_size)
  got = _spot_logits(config, {**backbone, "prompt": params}, module, enc, dec_in, tgt)
  ref = _peft_logits(model, enc, dec_in)
  diff = float(np.abs(got - ref)[tgt > 0].max())
  print(f"{config.logits_via_embedding=} {projection=} spot-jax vs peft max |logit diff| "
        f"{diff:.2e}")
  assert diff < TOL, diff
  bare = _peft_logits(_torch_model(hf_dir), enc, dec_in)
  assert np.abs(bare - ref)[tgt > 0].max() > 1e-2  # the prefixes matter


def test_spot_jax_adapter_loads_in_peft(base, tmp_path):
  """spot-jax -> peft: a projected PrefixTuning, folded and exported, gives peft the same logits."""
  config, backbone, hf_dir = base
  module = prompts.PrefixTuning(LENGTH, attention=("decoder",), layout="peft", projection=True,
                                projection_dim=HIDDEN)
  model = Transformer(config, prompt=module)
  enc, dec_in, tgt = _batch(config.vocab_size)
  rng = np.random.RandomState(7)
  shapes = jax.eval_shape(lambda: model.init(
      {"params": jax.random.PRNGKey(0)}, jnp.asarray(enc), jnp.asarray(dec_in),
      enable_dropout=False))["params"]["prompt"]
  params = jax.tree_util.tree_map(lambda s: rng.standard_normal(s.shape).astype(np.float32),
                                  jax.tree_util.tree_map(lambda x: x.value, shapes,
                                                         is_leaf=lambda x: hasattr(x, "value")))
  want = _spot_logits(config, {**backbone, "prompt": params}, module, enc, dec_in, tgt)
  parts = module.export_parts(params, config)
  peft_io.export_prefix_adapter(parts, config, str(tmp_path / "adapter"))
  loaded = peft.PeftModel.from_pretrained(_torch_model(hf_dir), str(tmp_path / "adapter")).eval()
  assert isinstance(loaded.peft_config["default"], peft.PrefixTuningConfig)
  diff = float(np.abs(_peft_logits(loaded, enc, dec_in) - want)[tgt > 0].max())
  assert diff < TOL, diff
  # and back: reading the adapter gives the exported prefixes exactly
  back = peft_io.read_prefix_adapter(str(tmp_path / "adapter"), config)
  assert back.keys() == {"decoder"} and np.array_equal(back["decoder"], parts["decoder"])


def test_peft_saved_adapter_serves_in_spot_jax(base, tmp_path):
  """peft -> spot-jax: peft's save_pretrained output, read and served, gives peft's logits."""
  config, backbone, hf_dir = base
  torch.manual_seed(1)
  pc = peft.PrefixTuningConfig(task_type="SEQ_2_SEQ_LM", num_virtual_tokens=LENGTH,
                               token_dim=config.num_heads * config.head_dim,
                               prefix_projection=True, encoder_hidden_size=HIDDEN)
  model = peft.get_peft_model(_torch_model(hf_dir), pc).eval()
  model.save_pretrained(str(tmp_path / "peft_made"))
  assert peft_io.peft_type(str(tmp_path / "peft_made")) == "PREFIX_TUNING"
  enc, dec_in, tgt = _batch(config.vocab_size)
  ref = _peft_logits(model, enc, dec_in)
  parts = peft_io.read_prefix_adapter(str(tmp_path / "peft_made"), config)
  got = _spot_logits(config, backbone, None, enc, dec_in, tgt, prefixes=deep.deep_prompt(parts))
  diff = float(np.abs(got - ref)[tgt > 0].max())
  assert diff < TOL, diff
  # the adapter also initialises a PrefixTuning(layout='peft') to the same model
  module = prompts.PrefixTuning(LENGTH, attention=("decoder",), layout="peft",
                                prefix_init=peft_io.prefix_initializer(str(tmp_path / "peft_made"),
                                                                       config))
  net = Transformer(config, prompt=module)
  _, variables = net.apply({"params": backbone}, jnp.asarray(enc), jnp.asarray(dec_in),
                           enable_dropout=False, mutable=["params"],
                           rngs={"params": jax.random.PRNGKey(0)})
  prompt = jax.tree_util.tree_map(np.asarray, variables["params"]["prompt"])
  prompt = {"prefix": getattr(prompt["prefix"], "value", prompt["prefix"])}
  got = _spot_logits(config, {**backbone, "prompt": prompt}, module, enc, dec_in, tgt)
  assert float(np.abs(got - ref)[tgt > 0].max()) < TOL


def test_prefixes_peft_cannot_place_are_refused(base, tmp_path):
  config, _, _ = base
  length, heads, depth = LENGTH, config.num_heads, config.head_dim
  layers = config.num_decoder_layers
  kv = np.random.RandomState(0).standard_normal((layers, 2, length, heads,
                                                 depth)).astype(np.float32)
  with pytest.raises(ConfigError, match="reaches only T5's decoder self-attention; this prompt has "
                                        "cross, encoder"):
    peft_io.export_prefix_adapter({"decoder": kv, "encoder": kv, "cross": kv}, config,
                                  str(tmp_path / "a"))
  if layers % 2 == 0:  # peft gives layers i and i + n/2 one slot: differing prefixes do not fit
    with pytest.raises(ConfigError, match="share one prefix slot"):
      peft_io.export_prefix_adapter({"decoder": kv}, config, str(tmp_path / "b"))
    kv[layers // 2:] = kv[:layers // 2]
  peft_io.export_prefix_adapter({"decoder": kv}, config, str(tmp_path / "c"))
  np.testing.assert_array_equal(
      peft_io.read_prefix_adapter(str(tmp_path / "c"), config)["decoder"], kv)
  cfg = json.loads((tmp_path / "c" / "adapter_config.json").read_text())
  cfg["num_layers"] += 1
  (tmp_path / "c" / "adapter_config.json").write_text(json.dumps(cfg))
  with pytest.raises(ConfigError, match="made for another base model: num_layers"):
    peft_io.read_prefix_adapter(str(tmp_path / "c"), config)


def test_spot_jax_greedy_decode_is_peft_forwards_argmax(base):
  """Incremental decoding with decoder prefixes: every greedy token spot-jax emits is the argmax
  of peft's own teacher-forced forward on the decoded prefix. (peft 0.21.2's `generate` for T5
  prefix tuning disagrees with its own forward from the first token, so it is not the
  reference.)"""
  config, backbone, hf_dir = base
  torch.manual_seed(2)
  pc = peft.PrefixTuningConfig(task_type="SEQ_2_SEQ_LM", num_virtual_tokens=LENGTH,
                               token_dim=config.num_heads * config.head_dim)
  model = peft.get_peft_model(_torch_model(hf_dir), pc).eval()
  params = {"prefix": model.prompt_encoder["default"].embedding.weight.detach().numpy()}
  module = prompts.PrefixTuning(LENGTH, attention=("decoder",), layout="peft")
  enc, _, _ = _batch(config.vocab_size)
  tokens, _ = generate(Transformer(config, prompt=module), {**backbone, "prompt": params},
                       jnp.asarray(enc), max_decode_length=6)
  tokens = np.asarray(tokens)
  dec_in = np.concatenate([np.zeros((3, 1), np.int64), tokens[:, :-1]], axis=1)
  argmax = _peft_logits(model, enc, dec_in).argmax(-1)
  emitted = np.cumsum(tokens == 1, axis=1) - (tokens == 1) == 0  # up to and including EOS
  np.testing.assert_array_equal(argmax[emitted], tokens[emitted])
