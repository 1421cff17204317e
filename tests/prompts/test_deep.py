"""Deep prompts (prefix tuning, P-tuning v2) and the T5 attention hook they use.

The hook is checked against the unmodified network: deep prompt tokens equal an explicit
layer-by-layer concatenation of a fresh prompt in front of each layer's input (outputs
discarded); cross-attention prefixes equal extra encoder positions; invisible prefixes equal
none; per-row prefixes equal each row served alone; incremental decoding with decoder prefixes
equals teacher forcing. The methods' folds keep logits within 1e-6, and their trainable
parameter counts equal the papers' formulas. PEFT parity is in test_serve_peft_prefix.py.
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import prompts
from spot_jax.errors import ConfigError
from spot_jax.prompts import deep
from spot_jax.backbones.t5 import Transformer, config_by_name, generate, layers, network
from spot_jax.backbones.t5.prefixes import DeepPrompt, Prefix
from tests.helpers.prompt_train import create_prompt_params, frozen_backbone, synthetic_batch

CONFIGS = {name: config_by_name(name).replace(dropout_rate=0.0)
           for name in ("t5_1_1_test", "t5_test")}


def _batch(seed=0):
  b = synthetic_batch(seed, batch=4, length=8)
  # longer, varied targets than the synthetic task's two tokens
  rs = np.random.RandomState(seed)
  tgt = rs.randint(2, 128, size=(4, 5)).astype(np.int32)
  tgt[1, 3:] = 0
  tgt[3, 2:] = 0
  dec = np.concatenate([np.zeros((4, 1), np.int32), tgt[:, :-1]], axis=1)
  return {"encoder_input_tokens": b["encoder_input_tokens"], "decoder_input_tokens": dec,
          "decoder_target_tokens": tgt}


def _prompt_shapes(model, backbone):
  """The prompt parameters the trainer's recipe creates (`create_prompt_params` with the whole
  model), as shapes: `jax.eval_shape` traces the same apply without compiling its initialisers."""
  batch = synthetic_batch(0, batch=2)

  def create(frozen, rng):
    return model.apply({"params": frozen}, batch["encoder_input_tokens"],
                       batch["decoder_input_tokens"], rngs={"params": rng, "dropout": rng},
                       mutable=["params"])[1]

  variables = jax.eval_shape(create, backbone, jax.random.PRNGKey(1))
  assert set(variables["params"]) - set(backbone) == {"prompt"}
  return nn.meta.unbox(variables["params"]["prompt"])


def _random_prompt(model, backbone, scale=0.5, seed=3):
  """Prompt parameters of the model's shapes with random values (not the initialiser's)."""
  leaves, tree = jax.tree_util.tree_flatten(_prompt_shapes(model, backbone))
  rs = np.random.RandomState(seed)
  return jax.tree_util.tree_unflatten(
      tree, [scale * rs.standard_normal(np.shape(x)).astype(np.float32) for x in leaves])


def _logits(model, params, batch, **kw):
  return np.asarray(model.apply({"params": params}, batch["encoder_input_tokens"],
                                batch["decoder_input_tokens"], batch["decoder_target_tokens"],
                                enable_dropout=False, **kw))


# --- the hook against the unmodified network -------------------------------------------------


def _explicit_encoder(cfg, backbone, tokens_emb, valid, deep_tokens):
  """Fresh prompt in front of each encoder layer's input, outputs of its positions discarded."""
  p = deep_tokens.shape[1]
  batch, length = valid.shape
  full_valid = jnp.concatenate([jnp.ones((batch, p), bool), valid], axis=1)
  mask = full_valid[:, None, :, None] & full_valid[:, None, None, :]
  rel = layers.RelativePositionBiases(cfg.relative_attention_num_buckets,
                                      cfg.relative_attention_max_distance, cfg.num_heads)
  bias = rel.apply({"params": backbone["encoder"]["relpos_bias"]}, p + length, p + length, True)
  x = tokens_emb
  for i in range(cfg.num_encoder_layers):
    prompt = jnp.broadcast_to(deep_tokens[i][None], (batch,) + deep_tokens[i].shape)
    h = jnp.concatenate([prompt, x], axis=1)
    h = network.EncoderLayer(cfg).apply({"params": backbone["encoder"][f"layers_{i}"]},
                                        h, mask, bias, True)
    x = h[:, p:]
  return layers.RMSNorm(cfg.layer_norm_epsilon).apply(
      {"params": backbone["encoder"]["encoder_norm"]}, x)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_deep_tokens_equal_explicit_prompt_at_every_encoder_layer(name):
  cfg = CONFIGS[name]
  backbone = frozen_backbone(cfg, 0)
  module = prompts.PTuningV2(3)
  model = Transformer(cfg, prompt=module)
  prompt = _random_prompt(model, backbone, scale=1.0)
  batch = _batch()
  enc = jnp.asarray(batch["encoder_input_tokens"])
  got, valid = model.apply({"params": {**backbone, "prompt": prompt}}, enc, enable_dropout=False,
                           method=Transformer.encode)
  assert got.shape == (4, 8, cfg.emb_dim) and np.array_equal(valid, enc > 0)  # no input positions
  emb = jnp.take(backbone["token_embedder"]["embedding"], enc, axis=0)
  want = _explicit_encoder(cfg, backbone, emb, enc > 0, prompt["encoder_tokens"])
  bare, _ = Transformer(cfg).apply({"params": backbone}, enc, enable_dropout=False,
                                   method=Transformer.encode)
  real = np.asarray(enc > 0)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-6, rtol=0)
  assert np.abs(np.asarray(got) - np.asarray(bare))[real].max() > 1e-2  # the prompt matters


