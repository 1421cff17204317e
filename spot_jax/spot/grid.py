"""The transferability study (SPoT section 3): sources x targets x seeds, plus baselines.

Cells, each one ordinary trainer run in its own directory under the study directory:

  stage 1  sources/<source>                          Prompt Tuning on each source (source seed)
           targets/<target>/seed<s>/baseline         Prompt Tuning on each target; its prompt at
                                                     the embedding step is the target embedding
           generic/source                            (--generic) one prompt on the mixture of all
                                                     sources (generic SPoT)
  stage 2  targets/<target>/seed<s>/from/<source>    target run initialised from the source's
                                                     best prompt
           targets/<target>/seed<s>/generic          (--generic) from the generic prompt

A cell with `spot_run.json` is finished and skipped; one without it is started again with the
same call, and the trainer resumes it from its own checkpoint. `--shard_index/--num_shards`
split each stage's cells round-robin; a stage-2 cell whose source belongs to another unfinished
shard is left for a later invocation. Every invocation rewrites results.csv / results.json from
all finished cells, so the table is the same however the grid was split or interrupted.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import pathlib
from typing import Callable, Optional, Sequence

from spot_jax import fileio
from spot_jax.errors import ConfigError
from spot_jax.spot import retrieval
from spot_jax.spot import runs as runs_lib
from spot_jax.spot import similarity
from spot_jax.spot.settings import RunSettings

CONFIG = "study.json"
COLUMNS = ("target", "seed", "init", "score", "baseline_score", "relative_error_reduction",
           "similarity_average", "similarity_per_token")


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of the grid.

  Attributes:
    kind: "source", "baseline", "generic_source", "transfer" or "generic".
    task: the task trained.
    seed: the run seed.
    source: the source task of a "transfer" cell.
  """
  kind: str
  task: str
  seed: int
  source: Optional[str] = None

  @property
  def path(self) -> str:
    if self.kind == "source":
      return f"sources/{self.task}"
    if self.kind == "generic_source":
      return "generic/source"
    base = f"targets/{self.task}/seed{self.seed}"
    return {"baseline": f"{base}/baseline", "generic": f"{base}/generic",
            "transfer": f"{base}/from/{self.source}"}[self.kind]


@dataclasses.dataclass(frozen=True)
class Grid:
  """The study's tasks and seeds.

  Attributes:
    sources: source tasks.
    targets: target tasks.
    seeds: target-run seeds.
    source_seed: the seed of the source runs.
    generic: include generic SPoT (mixture of all sources).
    source_train_steps: training steps of the source (and generic source) runs (None: the
      settings' train_steps, as for the target runs).
  """
  sources: tuple[str, ...]
  targets: tuple[str, ...]
  seeds: tuple[int, ...]
  source_seed: int = 0
  generic: bool = False
  source_train_steps: Optional[int] = None

  def __post_init__(self):
    for name in ("sources", "targets", "seeds"):
      values = getattr(self, name)
      if not values:
        raise ConfigError(f"--{name} is empty; give at least one")
      if len(set(values)) != len(values):
        raise ConfigError(f"--{name} lists a value twice: {list(values)}")

  def stage1(self) -> list[Cell]:
    cells = [Cell("source", s, self.source_seed) for s in self.sources]
    cells += [Cell("baseline", t, seed) for t in self.targets for seed in self.seeds]
    if self.generic:
      cells.append(Cell("generic_source", "", self.source_seed))
    return cells

  def stage2(self) -> list[Cell]:
    cells = [Cell("transfer", t, seed, s) for t in self.targets for seed in self.seeds
             for s in self.sources]
    if self.generic:
      cells += [Cell("generic", t, seed) for t in self.targets for seed in self.seeds]
    return cells


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
  if path.is_file():
    old = json.loads(path.read_text())
    changed = sorted(k for k in record if old.get(k) != record[k])
    if changed:
      raise ConfigError(f"{str(study_dir)!r} holds a study made with other settings ({', '.join(changed)} "
                        f"differ, e.g. {changed[0]}={old.get(changed[0])!r}); use the same flags or a new --study_dir")
  else:
    fileio.atomic_write_bytes(path, json.dumps(record, indent=1).encode())


def _generic_mixture(grid: Grid) -> str:
  return retrieval.register_runtime_mixture("spot_generic", grid.sources)


def run_cell(settings: RunSettings, study_dir: pathlib.Path, cell: Cell, grid: Grid,
             verbose: bool = False) -> Optional[runs_lib.RunOutcome]:
  """Runs (or resumes) one cell; None when it needs a stage-1 cell that is not finished."""
  run_dir = study_dir / cell.path
  source_settings = (dataclasses.replace(settings, train_steps=grid.source_train_steps)
                     if grid.source_train_steps else settings)
  if cell.kind == "baseline":
    return runs_lib.train_prompt(settings, cell.task, run_dir, cell.seed, verbose=verbose)
  if cell.kind == "source":
    return runs_lib.train_prompt(source_settings, cell.task, run_dir, cell.seed, verbose=verbose)
  if cell.kind == "generic_source":
    return runs_lib.train_prompt(source_settings, _generic_mixture(grid), run_dir, cell.seed,
                                 evaluate=False, verbose=verbose)
  origin = Cell("source", cell.source, grid.source_seed) if cell.kind == "transfer" else \
      Cell("generic_source", "", grid.source_seed)
  source = runs_lib.read_record(study_dir / origin.path)
  if source is None:
    return None
  return runs_lib.train_prompt(settings, cell.task, run_dir, cell.seed, init=source.prompt(),
                               init_note=f"best prompt of {origin.path}", verbose=verbose)


