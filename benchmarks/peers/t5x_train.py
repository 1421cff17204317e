"""`python -m benchmarks.peers.t5x_train`: t5x's train step for prompt-tuning's model
and spot-jax's.

Run by `python -m benchmarks --vs=t5x` in its own process. `--models` picks what t5x trains:

  prompt_tuning  google-research/prompt-tuning's model from its own gin file
                 (`prompt_tuning/configs/models/t5_1_1_prompt.gin`: flaxformer T5.1.1 with
                 `prompt_layers.PromptEncoder`, an encoder-only prompt of `--prompt_length` tokens,
                 uniform(0.5) init, t5x `EncoderDecoderModel` with z-loss 1e-4, and the
                 `MultiOptimizer` giving the paper's Adafactor (decay 0.8, no parameter scaling,
                 weight decay 1e-5) to the prompt only)
  contrib        spot-jax's `PromptEncoderDecoderModel` built by gin/t5x/models/common.gin (what
                 `t5x.train` runs with gin/t5x/models/*_prompt_tuning.gin) with
                 gin/prompts/prompt_tuning_uniform.gin: spot-jax's T5 with Prompt Tuning, z-loss
                 1e-4, the same Adafactor through `optim.prompt_only`, backbone gradients stopped

both at the shape given here in float32 with the given dropout. The step is t5x's own for both:
`t5x.trainer.Trainer`'s partitioned `train_with_lr` (the model's `loss_fn` under
`jax.value_and_grad`, then `train_state.apply_gradient`), partitioned by t5x's `PjitPartitioner`
(one device) and compiled as `Trainer.compile_train` does, exactly what `t5x.train` runs.
Learning rate 0.3, constant. `--spot_jax_step` also builds spot-jax's own trainer step (`pt` of
`benchmarks`) in this process, and `--interleave` times rounds of one step of every model
(order reversed every other round) so that each row's paired ratio to the first model is immune
to the machine's drift. Prints one JSON object {"rows": [...]} on stdout.

t5x, flaxformer and prompt-tuning are not on PyPI: put their checkouts on PYTHONPATH.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Sequence

from spot_jax import runtime
from benchmarks import common
from benchmarks.peers import worker as bench_worker
from benchmarks.common import PYTHONPATH_HINT, SHAPE_KEYS
from spot_jax.errors import ConfigError

MODELS = {"prompt_tuning": "t5x + prompt-tuning", "contrib": "t5x + spot-jax contrib"}
SPOT_JAX = "spot-jax"


def import_t5x():
  """Imports t5x and prompt_tuning (aliasing `flax.optim` to `t5x.optimizers`, as prompt-tuning
  needs).

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


def contrib_config(shape: dict, dropout_rate: float):
  """spot-jax's T5.1.1 `T5Config` at `shape` (SHAPE_KEYS), float32 activations."""
  from spot_jax.backbones import t5  # pylint: disable=import-outside-toplevel
  return t5.config_by_name("t5_1_1_small", dtype="float32", dropout_rate=dropout_rate).replace(
      **{k: shape[k] for k in SHAPE_KEYS})


def build_contrib_model(config: Any, prompt_length: int, *bindings: str):
  """spot-jax's t5x model as gin/t5x/models/common.gin builds it, over `config` (a `T5Config`).

  The prompt is gin/prompts/prompt_tuning_uniform.gin's (`prompt_length` tokens, uniform(0.5));
  `bindings` are extra gin lines (e.g. "spot_t5x_models.PromptEncoderDecoderModel.freeze_backbone
  = False"). No vocabulary is read.
  """
  import gin  # pylint: disable=import-outside-toplevel
  from spot_jax import paths  # pylint: disable=import-outside-toplevel
  gin.clear_config(clear_constants=True)
  gin.add_config_file_search_path(str(paths.ROOT))
  fields = [f"t5.T5Config.{k} = {v!r}" for k, v in dataclasses.asdict(config).items()]
  gin.parse_config("\n".join([
      "from __gin__ import dynamic_registration", "from spot_jax.backbones import t5", 
      "from spot_jax.contrib.t5x import models as spot_t5x_models",
      "include 'gin/prompts/prompt_tuning_uniform.gin'", "include 'gin/t5x/models/common.gin'",
      "CONFIG_NAME = 't5_1_1_small'", f"PROMPT_LENGTH = {int(prompt_length)}", "VOCABULARY = None",
      "t5.Transformer.config = @t5.T5Config()", *fields, *bindings]))
  model = gin.query_parameter("%MODEL").scoped_configurable_fn()
  gin.clear_config(clear_constants=True)
  return model


