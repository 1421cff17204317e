"""The prompts served, and the backbone they are served on.

  table        PromptTable: named prompts (Prompt Tuning, folded Residual and MPT, SMoP, folded
               Residual SMoP, ATTEMPT with its attention network, DePT with its input offset,
               deep prompts' per-layer prefixes) stacked
  capacity     SizedTable: a table padded to power-of-two room, so prompts that fit are added
               without recompiling
  prompt_loaders  prompts from modules, .npy files, run directories, PEFT adapters, libraries
  served_backbone  the served backbone and vocabulary: --model's, or the one the run
               directories recorded (run.json), refusing another backbone than recorded; the
               flags `infer` and `serve` share
  interpret    nearest vocabulary tokens of every prompt token (cosine similarity)
"""
