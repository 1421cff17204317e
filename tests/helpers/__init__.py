"""Helpers the tests share (no tests here), and REPO, the repository's folder.

  bang_token         A Llama-3-style tokenizer with "!" at id 0, a tiny random Llama over it, and
                     transformers' log-probabilities and greedy tokens to compare with.
  bench_tiny         `benchmarks` at its tiny shape, in this process.
  bucketing          The per-example loss of a prompt method on fixed-length and on length-bucketed
                     batches.
  bucketing_task     The skewed-length task and dataset settings of the bucketing tests.
  cli_error_runner   Runs command-line cases in one Python process, each exactly as `python -m
                     <module> <args>` would.
  cli_errors         The environment and log filters of the command-line tests.
  glue_data          Hand-made GLUE and SuperGLUE examples and their expected strings and metrics.
  hlo                The copies and transposes of an array of a given size in optimized HLO text.
  k_runs             The K-run trainer tests' jobs (tests/train/test_runs.py): a byte-tiny T5
                     (dropout 0.1), a local TSV task, 8 steps.
  kill               SIGKILL of a training subprocess at a chosen moment, for the exact-resume
                     tests.
  local_tasks        A seqio task built in tests from local TSV files (byte vocabulary: nothing to
                     download).
  mesh_train_script  Runs 5 training steps on meshes given on the command line and prints JSON
                     results.
  peft_models        What the PEFT interop tests share: a fixed padded batch and a random T5 on both
                     sides.
  prompt_train       A compact prompt-only training loop for the prompt-method tests (not the real
                     trainer).
  residual           Residual Prompt Tuning's NumPy reference.
  serve              What the mixed-batch serving tests share: a table of prompts and a batch of
                     padded rows.
  serve_http         What the HTTP serving tests share: toy prompts of five methods, and the real
                     server in a subprocess on 127.0.0.1 (a free port the server picks and prints).
  spot_tasks         Tiny local seqio tasks for the SPoT-layer tests (byte vocabulary, nothing to
                     download).
  task_checks        The shared check of one registered task against hand-made examples in T5's
                     format.
  train_cli          Running `python -m spot_jax.train` as a user does.
"""
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
