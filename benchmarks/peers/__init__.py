"""The peers' programs, each run in a process of its own (torch, t5x and JAX never share one).

  worker           the peer processes' shared command line and memory reading
  peft_train       `python -m benchmarks.peers.peft_train`: PyTorch + PEFT's train step
  compare_peft     `python -m benchmarks --vs=peft`: runs peft_train, the side-by-side table
  peft_serve       `python -m benchmarks.peers.peft_serve`: the PEFT peer of benchmarks.serve
  peft_serve_file  the PEFT script benchmarks.serve_e2e runs against `python -m spot_jax.infer`
  peft_http        `python -m benchmarks.peers.peft_http`: PyTorch + PEFT behind the HTTP front
  peft_decoder_train  `python -m benchmarks.peers.peft_decoder_train`: PyTorch + PEFT's step on
                   a decoder-only model (writes the weights and prompt spot-jax then reads)
  peft_decoder_serve  `python -m benchmarks.peers.peft_decoder_serve`: the PEFT peer of
                   benchmarks.decoder_serve
  t5x_train        `python -m benchmarks.peers.t5x_train`: t5x's train step for prompt-tuning's
                   model and spot-jax's contrib model (t5x, flaxformer, prompt-tuning on
                   PYTHONPATH)
  compare_t5x      `python -m benchmarks --vs=t5x`: runs t5x_train, the side-by-side rows
"""
