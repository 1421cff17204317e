"""`DecoderConfig`: the named configs build, bad fields are refused in one line naming them, and
the published shapes initialise abstractly (`jax.eval_shape`) to their known parameter counts
with a logical axis on every dimension of every parameter."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import traverse_util
from flax.core import meta

from spot_jax import partitioning
from spot_jax.backbones.decoder import config as config_lib
from spot_jax.backbones.decoder import layers, network
from spot_jax.backbones.decoder.config import CONFIGS, DecoderConfig, RopeScaling
from spot_jax.errors import ConfigError

TINY = dict(vocab_size=128, emb_dim=32, num_heads=4, num_kv_heads=2, num_layers=2, head_dim=8,
            mlp_dim=64)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_named_config_builds(name):
  config = config_lib.config_by_name(name)
  assert config is CONFIGS[name] and config.replace() == config
  assert config_lib.config_by_name(name, dtype="bfloat16").activation_dtype == np.dtype("bfloat16")
  assert len(config.layer_types) in (0, config.num_layers)
  hash(config)  # usable as a static argument of jit


def test_unknown_name_lists_close_and_valid_names():
  with pytest.raises(ConfigError) as info:
    config_lib.config_by_name("gemma_3_1")
  message = str(info.value)
  assert "did you mean gemma_3_1b" in message and "llama_3_2_1b" in message
  assert "\n" not in message


@pytest.mark.parametrize("change, message", [
    (dict(mlp_activation="swish"),
     "DecoderConfig.mlp_activation='swish' is unknown; valid: gelu, gelu_tanh, silu"),
    (dict(mlp_activation="gelu_tan"), "(did you mean 'gelu_tanh'"),
    (dict(num_kv_heads=3), "DecoderConfig.num_heads=4 must be a multiple of num_kv_heads=3"),
    (dict(head_dim=0), "DecoderConfig.head_dim=0 must be a positive integer"),
    (dict(dtype="float16"), "DecoderConfig.dtype='float16' is unknown"),
    (dict(layer_types=("full", "local")), "DecoderConfig.layer_types[1]='local' is unknown"),
    (dict(layer_types=("full",)), "DecoderConfig.layer_types has 1 entries but num_layers=2"),
    (dict(layer_types=("sliding", "full")),
     "DecoderConfig.sliding_window=None must be a positive integer (sliding layers need a "
     "window)"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}),
     "RopeScaling.rope_type='yarn' is unknown; valid: linear, llama3"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
     "RopeScaling.low_freq_factor=None must be a number > 0"),
    (dict(rope_scaling={"rope_type": "linear", "factor": 8.0, "low_freq_factor": 1.0}),
     "RopeScaling.low_freq_factor=1.0 is for rope_type 'llama3' only"),
    (dict(rope_scaling="linear"), "DecoderConfig.rope_scaling='linear' must be None, a "
                                  "RopeScaling or a dict"),
    (dict(attn_logit_softcap=0.0), "DecoderConfig.attn_logit_softcap=0.0 must be a number > 0"),
    (dict(bos_id=128), "DecoderConfig.bos_id=128 must be a token id in [0, 128)"),
    (dict(norm_epsilon=-1e-6), "DecoderConfig.norm_epsilon=-1e-06 must be a number > 0"),
])
def test_bad_fields_are_one_line_naming_the_field(change, message):
  with pytest.raises(ConfigError) as info:
    DecoderConfig(**{**TINY, **change})
  assert message in str(info.value), str(info.value)
  assert "\n" not in str(info.value)


def test_normalised_fields_compare_equal():
  a = DecoderConfig(**TINY, layer_types=["full", "full"], rope_theta=10000,
                    rope_scaling={"rope_type": "linear", "factor": 2})
  b = DecoderConfig(**TINY, rope_theta=10000.0, rope_scaling=RopeScaling("linear", 2.0))
  assert a == b and a.layer_types == () and hash(a) == hash(b)
  assert a.attention_scale == 8 ** -0.5
  assert a.replace(query_pre_attn_scalar=32).attention_scale == 32 ** -0.5


def _expected_count(c: DecoderConfig) -> int:
  """Parameters of a decoder from its shapes alone (not from the network's code)."""
  e, n, k, d, f = c.emb_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_dim
  attention = e * n * d * 2 + e * k * d * 2 + (2 * d if c.qk_norm else 0)
  norms = e * (4 if c.post_norms else 2)
  per_layer = attention + 3 * e * f + norms
  head = 0 if c.tie_word_embeddings else e * c.vocab_size
  return c.vocab_size * e + c.num_layers * per_layer + e + head


@pytest.mark.parametrize("name, approx", [("llama_3_2_1b", 1.236e9), ("gemma_3_1b", 1.000e9),
                                          ("gemma_2_2b", 2.614e9), ("gemma_3_270m", 0.268e9)])
def test_published_shapes_initialise_abstractly(name, approx):
  config = CONFIGS[name]
  boxed = network.abstract_params(config)
  leaves = traverse_util.flatten_dict(boxed, sep="/")
  count = sum(int(np.prod(x.value.shape)) for x in leaves.values())
  print(f"{name}: {count:,} parameters")
  assert count == _expected_count(config)
  assert abs(count / approx - 1) < 2e-3
  rules = dict(partitioning.DEFAULT_RULES)
  for path, leaf in leaves.items():
    assert isinstance(leaf, meta.Partitioned), path
    assert len(leaf.names) == len(leaf.value.shape) and set(leaf.names) <= set(rules), path
    assert leaf.value.dtype == np.float32, path
  attention = leaves["layers_0/attention/key/kernel"]
  assert attention.names == ("embed", "kv_heads", "kv") and rules["kv_heads"] is None


def test_norm_scales_start_at_their_identity():
  for name, want in (("decoder_tiny_llama", 1.0), ("decoder_tiny_gemma3", 0.0)):
    config = CONFIGS[name]
    params = meta.unbox(network.DecoderLM(config).init(jax.random.PRNGKey(0),
                                                       np.ones((1, 3), np.int32))["params"])
    np.testing.assert_array_equal(params["final_norm"]["scale"], want)
    np.testing.assert_array_equal(params["layers_0"]["pre_mlp_norm"]["scale"], want)


def test_llama3_rope_keeps_high_and_divides_low_frequencies():
  scaling = RopeScaling("llama3", 8.0, 1.0, 4.0, 16)
  plain = layers.rope_frequencies(8, 10000.0)
  scaled = layers.rope_frequencies(8, 10000.0, scaling)
  wavelengths = 2 * np.pi / plain  # 6.3 (between 16/4 and 16/1: smoothed), 63, 628, 6283
  np.testing.assert_allclose(scaled[1:], plain[1:] / 8, rtol=1e-6)
  assert plain[0] / 8 < scaled[0] < plain[0] and 4 < wavelengths[0] < 16
  np.testing.assert_allclose(layers.rope_frequencies(8, 1e4, RopeScaling("linear", 8.0)),
                             plain / 8, rtol=1e-6)
