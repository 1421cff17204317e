"""Serving frozen T5 and decoder-only models with soft prompts (above the trainer; nothing here
trains). Bottom to top:

  export/      writing prompts out: bare .npy, PEFT adapters (T5, MPT, CAUSAL_LM)
  catalog/     the prompts served: the stacked table, its sources, the served backbone
  model/       the compiled model step per backbone kind, gathering each row's prompt
  scheduler/   who runs when: the batching loop, several processes in step
  http/        the HTTP surface: request checks, routes, metrics
  service      `python -m spot_jax.serve` (flags, listening, SIGTERM)
  assemble     its start-up: backbone, prompts, batching loop

The command lines are `python -m spot_jax.infer` (files) and `python -m spot_jax.serve` (HTTP);
see docs/serving.md.
"""