def shard_cells(cells: Sequence[Cell], shard_index: int, num_shards: int) -> list[Cell]:
  """This shard's cells of one stage (round-robin, so shards get similar work)."""
  return [cell for i, cell in enumerate(cells) if i % num_shards == shard_index]


def run(settings: RunSettings, study_dir: str | pathlib.Path, grid: Grid, *, shard_index: int = 0,
        num_shards: int = 1, log: Callable[[str], None] = print, verbose: bool = False) -> dict:
  """Runs this shard's unfinished cells, then writes the tables; returns counts."""
  if num_shards < 1 or not 0 <= shard_index < num_shards:
    raise ConfigError(f"--shard_index={shard_index} --num_shards={num_shards}; valid: "
                      f"num_shards >= 1 and 0 <= shard_index < num_shards")
  study_dir = pathlib.Path(study_dir)
  study_dir.mkdir(parents=True, exist_ok=True)
  check_config(study_dir, settings, grid)
  counts = {"skipped": 0, "ran": 0, "waiting": 0}
  for stage in (grid.stage1(), grid.stage2()):
    for cell in shard_cells(stage, shard_index, num_shards):
      if runs_lib.read_record(study_dir / cell.path) is not None:
        counts["skipped"] += 1
        log(f"cell {cell.path}: finished, skipped")
        continue
      log(f"cell {cell.path}: running")
      outcome = run_cell(settings, study_dir, cell, grid, verbose)
      if outcome is None:
        counts["waiting"] += 1
        log(f"cell {cell.path}: waiting for its source (another shard); rerun this shard later")
        continue
      counts["ran"] += 1
      score = "-" if outcome.score is None else f"{outcome.score:.4g}"
      log(f"cell {cell.path}: done, {outcome.metric} {score}")
  rows = collect(settings, study_dir, grid)
  write_tables(study_dir, rows, grid)
  log(f"{counts['ran']} cells run, {counts['skipped']} already finished, {counts['waiting']} waiting; "
      f"{len(rows)} rows in {study_dir / 'results.csv'}")
  return counts


def relative_error_reduction(score: float, baseline: float, metric_max: float) -> Optional[float]:
  """(err_baseline - err) / err_baseline with err = metric_max - score; None if err_baseline = 0."""
  base_error = metric_max - baseline
  if base_error <= 0:
    return None
  return (base_error - (metric_max - score)) / base_error


def collect(settings: RunSettings, study_dir: pathlib.Path, grid: Grid) -> list[dict]:
  """One row per finished target run (baseline, generic, and each source)."""
  sources = {s: runs_lib.read_record(study_dir / Cell("source", s, grid.source_seed).path)
             for s in grid.sources}
  rows = []
  for target in grid.targets:
    for seed in grid.seeds:
      base = runs_lib.read_record(study_dir / Cell("baseline", target, seed).path)
      if base is None:
        continue
      embedding = base.embedding()
      inits = [("baseline", Cell("baseline", target, seed))]
      inits += [(s, Cell("transfer", target, seed, s)) for s in grid.sources]
      if grid.generic:
        inits.append(("generic", Cell("generic", target, seed)))
      for init, cell in inits:
        outcome = runs_lib.read_record(study_dir / cell.path)
        if outcome is None:
          continue
        row = {"target": target, "seed": seed, "init": init, "score": outcome.score,
               "baseline_score": base.score,
               "relative_error_reduction": relative_error_reduction(outcome.score, base.score,
                                                                    settings.metric_max),
               "similarity_average": None, "similarity_per_token": None}
        if cell.kind == "transfer" and sources[init] is not None:
          source_embedding = sources[init].embedding()
          for metric in similarity.METRICS:
            row[f"similarity_{metric}"] = float(similarity.similarities(embedding, [source_embedding],
                                                                        metric)[0])
        rows.append(row)
  return rows


def _csv_value(value) -> str:
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return ""
  return repr(value) if isinstance(value, float) else str(value)


def write_tables(study_dir: pathlib.Path, rows: Sequence[dict], grid: Grid) -> None:
  """results.csv and results.json (rows, grid, and the task-embedding files for the report)."""
  buf = io.StringIO()
  writer = csv.writer(buf, lineterminator="\n")
  writer.writerow(COLUMNS)
  for row in rows:
    writer.writerow([_csv_value(row[c]) for c in COLUMNS])
  fileio.atomic_write_bytes(study_dir / "results.csv", buf.getvalue().encode())
  embeddings = {}
  for s in grid.sources:
    rec = runs_lib.read_record(study_dir / Cell("source", s, grid.source_seed).path)
    if rec is not None:
      embeddings[s] = str(rec.embedding_path.relative_to(study_dir))
  for t in grid.targets:
    rec = runs_lib.read_record(study_dir / Cell("baseline", t, min(grid.seeds)).path)
    if rec is not None and t not in embeddings:
      embeddings[t] = str(rec.embedding_path.relative_to(study_dir))
  doc = {"grid": dataclasses.asdict(grid), "columns": list(COLUMNS), "rows": list(rows),
         "embeddings": embeddings}
  fileio.atomic_write_bytes(study_dir / "results.json", json.dumps(doc, indent=1).encode())
