"""The embedded toy decoder's config, `decoder_toy`: a Llama-style model of the toy T5's size.

Llama's recipe (pre-norm RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention, no
embedding scaling, untied output layer) rather than Gemma's: it has the fewest parts (no
post-norms, no query/key norms, no sliding window or soft-capping, which 64-token rows would
never exercise), and it is the layout `transformers`' LlamaForCausalLM reads, so the shipped
checkpoint also runs there.

The vocabulary is the suite's one SentencePiece model (the toy T5's, `tasks.embedded`): 178
pieces with pad 0, EOS 1 and unk 2, then T5's 100 sentinels, in a 384-row table. It has no BOS;
the decoder's is the table's last row (383), a token no text encodes to: EOS already ends the
inputs in the trainer's decoder-only layout ("<inputs> EOS <targets> EOS"), so a BOS equal to
EOS would make "start" and "answer now" one signal.
"""
from __future__ import annotations

from typing import Optional

from spot_jax.backbones.decoder import config as config_lib

NAME = "decoder_toy"
VOCAB_SIZE = 384  # the toy T5's table: 178 pieces + 100 sentinels, and free rows
PAD_ID, EOS_ID = 0, 1  # the SentencePiece model's
BOS_ID = VOCAB_SIZE - 1
MAX_POSITIONS = 256  # informative (config.json): rows of 64, prompts and demo inputs fit
DESCRIPTION = ("A Llama-style decoder-only model (width 128, 4 layers, 4 query heads of 32 over 2 "
               "key/value heads, SwiGLU MLP 384, RMSNorm, rotary positions, untied output layer)")


def toy_config(dtype: str = "float32", param_dtype: Optional[str] = None,
               remat_policy: str = "none") -> config_lib.DecoderConfig:
  """`decoder_toy`: width 128, 4 layers, 4 query heads of 32 over 2 key/value heads, SwiGLU 384.

  Args:
    dtype: the activation dtype ("float32", "bfloat16").
    param_dtype: the frozen weights' dtype (None: the checkpoint's).
    remat_policy: per-layer rematerialisation ("none", "full", "save_dots", "offload").
  """
  return config_lib.DecoderConfig(
      vocab_size=VOCAB_SIZE, emb_dim=128, num_heads=4, num_kv_heads=2, num_layers=4, head_dim=32,
      mlp_dim=384, mlp_activation="silu", norm_epsilon=1e-6, rope_theta=10000.0,
      tie_word_embeddings=False, max_position_embeddings=MAX_POSITIONS, bos_id=BOS_ID,
      eos_id=EOS_ID, pad_id=PAD_ID, dtype=dtype, param_dtype=param_dtype,
      remat_policy=remat_policy)
