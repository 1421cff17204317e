"""`python -m spot_jax.report`: figures and tables of a SPoT study.

  python -m spot_jax.report --study_dir=/runs/study [--output_dir=/runs/study/report]
  [--similarity=average]

Writes transfer_heatmap.png, similarity_heatmap.png, similarity_vs_transfer.png, retrieval.png
and report.md, every number with its interval over seeds (spot_jax/spot/report.py).
A --study_dir that is not a study's folder (missing, a file, empty, without results.json, or
with a results.json of something else) is a one-line error that says what was expected,
and nothing is written.
"""
from __future__ import annotations

import sys
from typing import Sequence

from spot_jax import cli
from spot_jax import validate
from spot_jax.cli import flags
from spot_jax.errors import ConfigError
from spot_jax.spot import similarity
from spot_jax.spot import report as study_report

PROG = "spot_jax.report"
STUDY_DIR = "the folder of a `python -m spot_jax.study` run, where it wrote results.json"
EXPECTED = f"give {STUDY_DIR}"


def check_study_dir(study_dir: str) -> None:
  """A one-line ConfigError unless `study_dir` is a folder with a results.json.

  What that results.json holds is checked where it is read (`study_report.load`).
  """
  path = validate.existing_dir(study_dir, "--study_dir", STUDY_DIR)
  if (path / "results.json").is_file():
    return
  try:
    names = sorted(p.name for p in path.iterdir())
  except OSError as e:
    raise ConfigError(f"--study_dir {study_dir!r} cannot be read ({e.strerror}); "
                      f"{EXPECTED}") from None
  if not names:
    raise ConfigError(f"--study_dir {study_dir!r} is empty; {EXPECTED}")
  shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
  raise ConfigError(f"--study_dir {study_dir!r} has no results.json (it holds {shown}); {EXPECTED}")


def main(argv: Sequence[str]) -> int:
  parser = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  parser.add_argument("--study_dir", required=True)
  flags.add_output_dir(parser, "where the figures and report.md go (default: <study_dir>/report)")
  parser.add_argument("--similarity", default="average", choices=similarity.METRICS)
  args = parser.parse_args(argv)
  check_study_dir(args.study_dir)
  result = study_report.write(args.study_dir, args.output_dir, args.similarity)
  print(f"wrote {result['out_dir']}/report.md and 4 figures")
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], PROG))
