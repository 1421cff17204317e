"""The trainer (`python -m spot_jax.train`): prompt-only training of a frozen T5.

  loop         train(): check config -> mesh -> backbone -> split -> state -> restore -> step -> loop
  step         the pure jitted train step (gradients of the trainable tree only)
  state        TrainState: step, trainable params, optimizer state, rng, data position
  checkpointer orbax training states of a run directory (latest, best, damaged ones moved aside)
  evaluator    seqio evaluation (greedy decoding, postprocessors, metrics)
  optimizers   optax factories with Prompt Tuning's defaults, learning-rate schedules
  progress     console progress lines and TensorBoard
"""
from spot_jax.train.loop import (TRAINABLE_ALL, TRAINABLE_PROMPT, CheckpointConfig, TrainResult,
                                 check_finite, train)
from spot_jax.train.state import TrainState
from spot_jax.train.step import DROPOUT_RNGS, dropout_key, make_train_step

__all__ = ["TRAINABLE_ALL", "TRAINABLE_PROMPT", "CheckpointConfig", "TrainResult", "TrainState",
           "check_finite", "train", "DROPOUT_RNGS", "dropout_key", "make_train_step"]
