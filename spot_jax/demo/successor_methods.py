"""The successor methods in the demo (`--methods=...,prefix,dept,...` or `--methods=all`).

Each is the same kind of job as the default methods (every target x seed as K runs of one
jitted step, ordinary run directories), with its own prompt module and, for DePT, optimizer:

  prefix         prefix tuning: key and value prefixes of the recipe's prompt length (10) in every
                 attention of both stacks (encoder self, decoder self, cross), as PEFT places
                 them, N(0, 1) init
  ptuning_v2     P-tuning v2: the recipe's length of prompt tokens in every encoder layer,
                 sampled vocabulary
  dept           DePT: 10 prompt tokens plus a rank-8 offset of the input positions, the offset at
                 its own learning rate (its parameter budget matches 20-token Prompt Tuning's)
  residual_smop  Residual SMoP: SMoP's 4 x 5 prompts through one shared bottleneck-128 MLP
  attempt        ATTEMPT: a per-input attentional mixture of the library's 8 frozen source
                 prompts and a trained target prompt of the recipe's length
  mpt            MPT: a prompt of the recipe's length shared by the 8 sources times rank-1 task
                 factors, distilled from the library's source prompts on the source mixture (one
                 more job), then each target starts from the shared prompt and the average factors
                 (as PEFT's AVERAGE_SOURCE_TASKS)
  ulpt           ULPT: the recipe's length of prompt rows in r = 8 dimensions through a frozen
                 random projection to the width (128), scaled and shifted: 10 x 8 + 2 x 128 = 336
                 parameters against Prompt Tuning's 1,280 (the paper's r = 64 is half the width
                 here; at 10 tokens the scale and shift alone are a fifth of Prompt Tuning's)

ATTEMPT and MPT read the source prompts from the demo's library, as SPoT does.
"""
from __future__ import annotations

import types
from typing import Mapping, Optional, Sequence

import numpy as np

from spot_jax import prompts
from spot_jax.prompts import dept as dept_lib
from spot_jax.run_dir import RunDir
from spot_jax.demo import methods
from spot_jax.experiment import Recipe, RunRequest
from spot_jax.spot import distill
from spot_jax.train import optimizers

NEEDS_LIBRARY = ("attempt", "mpt")


# Each successor's own settings. A job's key holds its method's entry only, so changing one
# method's setting retrains that method alone (the rest of the recipe is `methods.Settings`).
OWN_SETTINGS: Mapping[str, Mapping[str, float]] = types.MappingProxyType({
    # Prefix tuning: keys and values start N(0, init_std) (PEFT's embedding table default).
    "prefix": {"init_std": 1.0},
    "ptuning_v2": {},
    # DePT: `length` prompt tokens and rank r (m E + r (s + E) parameters, s the input length);
    # the offset's peak learning rate (the prompt's is the recipe's; the same warm-up and decay).
    "dept": {"length": 10, "rank": 8, "offset_learning_rate": 0.03},
    # Residual SMoP's MLP width (the demo's Residual PT uses the same).
    "residual_smop": {"bottleneck": 128},
    # ATTEMPT's attention network width (the paper's 100).
    "attempt": {"bottleneck": 100},
    # MPT: the task factors' rank and lambda on the distillation terms (the paper's 1 and 0.9).
    "mpt": {"rank": 1, "distill_weight": 0.9},
    # ULPT: the rows' dimension r and the projection's seed (Z ~ N(0, 1), s = 1, b = 0 at start).
    "ulpt": {"rank": 8, "projection_seed": 0},
})


def _key(method: str, own: Mapping[str, float], **more) -> dict:
  return {"successor": method, "recipe": dict(own), **more}


def source_prompts(entries: Sequence, order: Sequence[str]) -> np.ndarray:
  """The library's best source prompts stacked in `order`: [S, L, E] float32."""
  by_id = {e.id: e for e in entries}
  return np.stack([np.asarray(by_id[k].prompt, np.float32) for k in order])


def _dept_optimizer(settings: methods.Settings, offset_learning_rate: float):
  scale = offset_learning_rate / settings.learning_rate

  def build(lr):  # the offset's schedule: the prompt's, scaled to its own peak
    second = (lambda step: lr(step) * scale) if callable(lr) else lr * scale
    return optimizers.two_learning_rates(optimizer=optimizers.adafactor, learning_rate=lr,
                                         second_learning_rate=second,
                                         second_subtrees=(dept_lib.OFFSET,))
  return build


