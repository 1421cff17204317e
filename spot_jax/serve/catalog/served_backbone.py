"""The backbone and vocabulary `infer` serves, from its flags or from the runs it serves.

Every `spot_jax.train` run records its frozen backbone (config, checkpoint, seed, fingerprint)
and its task's vocabulary in run.json (`spot_jax.run_dir.RunRecord.backbone`). So serving run
directories needs no --model and no --vocab:

  --model given       the served config is --model's, the checkpoint --checkpoint's (none: the
                      random backbone of --seed); each run directory that recorded another
                      backbone is refused in one line naming both, unless --allow_backbone_change
  --model omitted     the config, checkpoint and random-backbone seed are the runs' record (all
                      run directories served must record the same backbone); --checkpoint
                      replaces the recorded checkpoint (the same refusal applies)
  --vocab omitted     the vocabulary the runs recorded (SentencePiece model and sentinels, or
                      bytes), else T5's (`spot_jax.vocabulary.get(None)`)

Only directories holding run.json count: .npy prompts, PEFT adapters and library entries record
no config (library entries are checked against the served fingerprint where they are loaded).

Both backbone kinds serve (`spot_jax.backbones.kinds`): a run records its kind with its config,
and a run of one kind is refused on the other in one line, even with --allow_backbone_change.
A decoder-only backbone reads the runs' recorded (task) vocabulary, or --vocab, or else the
tokenizer of its checkpoint directory; BOS is its config's.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
from typing import Any, Optional, Sequence

from spot_jax import backbone as backbone_lib
from spot_jax import cli
from spot_jax import embedded
from spot_jax.backbones import kinds
from spot_jax.cli import flags
from spot_jax.errors import ConfigError
from spot_jax.run_dir import RunDir, RunRecord

OVERRIDE_FLAG = "--allow_backbone_change"


@dataclasses.dataclass(frozen=True)
class ServedBackbone:
  """What `infer` serves on.

  Attributes:
    config: the T5Config (dropout off) or DecoderConfig.
    checkpoint: the frozen weights' local or remote path, or None for a random backbone.
    seed: the seed of the random backbone (unused with a checkpoint).
    origin: where the settings came from ("--model", or the run directory whose record it is).
    vocabularies: (run directory, recorded vocabulary) of every run that recorded one.
  """
  config: Any
  checkpoint: Optional[str]
  seed: int
  origin: str
  vocabularies: tuple[tuple[str, dict], ...] = ()

  def fingerprint(self) -> dict:
    """`spot_jax.backbone.fingerprint` of the served backbone (hashes the checkpoint's files)."""
    return backbone_lib.fingerprint(self.config, self.checkpoint, self.seed)

  @property
  def kind(self) -> str:
    """"t5" or "decoder"."""
    return kinds.kind_of(self.config)

  def network(self) -> Any:
    """The prompt-less frozen network: `Transformer(config)` or `DecoderLM(config)`."""
    # pylint: disable=g-import-not-at-top  (a job on one kind never imports the other)
    if self.kind == "decoder":
      from spot_jax.backbones.decoder.network import DecoderLM
      return DecoderLM(self.config)
    from spot_jax.backbones.t5.network import Transformer
    return Transformer(self.config)

  def model(self) -> Any:
    """The prompted model around `network()` (what `backbone.load_backbone` initialises)."""
    from spot_jax import models  # pylint: disable=g-import-not-at-top
    if self.kind == "decoder":
      return models.DecoderOnlyModel(self.network())
    return models.EncoderDecoderModel(self.network())

  def check_vocabulary(self, vocab: Any) -> None:
    """Refuses a vocabulary (a tokenizer) with more ids than the model's embedding table."""
    if vocab.vocab_size > self.config.vocab_size:
      what = getattr(vocab, "path", None) or "the vocabulary"
      raise ConfigError(f"{what} has {vocab.vocab_size} ids but the model's embedding table has "
                        f"{self.config.vocab_size} rows; give the model's own tokenizer (--vocab)")

  def vocabulary(self, flag: Optional[str]) -> Any:
    """The vocabulary of the inputs: --vocab's, else the runs' recorded one, else T5's (a
    decoder-only backbone: its checkpoint's tokenizer).

    Raises:
      ConfigError: runs that recorded different vocabularies, or a recorded file gone; a
        decoder-only backbone without any of them.
    """
    from spot_jax import vocabulary as vocab_lib  # pylint: disable=g-import-not-at-top
    if flag is None and not self.vocabularies and self.kind == "decoder":
      if not self.checkpoint or "://" in self.checkpoint:
        raise ConfigError("a decoder-only backbone without a checkpoint directory has no "
                          "tokenizer of its own; give --vocab ('byte' or a SentencePiece model)")
      from spot_jax.backbones.decoder import tokenizer  # pylint: disable=g-import-not-at-top
      return tokenizer.load_tokenizer(backbone_lib.resolve_checkpoint_path(self.checkpoint))
    if flag is not None or not self.vocabularies:
      return vocab_lib.get(flag)
    (where, first), *rest = self.vocabularies
    for other_where, other in rest:
      if other != first:
        raise ConfigError(f"--prompt {where} recorded the vocabulary {_describe_vocab(first)} and "
                          f"--prompt {other_where} {_describe_vocab(other)}; give --vocab, or "
                          "serve them in separate calls")
    return recorded_vocabulary(first, where)


def _describe_vocab(vocab: dict) -> str:
  if vocab.get("kind") == "byte":
    return "byte"
  return f"{vocab.get('path')} (+{vocab.get('extra_ids', 0)} sentinels)"


def recorded_vocabulary(vocab: dict, where: str) -> Any:
  """The vocabulary a run record describes ({"kind": "byte"} or {"kind": "sentencepiece", ...}).

  Raises:
    ConfigError: an unknown kind, or a SentencePiece file that no longer exists.
  """
  from spot_jax import vocabulary as vocab_lib  # pylint: disable=g-import-not-at-top
  kind = vocab.get("kind")
  if kind == "byte":
    return vocab_lib.Byte(int(vocab.get("extra_ids", 0) or 0))
  if kind != "sentencepiece" or not vocab.get("path"):
    raise ConfigError(f"{where}'s run.json records a vocabulary of kind {kind!r}; give --vocab "
                      f"('byte' or a SentencePiece model)")
  path, extra_ids = embedded.resolve(str(vocab["path"])), int(vocab.get("extra_ids", 0) or 0)
  if "://" in path:
    import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow's file systems)
    return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)
  if not os.path.isfile(path):
    raise ConfigError(f"{where}'s run.json records the vocabulary {path}, which does not exist; "
                      f"give --vocab")
  return vocab_lib.SentencePiece(path, extra_ids)


