"""Benchmarks: speed and memory targets live here and in docs/benchmarks.md, never in tests.

Run from a checkout (`python -m benchmarks.<name>`; not installed with the package), with
`pip install -e '.[bench]'` for the PyTorch + PEFT peers.

  common          what every benchmark shares (methods, shapes, batches, FLOPs, the matmul peak,
                  the goals)
  tables          the train-step benchmark's Markdown rows and paired lines
  train_step      `python -m benchmarks`: train-step speed, FLOPs, MFU and memory per method
  lengths         `python -m benchmarks.lengths`: fixed padding vs length buckets
  runs            `python -m benchmarks.runs`: K prompt runs in one jitted step against one run
  jobs            `python -m benchmarks.jobs`: K whole prompt runs in one trainer job against one
  serve           `python -m benchmarks.serve`: many-task serving, mixed vs one prompt vs PEFT
  serve_workload  its request queues and pass statistics (numpy only, shared with the peer)
  serve_e2e       `python -m benchmarks.serve_e2e`: whole processes on the toy T5, cold start
  serve_http      `python -m benchmarks.serve_http`: load test of `python -m spot_jax.serve`
  serve_load      `python -m benchmarks.serve_load`: open-loop decoder load: tokens/s, TTFT, ITL
  decoder_train_step  `python -m benchmarks.decoder_train_step`: the train step on a Llama /
                  Gemma 3 shape against PyTorch + PEFT prompt tuning, same weights and tokens
  decoder_serve   `python -m benchmarks.decoder_serve`: many prompts on a decoder-only model,
                  mixed vs one prompt vs PEFT
  prefix_cache    `python -m benchmarks.prefix_cache`: a prefill from a prompt's cached KV prefix
                  against prefilling the prompt too
  plan_table      `python -m benchmarks.plan_table`: the planner's memory per device at real
                  sizes, every frozen weight format x remat (FSDP over 8 for 27B and 70B)
  plan_check      `python -m benchmarks.plan_check`: the planner's total against a real step's
                  peak resident memory
  peers/          the peer programs (PyTorch + PEFT, t5x + prompt-tuning), each in its own process
"""
