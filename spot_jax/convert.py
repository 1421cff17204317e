"""Converts a Hugging Face T5 directory into a T5X (or orbax) checkpoint, and back; and
decoder-only models (Llama, Gemma 2/3, Qwen) between Hugging Face and the gemma library's orbax
layout (`spot_jax.backbones.decoder.convert`).

  python -m spot_jax.convert --hf_dir=/models/t5-base-lm-adapt \
      --output_dir=/ckpts/t5_1_1_lm100k_base/checkpoint_0 [--format=t5x|orbax] \
      [--model=t5_1_1_lm100k_base] [--overwrite]
  python -m spot_jax.convert --checkpoint=/ckpts/t5_1_1_lm100k_base/checkpoint_1100000 \
      --model=t5_1_1_lm100k_base --output_dir=/models/t5-base-lm-adapt-hf [--overwrite]

The second form (T5X or orbax -> Hugging Face) writes config.json + model.safetensors
(`spot_jax.backbones.t5.hf_export`), e.g. as the base model of an exported PEFT prompt adapter.

Decoder-only models take the same flags: a `--hf_dir` whose config.json names a decoder model
type becomes a Gemma orbax checkpoint (`--format=gemma`, the default for them), and
`--checkpoint` with a decoder `--model` (e.g. gemma_3_1b) becomes a Hugging Face directory.

The model config comes from the directory's config.json; with `--model` (a config name or a gin
model file) the checkpoint must match that config exactly. The T5X output (msgpack `checkpoint` +
gzip zarr arrays, float32) is read by `spot_jax.backbones.t5.load_checkpoint` and by t5x;
tensors are streamed one block at a time, so converting XXL needs little host memory. Bad input
is one line on stderr, `spot_jax.convert: error: ...`, and exit status 2 (`spot_jax.cli`).
"""
from __future__ import annotations

import math
import os
import sys
from typing import Optional, Sequence

from spot_jax import cli, fileio
from spot_jax import validate
from spot_jax.cli import flags
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import checkpoints, hf
from spot_jax.backbones.t5.config import CONFIGS, T5Config, config_by_name

_ARCH_FIELDS = ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim", "num_encoder_layers",
                "num_decoder_layers", "mlp_activations", "logits_via_embedding",
                "relative_attention_num_buckets", "relative_attention_max_distance",
                "layer_norm_epsilon")


def matching_names(config: T5Config) -> list[str]:
  """Registered config names with the same architecture as `config`."""
  key = lambda c: tuple(getattr(c, f) for f in _ARCH_FIELDS)
  return sorted(n for n, c in CONFIGS.items() if key(c) == key(config))


def convert(hf_dir: str, output_dir: str, *, format: str = "t5x",  # pylint: disable=redefined-builtin
            config_name: Optional[str] = None, overwrite: bool = False,
            config: Optional[T5Config] = None) -> tuple[T5Config, int, int]:
  """Writes the checkpoint; returns (config, number of tensors, number of parameters).

  Args:
    hf_dir: the Hugging Face T5 directory.
    output_dir: the checkpoint directory to create.
    format: "t5x" or "orbax".
    config_name: a registered config the weights must match (default: config.json's).
    overwrite: replace an existing `output_dir`.
    config: the config the weights must match, instead of `config_name`.

  Raises:
    ConfigError: (including `CheckpointError`) `hf_dir` or its config.json is missing or does
      not fit, or `output_dir` exists and `overwrite` is False.
  """
  validate.existing_dir(hf_dir, "--hf_dir", "a Hugging Face T5 directory")
  config_file = os.path.join(hf_dir, "config.json")
  if not os.path.isfile(config_file):
    raise ConfigError(f"{config_file} not found; --hf_dir must be a Hugging Face T5 directory")
  if format not in ("t5x", "orbax"):
    raise ConfigError(f"--format must be 't5x' or 'orbax', got {format!r}")
  if os.path.exists(output_dir) and not overwrite:
    raise ConfigError(f"--output_dir {output_dir} exists; pass --overwrite to replace it")
  hf_config = hf.config_from_hf(fileio.read_json(config_file, "--hf_dir's config.json"))
  config = config or (config_by_name(config_name) if config_name else hf_config)
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
  parser.add_argument("--hf_dir", default=None,
                      help="Hugging Face T5 directory (config.json + weights)")
  flags.add_backbone(parser, required=False, seed=False,
                     model_help="the config the checkpoint must match: a config name or a gin "
                                "model file (default with --hf_dir: from config.json; needed with "
                                "--checkpoint)",
                     checkpoint_help="T5X or orbax checkpoint to convert to a Hugging Face "
                                     "directory (needs --model)")
  flags.add_output_dir(parser,
                       "checkpoint (or, with --checkpoint, Hugging Face) directory to create")
  parser.add_argument("--format", default=None, choices=("t5x", "orbax", "gemma"),
                      help="t5x (default for T5) or orbax; gemma for decoder-only models")
  parser.add_argument("--overwrite", action="store_true", help="replace an existing --output_dir")
  args = parser.parse_args(argv)
  if (args.hf_dir is None) == (args.checkpoint is None):
    parser.error("give exactly one of --hf_dir (HF -> T5X) or --checkpoint (T5X/orbax -> HF)")
  if not args.output_dir:
    parser.error("the following arguments are required: --output_dir")
  # before reading any weights: the result is staged beside --output_dir, in its folder
  fileio.writable_dir(os.path.dirname(os.path.abspath(args.output_dir)), "--output_dir's folder")
  decoder = _decoder_config(args)
  if decoder is not None or (args.hf_dir and _decoder_dir(args.hf_dir)):
    return _convert_decoder(args, decoder)
  if args.format == "gemma":
    raise ConfigError("--format=gemma is for decoder-only models (Gemma, Llama, Qwen); a T5 "
                      "checkpoint converts to --format=t5x or --format=orbax")
  args.format = args.format or "t5x"
  if args.checkpoint is not None:
    return _to_hf(args)
  config = flags.model_config(args.model, args.model_binding) if args.model else None
  config, tensors, size = convert(args.hf_dir, args.output_dir, format=args.format,
                                  overwrite=args.overwrite, config=config)
  names = matching_names(config)
  arch = f"config {', '.join(names)}" if names else f"config {config}"
  print(f"wrote {args.format} checkpoint with {tensors} tensors ({size:,} parameters, float32; "
        f"{arch}) to {args.output_dir}")
  return 0