def recorded_runs(paths: Sequence[str]) -> list[tuple[str, RunRecord]]:
  """(path as given, record) of every --prompt that is a run directory holding run.json."""
  from spot_jax.serve.catalog import prompt_loaders  # pylint: disable=g-import-not-at-top
  out = []
  for path in paths:
    p = pathlib.Path(path)
    if (prompt_loaders.library_reference(path) is not None or not p.is_dir()
        or (p / "adapter_config.json").exists()):
      continue
    record = RunDir(p).read_record()
    if record is not None:
      out.append((path, record))
  return out


def recorded_config(record: RunRecord, where: str) -> Any:
  """The backbone config a run recorded: its kind's (a T5Config with dropout off, or a
  DecoderConfig).

  Raises:
    ConfigError: a record without a config, or with fields this version does not know.
  """
  fields = (record.backbone or {}).get("config")
  if not isinstance(fields, dict):
    raise ConfigError(f"{where}'s run.json records no backbone config; give --model (and "
                      f"--checkpoint)")
  fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
  kind = (record.backbone or {}).get("kind", "t5")
  if kind not in kinds.KINDS:
    raise ConfigError(f"{where}'s run.json records a backbone of kind {kind!r}; this version "
                      f"serves {', '.join(kinds.KINDS)}")
  cls = type(next(iter(kinds.named_configs(kind).values())))
  try:
    config = cls(**fields)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"{where}'s run.json records a backbone config this version cannot build "
                      f"({e}); give --model") from None
  return dataclasses.replace(config, dropout_rate=0.0) if kind == "t5" else config


