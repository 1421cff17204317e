"""`python -m spot_jax.bench`: see `spot_jax.bench.train_step`."""
import sys

from spot_jax import cli
from spot_jax.bench import train_step

if __name__ == "__main__":
  sys.exit(cli.run(train_step.main, sys.argv[1:], "spot_jax.bench"))
