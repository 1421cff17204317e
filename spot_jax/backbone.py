"""The frozen backbone: its identity (fingerprint) and loading it onto a mesh.

`load_backbone` places the frozen parameters (strictly loaded from a checkpoint, or random from
the run seed) with the rule table's shardings; `seed_keys` are a run's (backbone, prompt, state)
keys.

The identity of a frozen backbone: its configuration plus its checkpoint's files.

Two prompts can only be compared or transferred when they were trained against the same frozen
model. A fingerprint is a dict {"id", "config", "checkpoint", "model", "kind"}: `config` hashes
the config fields that define the weights' meaning (dropout, activation and stored dtypes and
remat excluded; a decoder-only config's hash also covers its kind, so no config of one kind
shares a hash with one of the other), `kind` is the backbone kind ("t5" or "decoder",
`backbones.kinds`), `checkpoint` is "random:<seed>" for a randomly initialised backbone, or a
hash of every file of the checkpoint directory (relative path, size, first and last MiB), which
is cheap for multi-GB checkpoints and changes whenever a file does.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any, Callable, Mapping, Optional

import jax

from spot_jax import models
from spot_jax import partitioning
from spot_jax import paths
from spot_jax.backbones import kinds
from spot_jax.backbones import quantization
from spot_jax.errors import ConfigError

# How the weights are computed with and held (activation dtype, stored dtype, remat,
# quantization), not what they are: a prompt trained on bfloat16 or int8 weights belongs to the
# same model as on float32 ones.
_IGNORED_FIELDS = ("dropout_rate", "dtype", "param_dtype", "remat_policy", "quantization",
                   "quantization_tile")
_CHUNK = 1 << 20


def _kind(config: Any) -> Optional[str]:
  """The backbone kind of `config`, or None for a dataclass of no kind."""
  try:
    return kinds.kind_of(config)
  except TypeError:
    return None


def config_hash(config: Any) -> str:
  """sha256 of the weight-defining fields of a backbone config (any dataclass)."""
  fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in _IGNORED_FIELDS}
  if _kind(config) not in (None, "t5"):  # T5's hashes are the ones its runs recorded
    fields["kind"] = _kind(config)
  return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def checkpoint_identity(path: Optional[str], seed: int) -> str:
  """"random:<seed>" without a checkpoint, else "files:<sha256>" of the checkpoint's files."""
  if not path:
    return f"random:{int(seed)}"
  if "://" in str(path):  # a remote checkpoint is known by its address (its files are not read)
    return f"path:{str(path).rstrip('/')}"
  root = pathlib.Path(resolve_checkpoint_path(path))
  if not root.exists():
    raise ConfigError(f"checkpoint {path!r} does not exist; give the frozen model's checkpoint "
                      f"directory")
  files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
  digest = hashlib.sha256()
  for file in files:
    size = file.stat().st_size
    digest.update(f"{file.relative_to(root) if file != root else file.name}\0{size}\0".encode())
    with open(file, "rb") as f:
      digest.update(f.read(_CHUNK))
      if size > 2 * _CHUNK:
        f.seek(size - _CHUNK)
        digest.update(f.read(_CHUNK))
      elif size > _CHUNK:
        digest.update(f.read())
  return "files:" + digest.hexdigest()


def fingerprint(config: Any, checkpoint_path: Optional[str], seed: int = 0) -> dict[str, str]:
  """{"id": short combined hash, "config": ..., "checkpoint": ..., "model": ...} of a frozen
  backbone; "model" names it as a user writes it (`model_name`), for messages only: the identity
  is "id" (`same_model`).

  Args:
    config: the backbone's config (T5Config or DecoderConfig).
    checkpoint_path: INITIAL_CHECKPOINT_PATH, or None for a random backbone.
    seed: the run seed (it seeds a random backbone; ignored with a checkpoint).
  """
  cfg, ckpt = config_hash(config), checkpoint_identity(checkpoint_path, seed)
  ident = hashlib.sha256(f"{cfg}|{ckpt}".encode()).hexdigest()[:16]
  return {"id": ident, "config": cfg, "checkpoint": ckpt,
          "model": model_name(cfg, checkpoint_path, seed), "kind": _kind(config) or "t5"}


def config_names(config_digest: str) -> list[str]:
  """The registered config names of every kind (`CONFIGS` of `spot_jax.backbones.t5.config` and
  `spot_jax.backbones.decoder.config`, the gin/models/<name>.gin files) whose weight-defining
  fields hash to `config_digest` (several share one: t5_1_1_small and t5_1_1_lm100k_small)."""
  return [name for kind in kinds.KINDS for name, c in kinds.named_configs(kind).items()
          if config_hash(c) == config_digest]