def recorded_checkpoint(record: RunRecord, where: str) -> Optional[str]:
  """The checkpoint a run recorded ("embedded:..." resolved), None for a random backbone."""
  path = (record.backbone or {}).get("checkpoint")
  if not path:
    return None
  local = embedded.resolve(str(path))
  if "://" not in local and not os.path.exists(backbone_lib.resolve_checkpoint_path(local)):
    raise ConfigError(f"{where}'s run.json records the checkpoint {path}, which does not exist "
                      f"here; give --checkpoint (and --model)")
  return local


def _check_agree(runs: Sequence[tuple[str, RunRecord]]) -> None:
  """All run directories (served without --model) recorded the same backbone."""
  where, first = runs[0]
  for other_where, other in runs[1:]:
    if not backbone_lib.same_model(first.fingerprint, other.fingerprint):
      raise ConfigError(f"--prompt {where} was trained against frozen model "
                        f"{backbone_lib.describe(first.fingerprint)} and --prompt {other_where} "
                        f"against {backbone_lib.describe(other.fingerprint)}; serve them in "
                        f"separate calls, or give --model and --checkpoint with {OVERRIDE_FLAG}")


def resolve(paths: Sequence[str], *, config: Optional[Any], checkpoint: Optional[str] = None,
            seed: int = 0, allow_backbone_change: bool = False,
            weights_used: bool = True) -> ServedBackbone:
  """The backbone served for `--prompt` values `paths` (see the module docstring).

  Args:
    paths: the --prompt paths (run directories, .npy files, adapters, library entries).
    config: --model's config (dropout off), or None when --model was not given.
    checkpoint, seed: --checkpoint and --seed.
    allow_backbone_change: serve runs on a backbone other than the one they recorded.
    weights_used: False for exports, which read the config only: a run is then refused only
      when it recorded another config (a --model without the run's --checkpoint is fine).

  Raises:
    ConfigError: no --model and no run directory with a record; runs recording different
      backbones (without --model); a run recorded another backbone than the one given.
  """
  runs = recorded_runs(paths)
  vocabularies = tuple((w, r.backbone["vocabulary"]) for w, r in runs
                       if isinstance((r.backbone or {}).get("vocabulary"), dict))
  if config is not None:
    served = ServedBackbone(config, checkpoint, seed, "--model", vocabularies)
  elif not runs:
    raise ConfigError("--model is required unless a --prompt is a run directory whose run.json "
                      "records its backbone; give --model=<config name or gin file>")
  else:
    _check_agree(runs)
    where, record = runs[0]
    recorded_seed = int((record.backbone or {}).get("seed", record.seed))
    served = ServedBackbone(recorded_config(record, where),
                            checkpoint or recorded_checkpoint(record, where), recorded_seed,
                            where, vocabularies)
    if checkpoint is None:  # exactly the recorded backbone: nothing to compare
      return served
  check_kinds(runs, served.kind)
  if runs and not allow_backbone_change:
    if not weights_used:
      _check_configs(runs, served.config)
      return served
    current = served.fingerprint()
    for where, record in runs:
      backbone_lib.check_same(record.fingerprint, current, f"--prompt {where}", OVERRIDE_FLAG)
  return served


