"""`python -m spot_jax.bench`: train-step speed and state size of each method on a random T5.

  python -m spot_jax.bench --config=t5_1_1_small --batch_size=8 --input_length=128 \
      --target_length=8 --steps=20 --methods=prompt_tuning,smop,residual,model_tuning

For each method it times the jitted train step (after one compile step) on random tokens and
reports steps/s, examples/s, trainable parameters and the bytes of trainable state (params +
optimizer state); `--json=FILE` writes the rows. Benchmark in float32 on CPUs without bf16
hardware. Targets for speed and memory live here, never in timed tests.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import cli, models, optimizers, prompts, trainer
from spot_jax.errors import ConfigError
from spot_jax.t5 import Transformer, config_by_name
from spot_jax.train_state import TrainState

METHODS = ("prompt_tuning", "smop", "residual", "model_tuning")


def _prompt_module(method: str, length: int):
  if method == "prompt_tuning":
    return prompts.PromptTuning(length=length)
  if method == "smop":
    return prompts.SMoP(num_prompts=4, length=max(1, length // 4))
  if method == "residual":
    return prompts.ResidualPrompt(length=length, bottleneck=128)
  if method == "model_tuning":
    return None
  raise ConfigError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")


def _nbytes(tree) -> int:
  return int(sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def bench_method(method: str, config_name: str, batch_size: int, input_length: int,
                 target_length: int, steps: int, prompt_length: int, seed: int = 0) -> dict:
  """Times `steps` train steps of `method`; returns one result row."""
  config = config_by_name(config_name, dropout_rate=0.1)
  model = models.EncoderDecoderModel(Transformer(config, prompt=_prompt_module(method, prompt_length)))
  dummy = model.dummy_batch(input_length, target_length)
  backbone_rng, prompt_rng, state_rng = trainer.seed_keys(seed)
  backbone = jax.jit(lambda r: models.unbox(model.init_backbone(r, dummy)))(backbone_rng)
  prompt_params = (jax.jit(lambda r, f: models.unbox(model.init_prompt(r, f, dummy)))(prompt_rng, backbone)
                   if model.has_prompt else {})
  if method == "model_tuning":
    frozen, params = {}, backbone
    tx = optimizers.adafactor(learning_rate=1e-3, factored=True, multiply_by_parameter_scale=True,
                              weight_decay_rate=None)
  else:
    frozen, params = backbone, prompt_params
    tx = optimizers.adafactor()
  state = TrainState.create(params, tx, state_rng)
  step = jax.jit(trainer.make_train_step(model, tx), donate_argnums=(0,))
  rng = np.random.RandomState(seed)
  targets = rng.randint(2, config.vocab_size, size=(batch_size, target_length)).astype(np.int32)
  batch = {
      "encoder_input_tokens": jnp.asarray(rng.randint(2, config.vocab_size, size=(batch_size, input_length)), jnp.int32),
      "decoder_target_tokens": jnp.asarray(targets),
      "decoder_input_tokens": jnp.asarray(np.concatenate([np.zeros((batch_size, 1), np.int32), targets[:, :-1]], 1)),
  }
  t0 = time.perf_counter()
  state, metrics = step(state, frozen, batch)
  jax.block_until_ready(metrics["loss"])
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(steps):
    state, metrics = step(state, frozen, batch)
  jax.block_until_ready(metrics["loss"])
  elapsed = time.perf_counter() - t0
  return {
      "method": method, "config": config_name, "batch_size": batch_size,
      "input_length": input_length, "target_length": target_length,
      "steps_per_sec": steps / elapsed, "examples_per_sec": steps * batch_size / elapsed,
      "first_step_sec": compile_s,
      "trainable_params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(state.params))),
      "trainable_state_bytes": _nbytes(state.params) + _nbytes(state.opt_state),
      "frozen_params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(frozen))),
      "final_loss": float(metrics["loss"]),
  }


def main(argv: Sequence[str]) -> int:
  """Command-line entry point (run it through `cli.run`, which reports errors in one line)."""
  parser = cli.ArgumentParser(prog="spot_jax.bench", description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="t5_1_1_small", help="a spot_jax.t5 config name")
  parser.add_argument("--methods", default=",".join(METHODS))
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--input_length", type=int, default=128)
  parser.add_argument("--target_length", type=int, default=8)
  parser.add_argument("--prompt_length", type=int, default=20)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--json", default=None, help="write the result rows to this file")
  parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
  args = parser.parse_args(argv)
  methods = [m for m in args.methods.split(",") if m]
  config_by_name(args.config)
  if not methods:
    raise ConfigError(f"--methods is empty; valid: a comma-separated subset of {', '.join(METHODS)}")
  for m in methods:
    if m not in METHODS:
      raise ConfigError(f"unknown method {m!r}; valid: {', '.join(METHODS)}")
  if min(args.batch_size, args.input_length, args.target_length, args.steps, args.prompt_length) <= 0:
    raise ConfigError("batch_size, input_length, target_length, prompt_length and steps must be positive")
  if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
    raise ConfigError(f"--json={args.json}: its directory does not exist; give a file in an existing directory")
  rows = []
  print(f"{'method':<14} {'steps/s':>9} {'ex/s':>9} {'trainable':>12} {'state MiB':>10} {'1st step s':>10}")
  for method in methods:
    row = bench_method(method, args.config, args.batch_size, args.input_length, args.target_length,
                       args.steps, args.prompt_length)
    rows.append(row)
    print(f"{method:<14} {row['steps_per_sec']:>9.2f} {row['examples_per_sec']:>9.1f} "
          f"{row['trainable_params']:>12,} {row['trainable_state_bytes'] / 2**20:>10.2f} "
          f"{row['first_step_sec']:>10.1f}", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"devices": [str(d) for d in jax.devices()], "rows": rows}, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "spot_jax.bench"))
