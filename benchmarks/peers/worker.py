"""The command line shared by the peer benchmark processes (`peft_train`, `t5x_train`).

`benchmarks --vs=...` starts each peer in its own process with the same shape and run
settings; both parse them here so their flags, checks and errors stay one piece of code.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from typing import Callable, Optional, Sequence

from spot_jax import cli
from spot_jax.cli import flags
from spot_jax import runtime
from spot_jax import validate
from spot_jax.errors import ConfigError


def parser(prog: str, description: str, shape_help: str) -> cli.ArgumentParser:
  """A parser with the shape (JSON) and the run settings every peer takes; add your own flags."""
  p = cli.ArgumentParser(prog=prog, description=description)
  p.add_argument("--shape", required=True, help=shape_help)
  p.add_argument("--batch_size", type=int, default=8)
  flags.add_lengths(p, 128, 16)
  p.add_argument("--prompt_length", type=int, default=100)
  p.add_argument("--dropout_rate", type=float, default=0.1)
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--warmup", type=int, default=1)
  return p


def parse(p: argparse.ArgumentParser, argv: Sequence[str], shape_source: str
          ) -> tuple[argparse.Namespace, dict]:
  """Parses `argv`; returns the flags and the decoded `--shape`.

  Raises:
    ConfigError: a non-positive size or step count, or a `--shape` that is not JSON (naming
      `shape_source`, the function whose output it should be).
  """
  args = p.parse_args(argv)
  for flag in ("batch_size", "input_length", "target_length", "prompt_length", "steps"):
    validate.positive_int(getattr(args, flag), f"--{flag}")
  try:
    shape = json.loads(args.shape)
  except json.JSONDecodeError as e:
    raise ConfigError(f"--shape is not JSON ({e}); give the output of {shape_source}") from e
  return args, shape


def peak_host_memory_bytes() -> int:
  """The process's peak resident set size so far (Linux reports ru_maxrss in KiB)."""
  return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def run(main: Callable[[Sequence[str]], Optional[int]], prog: str) -> int:
  """A peer's `spot_jax.cli.run` over sys.argv (one error line, exit 2 or 1, --debug): with
  spot-jax's host-memory setting only when its parent asked for it (SPOT_JAX_MALLOC=keep in the
  environment, `bench --peer_malloc=keep`)."""
  return cli.run(main, sys.argv[1:], prog, keep_heap=os.environ.get(runtime.ENV) == "keep")