def check_kinds(runs: Sequence[tuple[str, RunRecord]], kind: str) -> None:
  """Refuses, in one line, a run of another backbone kind (no flag moves a prompt across)."""
  for where, record in runs:
    recorded = (record.backbone or {}).get("kind", "t5")
    if recorded != kind:
      trained = kinds.DESCRIPTIONS.get(recorded, recorded)
      raise ConfigError(f"--prompt {where} was trained on an {trained} backbone, not on the "
                        f"{kinds.DESCRIPTIONS[kind]} one served; a prompt does not move between "
                        f"backbone kinds: serve it on the backbone it was trained with")


def _check_configs(runs: Sequence[tuple[str, RunRecord]], config: Any) -> None:
  """Each run recorded `config` (the weight-defining fields; an export reads nothing else)."""
  given = backbone_lib.config_hash(config)
  for where, record in runs:
    if record.fingerprint.get("config") != given:
      raise ConfigError(f"--prompt {where} was trained against frozen model "
                        f"{backbone_lib.describe(record.fingerprint)}, whose config differs from "
                        f"--model's; give the --model it was trained with, or {OVERRIDE_FLAG}")

def add_served_flags(p: cli.ArgumentParser) -> None:
  """The flags `infer` and `serve` share: the backbone, and the prompts served on it."""
  flags.add_backbone(p, required=False, model_help="the frozen backbone: a config name or a gin "
                     "model file (default: the one the --prompt run directories recorded)",
                     checkpoint_help="the frozen backbone's checkpoint (default: the runs' "
                     "recorded one with no --model, else the random backbone of --seed)",
                     seed_help="seed of the random backbone (no --checkpoint) and of sampling")
  p.add_argument("--allow_backbone_change", action="store_true", help="serve run directories "
                 "on the --model/--checkpoint given, although they recorded another backbone")
  p.add_argument("--prompt", action="append", default=[], metavar="NAME=PATH",
                 help="a prompt (repeatable)")


def prompt_specs(values: Sequence[str]) -> list[tuple[str, str]]:
  """(name, path) of each --prompt NAME=PATH (or PATH, named by its file or library id)."""
  specs = []
  for i, v in enumerate(values):
    name, sep, path = v.partition("=")
    if not sep:  # a library entry is named by its id, anything else by its file or folder
      name, path = (v.rsplit("#", 1)[1] if "#" in v else pathlib.Path(v.rstrip("/")).stem), v
    if not name or not path:
      raise ConfigError(f"--prompt entry {i} ({v!r}) is malformed; use --prompt NAME=PATH or "
                        f"--prompt PATH")
    if name in (n for n, _ in specs):
      raise ConfigError(f"--prompt entry {i} ({v!r}) repeats the name {name!r}; give each prompt "
                        f"its own NAME=PATH")
    specs.append((name, path))
  return specs


def load_params(served: ServedBackbone) -> tuple[Any, Any]:
  """(frozen params, mesh to place the serving arrays on, or None: one process)."""
  import jax  # pylint: disable=g-import-not-at-top
  from spot_jax import backbone as backbone_lib  # pylint: disable=g-import-not-at-top
  if served.checkpoint and jax.process_count() == 1:
    # Straight onto the device: no mesh, no abstract init of its own.
    from spot_jax.backbones import kinds  # pylint: disable=g-import-not-at-top
    backbone_lib.check_initial_checkpoint(served.checkpoint)
    path = backbone_lib.resolve_checkpoint_path(served.checkpoint)
    return kinds.load_checkpoint(served.kind, path, served.config), None
  from spot_jax import partitioning  # pylint: disable=g-import-not-at-top
  model = served.model()
  mesh = partitioning.create_mesh(1)
  note = lambda line: print(line, file=sys.stderr)
  params, _ = backbone_lib.load_backbone(model, model.dummy_batch(4, 4), served.checkpoint,
                                         served.seed, mesh, partitioning.logical_rules(), info=note)
  return params, mesh
