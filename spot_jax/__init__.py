"""spot-jax: soft prompts for frozen T5 models in JAX/Flax (docs/architecture.md has the layers).

Sub-packages:
  backbones/   the frozen backbones, two kinds: `t5` (encoder-decoder) and `decoder` (Llama,
               Gemma 2/3: decoder-only); networks, checkpoints by format, decoding
  prompts/     every prompt method (Prompt Tuning, SMoP, Residual, deep prompts, DePT, ...)
  data/        seqio tasks -> deterministic, resumable training batches
  train/       the trainer (`python -m spot_jax.train`)
  experiment/  where experiments are run: batches of prompt runs as K-run trainer jobs
  serve/       mixed-prompt serving (`python -m spot_jax.infer`)
  spot/        the SPoT layer: prompt library, task embeddings, retrieval, the study
  demo/        `python -m spot_jax.demo` on the embedded toy T5
  embedded/    the shipped toy T5 and the program that made it
  cli/         the command-line runner, shared flags and gin command lines
  contrib/     integrations with other frameworks (t5x)

Modules:
  errors       ConfigError: one line naming what is wrong and what would be valid
  validate     checks of user settings (numbers, fractions, names, paths), each refused in one line
  quiet_logs   quiet start-up of TensorFlow and XLA for `python -m spot_jax.<prog>`
  fileio       atomic files and directories
  partitioning meshes and the logical-axis rule table
  orbax_io     reading orbax states with one-line causes
  vocabulary   TF-free vocabularies for serving
  losses       token cross-entropy with t5x's z-loss
  stats        intervals and paired verdicts over seeds
  verdicts     superiority, non-inferiority and equivalence verdicts over paired seeds
  power        seeds a table needs: power analysis over paired seeds
  runtime      process settings: host memory, compilation cache, XLA compiles
  paths        where a relative path given to a program points
  run_dir      the run directory and its run.json record
  models       a (prompted) T5 and its loss and inference
  backbone     the frozen backbone's identity (fingerprint) and loading
  convert      `python -m spot_jax.convert`: Hugging Face <-> T5X / orbax checkpoints
  eval         `python -m spot_jax.eval`: evaluate a finished run
  plan         `python -m spot_jax.plan`: the memory a run needs per device, and what would fit
  infer        `python -m spot_jax.infer`: serve soft prompts from the command line
  library      `python -m spot_jax.library`: the SPoT prompt library
  retrieve     `python -m spot_jax.retrieve`: pick source prompts for a target and train it
  study        `python -m spot_jax.study`: the SPoT transferability grid
  report       `python -m spot_jax.report`: a study's figures and tables
"""

from spot_jax import quiet_logs as _quiet_logs

__version__ = "0.1.0"

# `python -m spot_jax.<prog>`: TensorFlow's and XLA's start-up log lines stay off (see
# quiet_logs.py)
_quiet_logs.quiet_if_module_run()
