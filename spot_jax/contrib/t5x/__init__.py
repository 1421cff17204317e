"""spot-jax's prompt methods inside t5x (`python -m t5x.train`): the only package importing t5x.

  models.PromptEncoderDecoderModel   t5x's EncoderDecoderModel over spot-jax's `Transformer`
                                     with a `prompt=` module (Prompt Tuning, SMoP, Residual);
                                     gradients stop at the frozen backbone
  partitioning.logical_axis_rules    t5x's standard rules plus the prompt axes
  optim.prompt_only                  a t5x MultiOptimizer updating only `prompt/` parameters
  state_fns.strict_prompt_restore    restore of an official T5X checkpoint: prompt fresh, any
                                     other missing parameter is an error naming it
  state_fns.PromptExporter           .npy (+ .npz of the raw parameters) at every checkpoint
  checkpointer.PromptCheckpointer    checkpoints of the prompt side only; a restart re-reads the
                                     backbone from INITIAL_CHECKPOINT_PATH

gin files: gin/t5x/models/<size>_<method>.gin and gin/t5x/runs/prompt_tune.gin (docs/t5x.md).
t5x is not on PyPI: install it from its repository (README, docs/t5x.md).
"""
