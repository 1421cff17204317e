"""Serving frozen T5 and decoder-only models with soft prompts (above the trainer; nothing here
trains).

  table        PromptTable: named prompts (Prompt Tuning, folded Residual and MPT, SMoP, folded
               Residual SMoP, ATTEMPT with its attention network, DePT with its input offset,
               deep prompts' per-layer prefixes) stacked
  gather       each row's prompt gathered from the table in jit (routing, ATTEMPT, DePT,
               placement, per-row prefixes), for either backbone kind
  mixed        jitted decoding / scoring of batches whose rows each name their prompt (T5)
  mixed_decoder  the same on a decoder-only backbone (Llama, Gemma): [prompt | BOS, inputs]
  prompt_loaders  prompts from modules, .npy files, run directories, PEFT adapters, libraries
  served_backbone  the served backbone and vocabulary: --model's, or the one the run
               directories recorded (run.json), refusing another backbone than recorded
  ensemble     N prompts of one task in one batched pass; majority vote or mean log-probs
  server       a frozen backbone (either kind) + table; fixed-size jitted calls, counted
  predict      batches examples through a server into JSONL records and a summary; Phases
  interpret    nearest vocabulary tokens of every prompt token (cosine similarity)
  export       infer's exports: a bare .npy, PEFT adapters of either kind, an unfolded MPT
  peft_io      Hugging Face PEFT prompt-tuning adapters and google-research/prompt-tuning .npy
  peft_mpt     PEFT MULTITASK_PROMPT_TUNING adapters <-> MPT prompts; MPT targets' start
  peft_causal  PEFT CAUSAL_LM adapters <-> decoder-only prompts (prompt and prefix tuning)
  inputs       text / JSONL / stdin / seqio inputs, class labels' tokens; outputs written
               atomically as JSONL
  capacity     SizedTable: a table padded to power-of-two room, so prompts that fit are added
               without recompiling
  catalog      the prompts a running service holds (added, removed) and a server per setting
  batcher      the batching loop: queued requests of any prompts, one mixed pass per batch
  api          HTTP requests checked field by field, OpenAI-style responses and errors
  app          the Starlette routes
  metrics      the Prometheus metrics
  service      `python -m spot_jax.serve` (flags, listening, SIGTERM)
  assemble     its start-up: backbone, prompts, batching loop
  follow       several processes: process 0 serves, the others repeat its calls
  model/       slot KV caches and one compiled decode step; the KV prefix cache per prompt
  scheduler/   continuous batching: iteration-level scheduling of sequences over the slots
  http/        OpenAI completions and chat completions on that engine, streamed as SSE

The command lines are `python -m spot_jax.infer` (files) and `python -m spot_jax.serve` (HTTP);
see docs/serving.md.
"""
