"""`python -m spot_jax.contrib.t5x.bench`: the t5x + google-research/prompt-tuning counterpart of `spot_jax.bench`.

Run by `python -m spot_jax.bench --vs=t5x` in its own process. It builds prompt-tuning's own
model from prompt-tuning's gin files (`prompt_tuning/configs/models/t5_1_1_prompt.gin`: the
flaxformer T5.1.1 architecture with `prompt_layers.PromptEncoder`, an encoder-only prompt of
`--prompt_length` tokens, uniform(0.5) prompt init, t5x `EncoderDecoderModel` with z-loss 1e-4,
and the `MultiOptimizer` that applies the paper's Adafactor (decay 0.8, no parameter scaling,
weight decay 1e-5) to the prompt only), with the shape, dropout and float32 activations given
here. The train step is t5x's own: `t5x.trainer.Trainer`'s partitioned `train_with_lr` (the
model's `loss_fn` under `jax.value_and_grad`, then `train_state.apply_gradient`), partitioned by
t5x's `PjitPartitioner` (one device) and compiled by `partitioner.compile`, exactly what
`t5x.train` runs. Learning rate 0.3, constant. Prints one JSON row on stdout.

t5x, flaxformer and prompt-tuning are not on PyPI: put their checkouts on PYTHONPATH.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Sequence

from spot_jax.bench import worker as bench_worker
from spot_jax import runtime
from spot_jax.bench.common import PYTHONPATH_HINT, SHAPE_KEYS
from spot_jax.errors import ConfigError

def import_t5x():
  """Imports t5x and prompt_tuning (aliasing `flax.optim` to `t5x.optimizers`, as prompt-tuning needs).

  Raises:
    ConfigError: naming what to put on PYTHONPATH when either cannot be imported.
  """
  try:
    import flax  # pylint: disable=import-outside-toplevel
    import t5x.optimizers  # pylint: disable=import-outside-toplevel
    # prompt_tuning.train.utils does `from flax import optim`, which flax removed; t5x carries it.
    sys.modules.setdefault("flax.optim", t5x.optimizers)
    flax.optim = t5x.optimizers
    import t5x.trainer  # pylint: disable=import-outside-toplevel,unused-import
    import prompt_tuning.train.layers  # pylint: disable=import-outside-toplevel,unused-import
    import prompt_tuning.train.utils  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    raise ConfigError(f"t5x + prompt-tuning are not importable ({e}); {PYTHONPATH_HINT}") from None


def build_model(shape: dict, prompt_length: int, dropout_rate: float):
  """prompt-tuning's T5.1.1 prompt model from its own gin files, at `shape` in float32."""
  import gin  # pylint: disable=import-outside-toplevel
  import prompt_tuning  # pylint: disable=import-outside-toplevel
  gin.clear_config()
  gin.add_config_file_search_path(os.path.dirname(os.path.dirname(prompt_tuning.__file__)))
  bindings = [
      f"NUM_HEADS = {shape['num_heads']}", f"HEAD_DIM = {shape['head_dim']}",
      f"EMBED_DIM = {shape['emb_dim']}", f"MLP_DIM = {shape['mlp_dim']}",
      f"NUM_ENCODER_LAYERS = {shape['num_encoder_layers']}",
      f"NUM_DECODER_LAYERS = {shape['num_decoder_layers']}",
      f"NUM_EMBEDDINGS = {shape['vocab_size']}", f"PROMPT_LENGTH = {prompt_length}",
      f"DROPOUT_RATE = {float(dropout_rate)}", "ACTIVATION_DTYPE = 'float32'",
      # No vocabulary file is read by a train step; a pass-through one of the same size avoids gs://.
      "VOCABULARY = @seqio.PassThroughVocabulary()",
      f"seqio.PassThroughVocabulary.size = {shape['vocab_size']}",
      f"relative_position_biases.RelativePositionBiases.num_buckets = "
      f"{shape['relative_attention_num_buckets']}",
      f"relative_position_biases.RelativePositionBiases.max_distance = "
      f"{shape['relative_attention_max_distance']}",
  ]
  gin.parse_config("\n".join([
      "from __gin__ import dynamic_registration", "import seqio",
      "from flaxformer.components import relative_position_biases",
      "include 'prompt_tuning/configs/models/t5_1_1_prompt.gin'", *bindings]))
  return gin.query_parameter("%MODEL").scoped_configurable_fn()