def model_name(config_digest: str, checkpoint_path: Optional[str], seed: int) -> str:
  """A backbone as a user names it: "t5_1_1_toy + checkpoint spot_jax/embedded/toy_t5/checkpoint",
  "t5_1_1_small + random weights of seed 0" (a config of no registered name: "config <hash>")."""
  names = config_names(config_digest)
  config = " or ".join(names) if names else f"config {config_digest[:16]}"
  if not checkpoint_path:
    return f"{config} + random weights of seed {int(seed)}"
  found = resolve_checkpoint_path(str(checkpoint_path))
  if not paths.is_remote(found):
    from spot_jax import embedded  # pylint: disable=g-import-not-at-top
    portable = embedded.portable(found)
    found = (os.path.join("spot_jax", "embedded", portable[len(embedded.EMBEDDED_PREFIX):])
             if portable.startswith(embedded.EMBEDDED_PREFIX) else portable)
  return f"{config} + checkpoint {found}"


def describe_vocabulary(vocab: Any) -> Optional[dict]:
  """What a run records of its task's vocabulary, so that serving it needs no --vocab.

  {"kind": "sentencepiece", "path": <portable path>, "extra_ids": n} for a SentencePiece model
  (seqio's, or spot-jax's deferred T5 vocabulary), {"kind": "byte"} for seqio's byte vocabulary,
  None for anything else (serving then needs the vocabulary named).
  """
  from spot_jax import embedded  # pylint: disable=g-import-not-at-top
  path = getattr(vocab, "sentencepiece_model_file", None)
  if path:
    local = path if "://" in path else os.path.abspath(path)
    return {"kind": "sentencepiece",
            "path": embedded.portable(local) if "://" not in local else local,
            "extra_ids": int(getattr(vocab, "extra_ids", 0) or 0)}
  if type(vocab).__name__ == "ByteVocabulary":
    return {"kind": "byte"}
  return None


def record(config: Any, checkpoint_path: Optional[str], seed: int, vocabulary: Any = None) -> dict:
  """The backbone part of a run record (`spot_jax.run_dir.RunRecord.backbone`)."""
  from spot_jax import embedded  # pylint: disable=g-import-not-at-top
  checkpoint = None
  if checkpoint_path:
    found = resolve_checkpoint_path(str(checkpoint_path))  # the files the run loads
    checkpoint = found if paths.is_remote(found) else embedded.portable(found)
  return {"kind": _kind(config) or "t5",
          "config": json.loads(json.dumps(dataclasses.asdict(config), default=list)),
          "checkpoint": checkpoint, "seed": int(seed),
          "fingerprint": fingerprint(config, checkpoint_path, seed),
          "vocabulary": describe_vocabulary(vocabulary) if vocabulary is not None else None}


def check_same(recorded: dict, current: dict, where: str, flag: str) -> None:
  """Refuses, in one line naming both, a backbone other than the one a run was trained with.

  Args:
    recorded: the run's recorded fingerprint.
    current: the fingerprint of the backbone given now.
    where: the run directory (for the message).
    flag: how to override on purpose (e.g. "--gin.ALLOW_BACKBONE_CHANGE=True").
  """
  if not same_model(recorded, current):
    old, new = recorded.get("kind", "t5"), current.get("kind", "t5")
    if old != new:  # a prompt cannot move between kinds: the flag would not help
      raise ConfigError(f"{where} was trained against the {kinds.DESCRIPTIONS.get(old, old)} "
                        f"frozen model {describe(recorded)}, not the "
                        f"{kinds.DESCRIPTIONS.get(new, new)} {describe(current)} given now; a "
                        f"prompt does not move between backbone kinds: give the backbone it was "
                        f"trained with, or a new MODEL_DIR")
    raise ConfigError(f"{where} was trained against frozen model {describe(recorded)}, not "
                      f"{describe(current)} given now; give the backbone it was trained with "
                      f"(config and checkpoint), or {flag} to move the prompt on purpose")


def same_model(a: dict, b: dict) -> bool:
  return isinstance(a, dict) and isinstance(b, dict) and a.get("id") == b.get("id")


def describe(fp: dict) -> str:
  """"t5_1_1_toy + checkpoint ... (fingerprint 55ef93f43347aa1f)": the name, the id as proof
  (a fingerprint recorded without a name: the id and the start of its checkpoint identity)."""
  if fp.get("model"):
    return f"{fp['model']} (fingerprint {fp.get('id', '?')})"
  ckpt = str(fp.get("checkpoint", "?"))
  return f"{fp.get('id', '?')} ({ckpt[:22]}{'...' if len(ckpt) > 22 else ''})"


