"""Frozen decoder-only backbone (Llama, Gemma 2/3, Qwen 2/3): config, network, checkpoints.

  config       DecoderConfig, one frozen dataclass for every family, and the named configs
  layers       RMSNorm (with Gemma's offset), rotary embedding, grouped-query attention, gated
               MLP, in Flax linen with logical axes
  network      `DecoderLM`: the parameter tree, the input hook (soft prompts) and the deep hook
               (per-layer key/value prefixes)
  decoding     KV-cache generation (greedy, temperature and top-k sampling) in one jitted call
  hf           Hugging Face config.json and state dict <-> DecoderConfig and our tree, strictly
  checkpoints/ strict loading and saving: Hugging Face directories, Gemma orbax checkpoints
  tokenizer    SentencePiece and Hugging Face tokenizer.json vocabularies
  chat_template  a model's chat template, rendered as transformers' apply_chat_template
  convert      `python -m spot_jax.convert` for decoders: Hugging Face <-> Gemma orbax
"""
from spot_jax.backbones.decoder.config import CONFIGS, DecoderConfig, config_by_name
from spot_jax.backbones.decoder.network import DecoderLM
from spot_jax.backbones.decoder.decoding import generate
