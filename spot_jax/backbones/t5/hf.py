"""Hugging Face T5 checkpoints: config translation and tensor names mapped onto the t5x tree.

A Hugging Face T5 directory holds `config.json` and the weights as `model.safetensors`, sharded
safetensors (`model.safetensors.index.json`) or `pytorch_model.bin` (torch is imported only for
the last). Names map onto the t5x parameter tree of `spot_jax.backbones.t5.Transformer` as follows
(linear weights are stored [out, in] by PyTorch and transposed to t5x's [in, out]):

  shared.weight [V, E]                        -> token_embedder/embedding
  {enc,dec}oder.embed_tokens.weight           -> aliases of shared.weight (must be equal)
  lm_head.weight [V, E]                       -> decoder/logits_dense/kernel [E, V]  (untied);
                                                 an alias of shared.weight when tied
  {stack}.block.{i}.layer.{j}.SelfAttention.{q,k,v,o}.weight
                                              -> {stack}/layers_{i}/(self_)attention/{query,...}
  decoder.block.{i}.layer.1.EncDecAttention.* -> decoder/layers_{i}/encoder_decoder_attention/*
  {stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight [buckets, H]
                                              -> {stack}/relpos_bias/rel_embedding [H, buckets]
  ....layer.{j}.layer_norm.weight             -> pre_{attention,self_attention,cross_attention,
                                                 mlp}_layer_norm/scale
  ....DenseReluDense.{wi,wi_0,wi_1,wo}.weight -> {stack}/layers_{i}/mlp/{wi,wi_0,wi_1,wo}/kernel
  {stack}.final_layer_norm.weight             -> {stack}/{stack}_norm/scale

Hugging Face never uses `decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight`
(old exports carry it); it is the one stored tensor skipped on purpose (`IGNORED_HF_NAMES`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Callable, Mapping, Optional

import numpy as np

from spot_jax.errors import ConfigError
from spot_jax.backbones.t5.config import T5Config

Index = tuple[slice, ...]

EMBEDDING_PATH = "token_embedder/embedding"
LOGITS_PATH = "decoder/logits_dense/kernel"
IGNORED_HF_NAMES = frozenset(
    {"decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"})
_EMBEDDING_ALIASES = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")

# HF activation name (the part after "gated-") -> spot-jax activation name.
_HF_ACTIVATIONS = {"relu": "relu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu",
                   "gelu": "gelu_exact", "silu": "silu", "swish": "silu"}

# spot-jax field -> config.json field, for the fields a checkpoint's shapes or numerics depend on.
_HF_FIELDS = {
    "vocab_size": "vocab_size", "emb_dim": "d_model", "num_heads": "num_heads",
    "head_dim": "d_kv", "mlp_dim": "d_ff", "num_encoder_layers": "num_layers",
    "num_decoder_layers": "num_decoder_layers", "mlp_activations": "feed_forward_proj",
    "logits_via_embedding": "tie_word_embeddings/scale_decoder_outputs",
    "relative_attention_num_buckets": "relative_attention_num_buckets",
    "relative_attention_max_distance": "relative_attention_max_distance",
    "layer_norm_epsilon": "layer_norm_epsilon",
}


def config_from_hf(hf_config: Mapping[str, Any]) -> T5Config:
  """The `T5Config` equivalent to a Hugging Face T5 `config.json` (as a dict).

  Original T5 (`feed_forward_proj="relu"`, tied and scaled logits) maps to
  `logits_via_embedding=True`; T5.1.1 / LM-adapted (`"gated-gelu"`, `tie_word_embeddings=false`,
  or `scale_decoder_outputs=false` as transformers>=5 writes it) to `logits_via_embedding=False`.

  Raises:
    ValueError: for a model type other than t5/mt5, a missing size field or an activation
      spot-jax does not implement.
  """
  model_type = hf_config.get("model_type", "t5")
  if model_type not in ("t5", "mt5"):
    raise ConfigError(f"config.json model_type {model_type!r} is not supported; valid: 't5', 'mt5'")
  missing = [k for k in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")
             if k not in hf_config]
  if missing:
    raise ConfigError(f"config.json lacks {', '.join(missing)}; a T5 config.json needs vocab_size, "
                      "d_model, d_kv, d_ff, num_layers and num_heads")
  num_layers = int(hf_config["num_layers"])
  return T5Config(
      vocab_size=int(hf_config["vocab_size"]),
      emb_dim=int(hf_config["d_model"]),
      num_heads=int(hf_config["num_heads"]),
      head_dim=int(hf_config["d_kv"]),
      mlp_dim=int(hf_config["d_ff"]),
      num_encoder_layers=num_layers,
      num_decoder_layers=int(hf_config.get("num_decoder_layers") or num_layers),
      mlp_activations=_activations(str(hf_config.get("feed_forward_proj", "relu"))),
      dropout_rate=float(hf_config.get("dropout_rate", 0.1)),
      logits_via_embedding=_scales_logits(hf_config),
      relative_attention_num_buckets=int(hf_config.get("relative_attention_num_buckets", 32)),
      relative_attention_max_distance=int(hf_config.get("relative_attention_max_distance", 128)),
      layer_norm_epsilon=float(hf_config.get("layer_norm_epsilon", 1e-6)),
  )


def config_mismatches(hf_config: Mapping[str, Any], config: T5Config) -> list[str]:
  """One message per architecture field where `config.json` disagrees with `config`."""
  hf = config_from_hf(hf_config)
  return [f"config.json {hf_name}={getattr(hf, field)!r} but "
          f"T5Config.{field}={getattr(config, field)!r}"
          for field, hf_name in _HF_FIELDS.items() if getattr(hf, field) != getattr(config, field)]


def _activations(feed_forward_proj: str) -> tuple[str, ...]:
  parts = feed_forward_proj.split("-")
  gated = len(parts) == 2 and parts[0] == "gated"
  if len(parts) > 2 or (len(parts) == 2 and not gated):
    raise ConfigError(f"config.json feed_forward_proj {feed_forward_proj!r} must be 'ACT' or "
                      "'gated-ACT'")
  # transformers maps "gated-gelu" (T5.1.1) to the tanh approximation, plain "gelu" to exact GELU.
  name = "gelu_new" if feed_forward_proj == "gated-gelu" else parts[-1]
  if name not in _HF_ACTIVATIONS:
    raise ConfigError(f"config.json feed_forward_proj {feed_forward_proj!r}: activation {name!r} "
                      f"is not supported; valid: {', '.join(sorted(_HF_ACTIVATIONS))}")
  act = _HF_ACTIVATIONS[name]
  return (act, "linear") if gated else (act,)


def _scales_logits(hf_config: Mapping[str, Any]) -> bool:
  # transformers>=5 always ties in its config and records the scaling separately.
  if "scale_decoder_outputs" in hf_config:
    return bool(hf_config["scale_decoder_outputs"])
  return hf_config.get("tie_word_embeddings", True) is not False


_BLOCK = re.compile(r"(encoder|decoder)\.block\.(\d+)\.layer\.(\d+)\.(.+)\.weight")
_PROJ = {"q": "query", "k": "key", "v": "value", "o": "out"}
# (stack, sub-layer index) -> (attention module name or None for the MLP, layer-norm name).
_SUBLAYERS = {
    ("encoder", 0): ("SelfAttention", "attention", "pre_attention_layer_norm"),
    ("encoder", 1): ("DenseReluDense", "mlp", "pre_mlp_layer_norm"),
    ("decoder", 0): ("SelfAttention", "self_attention", "pre_self_attention_layer_norm"),
    ("decoder", 1): ("EncDecAttention", "encoder_decoder_attention",
                     "pre_cross_attention_layer_norm"),
    ("decoder", 2): ("DenseReluDense", "mlp", "pre_mlp_layer_norm"),
}


def t5x_name(hf_name: str, tied: bool) -> Optional[tuple[str, bool]]:
  """(t5x parameter path, transpose?) for a Hugging Face tensor name; None if it has no place.

  Args:
    hf_name: e.g. "encoder.block.0.layer.0.SelfAttention.q.weight".
    tied: the output layer is the embedding (then `lm_head.weight` is an alias of it).
  """
  if hf_name in _EMBEDDING_ALIASES or (tied and hf_name == "lm_head.weight"):
    return EMBEDDING_PATH, False
  if hf_name == "lm_head.weight":
    return LOGITS_PATH, True
  m = re.fullmatch(r"(encoder|decoder)\.final_layer_norm\.weight", hf_name)
  if m:
    return f"{m[1]}/{m[1]}_norm/scale", False
  m = _BLOCK.fullmatch(hf_name)
  if not m or (m[1], int(m[3])) not in _SUBLAYERS:
    return None
  stack, block, rest = m[1], int(m[2]), m[4]
  hf_module, module, norm = _SUBLAYERS[(stack, int(m[3]))]
  layer = f"{stack}/layers_{block}"
  if rest == "layer_norm":
    return f"{layer}/{norm}/scale", False
  if rest == "SelfAttention.relative_attention_bias":
    return (f"{stack}/relpos_bias/rel_embedding", True) if block == 0 and module != "mlp" else None
  head, _, leaf = rest.partition(".")
  if head != hf_module:
    return None
  if module == "mlp" and leaf in ("wi", "wi_0", "wi_1", "wo"):
    return f"{layer}/mlp/{leaf}/kernel", True
  if module != "mlp" and leaf in _PROJ:
    return f"{layer}/{module}/{_PROJ[leaf]}/kernel", True
  return None


@dataclasses.dataclass(frozen=True)
class HFTensor:
  """One stored tensor, read lazily.

  Attributes:
    name: the Hugging Face name.
    file: the file holding it.
    shape: stored (PyTorch) shape.
    read: returns `tensor[index]` (a tuple of slices) as a numpy array in the stored dtype
      (torch bfloat16 comes back as float32); callers cast.
  """
  name: str
  file: str
  shape: tuple[int, ...]
  read: Callable[[Index], np.ndarray]


def weight_files(directory: str) -> list[str]:
  """The weight files of a Hugging Face directory, safetensors preferred.

  Raises:
    FileNotFoundError: when the directory holds none of the known weight files.
  """
  for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
    index = os.path.join(directory, index_name)
    if os.path.exists(index):
      with open(index, encoding="utf-8") as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
      return [os.path.join(directory, s) for s in shards]
  for name in ("model.safetensors", "pytorch_model.bin"):
    if os.path.exists(os.path.join(directory, name)):
      return [os.path.join(directory, name)]
  raise ConfigError(f"{directory} holds no Hugging Face weights; expected model.safetensors, "
                    "model.safetensors.index.json or pytorch_model.bin")


def open_tensors(directory: str) -> dict[str, HFTensor]:
  """All tensors of a Hugging Face directory by name, without reading their data."""
  tensors: dict[str, HFTensor] = {}
  for path in weight_files(directory):
    opened = _open_safetensors(path) if path.endswith(".safetensors") else _open_torch(path)
    for t in opened:
      if t.name in tensors:
        raise ConfigError(f"tensor {t.name} is stored twice ({tensors[t.name].file} and {t.file})")
      tensors[t.name] = t
  return tensors


def _open_safetensors(path: str) -> list[HFTensor]:
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  as_numpy = safe_open(path, framework="numpy")
  out = []
  for name in as_numpy.keys():
    sl = as_numpy.get_slice(name)
    if sl.get_dtype() in ("BF16", "F8_E4M3", "F8_E5M2"):
      # numpy has no bfloat16: read these through the flax backend, still slice by slice.
      sl = safe_open(path, framework="flax").get_slice(name)
    out.append(HFTensor(name, path, tuple(sl.get_shape()), lambda idx, sl=sl: np.asarray(sl[idx])))
  return out


def _open_torch(path: str) -> list[HFTensor]:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError(f"reading {path} needs PyTorch (pip install torch), or convert the "
                      "checkpoint to model.safetensors") from None
  try:
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
  except RuntimeError:  # pre-zipfile torch.save format cannot be memory-mapped
    state = torch.load(path, map_location="cpu", weights_only=True)

  def read(idx: Index, t: Any) -> np.ndarray:
    part = t[idx]
    return part.to(torch.float32).numpy() if part.is_floating_point() else part.numpy()
  return [HFTensor(name, path, tuple(t.shape), lambda idx, t=t: read(idx, t))
          for name, t in state.items()]
