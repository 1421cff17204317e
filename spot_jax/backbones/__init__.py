"""The frozen backbones: one concept, two kinds of network under a soft prompt.

  t5/       the encoder-decoder kind: T5 and T5.1.1 (config, Flax network with t5x's
            parameter tree, checkpoints by format, decoding)
  decoder/  the decoder-only kind: the Llama and Gemma 2/3 families as configurations of one
            network (config, Flax network, Hugging Face and Gemma checkpoints, KV-cache decoding,
            tokenizers)
  kinds     which kind a config is (`kind_of`), each kind's named configs and strict loader
  memory    what the frozen weights and layers hold: their stored dtype (FROZEN_DTYPE) and the
            per-layer rematerialisation policies (REMAT)

Each kind has a frozen config dataclass, a Flax network that takes an optional prompt module
(the input hook before the first layer, or the deep hook in every attention layer), strict
checkpoint loading, and decoding. Code above the backbones reaches a kind through one name
(`spot_jax.backbones.t5`, `spot_jax.backbones.decoder`), or asks `kinds` what a config's kind is
and loads its checkpoint there; neither kind imports the other.
"""