def recipe(method: str, settings: methods.Settings, vocab_rows: int,
           own_settings: Mapping[str, Mapping[str, float]] = OWN_SETTINGS,
           sources: Optional[np.ndarray] = None, mpt_source: Optional[str] = None) -> Recipe:
  """A successor's job recipe.

  Args:
    method: one of methods.SUCCESSORS.
    settings: the demo's settings.
    vocab_rows: the rows the sampled-vocabulary initialiser draws from.
    own_settings: the successors' own settings (`OWN_SETTINGS`' keys and fields).
    sources: ATTEMPT's frozen source prompts [S, L, E] (`source_prompts`).
    mpt_source: MPT's distillation run directory (`distill_recipe`'s job's run).
  """
  if method not in own_settings:
    raise ValueError(f"unknown successor {method!r}; valid: {', '.join(methods.SUCCESSORS)}")
  own = own_settings[method]

  def job_recipe(prompt, **more) -> Recipe:
    return methods.recipe(method, settings, vocab_rows, prompt=prompt, **more)

  sampled = prompts.sampled_vocab(num_most_frequent=vocab_rows)
  length = settings.prompt_length
  if method == "prefix":
    from spot_jax.prompts import prefix_tuning  # pylint: disable=g-import-not-at-top
    return job_recipe(prompts.PrefixTuning(length=length, prefix_init=prefix_tuning.normal(
        own["init_std"])), key=_key(method, own))
  if method == "ptuning_v2":
    return job_recipe(prompts.PTuningV2(length=length, prompt_init=sampled), key=_key(method, own))
  if method == "dept":
    return job_recipe(prompts.DePT(length=own["length"], max_length=settings.input_length,
                                   rank=own["rank"], prompt_init=sampled),
                      optimizer=_dept_optimizer(settings, own["offset_learning_rate"]),
                      key=_key(method, own))
  if method == "residual_smop":
    return job_recipe(prompts.ResidualSMoP(num_prompts=4, length=5, bottleneck=own["bottleneck"],
                                           prompt_init=sampled), key=_key(method, own))
  if method == "attempt":
    if sources is None:
      raise ValueError("attempt needs the library's source prompts")
    return job_recipe(prompts.Attempt(source_prompts=sources, bottleneck=own["bottleneck"],
                                      prompt_init=sampled),
                      key=_key(method, own, sources=methods.array_digest(sources)))
  if method == "mpt":
    if mpt_source is None:
      raise ValueError("mpt needs its distillation run")
    start = mpt_start(mpt_source)
    init = {n: prompts.from_array(v, source=f"{mpt_source} ({n})") for n, v in start.items()}
    return job_recipe(prompts.MultitaskPrompt(length=length, rank=own["rank"],
                                              shared_init=init["shared"],
                                              cols_init=init["task_cols"],
                                              rows_init=init["task_rows"]),
                      key=_key(method, own, shared=methods.array_digest(start["shared"])))
  if method == "ulpt":
    return job_recipe(prompts.ULPT(length=length, rank=own["rank"],
                                   projection_seed=own["projection_seed"]), key=_key(method, own))
  raise ValueError(f"successor {method!r} has settings but no recipe")


def mpt_start(distill_run: str) -> dict[str, np.ndarray]:
  """A target's start from MPT's distillation run: its shared prompt P* [L, E] and the source
  tasks' average factors U [1, L, r] and V [1, r, E] (PEFT's AVERAGE_SOURCE_TASKS)."""
  params = RunDir(distill_run).prompt_params()
  return {"shared": np.asarray(params["shared"], np.float32),
          "task_cols": np.asarray(params["task_cols"], np.float32).mean(axis=0, keepdims=True),
          "task_rows": np.asarray(params["task_rows"], np.float32).mean(axis=0, keepdims=True)}


def distill_recipe(settings: methods.Settings, vocab_rows: int, teachers: np.ndarray,
                   own_settings: Mapping[str, Mapping[str, float]] = OWN_SETTINGS) -> Recipe:
  """MPT's source training: the shared prompt and the 8 sources' factors, distilled from the
  library's source prompts (`teachers`, in `tasks.embedded.SOURCES` order) on the source mixture."""
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  names = [suite.task_name(k, taskless=True) for k in suite.SOURCES]
  student = prompts.MultitaskPrompt(length=settings.prompt_length, num_tasks=len(names),
                                    rank=own_settings["mpt"]["rank"],
                                    shared_init=prompts.sampled_vocab(num_most_frequent=vocab_rows))

  def model(module):
    return distill.PromptDistillationModel(module=module, teacher_prompts=teachers,
                                           distill_weight=own_settings["mpt"]["distill_weight"])

  return methods.recipe(methods.MPT_SOURCE, settings, vocab_rows, prompt=student, model=model,
                        source=True, evaluate=False, task_names=names,
                        key=_key("mpt_distill", own_settings["mpt"],
                                 teachers=methods.array_digest(teachers)))


def distill_requests(seed: int) -> list[RunRequest]:
  """The distillation job's one run on the source mixture (the sources' seed)."""
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  return [RunRequest(suite.SOURCE_MIXTURE, seed, label="sources")]
