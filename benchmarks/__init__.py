"""Benchmarks (targets for speed and memory live here and in docs/benchmarks.md, never in tests).

  common      what every bench shares (methods, shapes, batches, FLOPs, the matmul peak)
  train_step  `python -m spot_jax.bench`: train-step speed, FLOPs, MFU and memory per method
  lengths     `python -m spot_jax.bench.lengths`: fixed padding vs length buckets
  peft        the PyTorch + PEFT peer process of `--vs=peft`
  worker      the peer processes' shared command line and memory reading
  serve       `python -m spot_jax.bench.serve`: many-task serving, mixed vs one prompt vs PEFT
  serve_workload   its request queues and pass statistics (numpy only, shared with the peer)
  serve_peft  its PyTorch + PEFT peer process
  serve_e2e   `python -m spot_jax.bench.serve_e2e`: whole processes on the toy T5, cold start
  serve_peft_file  the PEFT script it runs against `python -m spot_jax.infer`
"""
