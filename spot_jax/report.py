"""`python -m spot_jax.report`: figures and tables of a SPoT study.

  python -m spot_jax.report --study_dir=/runs/study [--out_dir=/runs/study/report] [--similarity=average]

Writes transfer_heatmap.png, similarity_heatmap.png, similarity_vs_transfer.png, retrieval.png
and report.md, every number with its interval over seeds (spot_jax/spot/study_report.py).
"""
from __future__ import annotations

import sys
from typing import Sequence

from spot_jax import cli
from spot_jax.spot import study_report

PROG = "spot_jax.report"


def main(argv: Sequence[str]) -> int:
  parser = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  parser.add_argument("--study_dir", required=True)
  parser.add_argument("--out_dir", default=None, help="default: <study_dir>/report")
  parser.add_argument("--similarity", default="average", help="average or per_token")
  parser.add_argument("--debug", action="store_true")
  args = parser.parse_args(argv)
  result = study_report.write(args.study_dir, args.out_dir, args.similarity)
  print(f"wrote {result['out_dir']}/report.md and 4 figures")
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], PROG))
