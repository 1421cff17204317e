"""The transferability study (SPoT section 3): sources x targets x seeds, baselines, retrieve.

Every run is an ordinary run directory; the runs of one job are trained as K runs in one jitted
step (`spot_jax.experiment.runner`), so seeds cost little more than one run:

  stage 1  sources/<source>                              Prompt Tuning on each source
           baselines/<target>.seed_<s>                   Prompt Tuning on each target and seed;
                                                         its prompt at the embedding step is the
                                                         target's task embedding for that seed
           generic/source                                (--generic) the mixture of all sources
  stage 2  transfers/<source>/<target>.seed_<s>          one job per source: every target and
                                                         seed from that source's best prompt
           generic_transfers/<target>.seed_<s>           (--generic) from the generic prompt
           retrieval/weighted_average/<target>.seed_<s>  (--retrieval_k=k) from SPoT's weighted
                                                         average of the seed's top-k sources
           retrieval/mixture_sources/<target>.seed_<s>   prompt tuning on the top-k sources'
                                                         data + the target's (examples-prop.)
  stage 3  retrieval/mixture/<target>.seed_<s>           from that mixture prompt

A job's directory (the part before the last '/') holds `job.json`; runs whose validation metric
differs from --metric (`--task_metric`) go to a job of their own, `<job>.<metric>/` (one job
selects every run's best prompt by one metric). The trainer refuses two runs of one (task, seed)
in a job, so transfers are grouped by source (each target and seed once), not by target.

Finished runs are skipped; an interrupted job is started again with the same call and resumes
from the newest step all its runs saved. `--one_at_a_time` trains the same runs, at the same
paths, as single runs (for the wall-time comparison). `--shard_index/--num_shards` split each
stage's jobs round-robin; a job whose inputs another shard has not finished waits for a later
invocation. Every invocation rewrites results.csv / results.json from all finished runs.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Callable, Optional, Sequence

import numpy as np

from spot_jax import experiment
from spot_jax import fileio
from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.experiment import RunOutcome, RunRequest
from spot_jax.spot import retrieve
from spot_jax.spot import settings as settings_lib
from spot_jax.spot import similarity
from spot_jax.spot.settings import RunSettings

CONFIG = "study.json"
TIMING = "timing.jsonl"
KINDS = ("source", "baseline", "generic_source", "transfer", "generic", "weighted_average",
         "mixture_source", "mixture")
# Kinds trained for --source_train_steps without evaluation of the target (mixtures: none).
_SOURCE_BUDGET = ("source", "generic_source", "mixture_source")
_NOT_EVALUATED = ("generic_source", "mixture_source")


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of the grid.

  Attributes:
    kind: one of KINDS.
    task: the task trained (the target for target-side kinds; "" for the generic source).
    seed: the run seed.
    source: the source task of a "transfer" cell.
  """
  kind: str
  task: str
  seed: int
  source: Optional[str] = None

  @property
  def name(self) -> str:
    """The run directory's name in its job."""
    if self.kind == "source":
      return self.task
    if self.kind == "generic_source":
      return "source"
    return f"{self.task}.seed_{self.seed}"

  @property
  def group(self) -> str:
    """The job directory (before the metric suffix)."""
    return {"source": "sources", "baseline": "baselines", "generic_source": "generic",
            "transfer": f"transfers/{self.source}", "generic": "generic_transfers",
            "weighted_average": "retrieval/weighted_average",
            "mixture_source": "retrieval/mixture_sources",
            "mixture": "retrieval/mixture"}[self.kind]


@dataclasses.dataclass(frozen=True)
class Grid:
  """The study's tasks and seeds.

  Attributes:
    sources: source tasks.
    targets: target tasks.
    seeds: target-run seeds.
    source_seed: the seed of the source runs, and of the random backbone when there is no
      checkpoint (one backbone for every run).
    generic: include generic SPoT (mixture of all sources).
    source_train_steps: training steps of source and mixture-source runs (None: train_steps).
    retrieval_k: k of the retrieval runs (top-k weighted average, top-k mixture); 0: none.
    similarity: the similarity that ranks sources for those runs ("average" or "per_token").
  """
  sources: tuple[str, ...]
  targets: tuple[str, ...]
  seeds: tuple[int, ...]
  source_seed: int = 0
  generic: bool = False
  source_train_steps: Optional[int] = None
  retrieval_k: int = 0
  similarity: str = "average"

  def __post_init__(self):
    for name in ("sources", "targets"):
      values = getattr(self, name)
      if not values:
        raise ConfigError(f"--{name} is empty; give at least one")
      if len(set(values)) != len(values):
        raise ConfigError(f"--{name} lists a value twice: {list(values)}")
    from spot_jax import stats  # pylint: disable=g-import-not-at-top
    stats.check_seeds(self.seeds)
    if not isinstance(self.retrieval_k, int) or not 0 <= self.retrieval_k <= len(self.sources):
      raise ConfigError(f"--retrieval_k={self.retrieval_k!r}; give 0 (no retrieval runs) up to the "
                        f"number of sources ({len(self.sources)})")
    validate.one_of(self.similarity, "--similarity", similarity.METRICS)

  def stages(self) -> list[list[Cell]]:
    """The cells of each stage, in job order."""
    one = [Cell("source", s, self.source_seed) for s in self.sources]
    one += [Cell("baseline", t, seed) for t in self.targets for seed in self.seeds]
    if self.generic:
      one.append(Cell("generic_source", "", self.source_seed))
    two = [Cell("transfer", t, seed, s) for s in self.sources for t in self.targets
           for seed in self.seeds]
    per_target = [(t, seed) for t in self.targets for seed in self.seeds]
    if self.generic:
      two += [Cell("generic", t, seed) for t, seed in per_target]
    three = []
    if self.retrieval_k:
      two += [Cell(kind, t, seed) for kind in ("weighted_average", "mixture_source")
              for t, seed in per_target]
      three = [Cell("mixture", t, seed) for t, seed in per_target]
    return [one, two, three]

  def cells(self) -> list[Cell]:
    return [c for stage in self.stages() for c in stage]


