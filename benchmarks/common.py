"""What the benchmarks share: the method table, shapes, batches, FLOP counts and the matmul peak.

Public, so every bench (the train step, lengths, serving, the PEFT and t5x peers) uses the
same definitions: `METHODS` (name -> prompt method and length), `bench_config` (a named T5Config
with overrides), `numpy_batch` / `device_batch` (the random batch every peer gets),
`xla_flops` / `hlo_op_counts` (from a compiled step) and `MatmulPeak` / `mfu` (the MFU's
denominator, sampled through a run, and MFUs above 100% flagged). `t5x_shape` is the shape the t5x
peer process takes; nothing here imports t5x. `output_files` / `write_outputs`: every bench's
`--json` and `--markdown`, checked before any work and written atomically at the end.
"""
from __future__ import annotations

import functools
import json
import pathlib
import time
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import fileio, prompts, validate
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import config_by_name

# name -> (prompt method, prompt length); length None means --prompt_length.
METHODS = {
    "pt100": ("prompt_tuning", 100), "pt20": ("prompt_tuning", 20), "smop4x5": ("smop", 20),
    "residual100": ("residual", 100), "residual10": ("residual", 10),
    "model_tuning": ("model_tuning", 0),
    "prompt_tuning": ("prompt_tuning", None), "smop": ("smop", None),
    "residual": ("residual", None),
    # deep prompts: prefixes in every layer (prefix tuning: encoder, decoder and cross-attention;
    # "_mlp" with PEFT's projection MLP of width 512; P-tuning v2: encoder prompt tokens)
    "prefix10": ("prefix_tuning", 10), "prefix_mlp10": ("prefix_projection", 10),
    "ptuning_v2_20": ("ptuning_v2", 20),
    "prefix_tuning": ("prefix_tuning", None), "ptuning_v2": ("ptuning_v2", None),
    # DePT at PT-100's budget on T5-Base (m = 60, r = 30, s = the input length); Residual SMoP 4x5
    "dept60": ("dept", 60), "residual_smop4x5": ("residual_smop", 20),
    "dept": ("dept", None), "residual_smop": ("residual_smop", None),
    # ATTEMPT: 6 random "library" sources of 100 tokens, attention width 100 (the paper's T5-Base
    # setting); MPT: a target P* o (u v^T) and the source's prompt distillation over 2 tasks.
    "attempt100": ("attempt", 100), "mpt100": ("mpt", 100), "mpt_distill100": ("mpt_distill", 100),
    "attempt": ("attempt", None), "mpt": ("mpt", None), "mpt_distill": ("mpt_distill", None),
}
ATTEMPT_SOURCES = 6
MPT_DISTILL_TASKS = 2
DEFAULT_METHODS = ("pt100", "pt20", "smop4x5", "residual100", "residual10", "model_tuning")
# --vs=t5x pairs each DROPOUT_RNG with t5x's setting that draws dropout masks the same way.
T5X_DROPOUT_RNGS = {"threefry": "t5x's default", "unsafe_rbg": "t5x's USE_HARDWARE_RNG"}


