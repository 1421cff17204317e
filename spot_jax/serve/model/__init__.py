"""The compiled model step per backbone kind: each row of a batch names its prompt.

  gather       each row's prompt gathered from the table in jit (routing, ATTEMPT, DePT,
               placement, per-row prefixes), for either backbone kind
  t5           jitted decoding / scoring of batches whose rows each name their prompt (T5)
  decoder      the same on a decoder-only backbone (Llama, Gemma): [prompt | BOS, inputs]
  server       a frozen backbone (either kind) + table; fixed-size jitted calls, counted
  ensemble     N prompts of one task in one batched pass; majority vote or mean log-probs
  predict      batches examples through a server into JSONL records and a summary; Phases
  inputs       text / JSONL / stdin / seqio inputs, class labels' tokens; outputs written
               atomically as JSONL
"""