class Layout:
  """Where each cell's run directory is (the job directory depends on the run's metric)."""

  def __init__(self, settings: RunSettings):
    self.settings = settings

  def job_dir(self, cell: Cell) -> str:
    if cell.kind in _NOT_EVALUATED:
      return cell.group
    metric = self.settings.metric_for(cell.task)
    return cell.group if metric == self.settings.metric else f"{cell.group}.{metric}"

  def path(self, cell: Cell) -> str:
    return f"{self.job_dir(cell)}/{cell.name}"

  def jobs(self, stage: Sequence[Cell]) -> list[tuple[str, list[Cell]]]:
    """The stage's jobs: (job directory, its cells), in first-appearance order."""
    out: dict[str, list[Cell]] = {}
    for cell in stage:
      out.setdefault(self.job_dir(cell), []).append(cell)
    return list(out.items())


def _settings_record(settings: RunSettings) -> dict:
  return {"model": settings.model_name, "fingerprint": settings.fingerprint_for(0)["id"],
          "lengths": dict(settings.lengths), "batch_size": settings.batch_size,
          "train_steps": settings.train_steps, "embedding_step": settings.embedding_step,
          "eval_period": settings.eval_period, "checkpoint_period": settings.checkpoint_period,
          "eval_num_examples": settings.eval_num_examples,
          "prompt_length": settings.prompt_length, "learning_rate": settings.learning_rate,
          "metric": settings.metric, "task_metrics": dict(settings.task_metrics),
          "metric_max": settings.metric_max}


def check_config(study_dir: pathlib.Path, settings: RunSettings, grid: Grid) -> None:
  """Records the run settings; a restart with different ones is refused (cells would mix)."""
  path = study_dir / CONFIG
  record = dict(_settings_record(settings), source_seed=grid.source_seed,
                source_train_steps=grid.source_train_steps)
  if grid.retrieval_k:
    record["retrieval_similarity"] = grid.similarity
  if path.is_file():
    old = json.loads(path.read_text())
    changed = sorted(k for k in record if k in old and old[k] != record[k])
    changed += sorted(k for k in record if k not in old and k != "retrieval_similarity")
    if changed:
      raise ConfigError(f"{str(study_dir)!r} holds a study made with other settings "
                        f"({', '.join(changed)} "
                        f"differ, e.g. {changed[0]}={old.get(changed[0])!r}); use the same flags "
                        "or a new --study_dir")
    if record.keys() - old.keys():
      fileio.atomic_write_bytes(path, json.dumps({**old, **record}, indent=1).encode())
  else:
    fileio.atomic_write_bytes(path, json.dumps(record, indent=1).encode())


def read(study_dir: pathlib.Path, layout: Layout, cell: Cell) -> Optional[RunOutcome]:
  return experiment.read_outcome(study_dir / layout.path(cell))


def ranking(study_dir: pathlib.Path, layout: Layout, grid: Grid, target: str, seed: int,
            metric: str) -> Optional[list[tuple[str, float]]]:
  """Sources by decreasing similarity to the target's embedding of `seed` (None: not finished)."""
  base = read(study_dir, layout, Cell("baseline", target, seed))
  sources = [read(study_dir, layout, Cell("source", s, grid.source_seed)) for s in grid.sources]
  if base is None or any(s is None for s in sources):
    return None
  sims = similarity.similarities(base.embedding(), [s.embedding() for s in sources], metric)
  return [(grid.sources[i], float(sims[i])) for i in similarity.rank(sims)]