def prompt_module(kind: str, length: int, emb_dim: Optional[int] = None,
                  input_length: int = 512):
  """The prompt module of a METHODS kind (ATTEMPT's random sources need the width `emb_dim`;
  DePT's offset covers `input_length` positions)."""
  if kind == "prompt_tuning":
    return prompts.PromptTuning(length=length)
  if kind == "smop":
    return prompts.SMoP(num_prompts=4, length=max(1, length // 4))
  if kind == "residual":
    return prompts.ResidualPrompt(length=length, bottleneck=128)
  if kind in ("prefix_tuning", "prefix_projection"):
    return prompts.PrefixTuning(length=length, projection=kind == "prefix_projection",
                                projection_dim=512)
  if kind == "ptuning_v2":
    return prompts.PTuningV2(length=length)
  if kind == "dept":
    return prompts.DePT(length=length, max_length=input_length, rank=30)
  if kind == "residual_smop":
    return prompts.ResidualSMoP(num_prompts=4, length=max(1, length // 4), bottleneck=128)
  if kind == "attempt":
    sources = np.random.RandomState(0).normal(0, 1, (ATTEMPT_SOURCES, length, emb_dim))
    return prompts.Attempt(sources, bottleneck=100)
  if kind in ("mpt", "mpt_distill"):
    return prompts.MultitaskPrompt(length, num_tasks=1 if kind == "mpt" else MPT_DISTILL_TASKS)
  return None


def bench_model(kind: str, length: int, config, input_length: int = 512):
  """The model a METHODS kind trains: an EncoderDecoderModel, or MPT's distillation model."""
  from spot_jax import models  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.t5 import Transformer  # pylint: disable=g-import-not-at-top
  module = Transformer(config, prompt=prompt_module(kind, length, config.emb_dim, input_length))
  if kind != "mpt_distill":
    return models.EncoderDecoderModel(module)
  from spot_jax.spot import distill  # pylint: disable=g-import-not-at-top
  teachers = np.random.RandomState(1).normal(0, 1, (MPT_DISTILL_TASKS, length, config.emb_dim))
  return distill.PromptDistillationModel(module, teacher_prompts=teachers)


def with_task_index(kind: str, batch: dict) -> dict:
  """The batch plus a task_index feature (alternating tasks) when `kind` reads one."""
  if kind != "mpt_distill":
    return batch
  rows = batch["encoder_input_tokens"].shape[0]
  return dict(batch, task_index=jnp.arange(rows, dtype=jnp.int32) % MPT_DISTILL_TASKS)


# T5Config fields settable from the command line (--num_layers sets both stacks).
SHAPE_FIELDS = ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim", "num_encoder_layers",
                "num_decoder_layers", "relative_attention_num_buckets",
                "relative_attention_max_distance")
OVERRIDE_FLAGS = ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim", "num_layers")


def bench_config(name: str, overrides: Optional[dict] = None, dropout_rate: Optional[float] = None):
  """The named `T5Config` with `overrides` ({field: value}; "num_layers" sets both stacks)."""
  changes = dict(overrides or {})
  if "num_layers" in changes:
    layers = changes.pop("num_layers")
    changes.update(num_encoder_layers=layers, num_decoder_layers=layers)
  return config_by_name(name, dropout_rate=dropout_rate).replace(**changes)


def nbytes(tree) -> int:
  return int(sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def xla_flops(compiled) -> Optional[float]:
  """FLOPs of one call of a compiled computation from XLA's cost analysis (None if unknown)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  flops = (cost or {}).get("flops")
  return float(flops) if flops else None


def matmul_peak_flops(n: int = 1024, reps: int = 10) -> float:
  """float32 FLOP/s of a jitted [n, n] x [n, n] matmul (best of `reps`): the MFU denominator."""
  return MatmulPeak(n).sample(reps)


class MatmulPeak:
  """The float32 matmul peak, sampled through a run: an MFU's denominator is the maximum so far.

  One measurement at the start is not enough on a machine whose speed drifts (a shared one):
  the steps that follow can run faster than the peak did and show an MFU above 100%. A bench
  samples the peak again after every timed step (`sample`, a few matmuls: ~20 ms at T5-small
  shapes) and divides by `max`; a ratio above 1 is then flagged (`mfu`), never reported.

  Attributes:
    samples: FLOP/s of every sample, in order.
  """

  def __init__(self, n: int = 1024):
    self._n = n
    self._a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    self._f = jax.jit(lambda x: x @ x)
    jax.block_until_ready(self._f(self._a))
    self.samples: list[float] = []

  def sample(self, reps: int = 3) -> float:
    """Best FLOP/s of `reps` matmuls; recorded in `samples` and returned."""
    best = min(timed(lambda: self._f(self._a), reps))
    self.samples.append(2.0 * self._n ** 3 / best)
    return self.samples[-1]

  @property
  def max(self) -> float:
    return max(self.samples)


MFU_LIMIT = 1.0
# The K-runs goal (benchmarks.runs and benchmarks.jobs): K = 5 toy runs in at most 2x the wall
# time of one run.
GOAL_RUNS, GOAL_RATIO = 5, 2.0


def mfu(flops: Optional[float], seconds: float, peak: Optional[float]) -> dict:
  """{"mfu": FLOPs / s / peak, or None when unknown or above 100% (then "mfu_flagged" holds it)}.

  An MFU above 100% means the peak was measured while the machine ran slower than during the
  step: a measurement error, so it is flagged instead of reported.
  """
  if not flops or not peak:
    return {"mfu": None}
  value = flops / seconds / peak
  return {"mfu": value} if value <= MFU_LIMIT else {"mfu": None, "mfu_flagged": value}


def numpy_batch(vocab: int, batch_size: int, input_length: int, target_length: int,
                seed: int) -> dict[str, np.ndarray]:
  """The benchmark's random batch (no padding), shared with the t5x counterpart process."""
  rng = np.random.RandomState(seed)
  targets = rng.randint(2, vocab, size=(batch_size, target_length)).astype(np.int32)
  return {
      "encoder_input_tokens": rng.randint(2, vocab,
                                          size=(batch_size, input_length)).astype(np.int32),
      "decoder_target_tokens": targets,
      "decoder_input_tokens": np.concatenate([np.zeros((batch_size, 1), np.int32),
                                              targets[:, :-1]], 1),
  }


def device_batch(vocab: int, batch_size: int, input_length: int, target_length: int, seed: int):
  return {k: jnp.asarray(v) for k, v in numpy_batch(vocab, batch_size, input_length, target_length,
                                                    seed).items()}


def hlo_op_counts(lowered, compiled) -> dict[str, int]:
  """Instruction counts of a step: the lowered StableHLO module and XLA's optimized HLO module."""
  def count(text: str) -> int:
    return sum(1 for line in text.splitlines() if " = " in line)
  return {"stablehlo": count(lowered.as_text()), "optimized_hlo": count(compiled.as_text())}


def timed(fn, n: int) -> list[float]:
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return times



PYTHONPATH_HINT = ("put checkouts of google-research/t5x, flaxformer and prompt-tuning (plus t5x's "
                   "airio and jestimator) on PYTHONPATH")
SHAPE_KEYS = ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim", "num_encoder_layers",
              "num_decoder_layers", "relative_attention_num_buckets",
              "relative_attention_max_distance")


def t5x_importable() -> bool:
  """Whether this interpreter can import t5x and prompt_tuning (checked without importing them)."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  return all(importlib.util.find_spec(m) is not None
             for m in ("t5x", "flaxformer", "prompt_tuning", "airio", "jestimator"))


def t5x_shape(config) -> dict:
  """The shape fields of a spot_jax `T5Config` that the t5x model takes (called by bench)."""
  if tuple(config.mlp_activations) != ("gelu", "linear") or config.logits_via_embedding:
    raise ConfigError("--vs=t5x needs a T5.1.1 config (gated-GELU, untied logits) like "
                      "prompt-tuning's t5_1_1_prompt.gin; e.g. --model=t5_1_1_small")
  return {k: getattr(config, k) for k in SHAPE_KEYS}


def output_files(args) -> dict[str, pathlib.Path]:
  """A bench's `--json` and `--markdown` files (None: not asked for), checked before any work by
  `validate.output_file` (one line naming the flag)."""
  return {flag: validate.output_file(path, flag)
          for flag, path in (("--json", args.json), ("--markdown", args.markdown)) if path}


def write_outputs(files: Mapping[str, pathlib.Path], result: Any, markdown: str) -> None:
  """Writes `result` as JSON to --json and `markdown` to --markdown, each atomically,
  where asked."""
  if "--json" in files:
    fileio.atomic_write_bytes(files["--json"], json.dumps(result, indent=2).encode())
  if "--markdown" in files:
    fileio.atomic_write_bytes(files["--markdown"], markdown.encode())


@functools.partial(jax.jit, static_argnums=0)
def _init_backbone(backbone_module, rng, dummy: Mapping[str, Any]):
  from spot_jax import models  # pylint: disable=g-import-not-at-top
  return models.unbox(models.EncoderDecoderModel(backbone_module).init_backbone(rng, dummy))


def init_backbone(model, rng, dummy: Mapping[str, Any]):
  """`model`'s random frozen backbone from `rng` (unboxed), as the trainer initialises it.

  Every method of a run has the same backbone (the network without its prompt), so one
  compiled initialisation serves them all instead of one compile per row.
  """
  return _init_backbone(model.backbone_module(), rng, dict(dummy))


def initial_params(kind: str, model, dummy: Any, seed: int):
  """A row's starting point: (frozen, params, tx, state_rng) from `seed`'s keys.

  The backbone and the prompt are initialised as the trainer does; model tuning trains the whole
  backbone with t5x's fine-tuning Adafactor, DePT its two learning rates, the rest Adafactor.
  """
  from spot_jax import backbone as backbone_lib  # pylint: disable=g-import-not-at-top
  from spot_jax import models  # pylint: disable=g-import-not-at-top
  from spot_jax.train import optimizers  # pylint: disable=g-import-not-at-top
  backbone_rng, prompt_rng, state_rng = backbone_lib.seed_keys(seed)
  backbone = init_backbone(model, backbone_rng, dummy)
  prompt_params = (
      jax.jit(lambda r, f: models.unbox(model.init_prompt(r, f, dummy)))(prompt_rng, backbone)
      if model.has_prompt else {})
  if kind == "model_tuning":
    tx = optimizers.adafactor(learning_rate=1e-3, factored=True, multiply_by_parameter_scale=True,
                              weight_decay_rate=None)
    return {}, backbone, tx, state_rng
  tx = optimizers.two_learning_rates() if kind == "dept" else optimizers.adafactor()
  return backbone, prompt_params, tx, state_rng