def _decoder_dir(hf_dir: str) -> bool:
  """Whether --hf_dir holds a decoder-only model (by its config.json's model_type)."""
  from spot_jax.backbones.decoder import convert as decoder_convert  # pylint: disable=g-import-not-at-top
  config_file = os.path.join(hf_dir, "config.json")
  return os.path.isfile(config_file) and decoder_convert.is_decoder_dir(
      fileio.read_json(config_file, "--hf_dir's config.json"))


def _decoder_config(args) -> Optional[object]:
  """--model's DecoderConfig when it names a decoder config, else None (a T5 name or file)."""
  from spot_jax.backbones.decoder import config as decoder_config  # pylint: disable=g-import-not-at-top
  if args.model and args.model in decoder_config.CONFIGS:
    if args.model_binding:
      raise ConfigError("--model_binding applies to a gin model file; give --model=<file>.gin")
    return decoder_config.config_by_name(args.model)
  return None


def _convert_decoder(args, config) -> int:
  """The decoder-only conversions (`spot_jax.backbones.decoder.convert`)."""
  from spot_jax.backbones.decoder import convert as decoder_convert  # pylint: disable=g-import-not-at-top
  if args.format not in (None, "gemma"):
    raise ConfigError(f"--format={args.format} is a T5 format; a decoder-only model converts "
                      "to --format=gemma (Hugging Face -> the gemma library's orbax layout)")
  if args.checkpoint is not None:
    if config is None:
      from spot_jax.backbones.decoder import config as decoder_config  # pylint: disable=g-import-not-at-top
      raise ConfigError("--checkpoint of a decoder-only model needs --model, a decoder config "
                        f"name: {', '.join(sorted(decoder_config.CONFIGS))}")
    size = decoder_convert.to_hf(args.checkpoint, config, args.output_dir,
                                 overwrite=args.overwrite)
    print(f"wrote Hugging Face directory ({size:,} parameters, float32; config {args.model}) "
          f"to {args.output_dir}")
    return 0
  config, size = decoder_convert.hf_to_gemma(args.hf_dir, args.output_dir, config=config,
                                             overwrite=args.overwrite)
  print(f"wrote Gemma orbax checkpoint ({size:,} parameters, float32) to {args.output_dir}")
  return 0


def _to_hf(args) -> int:
  """--checkpoint -> Hugging Face directory (the dispatch of `main`)."""
  if not args.model:
    raise ConfigError("--checkpoint needs --model (T5X checkpoints do not record their "
                      f"architecture); valid config names: {', '.join(sorted(CONFIGS))}")
  from spot_jax.backbones.t5 import hf_export  # pylint: disable=g-import-not-at-top
  config = flags.model_config(args.model, args.model_binding)
  params = checkpoints.load_checkpoint(args.checkpoint, config)
  tensors = hf_export.export_hf(params, config, args.output_dir, overwrite=args.overwrite)
  print(f"wrote Hugging Face T5 directory with {tensors} tensors (config {args.model}) "
        f"to {args.output_dir}")
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "spot_jax.convert"))
