"""Writing served prompts out for other programs.

  export       infer's exports: a bare .npy, PEFT adapters of either kind, an unfolded MPT
  peft_io      Hugging Face PEFT prompt-tuning adapters and google-research/prompt-tuning .npy
  peft_mpt     PEFT MULTITASK_PROMPT_TUNING adapters <-> MPT prompts; MPT targets' start
  peft_causal  PEFT CAUSAL_LM adapters <-> decoder-only prompts (prompt and prefix tuning)
  vllm         a decoder-only prompt and each input as vLLM's `prompt_embeds` requests
"""
