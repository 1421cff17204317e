"""The trainer (`python -m spot_jax.train`): prompt-only training of a frozen T5, one run or K.

  loop         train(): check config -> mesh -> backbone -> split -> runs -> state -> step -> loop
  checks       section 0: every setting checked before anything is written; the job's plan
  run_spec     K runs in one jitted step: RunSpec, SEEDS / TASKS, the stacked runs axis
  prompt_init  each run's initial prompt parameters, traced once per initialiser
  train_result what the trainer returns: TrainResult and each run's RunResult
  job          per-run bookkeeping: records, checkpoints, exports, evaluation, best states
  streams      each run's data stream as the step's global batches
  step         the pure jitted train step (gradients of the trainable tree only), and its vmap
  footprint    the step's arguments as shapes (`step_inputs`: nothing read or allocated) and
               its bytes and FLOPs per device, from XLA's analysis of its compile
  plan         the memory planner (`python -m spot_jax.plan`): fits, and the nearest that does
  state        TrainState: step, trainable params, optimizer state, rng, data position
  checkpointer orbax training states of a run directory (latest, best, damaged ones moved aside)
  evaluator    seqio evaluation on global batches (greedy decoding, postprocessors, metrics)
  eval_log     seqio's JSONLogger files, each example's input encoded once
  evaluate     evaluating a finished run directory (`python -m spot_jax.eval`)
  optimizers   optax factories with Prompt Tuning's defaults, learning-rate schedules
  progress     console progress lines and TensorBoard
"""
from spot_jax.train.checks import (TRAINABLE_ALL, TRAINABLE_PROMPT, CheckpointConfig,
                                   check_finite)
from spot_jax.train.train_result import RunResult, TrainResult
from spot_jax.train.loop import train
from spot_jax.train.run_spec import RunSpec
from spot_jax.train.state import TrainState
from spot_jax.train.step import DROPOUT_RNGS, dropout_key, make_runs_step, make_train_step

__all__ = ["TRAINABLE_ALL", "TRAINABLE_PROMPT", "CheckpointConfig", "RunResult", "RunSpec",
           "TrainResult", "TrainState", "check_finite", "train", "DROPOUT_RNGS", "dropout_key",
           "make_runs_step", "make_train_step"]
