"""Numerical parity with transformers' PyTorch T5, through the Hugging Face checkpoint loader.

Random tiny models of both families are saved with `save_pretrained` (or as pytorch_model.bin),
loaded by
`spot_jax.backbones.t5.load_checkpoint`, and run on padded batches: encoder outputs at valid
positions and decoder logits at non-padding targets must agree within 1e-4 (float32).
"""
from __future__ import annotations

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spot_jax.backbones.t5 import T5Config, Transformer, load_checkpoint  # noqa: E402
from spot_jax.backbones.t5.hf import config_from_hf  # noqa: E402

TOL = 1e-4

# (gated, heads, head_dim, emb, mlp, buckets, max_distance, enc layers, dec layers, enc len, dec
# len)
SETTINGS = {
    "gated_h3_b8_d20": (True, 3, 4, 16, 24, 8, 20, 2, 3, 11, 7),
    "relu_h4_b32_d128": (False, 4, 8, 24, 40, 32, 128, 3, 2, 13, 6),
    "gated_h2_b4_d8_1layer": (True, 2, 6, 8, 16, 4, 8, 1, 1, 24, 12),
    "relu_h6_b16_d12_long": (False, 6, 4, 20, 36, 16, 12, 2, 2, 40, 20),
}
VOCAB = 48


def make_hf(setting: tuple, seed: int = 0):
  """A random HF T5 (eval mode) and the equivalent spot-jax `T5Config`."""
  gated, heads, head_dim, emb, mlp, buckets, dist, n_enc, n_dec = setting[:9]
  hf_config = transformers.T5Config(
      vocab_size=VOCAB, d_model=emb, d_kv=head_dim, d_ff=mlp, num_layers=n_enc,
      num_decoder_layers=n_dec, num_heads=heads, relative_attention_num_buckets=buckets,
      relative_attention_max_distance=dist, dropout_rate=0.0,
      feed_forward_proj="gated-gelu" if gated else "relu", tie_word_embeddings=not gated,
      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
  torch.manual_seed(seed)
  model = transformers.T5ForConditionalGeneration(hf_config).eval()
  if gated:
    # transformers>=5 ties lm_head to the embedding even for T5.1.1 configs; give it its own
    # weights, as real T5.1.1 / LM-adapted checkpoints have.
    model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, emb) * emb ** -0.5)
    assert model.lm_head.weight.data_ptr() != model.shared.weight.data_ptr()
  config = T5Config(vocab_size=VOCAB, emb_dim=emb, num_heads=heads, head_dim=head_dim, mlp_dim=mlp,
                    num_encoder_layers=n_enc, num_decoder_layers=n_dec,
                    mlp_activations=("gelu", "linear") if gated else ("relu",),
                    logits_via_embedding=not gated, relative_attention_num_buckets=buckets,
                    relative_attention_max_distance=dist, dropout_rate=0.0)
  return model, config


