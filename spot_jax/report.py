"""`python -m spot_jax.report`: figures and tables of a SPoT study.

  python -m spot_jax.report --study_dir=/runs/study [--output_dir=/runs/study/report] [--similarity=average]

Writes transfer_heatmap.png, similarity_heatmap.png, similarity_vs_transfer.png and report.md
(see spot_jax/spot/figures.py).
"""
from __future__ import annotations

import sys
from typing import Sequence

from spot_jax import cli
from spot_jax.cli import flags
from spot_jax.spot import figures
from spot_jax.spot import similarity

PROG = "spot_jax.report"


def main(argv: Sequence[str]) -> int:
  parser = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  parser.add_argument("--study_dir", required=True)
  flags.add_output_dir(parser, "where the figures and report.md go (default: <study_dir>/report)")
  parser.add_argument("--similarity", default="average", choices=similarity.METRICS)
  args = parser.parse_args(argv)
  result = figures.write(args.study_dir, args.output_dir, args.similarity)
  print(f"wrote {result['out_dir']}/report.md and 3 figures")
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], PROG))
