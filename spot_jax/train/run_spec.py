"""K prompt runs in one jitted step: which runs a job trains, and their stacked state.

A job trains one run (the default: MODEL_DIR is the run directory) or K runs that share the frozen
backbone, the prompt method and its shapes, and differ in seed and/or task (gin `SEEDS` /
`TASKS`, or `RunSpec`s from Python). The K trainable states are stacked along a leading runs axis
and the train step is vmapped over it; the frozen weights are an unbatched input, so every
matmul reads them once for all K. Each run keeps its own optimizer state, data stream, dropout
keys, evaluation, best state, checkpoints and run directory `<MODEL_DIR>/<name>`: an ordinary run
directory that `spot_jax.eval`, `infer`, `library add` and a resume read as any other.

  SEEDS=[0, 1, 2]                    runs seed_0, seed_1, seed_2 on MIXTURE_OR_TASK_NAME
  TASKS=['a', 'b']                   runs a, b with RANDOM_SEED
  TASKS=['a', 'b'], SEEDS=[0, 1]     runs a.seed_0, b.seed_1 (run i trains TASKS[i] with SEEDS[i])
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import fileio
from spot_jax.errors import ConfigError
from spot_jax.run_dir import RunDir

JOB_RECORD = "job.json"
JOB_FORMAT = "spot_jax.job/1"


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One run of a K-run job (Python API; gin uses SEEDS / TASKS).

  Attributes:
    seed: the run's seed (prompt initialisation, data order, dropout keys).
    task: its task or mixture (None: the job's training task).
    name: its run directory's name under MODEL_DIR (None: derived from task and seed).
    prompt_init: an initialiser replacing the prompt module's for this run only, e.g.
      `prompts.from_array(source_prompt)` for a SPoT transfer; it must give the same shapes.
    init_note: how the prompt was initialised (kept in the run's record).
  """
  seed: int
  task: Optional[str] = None
  name: Optional[str] = None
  prompt_init: Optional[Callable[..., Any]] = None
  init_note: str = ""


@dataclasses.dataclass(frozen=True)
class Run:
  """A resolved run: its index in the stack, seed, task and directory."""
  index: int
  seed: int
  task: str
  run_dir: RunDir
  prompt_init: Optional[Callable[..., Any]] = None
  init_note: str = ""

  @property
  def name(self) -> str:
    return self.run_dir.path.name


def _check_list(name: str, values: Any, kind: type) -> list:
  if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
    raise ConfigError(f"{name}={values!r} is not a list; give e.g. {name}="
                      f"{'[0, 1, 2]' if kind is int else repr(['task_a', 'task_b'])}")
  if not values:
    raise ConfigError(f"{name} is empty; give at least one entry, or None for a single run")
  for i, v in enumerate(values):
    ok = (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0) if kind is int \
        else (isinstance(v, str) and v.strip() != "")
    if not ok:
      what = "a non-negative integer seed" if kind is int else "a task name"
      raise ConfigError(f"{name}[{i}]={v!r} is not {what}; {name}={list(values)!r}")
  return [int(v) if kind is int else v for v in values]


