"""`python -m benchmarks`: see `benchmarks.train_step`."""
import sys

from spot_jax import cli
from benchmarks import train_step

if __name__ == "__main__":
  sys.exit(cli.run(train_step.main, sys.argv[1:], "benchmarks"))