def t5x_trainer(model: Any, batch: dict, logical_axis_rules: Sequence, seed: int = 0, **kwargs):
  """t5x's `Trainer` for `model` as `t5x.train` builds it: `PjitPartitioner` (one partition),
  a train state initialised from scratch by `TrainStateInitializer`, learning rate 0.3.

  `kwargs` go to `Trainer` (e.g. `weight_metrics_computer`, `num_microbatches`).
  """
  import jax  # pylint: disable=import-outside-toplevel
  from t5x import partitioning, trainer, utils  # pylint: disable=import-outside-toplevel
  partitioner = partitioning.PjitPartitioner(num_partitions=1,
                                             logical_axis_rules=logical_axis_rules)
  initializer = utils.TrainStateInitializer(
      optimizer_def=model.optimizer_def, init_fn=model.get_initial_variables,
      input_shapes={k: v.shape for k, v in batch.items()},
      input_types={k: v.dtype for k, v in batch.items()}, partitioner=partitioner)
  train_state = initializer.from_scratch(jax.random.PRNGKey(seed))
  jax.block_until_ready(train_state)
  kwargs.setdefault("num_microbatches", None)
  return trainer.Trainer(model, train_state, partitioner, eval_names=[], summary_dir=None,
                         train_state_axes=initializer.train_state_axes,
                         rng=jax.random.PRNGKey(seed + 1),
                         learning_rate_fn=lambda step: 0.3, **kwargs)


@dataclasses.dataclass
class _Run:
  """One model's compiled step, its live state, and what building it measured."""
  step: Callable[[], Any]  # runs one step to completion; returns its loss
  row: dict
  loss: float = float("nan")

  def time_step(self) -> float:
    t0 = time.perf_counter()
    self.loss = float(self.step())
    return time.perf_counter() - t0


