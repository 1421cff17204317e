"""`python -m spot_jax.serve`: the HTTP serving program (see `spot_jax.serve.service`)."""
import sys

from spot_jax import cli
from spot_jax.serve import service

if __name__ == "__main__":
  service.host_devices(sys.argv[1:])
  sys.exit(cli.run(service.main, sys.argv[1:], service.PROG))
