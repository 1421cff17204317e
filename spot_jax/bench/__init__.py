"""Benchmarks (targets for speed and memory live here and in docs/benchmarks.md, never in tests).

  common      what every bench shares (methods, shapes, batches, FLOPs, the matmul peak)
  train_step  `python -m spot_jax.bench`: train-step speed, FLOPs, MFU and memory per method
  lengths     `python -m spot_jax.bench.lengths`: fixed padding vs length buckets
  peft        the PyTorch + PEFT peer process of `--vs=peft`
  worker      the peer processes' shared command line and memory reading
"""
