"""Converts a Hugging Face T5 directory into a T5X (or orbax) checkpoint, and back.

  python -m spot_jax.convert --hf_dir=/models/t5-base-lm-adapt \
      --output_dir=/ckpts/t5_1_1_lm100k_base/checkpoint_0 [--format=t5x|orbax] \
      [--config_name=t5_1_1_lm100k_base] [--overwrite]
  python -m spot_jax.convert --checkpoint=/ckpts/t5_1_1_lm100k_base/checkpoint_1100000 \
      --config_name=t5_1_1_lm100k_base --output_dir=/models/t5-base-lm-adapt-hf [--overwrite]

The second form (T5X or orbax -> Hugging Face) writes config.json + model.safetensors
(`spot_jax.t5.hf_export`), e.g. as the base model of an exported PEFT prompt adapter.

The model config comes from the directory's config.json; with `--config_name` the checkpoint
must match that named config exactly. The T5X output (msgpack `checkpoint` + gzip zarr arrays,
float32) is read by `spot_jax.t5.load_checkpoint` and by t5x; tensors are streamed one block
at a time, so converting XXL needs little host memory. Bad input is one line on stderr,
`spot_jax.convert: error: ...`, and exit status 2 (`spot_jax.cli`).
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Optional, Sequence

from spot_jax import cli, fileio
from spot_jax.t5 import checkpoints, hf
from spot_jax.t5.config import CONFIGS, T5Config, config_by_name

_ARCH_FIELDS = ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim", "num_encoder_layers",
                "num_decoder_layers", "mlp_activations", "logits_via_embedding",
                "relative_attention_num_buckets", "relative_attention_max_distance",
                "layer_norm_epsilon")


def matching_names(config: T5Config) -> list[str]:
  """Registered config names with the same architecture as `config`."""
  key = lambda c: tuple(getattr(c, f) for f in _ARCH_FIELDS)
  return sorted(n for n, c in CONFIGS.items() if key(c) == key(config))


def convert(hf_dir: str, output_dir: str, *, format: str = "t5x",  # pylint: disable=redefined-builtin
            config_name: Optional[str] = None, overwrite: bool = False) -> tuple[T5Config, int, int]:
  """Writes the checkpoint; returns (config, number of tensors, number of parameters).

  Raises:
    FileNotFoundError: `hf_dir` or its config.json is missing.
    FileExistsError: `output_dir` exists and `overwrite` is False.
    ValueError: (including `CheckpointError`) for a config.json or weights that do not fit.
  """
  if not os.path.isdir(hf_dir):
    raise FileNotFoundError(f"--hf_dir {hf_dir} is not a directory")
  config_file = os.path.join(hf_dir, "config.json")
  if not os.path.isfile(config_file):
    raise FileNotFoundError(f"{config_file} not found; --hf_dir must be a Hugging Face T5 directory")
  if format not in ("t5x", "orbax"):
    raise ValueError(f"--format must be 't5x' or 'orbax', got {format!r}")
  if os.path.exists(output_dir) and not overwrite:
    raise FileExistsError(f"--output_dir {output_dir} exists; pass --overwrite to replace it")
  with open(config_file, encoding="utf-8") as f:
    config = hf.config_from_hf(json.load(f))
  if config_name:
    config = config_by_name(config_name)
  params = checkpoints.stored_arrays(hf_dir, config)
  checkpoints.save_checkpoint(_nest(params), output_dir, format=format, overwrite=overwrite)
  return config, len(params), sum(math.prod(a.shape) for a in params.values())


def _nest(flat: dict) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    *parents, leaf = path.split("/")
    node = tree
    for key in parents:
      node = node.setdefault(key, {})
    node[leaf] = value
  return tree


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Command-line entry point (run it through `cli.run`, which reports errors in one line)."""
  parser = cli.ArgumentParser(prog="spot_jax.convert", description=__doc__.split("\n")[0])
  parser.add_argument("--hf_dir", default=None, help="Hugging Face T5 directory (config.json + weights)")
  parser.add_argument("--checkpoint", default=None,
                      help="T5X or orbax checkpoint to convert to a Hugging Face directory "
                           "(needs --config_name)")
  parser.add_argument("--output_dir", default=None,
                      help="checkpoint (or, with --checkpoint, Hugging Face) directory to create")
  parser.add_argument("--format", default="t5x", choices=("t5x", "orbax"))
  parser.add_argument("--config_name", default=None,
                      help="named spot-jax config the checkpoint must match (default: from config.json)")
  parser.add_argument("--overwrite", action="store_true", help="replace an existing --output_dir")
  parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
  args = parser.parse_args(argv)
  if (args.hf_dir is None) == (args.checkpoint is None):
    parser.error("give exactly one of --hf_dir (HF -> T5X) or --checkpoint (T5X/orbax -> HF)")
  if not args.output_dir:
    parser.error("the following arguments are required: --output_dir")
  # before reading any weights: the result is staged beside --output_dir, in its folder
  fileio.writable_dir(os.path.dirname(os.path.abspath(args.output_dir)), "--output_dir's folder")
  if args.checkpoint is not None:
    return _to_hf(args)
  config, tensors, size = convert(args.hf_dir, args.output_dir, format=args.format,
                                  config_name=args.config_name, overwrite=args.overwrite)
  names = matching_names(config)
  arch = f"config {', '.join(names)}" if names else f"config {config}"
  print(f"wrote {args.format} checkpoint with {tensors} tensors ({size:,} parameters, float32; "
        f"{arch}) to {args.output_dir}")
  return 0


def _to_hf(args) -> int:
  """--checkpoint -> Hugging Face directory (the dispatch of `main`)."""
  if not args.config_name:
    raise ValueError("--checkpoint needs --config_name (T5X checkpoints do not record their "
                     f"architecture); valid: {', '.join(sorted(CONFIGS))}")
  from spot_jax.t5 import hf_export  # pylint: disable=g-import-not-at-top
  config = config_by_name(args.config_name)
  params = checkpoints.load_checkpoint(args.checkpoint, config)
  tensors = hf_export.export_hf(params, config, args.output_dir, overwrite=args.overwrite)
  print(f"wrote Hugging Face T5 directory with {tensors} tensors (config {args.config_name}) "
        f"to {args.output_dir}")
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "spot_jax.convert"))