def bench_t5x(shape: dict, batch_size: int, input_length: int, target_length: int, prompt_length: int,
              dropout_rate: float, steps: int, warmup: int, seed: int = 0,
              compilation_cache_dir: str = "", use_hardware_rng: bool = False) -> dict:
  """Compiles and times t5x's prompt-tuning train step; returns one result row.

  `use_hardware_rng` does what `t5x.train`'s USE_HARDWARE_RNG does (`utils.set_hardware_rng_ops`:
  every key of the run, dropout included, becomes an "unsafe_rbg" key); spot-jax's counterpart
  is DROPOUT_RNG="unsafe_rbg".
  """
  import_t5x()
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from t5x import partitioning, trainer, utils  # pylint: disable=import-outside-toplevel
  if use_hardware_rng:
    utils.set_hardware_rng_ops()
  from prompt_tuning.train import partitioning as pt_partitioning  # pylint: disable=import-outside-toplevel
  from spot_jax.bench import common  # pylint: disable=import-outside-toplevel
  runtime.enable_compilation_cache(compilation_cache_dir)

  model = build_model(shape, prompt_length, dropout_rate)
  batch = {k: jax.numpy.asarray(v) for k, v in common.numpy_batch(
      shape["vocab_size"], batch_size, input_length, target_length, seed).items()}
  batch["decoder_loss_weights"] = jax.numpy.ones_like(batch["decoder_target_tokens"], np.float32)
  partitioner = partitioning.PjitPartitioner(
      num_partitions=1, logical_axis_rules=partitioning.standard_logical_axis_rules(
          additional_rules=pt_partitioning.standard_logical_axis_rules()))
  initializer = utils.TrainStateInitializer(
      optimizer_def=model.optimizer_def, init_fn=model.get_initial_variables,
      input_shapes={k: v.shape for k, v in batch.items()},
      input_types={k: v.dtype for k, v in batch.items()}, partitioner=partitioner)
  train_state = initializer.from_scratch(jax.random.PRNGKey(seed))
  jax.block_until_ready(train_state)
  tr = trainer.Trainer(model, train_state, partitioner, eval_names=[], summary_dir=None,
                       train_state_axes=initializer.train_state_axes, rng=jax.random.PRNGKey(seed + 1),
                       learning_rate_fn=lambda step: 0.3, num_microbatches=None)

  # What `Trainer.compile_train` does (`partitioner.compile` = lower + compile), split in phases.
  t0 = time.perf_counter()
  lowered = tr._partitioned_train_step.lower(tr.train_state, batch)  # pylint: disable=protected-access
  lower_s = time.perf_counter() - t0
  step = lowered.compile()
  compile_s = time.perf_counter() - t0
  state, metrics = step(tr.train_state, batch)
  jax.block_until_ready(metrics)
  first_step_s = time.perf_counter() - t0
  loss = lambda m: float(m["loss"].compute())  # clu Sum metric (z-loss included, as t5x reports)
  for _ in range(warmup):
    state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t0)
  median = statistics.median(times)
  params = state.params
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  trainable = sum(int(np.prod(v.shape)) for p, v in flat if "prompt" in jax.tree_util.keystr(p))
  import t5x  # pylint: disable=import-outside-toplevel
  return {"framework": "t5x+prompt-tuning", "shape": shape, "batch_size": batch_size,
          "input_length": input_length, "target_length": target_length,
          "prompt_length": prompt_length, "dropout_rate": dropout_rate, "steps": steps,
          "use_hardware_rng": use_hardware_rng, "prng_impl": str(jax.config.jax_default_prng_impl),
          "step_sec_median": median, "step_sec_min": min(times), "step_sec_max": max(times),
          "examples_per_sec": batch_size / median,
          "lower_sec": lower_s, "compile_sec": compile_s, "compile_plus_first_step_sec": first_step_s,
          "flops_per_step": common.xla_flops(step), "hlo_ops": common.hlo_op_counts(lowered, step),
          "trainable_params": trainable,
          "frozen_params": sum(int(np.prod(v.shape)) for _, v in flat) - trainable,
          "final_loss": loss(metrics), "jax": jax.__version__, "t5x_path": os.path.dirname(t5x.__file__),
          "load_average_1min": os.getloadavg()[0],
          "peak_host_memory_bytes": bench_worker.peak_host_memory_bytes(), "malloc": runtime.applied()}


def main(argv: Sequence[str]) -> int:
  parser = bench_worker.parser("spot_jax.contrib.t5x.bench", __doc__.splitlines()[0],
                               "JSON of " + ", ".join(SHAPE_KEYS))
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--compilation_cache_dir", default="")
  parser.add_argument("--use_hardware_rng", action="store_true",
                      help="t5x's USE_HARDWARE_RNG: unsafe_rbg keys for the whole run")
  args, shape = bench_worker.parse(parser, argv, "spot_jax.contrib.t5x.bench.t5x_shape")
  missing = [k for k in SHAPE_KEYS if k not in shape]
  if missing:
    raise ConfigError(f"--shape lacks {', '.join(missing)}; give the output of spot_jax.contrib.t5x.bench.t5x_shape")
  row = bench_t5x(shape, args.batch_size, args.input_length, args.target_length, args.prompt_length,
                  args.dropout_rate, args.steps, args.warmup, args.seed, args.compilation_cache_dir,
                  args.use_hardware_rng)
  print(json.dumps(row), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(bench_worker.run(main, "spot_jax.contrib.t5x.bench"))