def padded_batch(enc_len: int, dec_len: int, seed: int = 1):
  """Encoder ids [3, T] and targets [3, S] with right padding (one row unpadded), and inputs."""
  rng = np.random.RandomState(seed)
  enc = rng.randint(2, VOCAB, size=(3, enc_len))
  enc[1, enc_len * 2 // 3:] = 0
  enc[2, 3:] = 0
  tgt = rng.randint(2, VOCAB, size=(3, dec_len))
  tgt[0, dec_len // 2:] = 0
  tgt[2, dec_len - 1:] = 0
  dec_in = np.concatenate([np.zeros((3, 1), np.int64), tgt[:, :-1]], axis=1)
  dec_in[tgt == 0] = 0
  return enc, dec_in, tgt


@functools.lru_cache(maxsize=None)
def forward(config: T5Config):
  """Jitted (params, enc, dec_in, tgt) -> ((encoded, valid), logits), one per config."""
  net = Transformer(config)

  def run(params, enc, dec_in, tgt):
    encoded = net.apply({"params": params}, enc, enable_dropout=False, method=Transformer.encode)
    return encoded, net.apply({"params": params}, enc, dec_in, tgt, enable_dropout=False)
  return jax.jit(run)


def compare(model, config: T5Config, path: str, enc_len: int, dec_len: int) -> tuple[float, float]:
  """Max |Δ| of encoder outputs (valid positions) and logits (non-padding targets)."""
  params = load_checkpoint(path, config)
  enc, dec_in, tgt = padded_batch(enc_len, dec_len)
  (encoded, valid), logits = forward(config)(params, jnp.asarray(enc), jnp.asarray(dec_in),
                                             jnp.asarray(tgt))
  with torch.no_grad():
    mask = torch.tensor(enc > 0).long()
    ref_enc = model.encoder(input_ids=torch.tensor(enc), attention_mask=mask).last_hidden_state
    ref_logits = model(input_ids=torch.tensor(enc), attention_mask=mask,
                       decoder_input_ids=torch.tensor(dec_in)).logits
  assert np.array_equal(np.asarray(valid), enc > 0)
  enc_diff = np.abs(np.asarray(encoded) - ref_enc.numpy())[enc > 0].max()
  logit_diff = np.abs(np.asarray(logits) - ref_logits.numpy())[tgt > 0].max()
  return float(enc_diff), float(logit_diff)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_safetensors_parity(name, tmp_path):
  setting = SETTINGS[name]
  model, config = make_hf(setting)
  model.save_pretrained(tmp_path)
  assert os.path.exists(tmp_path / "model.safetensors")
  with open(tmp_path / "config.json", encoding="utf-8") as f:
    assert config_from_hf(json.load(f)) == config
  enc_diff, logit_diff = compare(model, config, str(tmp_path), *setting[9:])
  assert enc_diff < TOL, f"encoder max |diff| {enc_diff}"
  assert logit_diff < TOL, f"logits max |diff| {logit_diff}"


@pytest.mark.parametrize("name", ["gated_h3_b8_d20", "relu_h4_b32_d128"])
def test_pytorch_bin_parity(name, tmp_path):
  """pytorch_model.bin holds every tied alias (embed_tokens, tied lm_head): all must agree."""
  setting = SETTINGS[name]
  model, config = make_hf(setting, seed=3)
  model.config.to_json_file(str(tmp_path / "config.json"))
  state = model.state_dict()
  assert "encoder.embed_tokens.weight" in state and "lm_head.weight" in state
  torch.save(state, tmp_path / "pytorch_model.bin")
  enc_diff, logit_diff = compare(model, config, str(tmp_path), *setting[9:])
  assert enc_diff < TOL and logit_diff < TOL, (enc_diff, logit_diff)


def test_sharded_safetensors_parity(tmp_path):
  setting = SETTINGS["relu_h6_b16_d12_long"]
  model, config = make_hf(setting, seed=5)
  model.save_pretrained(tmp_path, max_shard_size="8KB")
  assert os.path.exists(tmp_path / "model.safetensors.index.json")
  assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 1
  enc_diff, logit_diff = compare(model, config, str(tmp_path), *setting[9:])
  assert enc_diff < TOL and logit_diff < TOL, (enc_diff, logit_diff)


@pytest.mark.parametrize("hub_config, activations, tied", [
    # google/t5-v1_1-* and t5-base-lm-adapt (transformers 4.x era config.json)
    ({"d_model": 768, "d_kv": 64, "d_ff": 2048, "num_layers": 12, "num_heads": 12,
      "vocab_size": 32128, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
     ("gelu", "linear"), False),
    # t5-base: ReLU, tied by default, no max_distance field
    ({"d_model": 768, "d_kv": 64, "d_ff": 3072, "num_layers": 12, "num_heads": 12,
      "vocab_size": 32128, "feed_forward_proj": "relu"}, ("relu",), True),
    # transformers>=5 writes tie_word_embeddings=true and the scaling separately
    ({"d_model": 768, "d_kv": 64, "d_ff": 2048, "num_layers": 12, "num_heads": 12,
      "vocab_size": 32128, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": True,
      "scale_decoder_outputs": False}, ("gelu", "linear"), False),
])
def test_config_from_hf(hub_config, activations, tied):
  config = config_from_hf(hub_config)
  assert config.mlp_activations == activations
  assert config.logits_via_embedding is tied
  assert config.relative_attention_max_distance == 128
  assert (config.emb_dim, config.num_heads, config.head_dim, config.num_encoder_layers,
          config.num_decoder_layers) == (768, 12, 64, 12, 12)


def test_config_from_hf_rejects_unknown_activation():
  with pytest.raises(ValueError, match="feed_forward_proj"):
    config_from_hf({"d_model": 8, "d_kv": 2, "d_ff": 8, "num_layers": 1, "num_heads": 2,
                    "vocab_size": 10, "feed_forward_proj": "gated-mish"})
