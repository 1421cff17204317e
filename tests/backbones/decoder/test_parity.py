"""`DecoderLM` against transformers' own torch models, and the HF mapping both ways.

Tiny random models (float32, eager attention) of each family, built in memory with
transformers' config classes: Llama with llama3 rope scaling (untied and tied), Gemma 2 with
soft-capping and alternating sliding layers, Gemma 3 with q/k norms, local and global rope bases
and linear scaling on the global one (tied and untied), Qwen 2 (q/k/v biases) and Qwen 3 (q/k
norms). Sequences (14 tokens) are longer than the sliding window (4). Logits agree within 1e-5:
plain, with a soft prompt given to transformers as `inputs_embeds`, with right and left padding,
and with deep prefixes given to transformers as a cache.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from spot_jax.backbones.decoder import hf, network
from spot_jax.errors import ConfigError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-5
VOCAB, LENGTH, WINDOW, PROMPT = 128, 14, 4, 3
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-6)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def _hf_config(family: str):
  gemma = dict(query_pre_attn_scalar=12, sliding_window=WINDOW)
  if family in ("llama", "llama_tied"):
    return transformers.LlamaConfig(num_hidden_layers=2, rope_parameters=dict(LLAMA3),
                                    tie_word_embeddings=family == "llama_tied", **SIZES)
  if family == "gemma2":  # small caps, so tanh bends the logits
    return transformers.Gemma2Config(num_hidden_layers=2, attn_logit_softcapping=2.0,
                                     final_logit_softcapping=1.5, **gemma, **SIZES)
  if family in ("gemma3", "gemma3_untied"):
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    return transformers.Gemma3TextConfig(
        num_hidden_layers=3, layer_types=["sliding_attention", "full_attention",
                                          "sliding_attention"],
        rope_parameters=rope, tie_word_embeddings=family == "gemma3", **gemma, **SIZES)
  if family == "qwen2":
    sizes = dict(SIZES, num_attention_heads=4, head_dim=None)  # Qwen 2: D = E / N
    return transformers.Qwen2Config(num_hidden_layers=2, rope_parameters={
        "rope_type": "default", "rope_theta": 1e4}, **{k: v for k, v in sizes.items() if v})
  return transformers.Qwen3Config(num_hidden_layers=2, **SIZES)


_CLASSES = {"llama": "LlamaForCausalLM", "llama_tied": "LlamaForCausalLM",
            "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
            "gemma3_untied": "Gemma3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM"}
FAMILIES = [f for f in _CLASSES if hasattr(transformers, _CLASSES[f])]


def _hf_model(family: str, seed: int = 0):
  """A random model whose every weight (norm scales, biases) is far from its default."""
  torch.manual_seed(seed)
  config = _hf_config(family)
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  model = getattr(transformers, _CLASSES[family])(config).eval()
  with torch.no_grad():
    for _, p in model.named_parameters():
      p.normal_(0.0, 0.4 if p.ndim == 1 else 0.25)
  return model


def _state(model) -> dict[str, np.ndarray]:
  return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
  """(name, HF model, DecoderConfig, our params)."""
  model = _hf_model(request.param)
  config = hf.config_from_hf(model.config.to_dict())
  return request.param, model, config, hf.params_from_hf(_state(model), config)


def _tokens(batch: int = 2, length: int = LENGTH, seed: int = 1) -> np.ndarray:
  return np.random.RandomState(seed).randint(1, VOCAB, size=(batch, length)).astype(np.int32)


def _hf_logits(model, **inputs) -> np.ndarray:
  args = {k: torch.as_tensor(v) for k, v in inputs.items() if k != "cache"}
  if "cache" in inputs:
    args["past_key_values"] = inputs["cache"]
  with torch.no_grad():
    return model(**args).logits.numpy()


def _ours(config, params, tokens, prompt=None, **kwargs) -> np.ndarray:
  return np.asarray(network.DecoderLM(config, prompt).apply({"params": params}, tokens,
                                                            **kwargs))


def _close(name: str, got: np.ndarray, want: np.ndarray) -> None:
  diff = float(np.abs(got - want).max())
  print(f"{name}: max |diff| {diff:.2e} (logits std {want.std():.2f})")
  assert want.std() > 0.1  # not a comparison of near-constant outputs
  assert diff < ATOL, (name, diff)


def test_logits_equal_transformers(family):
  name, model, config, params = family
  tokens = _tokens()
  want = _hf_logits(model, input_ids=tokens.astype(np.int64))
  _close(f"{name} logits", _ours(config, params, tokens), want)
  assert (config.tie_word_embeddings, "logits_dense" in params) in ((True, False), (False, True))


def test_a_window_one_wider_or_narrower_is_detected(family):
  """The comparison can tell transformers' window (i - W < j <= i) from its neighbours."""
  name, model, config, params = family
  if not config.layer_types:
    pytest.skip(f"{name} has no sliding layers")
  want = _hf_logits(model, input_ids=_tokens().astype(np.int64))
  for other in (config.replace(sliding_window=WINDOW - 1),
                config.replace(sliding_window=WINDOW + 1), config.replace(layer_types=())):
    assert np.abs(_ours(other, params, _tokens()) - want).max() > 1e-3