def _prepare_t5x(name: str, shape: dict, batch_size: int, input_length: int, target_length: int,
                 prompt_length: int, dropout_rate: float, warmup: int, seed: int) -> _Run:
  """Builds `name`'s model under t5x's Trainer, compiles its step
  (timed) and runs 1 + `warmup` steps."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from t5x import partitioning  # pylint: disable=import-outside-toplevel
  if name == "prompt_tuning":
    from prompt_tuning.train import partitioning as pt_partitioning  # pylint: disable=import-outside-toplevel
    model = build_model(shape, prompt_length, dropout_rate)
    rules = partitioning.standard_logical_axis_rules(
        additional_rules=pt_partitioning.standard_logical_axis_rules())
  else:
    from spot_jax.contrib.t5x import partitioning as spot_t5x_partitioning  # pylint: disable=import-outside-toplevel
    model = build_contrib_model(contrib_config(shape, dropout_rate), prompt_length)
    rules = spot_t5x_partitioning.logical_axis_rules()
  batch = {k: jax.numpy.asarray(v) for k, v in common.numpy_batch(
      shape["vocab_size"], batch_size, input_length, target_length, seed).items()}
  batch["decoder_loss_weights"] = jax.numpy.ones_like(batch["decoder_target_tokens"], np.float32)
  tr = t5x_trainer(model, batch, rules, seed)

  # What `Trainer.compile_train` does (`partitioner.compile` = lower + compile), split in phases.
  t0 = time.perf_counter()
  lowered = tr._partitioned_train_step.lower(tr.train_state, batch)  # pylint: disable=protected-access
  lower_s = time.perf_counter() - t0
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  live = {"state": tr.train_state}
  flat = jax.tree_util.tree_flatten_with_path(live["state"].params)[0]
  total = sum(int(np.prod(v.shape)) for _, v in flat)
  trainable = sum(int(np.prod(v.shape)) for p, v in flat if "prompt" in jax.tree_util.keystr(p))

  def step():
    live["state"], metrics = compiled(live["state"], batch)
    return metrics["loss"].compute()  # clu Sum metric (z-loss included, as t5x reports)

  jax.block_until_ready(step())
  first_step_s = time.perf_counter() - t0
  for _ in range(warmup):
    step()
  import t5x  # pylint: disable=import-outside-toplevel
  return _Run(step, {
      "framework": MODELS[name], "model": name, "shape": shape, "batch_size": batch_size,
      "input_length": input_length, "target_length": target_length, "prompt_length": prompt_length,
      "dropout_rate": dropout_rate, "prng_impl": str(jax.config.jax_default_prng_impl),
      "lower_sec": lower_s, "compile_sec": compile_s, "compile_plus_first_step_sec": first_step_s,
      "flops_per_step": common.xla_flops(compiled),
      "hlo_ops": common.hlo_op_counts(lowered, compiled),
      "trainable_params": trainable, "frozen_params": total - trainable, "jax": jax.__version__,
      "t5x_path": os.path.dirname(t5x.__file__)})


def _prepare_spot_jax(shape: dict, batch_size: int, input_length: int, target_length: int,
                      prompt_length: int, dropout_rate: float, warmup: int, seed: int,
                      dropout_rng: str) -> _Run:
  """spot-jax's own trainer step (`benchmarks`'s prompt_tuning row) built in this process."""
  import jax  # pylint: disable=import-outside-toplevel
  from benchmarks import train_step  # pylint: disable=import-outside-toplevel
  run = train_step.prepare_run(
      "prompt_tuning", "t5_1_1_small", batch_size, input_length, target_length, prompt_length,
      dropout_rate=dropout_rate, warmup=warmup, seed=seed, dropout_rng=dropout_rng,
      config_overrides={k: shape[k] for k in SHAPE_KEYS})

  def step():
    run.time_step()
    return run.metrics["loss"]

  row = {k: run.row[k] for k in ("batch_size", "input_length", "target_length", "prompt_length",
                                  "dropout_rate", "lower_sec", "compile_sec",
                                  "compile_plus_first_step_sec", "flops_per_step", "hlo_ops",
                                  "trainable_params", "frozen_params")}
  row.update(framework=SPOT_JAX, model=SPOT_JAX, shape=shape, jax=jax.__version__,
             dropout_rng=dropout_rng)
  return _Run(step, row)


def _finish(run: _Run, times: Sequence[float]) -> dict:
  row = dict(run.row)
  median = statistics.median(times)
  row.update({"steps": len(times), "step_sec_all": [float(t) for t in times],
              "step_sec_median": median, "step_sec_min": min(times), "step_sec_max": max(times),
              "examples_per_sec": row["batch_size"] / median, "final_loss": run.loss,
              "load_average_1min": os.getloadavg()[0],
              "peak_host_memory_bytes": bench_worker.peak_host_memory_bytes(),
              "malloc": runtime.applied()})
  return row


def bench_t5x(shape: dict, batch_size: int, input_length: int, target_length: int,
              prompt_length: int, dropout_rate: float, steps: int, warmup: int, seed: int = 0,
              compilation_cache_dir: str = "", use_hardware_rng: bool = False,
              models: Sequence[str] = ("prompt_tuning",), spot_jax_step: bool = False,
              interleave: bool = False) -> list[dict]:
  """Compiles and times t5x's train step of each of `models` (and spot-jax's own); one row each.

  `use_hardware_rng` does what `t5x.train`'s USE_HARDWARE_RNG does (`utils.set_hardware_rng_ops`:
  every key of the run, dropout included, becomes an "unsafe_rbg" key); spot-jax's counterpart
  is DROPOUT_RNG="unsafe_rbg". Sequentially, each model is built and timed in turn; with
  `interleave` every step is built first, then `steps` rounds time one step of each, and every
  row gets `paired_step_ratio`: the median over rounds of its step time over the first row's.
  """
  import_t5x()
  from t5x import utils  # pylint: disable=import-outside-toplevel
  from benchmarks import train_step  # pylint: disable=import-outside-toplevel
  if use_hardware_rng:
    utils.set_hardware_rng_ops()
  runtime.enable_compilation_cache(compilation_cache_dir)
  sizes = (shape, batch_size, input_length, target_length, prompt_length, dropout_rate,
           warmup, seed)
  builders = ([lambda: _prepare_spot_jax(*sizes, "unsafe_rbg" if use_hardware_rng else "threefry")]
              if spot_jax_step else [])
  builders += [lambda name=name: _prepare_t5x(name, *sizes) for name in models]
  rows = []
  for group in [builders] if interleave else [[b] for b in builders]:
    runs = [build() for build in group]
    times = [[] for _ in runs]
    for r in range(steps):
      for i in train_step.round_order(len(runs), r):
        times[i].append(runs[i].time_step())
    rows += [dict(_finish(run, t), timing="interleaved" if interleave else "sequential",
                  use_hardware_rng=use_hardware_rng) for run, t in zip(runs, times)]
  if interleave:
    first = rows[0]["step_sec_all"]
    for row in rows:
      row["paired_with"] = rows[0]["framework"]
      row["paired_step_ratio"] = statistics.median(t / f
                                                   for t, f in zip(row["step_sec_all"], first))
  return rows


def main(argv: Sequence[str]) -> int:
  parser = bench_worker.parser("benchmarks.peers.t5x_train", __doc__.splitlines()[0],
                               "JSON of " + ", ".join(SHAPE_KEYS))
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--compilation_cache_dir", default="")
  parser.add_argument("--use_hardware_rng", action="store_true",
                      help="t5x's USE_HARDWARE_RNG: unsafe_rbg keys for the whole run")
  parser.add_argument("--models", default="prompt_tuning",
                      help=f"comma-separated t5x models to time, from: {', '.join(MODELS)}")
  parser.add_argument("--spot_jax_step", action="store_true",
                      help="also time spot-jax's own trainer step in this process (first row)")
  parser.add_argument("--interleave", action="store_true",
                      help="build every step first, then time rounds of one step of each")
  args, shape = bench_worker.parse(parser, argv, "benchmarks.peers.t5x_train.t5x_shape")
  missing = [k for k in SHAPE_KEYS if k not in shape]
  if missing:
    raise ConfigError(f"--shape lacks {', '.join(missing)}; give the output of "
                      "benchmarks.peers.t5x_train.t5x_shape")
  models = [m for m in args.models.split(",") if m]
  unknown = [m for m in models if m not in MODELS]
  if unknown or not models:
    raise ConfigError(f"--models={args.models!r}: unknown or no model; valid: {', '.join(MODELS)}")
  rows = bench_t5x(shape, args.batch_size, args.input_length, args.target_length,
                   args.prompt_length, args.dropout_rate, args.steps, args.warmup, args.seed,
                   args.compilation_cache_dir, args.use_hardware_rng, models, args.spot_jax_step,
                   args.interleave)
  print(json.dumps({"rows": rows}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(bench_worker.run(main, "benchmarks.peers.t5x_train"))
