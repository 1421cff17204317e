"""Hugging Face transformers configs and state dicts <-> `DecoderConfig` and our parameter tree.

Model types: llama (LlamaForCausalLM), gemma2, gemma3_text (Gemma3ForCausalLM), gemma3 (the
multimodal config: its text_config; the checkpoint's `language_model` weights, vision weights
dropped), qwen2 and qwen3. Both config formats of transformers are read: 5.x's
`rope_parameters` (per layer type for Gemma 3) and 4.x's `rope_theta` / `rope_scaling` /
`rope_local_base_freq`. `config_to_hf` writes 5.x's.

Tensor layout: transformers' Linear stores [out, in]; our kernels are [in, ...] with heads
split out: q_proj [N*D, E] <-> query/kernel [E, N, D], o_proj [E, N*D] <-> out/kernel [N, D, E],
gate/up_proj [F, E] <-> wi_0/wi_1 [E, F], down_proj [E, F] <-> wo [F, E]; norm weights are
copied as stored (Gemma's zero-centred). Llama's `post_attention_layernorm` is the norm before
the MLP (our pre_mlp_norm); Gemma's is the norm after attention (post_attention_norm), whose
pre-MLP norm is `pre_feedforward_layernorm`.

The mapping is strict both ways: a missing, extra or mis-shaped tensor is a `ConfigError` whose
one line names it. A tied model's `lm_head.weight` (which `state_dict()` lists) is accepted only
if it equals the embedding.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Optional

import numpy as np
from flax import traverse_util

from spot_jax.errors import ConfigError
from spot_jax.backbones.decoder.config import DecoderConfig, RopeScaling

MODEL_TYPES = ("gemma2", "gemma3", "gemma3_text", "llama", "qwen2", "qwen3")
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                  "gemma3_text": "Gemma3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM"}
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_new": "gelu_tanh", "gelu": "gelu"}
_ROPE_TYPES = ("default", "linear", "llama3")
_LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}
_MAX_LISTED = 4


# ----------------------------------------------------------------------------------- config


def _rope(params: Mapping[str, Any], default_theta: float, max_positions: int
          ) -> tuple[float, Optional[RopeScaling]]:
  """(theta, scaling) of one transformers rope dict ({"rope_type", "rope_theta", ...})."""
  kind = params.get("rope_type", params.get("type", "default"))
  if kind not in _ROPE_TYPES:
    raise ConfigError(f"rope_type {kind!r} is not supported; valid: {', '.join(_ROPE_TYPES)}")
  if params.get("partial_rotary_factor", 1.0) != 1.0:
    raise ConfigError(f"partial_rotary_factor={params['partial_rotary_factor']} is not "
                      "supported; valid: 1.0 (RoPE on the whole head)")
  theta = float(params.get("rope_theta") or default_theta)
  if kind == "default":
    return theta, None
  if kind == "linear":
    return theta, RopeScaling("linear", float(params["factor"]))
  return theta, RopeScaling("llama3", float(params["factor"]), float(params["low_freq_factor"]),
                            float(params["high_freq_factor"]),
                            int(params.get("original_max_position_embeddings") or max_positions))


def _rope_fields(d: Mapping[str, Any], model_type: str) -> dict[str, Any]:
  """rope_theta, rope_local_theta and rope_scaling of a config dict, 5.x or 4.x format."""
  maxpos = int(d.get("max_position_embeddings") or 8192)
  params = d.get("rope_parameters") or {}
  legacy = dict(d.get("rope_scaling") or {})
  if model_type != "gemma3_text":
    theta, scaling = _rope({**legacy, "rope_theta": d.get("rope_theta"), **params}, 10000.0,
                           maxpos)
    return dict(rope_theta=theta, rope_local_theta=None, rope_scaling=scaling)
  full = params.get("full_attention") or {**legacy, "rope_theta": d.get("rope_theta")}
  local = params.get("sliding_attention") or {"rope_theta": d.get("rope_local_base_freq")}
  theta, scaling = _rope(full, 1_000_000.0, maxpos)
  local_theta, local_scaling = _rope(local, 10_000.0, maxpos)
  if (local_theta, local_scaling) == (theta, scaling):
    return dict(rope_theta=theta, rope_local_theta=None, rope_scaling=scaling)
  if local_scaling is not None:
    raise ConfigError("a Gemma 3 config whose sliding layers have a rope scaling of their own "
                      "is not supported; valid: rope_type 'default' on sliding_attention")
  return dict(rope_theta=theta, rope_local_theta=local_theta, rope_scaling=scaling)


def _layer_types(d: Mapping[str, Any], model_type: str, layers: int) -> tuple[str, ...]:
  if d.get("layer_types"):
    unknown = sorted(set(d["layer_types"]) - set(_LAYER_TYPES))
    if unknown:
      raise ConfigError(f"layer type {unknown[0]!r} is not supported; valid: "
                        f"{', '.join(_LAYER_TYPES)}")
    return tuple(_LAYER_TYPES[t] for t in d["layer_types"])
  if model_type == "gemma2":
    return tuple("sliding" if (i + 1) % 2 else "full" for i in range(layers))
  if model_type == "gemma3_text":
    every = int(d.get("sliding_window_pattern") or 6)
    return tuple("sliding" if (i + 1) % every else "full" for i in range(layers))
  if model_type in ("qwen2", "qwen3") and d.get("use_sliding_window"):
    return tuple("sliding" if i >= d.get("max_window_layers", 28) else "full"
                 for i in range(layers))
  return ()


def _refuse_unsupported(d: Mapping[str, Any], model_type: str) -> None:
  if model_type in ("llama", "qwen3", "gemma2", "gemma3_text") and d.get("attention_bias"):
    raise ConfigError(f"{model_type} with attention_bias=true (an output-projection bias) is "
                      "not supported; valid: attention_bias=false")
  if d.get("mlp_bias"):
    raise ConfigError("mlp_bias=true is not supported; valid: mlp_bias=false")
  if d.get("use_bidirectional_attention"):
    raise ConfigError("use_bidirectional_attention=true (an encoder) is not supported; valid: "
                      "false (causal attention)")


def config_from_hf(config_dict: Mapping[str, Any]) -> DecoderConfig:
  """The DecoderConfig of a transformers config.json dict (activations float32).

  Raises:
    ConfigError: an unknown model_type, activation, rope type or layer type, or a feature
      the network does not have; one line naming what is valid.
  """
  d = dict(config_dict)
  model_type = d.get("model_type")
  if model_type not in MODEL_TYPES:
    raise ConfigError(f"model_type {model_type!r} is not a supported decoder-only model; valid: "
                      f"{', '.join(MODEL_TYPES)}")
  if model_type == "gemma3":
    d = {"tie_word_embeddings": d.get("tie_word_embeddings", True), **d.get("text_config", {})}
    model_type = "gemma3_text"
  _refuse_unsupported(d, model_type)
  gemma = model_type.startswith("gemma")
  act = (d.get("hidden_activation") or d.get("hidden_act")) if gemma else d.get("hidden_act")
  if act not in _ACTIVATIONS:
    raise ConfigError(f"activation {act!r} is not supported; valid: {', '.join(_ACTIVATIONS)}")
  heads, layers = int(d["num_attention_heads"]), int(d["num_hidden_layers"])
  head_dim = int(d.get("head_dim") or d["hidden_size"] // heads)
  types = _layer_types(d, model_type, layers)
  eos = d.get("eos_token_id")
  eos = eos[0] if isinstance(eos, (list, tuple)) else eos
  fields = dict(
      vocab_size=int(d["vocab_size"]), emb_dim=int(d["hidden_size"]), num_heads=heads,
      num_kv_heads=int(d.get("num_key_value_heads") or heads), num_layers=layers,
      head_dim=head_dim, mlp_dim=int(d["intermediate_size"]), mlp_activation=_ACTIVATIONS[act],
      norm_epsilon=float(d.get("rms_norm_eps", 1e-6)), norm_offset=1.0 if gemma else 0.0,
      post_norms=gemma, qk_norm=model_type in ("gemma3_text", "qwen3"),
      attention_bias=model_type == "qwen2", layer_types=types,
      sliding_window=int(d["sliding_window"]) if "sliding" in types else None,
      attn_logit_softcap=d.get("attn_logit_softcapping"),
      final_logit_softcap=d.get("final_logit_softcapping"),
      query_pre_attn_scalar=(float(d.get("query_pre_attn_scalar") or head_dim) if gemma
                             else None),
      scale_embeddings=gemma,
      tie_word_embeddings=bool(d.get("tie_word_embeddings", gemma)),
      max_position_embeddings=int(d.get("max_position_embeddings") or 8192),
      bos_id=1 if d.get("bos_token_id") is None else int(d["bos_token_id"]),
      eos_id=2 if eos is None else int(eos), pad_id=d.get("pad_token_id"),
      **_rope_fields(d, model_type))
  return DecoderConfig(**fields)


def model_type_of(config: DecoderConfig) -> str:
  """The transformers model_type that computes what `config` does.

  Raises:
    ConfigError: a combination no transformers model has, naming the field.
  """
  c = config
  if c.norm_offset == 1.0 and c.post_norms and c.scale_embeddings and not c.attention_bias:
    if not c.qk_norm and c.rope_local_theta is not None:
      raise ConfigError("DecoderConfig.rope_local_theta is Gemma 3's (with qk_norm); Gemma 2 "
                        "has one rope base: leave it None")
    return "gemma3_text" if c.qk_norm else "gemma2"
  if c.norm_offset == 0.0 and not (c.post_norms or c.scale_embeddings):
    odd = [f for f in ("attn_logit_softcap", "final_logit_softcap", "rope_local_theta")
           if getattr(c, f) is not None]
    if c.query_pre_attn_scalar not in (None, float(c.head_dim)):
      odd.append("query_pre_attn_scalar")
    if odd:
      raise ConfigError(f"DecoderConfig.{odd[0]} is Gemma's; Llama and Qwen models have "
                        "none: leave it None")
    if c.qk_norm and c.attention_bias:
      raise ConfigError("DecoderConfig.qk_norm with attention_bias: Qwen 3 has q/k norms and "
                        "no biases, Qwen 2 biases and no norms; set one")
    if c.layer_types and not (c.qk_norm or c.attention_bias):
      raise ConfigError("DecoderConfig.layer_types with sliding layers: transformers' Llama "
                        "has none; valid: () (all full)")
    return "qwen3" if c.qk_norm else "qwen2" if c.attention_bias else "llama"
  raise ConfigError(f"DecoderConfig(norm_offset={c.norm_offset}, post_norms={c.post_norms}, "
                    f"scale_embeddings={c.scale_embeddings}) is neither Llama/Qwen (0, False, "
                    "False) nor Gemma 2/3 (1, True, True); transformers has no such model")


def _number(x: float) -> Any:
  """An integral float as an int (transformers' strict configs type some fields int)."""
  return int(x) if float(x).is_integer() else float(x)


def _rope_dict(theta: float, scaling: Optional[RopeScaling]) -> dict[str, Any]:
  if scaling is None:
    return {"rope_type": "default", "rope_theta": theta}
  fields = {k: v for k, v in vars(scaling).items() if v is not None and k != "rope_type"}
  return {"rope_type": scaling.rope_type, "rope_theta": theta, **fields}


def config_to_hf(config: DecoderConfig) -> dict[str, Any]:
  """The config.json dict (transformers 5.x) of the model `config` describes; weights float32.

  Raises:
    ConfigError: as `model_type_of`.
  """
  c, model_type = config, model_type_of(config)
  hf_types = [("full_attention" if c.layer_type(i) == "full" else "sliding_attention")
              for i in range(c.num_layers)]
  out = {
      "architectures": [_ARCHITECTURES[model_type]], "model_type": model_type,
      "vocab_size": c.vocab_size, "hidden_size": c.emb_dim, "intermediate_size": c.mlp_dim,
      "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
      "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
      "rms_norm_eps": c.norm_epsilon, "max_position_embeddings": c.max_position_embeddings,
      "tie_word_embeddings": c.tie_word_embeddings, "bos_token_id": c.bos_id,
      "eos_token_id": c.eos_id, "pad_token_id": c.pad_id, "attention_dropout": 0.0,
      "use_cache": True, "dtype": "float32",
  }
  full = _rope_dict(c.rope_theta, c.rope_scaling)
  if model_type.startswith("gemma"):
    out.update(hidden_activation={"gelu_tanh": "gelu_pytorch_tanh"}.get(c.mlp_activation,
                                                                          c.mlp_activation),
               query_pre_attn_scalar=_number(c.query_pre_attn_scalar or c.head_dim),
               sliding_window=c.sliding_window or 4096, layer_types=hf_types,
               attn_logit_softcapping=c.attn_logit_softcap,
               final_logit_softcapping=c.final_logit_softcap, attention_bias=False)
  else:
    out.update(hidden_act=c.mlp_activation if c.mlp_activation != "gelu_tanh"
               else "gelu_pytorch_tanh", rope_parameters=full, mlp_bias=False)
  if model_type == "gemma2":
    out["rope_parameters"] = full
  elif model_type == "gemma3_text":
    local = (full if c.rope_local_theta is None else _rope_dict(c.rope_local_theta, None))
    out.update(rope_parameters={"full_attention": full, "sliding_attention": local},
               use_bidirectional_attention=False)
  elif model_type in ("qwen2", "qwen3"):
    sliding = [i for i in range(c.num_layers) if c.layer_type(i) == "sliding"]
    out.update(use_sliding_window=bool(sliding), sliding_window=c.sliding_window,
               max_window_layers=sliding[0] if sliding else c.num_layers, layer_types=hf_types)
    if model_type == "qwen3":
      out["attention_bias"] = False
  else:
    out["attention_bias"] = False
  return out


# ----------------------------------------------------------------------------------- tensors


class _Tensor(NamedTuple):
  """One HF tensor: its name and shape, our path and how the layouts convert."""
  name: str
  shape: tuple[int, ...]
  path: tuple[str, ...]
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def _tensors(config: DecoderConfig) -> list[_Tensor]:
  """Every HF tensor of `config`'s model, in transformers' order."""
  c = config
  e, d, f, v = c.emb_dim, c.head_dim, c.mlp_dim, c.vocab_size
  same = lambda x: x  # noqa: E731
  t = lambda x: x.T  # noqa: E731
  out = [_Tensor("model.embed_tokens.weight", (v, e), ("token_embedder", "embedding"), same,
                 same)]
  for i in range(c.num_layers):
    hf, ours = f"model.layers.{i}.", (f"layers_{i}",)
    norm = lambda name, path, dim=e: _Tensor(  # noqa: E731
        hf + name + ".weight", (dim,), ours + path + ("scale",), same, same)
    out.append(norm("input_layernorm", ("pre_attention_norm",)))
    for proj, heads, ours_name in (("q", c.num_heads, "query"), ("k", c.num_kv_heads, "key"),
                                   ("v", c.num_kv_heads, "value")):
      n = heads
      out.append(_Tensor(f"{hf}self_attn.{proj}_proj.weight", (n * d, e),
                         ours + ("attention", ours_name, "kernel"),
                         lambda x, n=n: x.T.reshape(e, n, d),
                         lambda x, n=n: x.reshape(e, n * d).T))
      if c.attention_bias:
        out.append(_Tensor(f"{hf}self_attn.{proj}_proj.bias", (n * d,),
                           ours + ("attention", ours_name, "bias"),
                           lambda x, n=n: x.reshape(n, d), lambda x: x.reshape(-1)))
    out.append(_Tensor(f"{hf}self_attn.o_proj.weight", (e, c.num_heads * d),
                       ours + ("attention", "out", "kernel"),
                       lambda x: x.T.reshape(c.num_heads, d, e),
                       lambda x: x.reshape(c.num_heads * d, e).T))
    if c.qk_norm:
      out.append(norm("self_attn.q_norm", ("attention", "query_norm"), d))
      out.append(norm("self_attn.k_norm", ("attention", "key_norm"), d))
    if c.post_norms:  # Gemma's names
      out.append(norm("post_attention_layernorm", ("post_attention_norm",)))
      out.append(norm("pre_feedforward_layernorm", ("pre_mlp_norm",)))
      out.append(norm("post_feedforward_layernorm", ("post_mlp_norm",)))
    else:  # Llama's "post-attention" norm is the one before the MLP
      out.append(norm("post_attention_layernorm", ("pre_mlp_norm",)))
    for name, ours_name, shape in (("gate_proj", "wi_0", (f, e)), ("up_proj", "wi_1", (f, e)),
                                   ("down_proj", "wo", (e, f))):
      out.append(_Tensor(f"{hf}mlp.{name}.weight", shape, ours + ("mlp", ours_name, "kernel"),
                         t, t))
  out.append(_Tensor("model.norm.weight", (e,), ("final_norm", "scale"), same, same))
  if not c.tie_word_embeddings:
    out.append(_Tensor("lm_head.weight", (v, e), ("logits_dense", "kernel"), t, t))
  return out


def _our_shape(spec: _Tensor) -> tuple[int, ...]:
  """The shape `spec.to_ours` gives, without allocating the tensor."""
  return spec.to_ours(np.broadcast_to(np.float32(0), spec.shape)).shape


def _shape(shape) -> str:
  return str(tuple(int(n) for n in shape))


def _check(stored: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]],
           what: str) -> None:
  """Refuses, in one line naming the tensors, any difference of names or shapes."""
  problems = [f"{n} has shape {_shape(stored[n])}, expected {_shape(expected[n])}"
              for n in expected if n in stored and tuple(stored[n]) != tuple(expected[n])]
  problems += [f"{n} {_shape(expected[n])} is missing" for n in expected if n not in stored]
  problems += [f"{n} {_shape(stored[n])} is not part of the model" for n in stored
               if n not in expected]
  if problems:
    more = f"; and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
    raise ConfigError(f"{what} does not fit the config: {'; '.join(problems[:_MAX_LISTED])}"
                      f"{more}")