def _request(study_dir: pathlib.Path, layout: Layout, grid: Grid,
             cell: Cell) -> Optional[RunRequest]:
  """The trainer's request for a cell, or None when a run it starts from is not finished."""
  if cell.kind in ("source", "baseline"):
    return RunRequest(cell.task, cell.seed, name=cell.name)
  if cell.kind == "generic_source":
    return RunRequest(retrieve.register_runtime_mixture("spot_generic", grid.sources), cell.seed,
                      name=cell.name)
  if cell.kind in ("transfer", "generic", "mixture"):
    origin = {"transfer": Cell("source", cell.source, grid.source_seed),
              "generic": Cell("generic_source", "", grid.source_seed),
              "mixture": Cell("mixture_source", cell.task, cell.seed)}[cell.kind]
    done = read(study_dir, layout, origin)
    if done is None:
      return None
    return RunRequest(cell.task, cell.seed, name=cell.name, init=done.prompt(),
                      init_note=f"best prompt of {layout.path(origin)}")
  ranked = ranking(study_dir, layout, grid, cell.task, cell.seed, grid.similarity)
  if ranked is None:
    return None
  top = ranked[:grid.retrieval_k]
  if cell.kind == "mixture_source":
    mixture = retrieve.register_runtime_mixture("spot_mixture", [s for s, _ in top] + [cell.task])
    return RunRequest(mixture, cell.seed, name=cell.name)
  prompts = [read(study_dir, layout, Cell("source", s, grid.source_seed)).prompt() for s, _ in top]
  sims = np.array([v for _, v in top])
  if not sims.sum() > 0:  # SPoT's weights need a positive total; fall back to equal weights
    sims = np.ones_like(sims)
  return RunRequest(cell.task, cell.seed, name=cell.name,
                    init=similarity.weighted_average(prompts, sims),
                    init_note="weighted average of " + ", ".join(s for s, _ in top))


def shard_jobs(jobs: Sequence, shard_index: int, num_shards: int) -> list:
  """This shard's jobs of one stage (round-robin)."""
  return [job for i, job in enumerate(jobs) if i % num_shards == shard_index]


def _train_job(settings: RunSettings, study_dir: pathlib.Path, job_dir: str, cells: Sequence[Cell],
               requests: Sequence[RunRequest], grid: Grid, one_at_a_time: bool,
               verbose: bool) -> None:
  """The cells' runs as one K-run job of the experiment runner (or one at a time)."""
  kind = cells[0].kind
  steps = grid.source_train_steps if kind in _SOURCE_BUDGET and grid.source_train_steps else None
  job_settings = dataclasses.replace(settings, train_steps=steps) if steps else settings
  recipe = settings_lib.recipe(job_settings, requests[0].task, evaluate=kind not in _NOT_EVALUATED,
                               backbone_seed=grid.source_seed)
  experiment.run(recipe, study_dir / job_dir, requests, alone=one_at_a_time, verbose=verbose)


def run(settings: RunSettings, study_dir: str | pathlib.Path, grid: Grid, *, shard_index: int = 0,
        num_shards: int = 1, one_at_a_time: bool = False, log: Callable[[str], None] = print,
        verbose: bool = False) -> dict:
  """Runs this shard's unfinished jobs; returns counts (in runs). Tables: `spot.study_tables`."""
  if num_shards < 1 or not 0 <= shard_index < num_shards:
    raise ConfigError(f"--shard_index={shard_index} --num_shards={num_shards}; valid: "
                      f"num_shards >= 1 and 0 <= shard_index < num_shards")
  if one_at_a_time and not settings.initial_checkpoint_path:
    raise ConfigError("--one_at_a_time needs --checkpoint: a single run's random "
                      "backbone follows its own seed, a job's follows --source_seed")
  study_dir = pathlib.Path(study_dir)
  study_dir.mkdir(parents=True, exist_ok=True)
  check_config(study_dir, settings, grid)
  layout = Layout(settings)
  counts = {"skipped": 0, "ran": 0, "waiting": 0, "jobs": 0}
  for stage in grid.stages():
    for job_dir, cells in shard_jobs(layout.jobs(stage), shard_index, num_shards):
      todo = [c for c in cells if read(study_dir, layout, c) is None]
      counts["skipped"] += len(cells) - len(todo)
      if not todo:
        log(f"job {job_dir}: {len(cells)} runs finished, skipped")
        continue
      requests = [_request(study_dir, layout, grid, c) for c in todo]
      if any(r is None for r in requests):
        counts["waiting"] += len(todo)
        log(f"job {job_dir}: waiting for runs it starts from (another shard); rerun this "
            "shard later")
        continue
      log(f"job {job_dir}: running {len(todo)} runs" + (" one at a time" if one_at_a_time else
                                                         " in one step"))
      start = time.perf_counter()
      _train_job(settings, study_dir, job_dir, todo, requests, grid, one_at_a_time, verbose)
      seconds = time.perf_counter() - start
      counts["ran"] += len(todo)
      counts["jobs"] += 1
      with open(study_dir / TIMING, "a", encoding="utf-8") as f:
        f.write(json.dumps({"job": job_dir, "runs": len(todo), "seconds": round(seconds, 3),
                            "one_at_a_time": one_at_a_time}) + "\n")
      scores = [read(study_dir, layout, c).score for c in todo]
      real = [s for s in scores if s is not None]
      log(f"job {job_dir}: done in {seconds:.1f} s"
          + (f", mean score {np.mean(real):.4g}" if real else ""))
  return counts
