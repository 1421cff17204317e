"""bfloat16 frozen weights (FROZEN_DTYPE) against transformers' bfloat16 models, both backbones.

A random model of each family is cast to bfloat16 in torch (`model.to(torch.bfloat16)`, every
weight and activation bfloat16) and saved; spot-jax loads the same file with
param_dtype="bfloat16" (the arrays stay bfloat16) and dtype="bfloat16". Two runs in bfloat16
differ by rounding order, not by a formula, so the tolerance is set by bfloat16 itself: the
largest logit difference must stay within 3% of the largest |logit| (bfloat16 keeps 8 bits, a
relative step of 2^-8 ~ 0.4%, compounded over a few layers and summations), and spot-jax must
be about as close (within 2x + 1%) to the float32 model as transformers' bfloat16 run is. A
formula error (a norm or a scale in the wrong dtype, a missing cast) moves logits by far more.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spot_jax.backbones.decoder import checkpoints as decoder_checkpoints  # noqa: E402
from spot_jax.backbones.decoder import network as decoder_network  # noqa: E402
from spot_jax.backbones.t5 import T5Config, Transformer, load_checkpoint  # noqa: E402

VOCAB = 96
REL_TOL = 0.03  # measured: 0.59% to 1.23% (llama, gemma3, t5_1_1, t5)


def _check(name: str, ours: np.ndarray, theirs: np.ndarray, reference: np.ndarray) -> None:
  scale = float(np.abs(reference).max())
  diff = float(np.abs(ours - theirs).max())
  ours_err = float(np.abs(ours - reference).max())
  theirs_err = float(np.abs(theirs - reference).max())
  print(f"{name}: max|logit| {scale:.2f}; spot-jax vs transformers bf16 {diff:.4f} "
        f"({diff / scale:.2%}); vs float32: spot-jax {ours_err:.4f}, transformers {theirs_err:.4f}")
  assert reference.std() > 0.2  # logits that vary: a comparison that can fail
  assert diff <= REL_TOL * scale, (name, diff, scale)
  assert ours_err <= 2 * theirs_err + 0.01 * scale, (name, ours_err, theirs_err)


def _decoder_model(family: str):
  sizes = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
  if family == "llama":
    config = transformers.LlamaConfig(**sizes, tie_word_embeddings=True)
    cls = transformers.LlamaForCausalLM
  else:
    config = transformers.Gemma3TextConfig(
        **sizes, query_pre_attn_scalar=16, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    cls = transformers.Gemma3ForCausalLM
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  torch.manual_seed(0)
  model = cls(config).eval()
  with torch.no_grad():
    for _, p in model.named_parameters():
      p.normal_(0.0, 0.3 if p.ndim == 1 else 0.15)
  return model


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_decoder_bfloat16_logits_match_transformers(family, tmp_path):
  model = _decoder_model(family)
  tokens = np.random.RandomState(1).randint(3, VOCAB, size=(2, 12))
  with torch.no_grad():
    reference = model(input_ids=torch.as_tensor(tokens)).logits.float().numpy()
    half = model.to(torch.bfloat16)
    half.save_pretrained(str(tmp_path))
    theirs = half(input_ids=torch.as_tensor(tokens)).logits.float().numpy()
  assert decoder_checkpoints.stored_dtype(str(tmp_path)) == "bfloat16"
  config, params = decoder_checkpoints.load_checkpoint(str(tmp_path))
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
  config = config.replace(dtype="bfloat16", param_dtype="bfloat16")
  ours = np.asarray(decoder_network.DecoderLM(config).apply({"params": params},
                                                            jnp.asarray(tokens, jnp.int32)))
  _check(family, ours, theirs, reference)


def _t5_model(gated: bool):
  hf_config = transformers.T5Config(
      vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
      num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
      dropout_rate=0.0, feed_forward_proj="gated-gelu" if gated else "relu",
      tie_word_embeddings=not gated, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
  torch.manual_seed(0)
  model = transformers.T5ForConditionalGeneration(hf_config).eval()
  if gated:  # transformers 5 ties lm_head even for T5.1.1: untie it, as real checkpoints are
    model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 64) * 64 ** -0.5)
  config = T5Config(vocab_size=VOCAB, emb_dim=64, num_heads=4, head_dim=16, mlp_dim=128,
                    num_encoder_layers=2, num_decoder_layers=2,
                    mlp_activations=("gelu", "linear") if gated else ("relu",),
                    logits_via_embedding=not gated, relative_attention_num_buckets=8,
                    relative_attention_max_distance=20, dropout_rate=0.0)
  return model, config


@pytest.mark.parametrize("gated", [True, False], ids=["t5_1_1", "t5"])
def test_t5_bfloat16_logits_match_transformers(gated, tmp_path):
  model, config = _t5_model(gated)
  rs = np.random.RandomState(2)
  enc = rs.randint(2, VOCAB, size=(2, 10))
  enc[1, 6:] = 0
  dec = np.concatenate([np.zeros((2, 1), np.int64), rs.randint(2, VOCAB, size=(2, 5))], axis=1)
  args = dict(input_ids=torch.as_tensor(enc), attention_mask=torch.as_tensor(enc > 0).long(),
              decoder_input_ids=torch.as_tensor(dec))
  with torch.no_grad():
    reference = model(**args).logits.float().numpy()
    half = model.to(torch.bfloat16)
    half.save_pretrained(str(tmp_path))
    theirs = half(**args).logits.float().numpy()
  config = config.replace(dtype="bfloat16", param_dtype="bfloat16")
  params = load_checkpoint(str(tmp_path), config)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
  ours = np.asarray(Transformer(config).apply(
      {"params": params}, jnp.asarray(enc, jnp.int32), jnp.asarray(dec, jnp.int32),
      enable_dropout=False))
  _check("t5_1_1" if gated else "t5", ours, theirs, reference)