def test_deep_tokens_equal_explicit_prompt_at_every_decoder_layer():
  cfg = CONFIGS["t5_1_1_test"]
  backbone = frozen_backbone(cfg, 0)
  model = Transformer(cfg, prompt=prompts.PTuningV2(2, stacks=("decoder",)))
  prompt = _random_prompt(model, backbone, scale=1.0)
  batch = _batch(1)
  got = _logits(model, {**backbone, "prompt": prompt}, batch)
  # explicit: the decoder over [P_l; y] at every layer, causal, prompt rows discarded
  encoded, valid = Transformer(cfg).apply({"params": backbone}, batch["encoder_input_tokens"],
                                          enable_dropout=False, method=Transformer.encode)
  tgt = jnp.asarray(batch["decoder_target_tokens"])
  p, (b, s) = 2, tgt.shape
  on = jnp.concatenate([jnp.ones((b, p), bool), tgt > 0], axis=1)
  causal = np.tril(np.ones((p + s, p + s), bool))[None, None]
  self_mask = causal & on[:, None, :, None] & on[:, None, None, :]
  cross_mask = on[:, None, :, None] & valid[:, None, None, :]
  rel = layers.RelativePositionBiases(cfg.relative_attention_num_buckets,
                                      cfg.relative_attention_max_distance, cfg.num_heads)
  bias = rel.apply({"params": backbone["decoder"]["relpos_bias"]}, p + s, p + s, False)
  y = jnp.take(backbone["token_embedder"]["embedding"],
               jnp.asarray(batch["decoder_input_tokens"]), axis=0)
  for i in range(cfg.num_decoder_layers):
    tokens = jnp.broadcast_to(prompt["decoder_tokens"][i][None], (b, p, cfg.emb_dim))
    h = network.DecoderLayer(cfg).apply(
        {"params": backbone["decoder"][f"layers_{i}"]}, jnp.concatenate([tokens, y], axis=1),
        encoded, self_mask, cross_mask, bias, deterministic=True, decode=False)
    y = h[:, p:]
  y = layers.RMSNorm(cfg.layer_norm_epsilon).apply(
      {"params": backbone["decoder"]["decoder_norm"]}, y)
  want = y @ backbone["decoder"]["logits_dense"]["kernel"]
  real = np.asarray(tgt > 0)
  np.testing.assert_allclose(got[real], np.asarray(want)[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cross_prefixes_equal_extra_encoder_positions(name):
  """Cross-attention prefixes K_l = e W_k^l, V_l = e W_v^l act as positions e added to the
  encoder output (cross-attention has no position bias)."""
  cfg = CONFIGS[name]
  backbone = frozen_backbone(cfg, 0)
  batch = _batch(2)
  model = Transformer(cfg)
  encoded, valid = model.apply({"params": backbone}, batch["encoder_input_tokens"],
                               enable_dropout=False, method=Transformer.encode)
  e = jnp.asarray(np.random.RandomState(5).standard_normal((3, cfg.emb_dim)), jnp.float32)
  kv = []
  for i in range(cfg.num_decoder_layers):
    attn = backbone["decoder"][f"layers_{i}"]["encoder_decoder_attention"]
    kv.append([(e @ attn[n]["kernel"]).reshape(3, cfg.num_heads, cfg.head_dim)
               for n in ("key", "value")])
  prefix = Prefix(key=jnp.stack([k for k, _ in kv])[None],
                  value=jnp.stack([v for _, v in kv])[None])
  dec = (batch["decoder_input_tokens"], batch["decoder_target_tokens"])
  got = model.apply({"params": backbone}, encoded, valid, *dec, enable_dropout=False,
                    prefixes=DeepPrompt(cross=prefix), method=Transformer.decode)
  b = encoded.shape[0]
  want = model.apply({"params": backbone},
                     jnp.concatenate([jnp.broadcast_to(e[None], (b, 3, cfg.emb_dim)), encoded], 1),
                     jnp.concatenate([jnp.ones((b, 3), bool), valid], 1), *dec,
                     enable_dropout=False, method=Transformer.decode)
  real = batch["decoder_target_tokens"] > 0
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5, rtol=0)


@functools.lru_cache(maxsize=None)
def _prefix_setup(name="t5_1_1_test", projection=False):
  cfg = CONFIGS[name]
  backbone = frozen_backbone(cfg, 0)
  module = prompts.PrefixTuning(3, projection=projection, projection_dim=5)
  model = Transformer(cfg, prompt=module)
  return cfg, backbone, module, model, _random_prompt(model, backbone)


def test_invisible_prefixes_equal_none_and_rows_equal_alone():
  cfg, backbone, module, model, prompt = _prefix_setup()
  deep_prompt = module.prefixes(prompt["prefix"], cfg)
  batch = _batch(3)
  bare = _logits(Transformer(cfg), backbone, batch)
  hidden = DeepPrompt(*[p._replace(visible=jnp.zeros((1, 3), bool)) for p in deep_prompt])
  net = Transformer(cfg)
  enc, dec, tgt = (jnp.asarray(batch[k]) for k in ("encoder_input_tokens", "decoder_input_tokens",
                                                   "decoder_target_tokens"))

  def run(prefixes):
    encoded, valid = net.apply({"params": backbone}, enc, enable_dropout=False,
                               prefixes=prefixes, method=Transformer.encode)
    return np.asarray(net.apply({"params": backbone}, encoded, valid, dec, tgt,
                                enable_dropout=False, prefixes=prefixes, method=Transformer.decode))

  real = batch["decoder_target_tokens"] > 0
  np.testing.assert_allclose(run(hidden)[real], bare[real], atol=2e-6, rtol=0)  # float32 ulps
  # per-row prefixes (b = B): row 0 its own, row 1 none, row 2 the shared ones, row 3 the
  # first two, left-padded (a shorter prefix keeps its positions next to the input)
  def rows_of(x):
    left_padded = jnp.concatenate([jnp.zeros_like(x[:, :, :1]), x[:, :, :2]], axis=2)
    return jnp.concatenate([2 * x, x, x, left_padded], axis=0)

  visible = jnp.asarray([[1, 1, 1], [0, 0, 0], [1, 1, 1], [0, 1, 1]], bool)
  rows = DeepPrompt(*[Prefix(key=rows_of(p.key), value=rows_of(p.value), visible=visible)
                      for p in deep_prompt])
  got = run(rows)
  shared = _logits(model, {**backbone, "prompt": prompt}, batch)
  np.testing.assert_allclose(got[2][real[2]], shared[2][real[2]], atol=1e-5, rtol=0)
  np.testing.assert_allclose(got[1][real[1]], bare[1][real[1]], atol=1e-5, rtol=0)
  doubled = DeepPrompt(*[Prefix(key=p.key * 2, value=p.value * 2) for p in deep_prompt])
  np.testing.assert_allclose(got[0][real[0]], run(doubled)[0][real[0]], atol=1e-5, rtol=0)
  two = DeepPrompt(*[Prefix(key=p.key[:, :, :2], value=p.value[:, :, :2]) for p in deep_prompt])
  np.testing.assert_allclose(got[3][real[3]], run(two)[3][real[3]], atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_incremental_decoding_sees_the_prefixes(method):
  """Decoded scores equal the teacher-forced log-probabilities of the decoded tokens."""
  cfg, backbone, _, model, prompt = _prefix_setup("t5_test")
  params = {**backbone, "prompt": prompt}
  enc = jnp.asarray(_batch(4)["encoder_input_tokens"])
  tokens, scores = generate(model, params, enc, max_decode_length=5, method=method, num_beams=3,
                            alpha=0.0)
  tokens = np.asarray(tokens)
  dec_in = np.concatenate([np.zeros((4, 1), np.int32), tokens[:, :-1]], axis=1)
  logits = model.apply({"params": params}, enc, jnp.asarray(dec_in), jnp.asarray(tokens),
                       enable_dropout=False)
  logp = jax.nn.log_softmax(logits)
  want = np.sum(np.take_along_axis(np.asarray(logp), tokens[..., None], -1)[..., 0] * (tokens > 0),
                axis=1)
  np.testing.assert_allclose(np.asarray(scores), want, atol=1e-4, rtol=0)
  if method == "greedy":
    bare, _ = generate(Transformer(cfg), backbone, enc, max_decode_length=5)
    assert not np.array_equal(np.asarray(bare), tokens)  # the prefixes change the decode


# --- folds and parameter counts ------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_folded_prefix_projection_equals_unfolded(name):
  cfg, backbone, module, model, prompt = _prefix_setup(name, projection=True)
  batch = _batch(5)
  want = _logits(model, {**backbone, "prompt": prompt}, batch)
  folded = module.fold(prompt, cfg)
  got = _logits(Transformer(cfg, prompt=module.folded_module()), {**backbone, "prompt": folded},
                batch)
  np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
  assert np.abs(want - _logits(Transformer(cfg), backbone, batch)).max() > 1e-2
  record = prompts.effective_prompt(module, prompt, cfg)
  parts = deep.from_record(record)
  assert set(parts) == {"encoder", "decoder", "cross"}
  assert parts["encoder"].shape == (cfg.num_encoder_layers, 2, 3, cfg.num_heads, cfg.head_dim)
  served = _logits(Transformer(cfg), backbone, batch, prefixes=deep.deep_prompt(parts))
  np.testing.assert_allclose(served, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("stacks", [("encoder",), ("encoder", "decoder")])
def test_folded_ptuning_v2_equals_unfolded(stacks):
  cfg = CONFIGS["t5_1_1_test"]
  backbone = frozen_backbone(cfg, 0)
  module = prompts.PTuningV2(4, stacks=stacks)
  model = Transformer(cfg, prompt=module)
  prompt = _random_prompt(model, backbone, scale=1.0)
  batch = _batch(6)
  want = _logits(model, {**backbone, "prompt": prompt}, batch)
  folded = _logits(Transformer(cfg, prompt=module.folded_module()),
                   {**backbone, "prompt": module.fold(prompt, backbone, cfg)}, batch)
  np.testing.assert_allclose(folded, want, atol=1e-6, rtol=0)
  parts = deep.from_record(prompts.effective_prompt(module, prompt, cfg))
  assert set(parts) == {f"{s}_tokens" for s in stacks}
  tokens = _logits(Transformer(cfg), backbone, batch, prefixes=deep.deep_prompt(parts))
  np.testing.assert_allclose(tokens, want, atol=1e-6, rtol=0)


def _count(tree) -> int:
  return sum(int(np.prod(np.shape(x))) for x in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize("kind", ["all", "decoder", "encoder_cross", "projection", "peft"])
def test_prefix_tuning_parameter_count_is_the_formula(kind):
  cfg = CONFIGS["t5_1_1_test"].replace(num_decoder_layers=3)
  length, hd, n_enc, n_dec, m = 5, cfg.num_heads * cfg.head_dim, 2, 3, 6
  if kind == "peft":
    cfg = cfg.replace(num_decoder_layers=2)
    module = prompts.PrefixTuning(length, attention=("decoder",), layout="peft")
    want = length * 2 * n_enc * hd  # peft: num_virtual_tokens * num_layers * 2 * token_dim
  else:
    attention = {"all": ("encoder", "decoder", "cross"), "decoder": ("decoder",),
                 "encoder_cross": ("encoder", "cross"),
                 "projection": ("encoder", "decoder", "cross")}[kind]
    module = prompts.PrefixTuning(length, attention=attention, projection=kind == "projection",
                                  projection_dim=m)
    layers_used = sum({"encoder": n_enc, "decoder": n_dec, "cross": n_dec}[a] for a in attention)
    want = 2 * layers_used * length * hd  # 2 x layers x L x H x D per attention type
    if kind == "projection":  # embedding [L, T], Linear(T, M), Linear(M, S T), with biases
      want = length * hd + (hd * m + m) + (m * 2 * layers_used * hd + 2 * layers_used * hd)
  backbone = frozen_backbone(cfg, 0)
  assert _count(_prompt_shapes(Transformer(cfg, prompt=module), backbone)) == want


def test_ptuning_v2_parameter_count_is_the_formula():
  cfg = CONFIGS["t5_1_1_test"].replace(num_decoder_layers=3)
  backbone = frozen_backbone(cfg, 0)
  for stacks, layers_used in ((("encoder",), 2), (("encoder", "decoder"), 5)):
    params = _prompt_shapes(Transformer(cfg, prompt=prompts.PTuningV2(7, stacks=stacks)),
                            backbone)
    assert _count(params) == layers_used * 7 * cfg.emb_dim  # layers x L x E


def test_bad_settings_are_one_line_config_errors():
  for make, match in [
      (lambda: prompts.PrefixTuning(0),
       "PrefixTuning.length=0 must be a positive integer, e.g. PrefixTuning.length=10"),
      (lambda: prompts.PrefixTuning(2, attention=("encoder", "self")), "give distinct names"),
      (lambda: prompts.PrefixTuning(2, layout="hf"), "PrefixTuning.layout='hf' is unknown; valid"),
      (lambda: prompts.PrefixTuning(2, layout="peft"), "set attention=\\('decoder',\\)"),
      (lambda: prompts.PTuningV2(2, stacks=("cross",)), "give distinct names"),
      (lambda: prompts.PTuningV2(-1), "PTuningV2.length=-1 must be a positive integer")]:
    with pytest.raises(ConfigError, match=match) as info:
      make()
    assert "\n" not in str(info.value)
  cfg = CONFIGS["t5_1_1_test"].replace(num_decoder_layers=3)
  model = Transformer(cfg, prompt=prompts.PrefixTuning(2, attention=("decoder",), layout="peft"))
  with pytest.raises(ConfigError, match="as many decoder as encoder layers"):
    create_prompt_params(model, frozen_backbone(cfg, 0), full_model=True)
  with pytest.raises(ConfigError, match="not a deep prompt export"):
    deep.from_record(np.zeros((3, 4), np.float32))
