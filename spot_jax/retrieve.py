"""`python -m spot_jax.retrieve`: pick source prompts for a new target task and train it.

  python -m spot_jax.retrieve --library=/lib --target_task=spot_glue_rte_v200 \
    --strategy=best_of_top_k --k=3 --output_dir=/runs/retrieve_rte \
    --model=gin/models/t5_1_1_lm100k_base.gin --checkpoint=/ckpts/... \
    --train_steps=30000 --embedding_step=10000 --prompt_length=100

Several strategies may be given, comma-separated (best_of_top_k, weighted_average, mixture,
smop_experts, smop, generic, baseline). It prints the ranking (the similarities), what each
strategy chose and its validation score, and writes the same as JSON to
<output_dir>/retrieval-<key>.json, where <key> is a short hash of the settings that determine the
result (target, library content, strategies, k, similarity, seed, model and budgets). Every run is
kept under <output_dir>/runs/, keyed the same way: a rerun with other settings keeps the earlier
results, and a rerun with the same settings reuses (or resumes) its runs and trains nothing again.
"""
from __future__ import annotations

import sys
from typing import Sequence

from spot_jax import cli, validate
from spot_jax.cli import flags
from spot_jax import fileio
from spot_jax.errors import ConfigError
from spot_jax import backbone as backbone_lib
from spot_jax.spot import library as prompt_library
from spot_jax.spot import experts
from spot_jax.spot import retrieve as retrieval
from spot_jax.spot import settings as settings_lib
from spot_jax.spot import similarity

PROG = "spot_jax.retrieve"


def _parser() -> cli.ArgumentParser:
  parser = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  parser.add_argument("--library", required=True, help="the prompt library directory")
  parser.add_argument("--target_task", required=True)
  parser.add_argument("--strategy", default="best_of_top_k",
                      help=f"comma-separated, of: {', '.join(retrieval.STRATEGIES)}")
  parser.add_argument("--k", type=int, default=3)
  parser.add_argument("--similarity", default="average", choices=similarity.METRICS)
  parser.add_argument("--expert_length", type=int, default=5, help="tokens per SMoP expert")
  parser.add_argument("--compression", default="mean_pool", choices=experts.COMPRESSIONS,
                      help="how a source prompt becomes an SMoP expert")
  flags.add_output_dir(parser, "where the runs and the retrieval-<key>.json reports go (kept per "
                               "settings, resumable)", required=True)
  parser.add_argument("--verbose", action="store_true", help="the trainer's progress lines")
  settings_lib.add_flags(parser, seed=True)
  return parser


def main(argv: Sequence[str]) -> int:
  args = _parser().parse_args(argv)
  strategies = list(flags.name_list("--strategy", args.strategy, retrieval.STRATEGIES))
  validate.positive_int(args.k, "--k", optional=True)
  validate.positive_int(args.expert_length, "--expert_length", optional=True)
  options = retrieval.Options(k=args.k, metric=args.similarity, seed=args.seed,
                              expert_length=args.expert_length, compression=args.compression)
  settings = settings_lib.from_flags(args)
  settings_lib.check_tasks([args.target_task], args.task_module)
  lib = prompt_library.Library(args.library)
  header = lib.header()
  if header is None:
    raise ConfigError(f"--library {args.library!r} is empty or missing; add source prompts with "
                      f"`python -m spot_jax.library add`")
  expected = settings.fingerprint_for(args.seed)
  if not backbone_lib.same_model(header["fingerprint"], expected):
    raise ConfigError(f"the library belongs to another frozen model "
                      f"({backbone_lib.describe(header['fingerprint'])}) than --model/"
                      f"--checkpoint/--seed ({backbone_lib.describe(expected)})")
  entries, problems = lib.load()
  for line in problems:
    print(f"{PROG}: warning: {line}", file=sys.stderr)
  work_dir = fileio.writable_dir(args.output_dir, "--output_dir")
  report = retrieval.retrieve(settings, args.target_task, entries, strategies, work_dir, options,
                              library=str(lib.root.resolve()))
  print(f"wrote {retrieval.write_report(work_dir, report)}")
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], PROG))