def test_family_switches_are_read_from_the_hf_config(family):
  name, _, config, _ = family
  if name.startswith("gemma"):
    assert (config.norm_offset, config.post_norms, config.scale_embeddings) == (1.0, True, True)
    assert config.layer_types[:2] == ("sliding", "full") and config.sliding_window == WINDOW
    assert config.query_pre_attn_scalar == 12
  if name.startswith("gemma3"):
    assert config.qk_norm and config.rope_local_theta == 1e4 and config.rope_theta == 1e6
    assert config.rope_scaling.rope_type == "linear"
  if name == "gemma2":
    assert (config.attn_logit_softcap, config.final_logit_softcap) == (2.0, 1.5)
  if name.startswith("llama"):
    assert config.rope_scaling.rope_type == "llama3" and config.layer_types == ()
  assert config.tie_word_embeddings == (name in ("llama_tied", "gemma2", "gemma3"))
  assert config.attention_bias == (name == "qwen2")
  assert config.qk_norm == (name in ("gemma3", "gemma3_untied", "qwen3"))


class _TestPrompt(nn.Module):
  """The input hook at its simplest: a [L, E] parameter before the embedded tokens."""
  length: int

  @nn.compact
  def __call__(self, embedded, tokens, *, embedding, deterministic, valid=None):
    del embedding, deterministic
    prompt = self.param("prompt", nn.initializers.normal(1.0), (self.length, embedded.shape[-1]))
    batch = embedded.shape[0]
    x = jnp.concatenate([jnp.broadcast_to(prompt, (batch,) + prompt.shape), embedded], axis=1)
    valid = tokens > 0 if valid is None else valid
    return x, jnp.concatenate([jnp.ones((batch, self.length), bool), valid], axis=1)


def test_soft_prompt_equals_transformers_inputs_embeds(family):
  """transformers 5 scales token embeddings inside embed_tokens (Gemma's sqrt(E) too) and uses
  `inputs_embeds` as given, so the prompt rows go in unscaled, the token rows scaled."""
  name, model, config, params = family
  tokens = _tokens()
  prompt = np.random.RandomState(2).normal(0, 1, (PROMPT, config.emb_dim)).astype(np.float32)
  with torch.no_grad():
    embedded = model.get_input_embeddings()(torch.as_tensor(tokens.astype(np.int64))).numpy()
  embeds = np.concatenate([np.broadcast_to(prompt, (2,) + prompt.shape), embedded], axis=1)
  want = _hf_logits(model, inputs_embeds=embeds)
  got = _ours(config, {**params, "prompt": {"prompt": prompt}}, tokens, _TestPrompt(PROMPT))
  _close(f"{name} soft prompt", got, want)
  _close(f"{name} inputs_embeds", _ours(config, params, None, inputs_embeds=embeds), want)


def test_right_padding_equals_each_row_alone(family):
  name, model, config, params = family
  tokens = _tokens(batch=3)
  lengths = [LENGTH, 9, 5]
  valid = np.arange(LENGTH)[None] < np.array(lengths)[:, None]
  padded = np.where(valid, tokens, 0)
  got = _ours(config, params, padded, valid=valid)
  want = _hf_logits(model, input_ids=padded.astype(np.int64),
                    attention_mask=valid.astype(np.int64))
  for row, n in enumerate(lengths):
    alone = _ours(config, params, tokens[row:row + 1, :n])[0]
    _close(f"{name} row {row} padded vs alone", got[row, :n], alone)
    _close(f"{name} row {row} padded vs transformers", got[row, :n], want[row, :n])


def test_left_padding_equals_transformers_with_cumsum_positions(family):
  """As `generate` calls transformers on left-padded rows: positions cumsum(mask) - 1."""
  name, model, config, params = family
  tokens = _tokens(batch=2)
  valid = np.arange(LENGTH)[None] >= np.array([0, 6])[:, None]
  padded = np.where(valid, tokens, 0)
  positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0)
  want = _hf_logits(model, input_ids=padded.astype(np.int64),
                    attention_mask=valid.astype(np.int64), position_ids=positions)
  got = _ours(config, params, padded, valid=valid)
  _close(f"{name} left padding", got[valid], want[valid])


def _random_prefixes(config, batch: int, length: int, seed: int = 4):
  """Per layer (key, value) [B, P, K, D] ~ N(0, 1)."""
  rng = np.random.RandomState(seed)
  shape = (batch, length, config.num_kv_heads, config.head_dim)
  return [(rng.normal(0, 1, shape).astype(np.float32), rng.normal(0, 1, shape).astype(np.float32))
          for _ in range(config.num_layers)]