def resolve_checkpoint_path(path: str) -> str:
  """Where a checkpoint path points, by the one rule of `spot_jax.paths` (absolute when found).

  A relative path means the working directory first, then the spot-jax root, so
  `spot_jax/embedded/toy_t5/checkpoint` (the embedded model) works from any directory. A path
  found in neither place is returned unchanged (`check_initial_checkpoint` names it).
  """
  return paths.find(path)


def check_initial_checkpoint(path: str) -> None:
  """A one-line error when a local INITIAL_CHECKPOINT_PATH exists neither here nor
  in the repository."""
  if "://" not in path and not os.path.exists(resolve_checkpoint_path(path)):
    where = ("" if os.path.isabs(path)
             else f" (looked in {' and '.join(paths.search_roots())})")
    raise ConfigError(f"INITIAL_CHECKPOINT_PATH {path!r} does not exist{where}; give a T5X "
                      "checkpoint directory (checkpoint_N), an orbax checkpoint or a Hugging Face "
                      "model directory")


def seed_keys(seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(backbone, prompt, state) keys of a run; shared by training and evaluation."""
  backbone_rng, prompt_rng, state_rng = jax.random.split(jax.random.PRNGKey(seed), 3)
  return backbone_rng, prompt_rng, state_rng


def divisible_hint(rules) -> str:
  """What a user can change when the frozen weights do not divide over the mesh."""
  fsdp = dict(rules).get("embed") == partitioning.DATA
  return ("give a device count and NUM_PARTITIONS whose mesh axes divide it"
          + (", or FSDP=False" if fsdp else ""))


def resolve_frozen_dtype(model: Any, checkpoint_path: Optional[str],
                         trainable: str = "prompt") -> Any:
  """`model` with its config's `param_dtype` decided: FROZEN_DTYPE as given, else (None) the
  checkpoint's (`backbones.kinds.stored_dtype`); float32 when the backbone trains
  (trainable="all": its optimizer updates need float32 weights)."""
  config = model.config
  if config.param_dtype is not None:
    return model
  if trainable != "prompt" or not checkpoint_path:
    dtype = "float32"
  else:
    dtype = kinds.stored_dtype(kinds.kind_of(config), resolve_checkpoint_path(checkpoint_path))
  return model.with_config(dataclasses.replace(config, param_dtype=dtype))


def load_backbone(model: Any, dummy: Mapping[str, jax.Array],
                  initial_checkpoint_path: Optional[str], seed: int, mesh, rules,
                  info: Callable[[str], None] = print) -> tuple[Any, Any]:
  """The frozen backbone on `mesh` (strictly loaded, or random from `seed`) and its shardings.

  `model` is an `EncoderDecoderModel` or a `DecoderOnlyModel`; its config's kind picks the
  checkpoint loader (`backbones.kinds.load_checkpoint`). The weights are read array by array in
  the config's `param_dtype` (None: the checkpoint's, `resolve_frozen_dtype`), then quantized
  once as its `quantization` says (`backbones.quantization`). Call outside
  `nn.logical_axis_rules`: shardings are explicit here. `rules` are the frozen parameters'
  rules (`partitioning.frozen_rules`); a mesh that does not divide a weight is refused in one
  line.
  """
  if initial_checkpoint_path:
    check_initial_checkpoint(initial_checkpoint_path)
  model = resolve_frozen_dtype(model, initial_checkpoint_path)
  backbone_rng = seed_keys(seed)[0]
  abstract = jax.eval_shape(model.init_backbone, backbone_rng, dummy)
  partitioning.check_divisible(abstract, partitioning.param_shardings(abstract, mesh, rules),
                              mesh, hint=divisible_hint(rules))
  shardings = quantization.shardings(abstract, model.config, mesh, rules)
  if initial_checkpoint_path:
    path = resolve_checkpoint_path(initial_checkpoint_path)
    params = kinds.load_checkpoint(kinds.kind_of(model.config), path, model.config, mesh=mesh,
                                   rules=rules)
    return params, shardings
  info(f"note: no INITIAL_CHECKPOINT_PATH; the backbone is randomly initialised (seed {seed}); "
       f"fine for smoke tests, meaningless for research")
  init = jax.jit(lambda r: models.unbox(model.init_backbone(r, dummy)),
                 out_shardings=partitioning.param_shardings(abstract, mesh, rules))
  params = quantization.quantize(init(backbone_rng), abstract, model.config, mesh=mesh, rules=rules)
  return params, shardings
