"""Serving frozen T5 and decoder-only models with soft prompts (above the trainer; nothing here
trains), in layers, each importing only the ones listed above it:

  export/      prompts written out and read back: .npy, PEFT adapters
  catalog/     the prompts served (the stacked table, its capacity, their loaders) and the
               backbone they are served on
  model/       the compiled model step per backbone kind on mixed-prompt batches; slot KV caches
               and the KV prefix cache per prompt (continuous batching)
  scheduler/   who runs when: the live catalog, the batching loop, continuous batching over
               slots, several processes in step
  http/        the HTTP surface: requests checked, routes, metrics, OpenAI completions and chat
               streamed as server-sent events
  service      `python -m spot_jax.serve` (flags, listening, SIGTERM)
  assemble     its start-up: backbone, prompts, batching loop

The command lines are `python -m spot_jax.infer` (files) and `python -m spot_jax.serve` (HTTP);
see docs/serving.md.
"""