def test_deep_prefixes_equal_a_transformers_cache(family):
  """PEFT's prefix tuning: the prefixes are a cache of length P; real tokens at P, P+1, ..."""
  name, model, config, params = family
  tokens = _tokens()
  prefixes = _random_prefixes(config, 2, PROMPT)
  cache = transformers.DynamicCache(config=model.config)
  for i, (k, v) in enumerate(prefixes):
    cache.update(torch.as_tensor(k).transpose(1, 2), torch.as_tensor(v).transpose(1, 2), i)
  mask = np.ones((2, PROMPT + LENGTH), np.int64)
  want = _hf_logits(model, input_ids=tokens.astype(np.int64), attention_mask=mask, cache=cache)
  got = _ours(config, params, tokens, prefixes=prefixes)
  _close(f"{name} deep prefixes", got, want)
  shared = [(k[:1], v[:1]) for k, v in prefixes]  # one prefix for the batch: [1, P, K, D]
  np.testing.assert_allclose(_ours(config, params, tokens, prefixes=shared)[0], got[0],
                             atol=ATOL)


# ------------------------------------------------------------------------------ the mapping


def _flat(params) -> dict[str, np.ndarray]:
  return traverse_util.flatten_dict(params, sep="/")


def test_state_dict_round_trips_exactly(family):
  name, model, config, params = family
  state = _state(model)
  back = hf.params_to_hf(params, config)
  expected = {k: v for k, v in state.items()
              if not (config.tie_word_embeddings and k == "lm_head.weight")}
  assert sorted(back) == sorted(expected)
  for key, value in expected.items():
    np.testing.assert_array_equal(back[key], value, err_msg=key)
  assert all(x.dtype == np.float32 for x in _flat(params).values())
  boxed = network.abstract_params(config)
  shapes = {p: tuple(getattr(x, "value", x).shape) for p, x in _flat(boxed).items()}
  assert shapes == {p: x.shape for p, x in _flat(params).items()}, name


def test_config_round_trips_through_config_to_hf(family):
  name, model, config, _ = family
  assert hf.config_from_hf(hf.config_to_hf(config)) == config
  rebuilt = getattr(transformers, _CLASSES[name]).config_class(**hf.config_to_hf(config))
  assert hf.config_from_hf(rebuilt.to_dict()) == config


@pytest.mark.parametrize("damage, message", [
    (lambda s: s.pop("model.layers.1.mlp.up_proj.weight"),
     "model.layers.1.mlp.up_proj.weight (64, 32) is missing"),
    (lambda s: s.__setitem__("model.layers.1.mlp.extra.weight", np.ones(3, np.float32)),
     "model.layers.1.mlp.extra.weight (3,) is not part of the model"),
    (lambda s: s.__setitem__("model.layers.1.self_attn.k_proj.weight", np.ones((8, 32))),
     "model.layers.1.self_attn.k_proj.weight has shape (8, 32), expected (16, 32)"),
])
def test_a_damaged_state_dict_is_one_line_naming_the_tensor(damage, message):
  model = _hf_model("llama")
  config = hf.config_from_hf(model.config.to_dict())
  state = _state(model)
  damage(state)
  with pytest.raises(ConfigError) as info:
    hf.params_from_hf(state, config)
  assert message in str(info.value) and "\n" not in str(info.value)


def test_our_tree_is_checked_when_writing_hf():
  model = _hf_model("gemma2")
  config = hf.config_from_hf(model.config.to_dict())
  params = hf.params_from_hf(_state(model), config)
  del params["layers_1"]["post_mlp_norm"]
  with pytest.raises(ConfigError, match="layers_1/post_mlp_norm/scale .32,. is missing"):
    hf.params_to_hf(params, config)


def test_a_differing_tied_head_is_refused():
  model = _hf_model("gemma3")
  config = hf.config_from_hf(model.config.to_dict())
  state = _state(model)
  state["lm_head.weight"] = state["lm_head.weight"] + 1.0
  with pytest.raises(ConfigError, match="lm_head.weight differs from model.embed_tokens.weight"):
    hf.params_from_hf(state, config)


def test_gemma3_multimodal_names_and_config():
  model = _hf_model("gemma3")
  text = model.config.to_dict()
  config = hf.config_from_hf({"model_type": "gemma3", "text_config": text})
  assert config == hf.config_from_hf(text)
  state = {k.replace("model.", "model.language_model.", 1): v for k, v in _state(model).items()}
  state["model.vision_tower.encoder.weight"] = np.ones(2, np.float32)
  want = hf.params_from_hf(_state(model), config)
  got = hf.params_from_hf(state, config)
  assert all(np.array_equal(got_x, _flat(want)[p]) for p, got_x in _flat(got).items())


@pytest.mark.parametrize("change, message", [
    ({"model_type": "mistral"}, "model_type 'mistral' is not a supported decoder-only model; "
                                "valid: gemma2, gemma3, gemma3_text, llama, qwen2, qwen3"),
    ({"hidden_act": "relu"}, "activation 'relu' is not supported; valid: silu, swish"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}},
     "rope_type 'yarn' is not supported; valid: default, linear, llama3"),
    ({"attention_bias": True}, "llama with attention_bias=true"),
])
def test_unsupported_hf_configs_are_one_line(change, message):
  config = {**_hf_config("llama").to_dict(), **change}
  with pytest.raises(ConfigError) as info:
    hf.config_from_hf(config)
  assert message in str(info.value) and "\n" not in str(info.value)