_MULTIMODAL_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                        ("language_model.lm_head.", "lm_head."))
_VISION = ("model.vision_tower.", "vision_tower.", "model.multi_modal_projector.",
           "multi_modal_projector.")


def _text_names(names: list[str]) -> dict[str, str]:
  """{text-model name: stored name}: a Gemma 3 multimodal checkpoint's language model renamed
  as Gemma3ForCausalLM's, its vision weights dropped; other checkpoints unchanged."""
  if not any(n.startswith(p) for n in names for p, _ in _MULTIMODAL_PREFIXES):
    return {n: n for n in names}
  out = {}
  for n in names:
    if n.startswith(_VISION):
      continue
    new = next((to + n[len(p):] for p, to in _MULTIMODAL_PREFIXES if n.startswith(p)), n)
    out[new] = n
  return out


def params_from_hf(state: Mapping[str, Any], config: DecoderConfig,
                   place: Optional[Callable[[str, np.ndarray], Any]] = None) -> dict[str, Any]:
  """Our parameter tree from an HF state dict, checked from shapes first, read tensor by tensor.

  Args:
    state: {tensor name: array} (numpy, or anything np.asarray reads; read once each), or a
      lazy state with `shape(name)` (`huggingface.SafetensorsState`).
    config: the DecoderConfig the tensors must fit.
    place: (our "/"-joined path, array as stored, in our layout) -> the leaf kept (a cast and a
      device placement), called before the next tensor is read. None: float32 numpy arrays.

  Raises:
    ConfigError: a missing, extra or mis-shaped tensor, named in one line.
  """
  place = place or (lambda path, x: np.asarray(x, np.float32))
  names = _text_names(list(state))
  lazy = callable(getattr(state, "shape", None))
  shapes = {n: tuple(state.shape(s) if lazy else np.shape(state[s])) for n, s in names.items()}
  specs = _tensors(config)
  if config.tie_word_embeddings and "lm_head.weight" in shapes:
    head, table = shapes.pop("lm_head.weight"), "model.embed_tokens.weight"
    if head != shapes.get(table) or not np.array_equal(
        np.asarray(state[names["lm_head.weight"]]), np.asarray(state[names[table]])):
      raise ConfigError("lm_head.weight differs from model.embed_tokens.weight, but the config "
                        "ties them (tie_word_embeddings); give the config of this checkpoint")
  _check(shapes, {s.name: s.shape for s in specs}, "the Hugging Face state")
  flat = {s.path: place("/".join(s.path),
                        np.ascontiguousarray(s.to_ours(np.asarray(state[names[s.name]]))))
          for s in specs}
  return traverse_util.unflatten_dict(flat)


def params_to_hf(params: Mapping[str, Any], config: DecoderConfig) -> dict[str, np.ndarray]:
  """The HF state dict {name: float32 array} of our (boxed or plain) parameter tree.

  Raises:
    ConfigError: a missing, extra or mis-shaped parameter of our tree, named in one line.
  """
  from flax.core import meta  # pylint: disable=g-import-not-at-top
  flat = traverse_util.flatten_dict(meta.unbox(dict(params)))
  specs = _tensors(config)
  _check({"/".join(p): np.shape(x) for p, x in flat.items()},
         {"/".join(s.path): _our_shape(s) for s in specs}, "the parameter tree")
  return {s.name: np.ascontiguousarray(s.to_hf(np.asarray(flat[s.path], np.float32)))
          for s in specs}
