"""`infer --export_npy / --export_peft / --export_peft_mpt`: one served prompt written out.

  export_npy       a bare [L, E] prompt (google-research/prompt-tuning's format)
  export_peft      a PEFT adapter: SEQ_2_SEQ_LM prompt or prefix tuning on T5 (`peft_io`),
                   CAUSAL_LM prompt or prefix tuning on a decoder-only model (`peft_causal`)
  export_peft_mpt  an MPT run unfolded as a MULTITASK_PROMPT_TUNING adapter (`peft_mpt`)

Each refuses, in one line, a prompt its file cannot hold (a mixture, a DePT offset, a deep
prompt where only an input prompt fits).
"""
from __future__ import annotations

import os

from spot_jax import fileio, validate
from spot_jax.backbones import kinds
from spot_jax.errors import ConfigError


def single(table, what: str):
  """The table's one entry, if `what` can write it (one-line ConfigError otherwise)."""
  if len(table) != 1:
    raise ConfigError(f"{what} exports one prompt; {len(table)} given ({', '.join(table.names)})")
  entry = table.entries[0]
  if entry.deep and what != "--export_peft":
    raise ConfigError(f"prompt {entry.name!r} is a deep prompt (per-layer prefixes); {what} holds "
                      f"one [L, E] input prompt (its run's prompts/*.npy is the deep record)")
  if entry.num_prompts != 1:
    raise ConfigError(f"prompt {entry.name!r} is a per-input mixture of {entry.num_prompts} "
                      f"prompts ({entry.routing} routing, SMoP or ATTEMPT); {what} holds one [L, "
                      "E] prompt")
  if entry.offset is not None:
    raise ConfigError(f"prompt {entry.name!r} is a DePT prompt with an offset of the input "
                      f"embeddings; {what} holds one [L, E] prompt without it")
  return entry


def export_mpt(args, specs, config) -> int:
  """--export_peft_mpt: the one MPT run or adapter of `specs`, unfolded."""
  from spot_jax.serve.export import peft_mpt  # pylint: disable=g-import-not-at-top
  if len(specs) != 1:
    raise ConfigError(f"--export_peft_mpt exports one MPT prompt; {len(specs)} given")
  fileio.writable_dir(os.path.dirname(os.path.abspath(args.export_peft_mpt)),
                      "--export_peft_mpt's folder")
  arrays = peft_mpt.source_arrays(specs[0][1], config)
  peft_mpt.export_adapter(arrays, config, args.export_peft_mpt,
                          base_model_name_or_path=args.base_model, overwrite=args.overwrite)
  k, length, r = arrays["task_cols"].shape
  print(f"wrote PEFT multitask prompt-tuning adapter ({k} tasks, {length} tokens x "
        f"{arrays['shared'].shape[1]}, rank {r}) of {specs[0][0]!r} to {args.export_peft_mpt}")
  return 0


def export(args, table, config) -> int:
  """--export_peft or --export_npy of the table's one entry."""
  from spot_jax.serve.export import peft_io  # pylint: disable=g-import-not-at-top
  if args.export_peft:
    entry = single(table, "--export_peft")
    fileio.writable_dir(os.path.dirname(os.path.abspath(args.export_peft)),
                        "--export_peft's folder")
    if kinds.kind_of(config) == "decoder":
      return export_causal(args, entry, config)
    if entry.deep:
      if entry.has_tokens or entry.length:
        raise ConfigError(f"prompt {entry.name!r} is not plain decoder prefixes; peft's prefix "
                          f"tuning holds decoder self-attention prefixes only")
      peft_io.export_prefix_adapter(entry.deep, config, args.export_peft,
                                    base_model_name_or_path=args.base_model,
                                    overwrite=args.overwrite)
      print(f"wrote PEFT prefix-tuning adapter ({entry.deep['decoder'].shape[2]} prefix positions "
            f"x {config.num_decoder_layers} decoder layers) of {entry.name!r} to "
            f"{args.export_peft}")
      return 0
    peft_io.export_adapter(entry.prompts[0], config, args.export_peft,
                           base_model_name_or_path=args.base_model, overwrite=args.overwrite)
    print(f"wrote PEFT prompt-tuning adapter ({entry.length} tokens x {entry.width}) of "
          f"{entry.name!r} to {args.export_peft}")
  else:
    entry = single(table, "--export_npy")
    validate.output_file(args.export_npy, "--export_npy")
    if os.path.exists(args.export_npy) and not args.overwrite:
      raise ConfigError(f"{args.export_npy} exists; pass --overwrite to replace it")
    peft_io.export_npy(entry.prompts[0], args.export_npy)
    print(f"wrote [{entry.length}, {entry.width}] prompt {entry.name!r} to {args.export_npy}")
  return 0


def export_causal(args, entry, config) -> int:
  """--export_peft of a decoder-only prompt: a PEFT CAUSAL_LM adapter (prompt or prefixes)."""
  from spot_jax.serve.export import peft_causal  # pylint: disable=g-import-not-at-top
  fileio.writable_dir(os.path.dirname(os.path.abspath(args.export_peft)), "--export_peft's folder")
  if entry.has_tokens:
    raise ConfigError(f"prompt {entry.name!r} is P-tuning v2 prompt tokens, which become key/value "
                      f"prefixes only through the frozen weights; --export_peft writes prefix "
                      f"tuning's plain prefixes (train PrefixTuning, or serve this prompt)")
  if entry.deep:
    peft_causal.export_prefix_adapter(entry.deep["decoder"], config, args.export_peft,
                                      base_model_name_or_path=args.base_model,
                                      overwrite=args.overwrite)
    what = f"prefix-tuning adapter ({entry.deep['decoder'].shape[2]} prefix positions)"
  else:
    peft_causal.export_prompt_adapter(entry.prompts[0], config, args.export_peft,
                                      base_model_name_or_path=args.base_model,
                                      overwrite=args.overwrite)
    what = f"prompt-tuning adapter ({entry.length} tokens x {entry.width})"
  print(f"wrote PEFT CAUSAL_LM {what} of {entry.name!r} to {args.export_peft}")
  return 0
