"""Each run's initial prompt parameters, traced once per initialiser.

Tracing a prompt's initialisation traces the model, so runs sharing an initialiser share one
compiled function; runs starting from given arrays of one shape (`prompts.from_array`: SPoT's
retrieved sources) share one too, with the array as its argument.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from spot_jax import backbone as backbone_lib
from spot_jax import models
from spot_jax import partitioning
from spot_jax.errors import ConfigError
from spot_jax.prompts import initializers


def with_init(model: models.Model, prompt_init: Any) -> models.Model:
  """`model` with its prompt module's initialiser replaced (None: unchanged)."""
  if prompt_init is None:
    return model
  return dataclasses.replace(model, module=model.module.clone(
      prompt=model.module.prompt.clone(prompt_init=prompt_init)))


def initial_prompts(model: models.Model, runs: Sequence[Any], backbone: Any,
                    dummy: Any, mesh: jax.sharding.Mesh, rules: Any, stacked: bool
                    ) -> tuple[list[Any], Any]:
  """(each run's prompt parameters, one run's prompt shardings).

  Args:
    runs: the job's runs (`.seed`, `.name`, `.prompt_init`: None for the module's own).
    stacked: a K-run job, whose shape errors name the run.
  """
  per_run, compiled, shardings = [], {}, None
  check_run_dir = getattr(model.module.prompt, "check_run_dir", None)  # ULPT: its kept P
  for run in runs:
    if check_run_dir is not None:
      check_run_dir(run.run_dir.path)
    rng = backbone_lib.seed_keys(run.seed)[1]
    value = getattr(run.prompt_init, "value", None)
    given = isinstance(value, np.ndarray)
    key = ("array", value.shape) if given else id(run.prompt_init)
    if key not in compiled:
      try:
        abstract = jax.eval_shape(with_init(model, run.prompt_init).init_prompt, rng,
                                  backbone, dummy)
      except ValueError as e:  # e.g. a run's initial prompt of another shape
        if not stacked:
          raise
        raise ConfigError(f"run {run.name}'s prompt cannot be initialised: "
                          f"{str(e).splitlines()[0]}") from None
      shardings = partitioning.param_shardings(abstract, mesh, rules)
      if given:
        compiled[key] = jax.jit(lambda r, f, v: models.unbox(with_init(
            model, lambda rng, shape, embedding: v).init_prompt(r, f, dummy)),
                                out_shardings=shardings)
      else:
        run_model = with_init(model, run.prompt_init)
        compiled[key] = jax.jit(lambda r, f, m=run_model: models.unbox(m.init_prompt(r, f, dummy)),
                                out_shardings=shardings)
    per_run.append(compiled[key](rng, backbone, value) if given else compiled[key](rng, backbone))
  return per_run, shardings


def origin(model: models.Model, run: Any) -> str:
  """Where a run's prompt starts, in words, for its record (`RunRecord.init`).

  The run's own note when it has one (a SPoT layer's "library entry ..."), else its own
  initialiser's origin, else the prompt module's initialisers' ("prompt_init: ...; router_init:
  ..." when there are several).
  """
  if run.init_note:
    return run.init_note
  if run.prompt_init is not None:
    return initializers.origin(run.prompt_init)
  prompt = model.module.prompt
  inits = {f.name: getattr(prompt, f.name) for f in dataclasses.fields(prompt)
           if f.name.endswith("_init") and callable(getattr(prompt, f.name, None))}
  if len(inits) == 1:
    return initializers.origin(next(iter(inits.values())))
  return "; ".join(f"{name}: {initializers.origin(init)}" for name, init in inits.items())
