"""`python -m spot_jax.study`: the SPoT transferability grid
(sources x targets x seeds + baselines).

  python -m spot_jax.study --study_dir=/runs/study \
    --model=gin/models/t5_1_1_lm100k_base.gin --checkpoint=/ckpts/... \
    [--sources=a,b,...] [--targets=x,y,...] [--seeds=0,1,2] [--generic] [--retrieval_k=3] \
    [--one_at_a_time] [--shard_index=0 --num_shards=1]

Defaults: the paper's 16 source and 10 target tasks (tasks.names) and seeds 0,1,2. The runs of
each job (every source; every target x seed; every target x seed from one source; ...) train
as K runs in one jitted step (spot_jax/spot/study.py). Resumable: rerun the same command after
an interruption; finished runs are skipped and a half-finished job resumes from its checkpoints.
Writes <study_dir>/results.csv and results.json (scores and relative error reduction against
the same seed's prompt-tuning baseline); `python -m spot_jax.report` draws them with intervals.
"""
from __future__ import annotations

import pathlib
import sys
from typing import Sequence

from spot_jax import cli
from spot_jax import fileio
from spot_jax import stats
from spot_jax import validate
from spot_jax.cli import flags
from spot_jax.errors import ConfigError
from spot_jax.spot import study as grid_lib
from spot_jax.spot import study_tables
from spot_jax.spot import settings as settings_lib
from spot_jax.spot import similarity

PROG = "spot_jax.study"


def _parser() -> cli.ArgumentParser:
  parser = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  parser.add_argument("--study_dir", required=True)
  parser.add_argument("--sources", default=None,
                      help="comma-separated source tasks (default: the paper's 16)")
  parser.add_argument("--targets", default=None,
                      help="comma-separated target tasks (default: the paper's 10)")
  parser.add_argument("--seeds", default="0,1,2",
                      help="comma-separated target-run seeds (distinct)")
  parser.add_argument("--source_seed", type=int, default=0,
                      help="seed of the source runs (and of a random backbone, shared by all runs)")
  parser.add_argument("--source_train_steps", type=int, default=None,
                      help="training steps of the source runs (default: --train_steps)")
  parser.add_argument("--generic", action="store_true",
                      help="also generic SPoT (mixture of all sources)")
  parser.add_argument("--retrieval_k", type=int, default=0,
                      help="also train SPoT's top-k weighted average and top-k mixture per target "
                           "and seed (0: not)")
  parser.add_argument("--similarity", default="average", choices=similarity.METRICS,
                      help="similarity ranking the sources of the retrieval runs")
  parser.add_argument("--one_at_a_time", action="store_true",
                      help="train every run alone instead of K runs in one step (wall-time "
                           "comparison)")
  parser.add_argument("--shard_index", type=int, default=0)
  parser.add_argument("--num_shards", type=int, default=1)
  parser.add_argument("--verbose", action="store_true", help="the trainer's progress lines")
  settings_lib.add_flags(parser)
  return parser


def _tasks(flag: str, value, default: Sequence[str], module: str) -> tuple[str, ...]:
  """The tasks of --sources/--targets, each registered (an unknown one is named with its index)."""
  names = tuple(default) if value is None else flags.name_list(flag, value)
  for i, name in enumerate(names):
    try:
      settings_lib.check_tasks([name], module)
    except ConfigError as e:
      raise ConfigError(f"{flag}: entry {i} ({name!r}): {e}") from None
  return names


def main(argv: Sequence[str]) -> int:
  args = _parser().parse_args(argv)
  if args.num_shards < 1 or not 0 <= args.shard_index < args.num_shards:
    raise ConfigError(f"--shard_index={args.shard_index} --num_shards={args.num_shards}; valid: "
                      f"num_shards >= 1 and 0 <= shard_index < num_shards")
  default_sources: Sequence[str] = ()
  default_targets: Sequence[str] = ()
  if args.sources is None or args.targets is None:
    from tasks import names  # pylint: disable=g-import-not-at-top
    default_sources, default_targets = names.SOURCE_TASKS.values(), names.TARGET_TASKS.values()
  seeds = tuple(stats.check_seeds(flags.int_list("--seeds", args.seeds, minimum=0), "--seeds"))
  validate.positive_int(args.source_seed, "--source_seed", minimum=0, optional=True)
  validate.positive_int(args.retrieval_k, "--retrieval_k", minimum=0, optional=True)
  settings = settings_lib.from_flags(args)
  if args.source_train_steps is not None and not settings.embedding_step <= args.source_train_steps:
    raise ConfigError(f"--source_train_steps={args.source_train_steps} must be a positive integer "
                      f">= --embedding_step={settings.embedding_step} (the source embedding is "
                      "exported then)")
  grid = grid_lib.Grid(sources=_tasks("--sources", args.sources, default_sources, args.task_module),
                       targets=_tasks("--targets", args.targets, default_targets, args.task_module),
                       seeds=seeds, source_seed=args.source_seed, generic=args.generic,
                       source_train_steps=args.source_train_steps, retrieval_k=args.retrieval_k,
                       similarity=args.similarity)
  if args.one_at_a_time and not args.checkpoint:
    raise ConfigError("--one_at_a_time needs --checkpoint: a single run's random backbone follows "
                      "its own seed, a job's follows --source_seed")
  fileio.writable_dir(args.study_dir, "--study_dir")
  counts = grid_lib.run(settings, args.study_dir, grid, shard_index=args.shard_index,
                        num_shards=args.num_shards, one_at_a_time=args.one_at_a_time,
                        verbose=args.verbose)
  # The tables come from every finished run, so sharded or interrupted studies give the same.
  rows = study_tables.collect(settings, pathlib.Path(args.study_dir), grid)
  study_tables.write_tables(pathlib.Path(args.study_dir), rows, grid, settings)
  print(f"{counts['ran']} runs in {counts['jobs']} jobs run, {counts['skipped']} already finished, "
        f"{counts['waiting']} waiting; {len(rows)} rows in "
        f"{pathlib.Path(args.study_dir) / 'results.csv'}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], PROG))