def resolve(model_dir: str, task: str, seed: int, seeds: Optional[Sequence[int]] = None,
            tasks: Optional[Sequence[str]] = None, specs: Optional[Sequence[RunSpec]] = None,
            init_note: str = "") -> tuple[list[Run], bool]:
  """The job's runs and whether they are stacked (False: one plain run in MODEL_DIR itself).

  Raises:
    ConfigError: an empty list, a duplicate seed or run name, lists of different
      lengths, a bad entry or run name; one line naming the setting. Nothing is written.
  """
  if specs is not None:
    if seeds is not None or tasks is not None:
      raise ConfigError("give runs= (RunSpecs) or SEEDS/TASKS, not both")
    if not specs:
      raise ConfigError("runs= is empty; give at least one RunSpec")
    specs = list(specs)
  elif seeds is None and tasks is None:
    return [Run(0, int(seed), task, RunDir(model_dir), init_note=init_note)], False
  else:
    seed_list = _check_list("SEEDS", seeds, int) if seeds is not None else None
    task_list = _check_list("TASKS", tasks, str) if tasks is not None else None
    if seed_list is not None and task_list is not None and len(seed_list) != len(task_list):
      raise ConfigError(f"SEEDS has {len(seed_list)} entries and TASKS {len(task_list)}; give "
                        "lists of the same length (run i trains TASKS[i] with SEEDS[i]) or only "
                        "one")
    if task_list is None:
      dup = _first_duplicate(seed_list)
      if dup is not None:
        raise ConfigError(f"SEEDS lists {dup} twice; give each seed once, e.g. "
                          f"SEEDS={sorted(set(seed_list))}")
      specs = [RunSpec(s, name=f"seed_{s}") for s in seed_list]
    elif seed_list is None:
      dup = _first_duplicate(task_list)
      if dup is not None:
        raise ConfigError(f"TASKS lists {dup!r} twice; give each task once (or SEEDS of the same "
                          f"length to repeat a task with other seeds)")
      specs = [RunSpec(int(seed), t, name=t) for t in task_list]
    else:
      specs = [RunSpec(s, t, name=f"{t}.seed_{s}") for t, s in zip(task_list, seed_list)]
  runs = []
  for i, spec in enumerate(specs):
    run_task = spec.task or task
    name = spec.name or (f"{run_task}.seed_{spec.seed}" if spec.task else f"seed_{spec.seed}")
    if not fileio.SAFE_NAME.match(name):
      raise ConfigError(f"run name {name!r} is not a valid directory name; use letters, digits, "
                        f"'_', '.', '-'")
    runs.append(Run(i, int(spec.seed), run_task, RunDir(pathlib.Path(model_dir) / name),
                    spec.prompt_init, spec.init_note))
  # Runs may share a (task, seed) when they differ otherwise (e.g. SPoT transfers from other
  # sources, named apart); each needs its own directory.
  dup = _first_duplicate([r.name for r in runs])
  if dup is not None:
    raise ConfigError(f"the job lists the run name {dup!r} twice; give each run once (runs of one "
                      f"task and seed need names of their own)")
  return runs, True


def _first_duplicate(values: Sequence[Any]) -> Any:
  seen = set()
  for v in values:
    if v in seen:
      return v
    seen.add(v)
  return None


def check_job(model_dir: pathlib.Path, runs: Sequence[Run]) -> None:
  """A restart must list the same runs: MODEL_DIR/job.json records them (refused otherwise)."""
  path = model_dir / JOB_RECORD
  if not path.is_file():
    return
  try:
    old = json.loads(path.read_text())
    old_runs = [(r["name"], r["task"], int(r["seed"])) for r in old["runs"]]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"{path} cannot be read ({e}); restore it or use a new MODEL_DIR") from None
  new_runs = [(r.name, r.task, r.seed) for r in runs]
  if old_runs != new_runs:
    raise ConfigError(
        f"MODEL_DIR {str(model_dir)!r} holds a job of {len(old_runs)} runs "
        f"({', '.join(n for n, _, _ in old_runs[:4])}{', ...' if len(old_runs) > 4 else ''}), "
        f"not these {len(new_runs)}; give the same SEEDS/TASKS or a new MODEL_DIR")


def write_job(model_dir: pathlib.Path, runs: Sequence[Run]) -> None:
  record = {"format": JOB_FORMAT,
            "runs": [{"name": r.name, "task": r.task, "seed": r.seed} for r in runs]}
  fileio.atomic_write_bytes(model_dir / JOB_RECORD, json.dumps(record, indent=1).encode())


def stack(trees: Sequence[Any]) -> Any:
  """Stacks K trees of the same structure and shapes along a new leading runs axis."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree: Any, k: int) -> Any:
  """Run k's tree from a stacked one."""
  return jax.tree.map(lambda x: x[k], tree)


def check_same_shapes(trees: Sequence[Any], runs: Sequence[Run]) -> None:
  """K runs share one method and shape: a run whose prompt tree differs is refused."""
  def shapes(tree):
    return {jax.tree_util.keystr(p): tuple(x.shape)
            for p, x in jax.tree_util.tree_leaves_with_path(tree)}
  first = shapes(trees[0])
  for run, tree in zip(runs[1:], trees[1:]):
    other = shapes(tree)
    if other != first:
      diff = next((k for k in sorted(set(first) | set(other)) if first.get(k) != other.get(k)), "?")
      raise ConfigError(f"run {run.name}'s prompt parameter {diff} has shape {other.get(diff)}, "
                        f"run {runs[0].name}'s {first.get(diff)}; K runs in one step share one "
                        "prompt method and its shapes")
