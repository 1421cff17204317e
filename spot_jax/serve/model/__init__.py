"""The compiled model step, per backbone kind, on batches whose rows each name their prompt.

  gather       each row's prompt gathered from the table in jit (routing, ATTEMPT, DePT,
               placement, per-row prefixes), for either backbone kind
  mixed        jitted decoding / scoring of mixed-prompt batches on T5
  mixed_decoder  the same on a decoder-only backbone (Llama, Gemma): [prompt | BOS, inputs]
  slots        continuous batching's per-slot key/value caches: prefill one request into a
               slot, one decode step for every slot, per-slot sampling and logprobs
  prefix_cache  each prompt's KV prefix (deep prefixes, its positions and BOS), computed once
  server       a frozen backbone (either kind) + table; fixed-size jitted calls, counted
  ensemble     N prompts of one task in one batched pass; majority vote or mean log-probs
  predict      batches examples through a server into JSONL records and a summary; Phases
  inputs       text / JSONL / stdin / seqio inputs, class labels' tokens; outputs written
               atomically as JSONL
"""
