"""Gemma 2/3 checkpoints of Google DeepMind's `gemma` library: orbax PyTrees, strictly checked.

The library (gemma/gm/nn/_modules.py, _transformer.py; gemma/gm/ckpts/_checkpoint.py) names
every weight under `transformer/`; with N heads, K kv heads, E embed, H head_dim, F mlp:

  embedder/input_embedding           [V, E]     our token_embedder/embedding
  layer_i/attn/q_einsum/w            [N, E, H]  our query/kernel [E, N, H], axes 0 and 1 swapped
  layer_i/attn/kv_einsum/w           [2, K, E, H]  key and value, each as the query
  layer_i/attn/qkv_einsum/w          [3, N, E, H]  instead of the two above when K == N
  layer_i/attn/attn_vec_einsum/w     [N, H, E]  our out/kernel as it is
  layer_i/attn/_query_norm/scale, _key_norm/scale  [H]  (qk_norm)
  layer_i/mlp/gating_einsum/w        [2, F, E]  gate then up, each our wi_* [E, F] transposed;
                                     [2, E, F] untransposed in Gemma 2 2B (the library's
                                     `transpose_gating_einsum=False`, every other release True)
  layer_i/mlp/linear/w               [F, E]     our wo/kernel as it is
  layer_i/{pre_attention_norm, post_attention_norm, pre_ffw_norm, post_ffw_norm}/scale  [E]
  final_norm/scale                   [E]
Norm scales are zero-centred (applied as 1 + scale) there as in our tree; the output layer is
the embedding (tied), so there is no logits_dense.

On disk (what `gm.ckpts.load_params` reads) the tree takes one of three shapes:
  flat     the released checkpoints: {"transformer/layer_0/attn/q_einsum": {"w": ...}, ...}
  nested   `gm.ckpts.save_params(model.init(...)["params"])`: {"layer_0": {"attn": ...}} with
           no `transformer/` and the MLP weights bare (`mlp/gating_einsum`, `mlp/linear`)
  kauldron a trainer state {"params": nested, "opt_state", "step", "collections"}
Every shape is read as the names above. The multimodal weights of Gemma 3 4B+ (the SigLIP
encoder, `embedder/mm_*`) are ignored: this backbone is text only, as the library's
`text_only=True`. The stacked layout (`transformer/stacked_layers/...`) is refused.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping, Optional

import numpy as np
from flax import traverse_util

from spot_jax import orbax_io
from spot_jax.backbones.decoder.checkpoints.common import (CheckpointError, Dims, Params,
                                                          check_fit, check_params, dims)

ROOT = "transformer"
_IGNORED = ("SigLiPFromPatches_0/", f"{ROOT}/vision_encoder/", f"{ROOT}/embedder/mm_")
_KAULDRON = {"collections", "opt_state", "params", "step"}
_BARE = ("/mlp/gating_einsum", "/mlp/linear")  # weights the nested layout keeps without "/w"


# {our name under layers_i: the library's under layer_i}, each holding one `scale`.
_NORMS = {"pre_attention_norm": "pre_attention_norm", "pre_mlp_norm": "pre_ffw_norm",
          "post_attention_norm": "post_attention_norm", "post_mlp_norm": "post_ffw_norm",
          "attention/query_norm": "attn/_query_norm", "attention/key_norm": "attn/_key_norm"}

# What the library's Transformer fixes and a DecoderConfig leaves free: {field: (the library's
# value, why)}.
_LIBRARY = {"attention_bias": (False, "no attention biases"),
            "tie_word_embeddings": (True, "the output layer is the embedding"),
            "norm_offset": (1.0, "norm scales are applied as 1 + scale"),
            "mlp_activation": ("gelu_tanh", "the MLP gate is nn.gelu, tanh-approximated")}


def gemma_dims(config: Any) -> Dims:
  """The sizes of `config`, refused unless the gemma library's Transformer can hold it.

  Raises:
    CheckpointError: a field the library fixes to another value, named with that value.
  """
  for field, (value, why) in _LIBRARY.items():
    if getattr(config, field) != value:
      raise CheckpointError(f"a Gemma orbax checkpoint cannot hold a config with {field}="
                            f"{getattr(config, field)!r} (the gemma library has {field}="
                            f"{value!r}: {why}); give a Gemma 2/3 config, e.g. "
                            "config_by_name('gemma_3_1b'), or save a Hugging Face directory")
  return dims(config)


def gemma_shapes(config: Any, *, transpose_gating: bool = True) -> dict[str, tuple[int, ...]]:
  """{gemma name: shape} of the weights a Gemma checkpoint of `config` holds.

  Raises:
    CheckpointError: `config` has weights the library has no place for (biases, an untied
      output layer) or is not a Gemma (norms not zero-centred, no GELU).
  """
  d = gemma_dims(config)
  v, e, n, k, h, f = d.vocab, d.embed, d.heads, d.kv_heads, d.head_dim, d.mlp
  shapes = {f"{ROOT}/embedder/input_embedding": (v, e), f"{ROOT}/final_norm/scale": (e,)}
  for i in range(d.layers):
    at = f"{ROOT}/layer_{i}"
    if k == n:  # the library's `use_qkv_einsum`
      shapes[f"{at}/attn/qkv_einsum/w"] = (3, n, e, h)
    else:
      shapes[f"{at}/attn/q_einsum/w"] = (n, e, h)
      shapes[f"{at}/attn/kv_einsum/w"] = (2, k, e, h)
    shapes[f"{at}/attn/attn_vec_einsum/w"] = (n, h, e)
    if d.qk_norm:
      shapes[f"{at}/attn/_query_norm/scale"] = (h,)
      shapes[f"{at}/attn/_key_norm/scale"] = (h,)
    shapes[f"{at}/mlp/gating_einsum/w"] = (2, f, e) if transpose_gating else (2, e, f)
    shapes[f"{at}/mlp/linear/w"] = (f, e)
    norms = ["pre_attention_norm", "pre_ffw_norm"]
    norms += ["post_attention_norm", "post_ffw_norm"] if d.post_norms else []
    for norm in norms:
      shapes[f"{at}/{norm}/scale"] = (e,)
  return shapes


def params_to_gemma(params: Params, config: Any, *, transpose_gating: bool = True
                    ) -> dict[str, np.ndarray]:
  """Our parameter tree as {gemma name: array} (float32 numpy); see the module docstring.

  Raises:
    CheckpointError: `config` is no Gemma, or `params` does not fit it (one line naming the
      parameter).
  """
  d = gemma_dims(config)
  flat = {p: np.asarray(x, np.float32) for p, x in check_params(params, config).items()}
  out = {f"{ROOT}/embedder/input_embedding": flat.pop("token_embedder/embedding"),
         f"{ROOT}/final_norm/scale": flat.pop("final_norm/scale")}
  for i in range(d.layers):
    at, mine = f"{ROOT}/layer_{i}", f"layers_{i}"
    q, kk, vv = (flat.pop(f"{mine}/attention/{x}/kernel").transpose(1, 0, 2)
                 for x in ("query", "key", "value"))
    if d.kv_heads == d.heads:
      out[f"{at}/attn/qkv_einsum/w"] = np.stack([q, kk, vv])
    else:
      out[f"{at}/attn/q_einsum/w"] = q
      out[f"{at}/attn/kv_einsum/w"] = np.stack([kk, vv])
    out[f"{at}/attn/attn_vec_einsum/w"] = flat.pop(f"{mine}/attention/out/kernel")
    gate, up = flat.pop(f"{mine}/mlp/wi_0/kernel"), flat.pop(f"{mine}/mlp/wi_1/kernel")
    out[f"{at}/mlp/gating_einsum/w"] = (np.stack([gate.T, up.T]) if transpose_gating
                                        else np.stack([gate, up]))
    out[f"{at}/mlp/linear/w"] = flat.pop(f"{mine}/mlp/wo/kernel")
    for name, theirs in _NORMS.items():
      if f"{mine}/{name}/scale" in flat:
        out[f"{at}/{theirs}/scale"] = flat.pop(f"{mine}/{name}/scale")
  return out


def _ours(name: str, w: np.ndarray, transpose_gating: bool) -> dict[str, np.ndarray]:
  """{our "/"-joined path: array} made of the stored array `name` (a gemma name)."""
  if name == f"{ROOT}/embedder/input_embedding":
    return {"token_embedder/embedding": w}
  if name == f"{ROOT}/final_norm/scale":
    return {"final_norm/scale": w}
  layer, rest = name[len(ROOT) + 1:].split("/", 1)
  mine = "layers_" + layer[len("layer_"):]
  heads = lambda ws, ours: {f"{mine}/attention/{o}/kernel": np.ascontiguousarray(  # noqa: E731
      x.transpose(1, 0, 2)) for o, x in zip(ours, ws)}
  if rest == "attn/qkv_einsum/w":
    return heads(w, ("query", "key", "value"))
  if rest == "attn/q_einsum/w":
    return heads([w], ("query",))
  if rest == "attn/kv_einsum/w":
    return heads(w, ("key", "value"))
  if rest == "attn/attn_vec_einsum/w":
    return {f"{mine}/attention/out/kernel": w}
  if rest == "mlp/gating_einsum/w":
    gate, up = (w[0].T, w[1].T) if transpose_gating else (w[0], w[1])
    return {f"{mine}/mlp/wi_0/kernel": np.ascontiguousarray(gate),
            f"{mine}/mlp/wi_1/kernel": np.ascontiguousarray(up)}
  if rest == "mlp/linear/w":
    return {f"{mine}/mlp/wo/kernel": w}
  ours = {f"{theirs}/scale": o for o, theirs in _NORMS.items()}
  return {f"{mine}/{ours[rest]}/scale": w}


def _float32(path: str, array: np.ndarray) -> np.ndarray:
  del path
  return np.asarray(array, np.float32)


def params_from_gemma(tree: Mapping[str, Any], config: Any, *,
                      transpose_gating: Optional[bool] = None,
                      place: Optional[Callable[[str, np.ndarray], Any]] = None) -> Params:
  """Our parameter tree from a Gemma tree, strictly checked against `config`.

  Args:
    tree: {gemma name: array} as `params_to_gemma` gives, or the library's flat, nested or
      kauldron tree (see the module docstring).
    config: the DecoderConfig the weights must fit.
    transpose_gating: the layout of `mlp/gating_einsum/w`; None reads it from the stored shape
      ([2, F, E] when E == F: the layout of every release but Gemma 2 2B).
    place: (our "/"-joined path, array in its stored dtype) -> the leaf to keep (a cast and a
      device placement), called as each array is converted; None: float32 numpy arrays.

  Raises:
    CheckpointError: one line naming each missing, unexpected or mis-shaped array.
  """
  names = gemma_names(tree)
  shapes = {n: tuple(np.shape(tree_get(tree, p))) for n, p in names.items()}
  if transpose_gating is None:
    transpose_gating = gating_transposed(shapes, config)
  check_fit(shapes, gemma_shapes(config, transpose_gating=transpose_gating), "the Gemma tree")
  place = place or _float32
  out = {ours: place(ours, w) for n, p in names.items()
         for ours, w in _ours(n, np.asarray(tree_get(tree, p)), transpose_gating).items()}
  return traverse_util.unflatten_dict(out, sep="/")


def gating_transposed(shapes: Mapping[str, tuple[int, ...]], config: Any) -> bool:
  """Whether the stored `mlp/gating_einsum/w` is [2, F, E] (True) or [2, E, F] (False)."""
  d = gemma_dims(config)
  stored = tuple(shapes.get(f"{ROOT}/layer_0/mlp/gating_einsum/w", ()))
  return not (stored == (2, d.embed, d.mlp) and d.embed != d.mlp)


# ----------------------------------------------------------------------------- tree layouts


def gemma_names(tree: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
  """{gemma name: path of keys in `tree`} for a flat, nested, kauldron or already-named tree;
  multimodal weights left out.

  Raises:
    CheckpointError: the stacked layout.
  """
  if any(str(k).startswith(f"{ROOT}/stacked_layers") for k in tree):
    raise CheckpointError("the checkpoint stores its layers stacked (transformer/stacked_layers/"
                          "...), which is not read here; save it unstacked with the gemma "
                          "library (gm.ckpts.save_params of gm.ckpts.load_params)")
  prefix: tuple[str, ...] = ()
  if set(tree) == _KAULDRON:
    prefix, tree = ("params",), tree["params"]
  names = {}
  flat_layout = all(str(k).startswith((f"{ROOT}/", "SigLiPFromPatches_0/")) for k in tree)
  for path in _leaf_paths(tree):
    if flat_layout:  # released: "transformer/layer_0/attn/q_einsum" -> {"w": ...}
      name = "/".join(path)
    else:  # model.init's nested params, without the "transformer" scope
      name = f"{ROOT}/" + "/".join(path)
      name += "/w" if name.endswith(_BARE) else ""
    if not name.startswith(_IGNORED):
      names[name] = prefix + tuple(path)
  return names


def _leaf_paths(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
  paths = []
  for key, value in tree.items():
    if isinstance(value, Mapping):
      paths += _leaf_paths(value, prefix + (str(key),))
    else:
      paths.append(prefix + (str(key),))
  return paths


def tree_get(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def checkpoint_tree(named: Mapping[str, Any], layout: str = "flat") -> dict[str, Any]:
  """{gemma name: array} as the library stores it: "flat" (the released layout) or "nested"
  (`gm.ckpts.save_params` of model.init's params)."""
  if layout == "flat":
    tree: dict[str, Any] = {}
    for name, value in named.items():
      module, weight = name.rsplit("/", 1)
      tree.setdefault(module, {})[weight] = value
    return tree
  if layout == "nested":
    paths = {}
    for name, value in named.items():
      inner = name[len(ROOT) + 1:]
      inner = inner[:-2] if inner.endswith(tuple(b + "/w" for b in _BARE)) else inner
      paths[tuple(inner.split("/"))] = value
    return traverse_util.unflatten_dict(paths)
  raise CheckpointError(f"layout={layout!r} is unknown; valid: 'flat', 'nested'")


# ----------------------------------------------------------------------------- orbax on disk


def _item_dir(path: str) -> str:
  """The directory holding the tree: `path`, or its `default` item (a kauldron step)."""
  if (not os.path.exists(os.path.join(path, "_METADATA"))
      and os.path.exists(os.path.join(path, "default", "_METADATA"))):
    return os.path.join(path, "default")
  return path


def _metadata_tree(directory: str) -> Mapping[str, Any]:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  absl_log = logging.getLogger("absl")
  level = absl_log.level
  absl_log.setLevel(logging.ERROR)  # orbax logs a missing step metadata file; it is optional
  try:
    meta = ocp.PyTreeCheckpointer().metadata(directory)
  except Exception as e:  # pylint: disable=broad-except  (orbax raises assorted types)
    raise CheckpointError(f"cannot read the orbax metadata of {directory} "
                          f"({orbax_io.root_cause(e)}); give a Gemma orbax checkpoint directory "
                          "(with _METADATA)") from None
  finally:
    absl_log.setLevel(level)
  tree = getattr(getattr(meta, "item_metadata", meta), "tree", getattr(meta, "item_metadata", meta))
  if not isinstance(tree, Mapping) or not tree:
    raise CheckpointError(f"{directory} holds no parameter tree; give a Gemma orbax checkpoint")
  return tree


def _check_vocab(shapes: Mapping[str, tuple[int, ...]], config: Any, source: str) -> None:
  """A table of another row count is most often a padded one (the library's Gemma 2 has 256128
  rows, the HF config 256000): say which vocab_size would read it."""
  d = gemma_dims(config)
  name = f"{ROOT}/embedder/input_embedding"
  stored = shapes.get(name)
  if stored and len(stored) == 2 and stored[1] == d.embed and stored[0] != d.vocab:
    raise CheckpointError(f"{source} does not fit the model config: {name} has shape "
                          f"{tuple(stored)}, expected {(d.vocab, d.embed)}; use a config with "
                          f"vocab_size={stored[0]} (config.replace(vocab_size={stored[0]}))")


def load_gemma_orbax(path: str, config: Any, *, transpose_gating: Optional[bool] = None,
                     place: Optional[Callable[[str, np.ndarray], Any]] = None) -> Params:
  """Our parameter tree from a Gemma orbax checkpoint, strictly checked, read layer by layer
  (each layer's arrays converted and placed before the next layer is read).

  Args:
    path: the checkpoint directory (a released Gemma checkpoint, `gm.ckpts.save_params`'
      output, a kauldron step, or `save_gemma_orbax`'s).
    config: the DecoderConfig it must fit (the checkpoint carries none).
    transpose_gating: as `params_from_gemma`.
    place: as `params_from_gemma` (None: float32 numpy arrays).

  Raises:
    CheckpointError: one line naming a missing, unexpected or mis-shaped array in the gemma
      name, or an array that cannot be read.
  """
  directory = os.path.abspath(os.fspath(path))
  if not os.path.isdir(directory):
    raise CheckpointError(f"the Gemma checkpoint {directory} does not exist; give an orbax "
                          "checkpoint directory (with _METADATA)")
  directory = _item_dir(directory)
  meta = _metadata_tree(directory)
  names = gemma_names(meta)
  shapes = {n: tuple(getattr(tree_get(meta, p), "shape", ())) for n, p in names.items()}
  if transpose_gating is None:
    transpose_gating = gating_transposed(shapes, config)
  _check_vocab(shapes, config, directory)
  check_fit(shapes, gemma_shapes(config, transpose_gating=transpose_gating), directory)
  place = place or _float32
  groups: dict[str, list[str]] = {}  # one read per layer (and one for the rest)
  for name in names:
    groups.setdefault(name.split("/")[1] if name.count("/") > 2 else "", []).append(name)
  out = {}
  for group in groups.values():
    restored = _restore(directory, {n: names[n] for n in group})
    for name in group:
      for ours, w in _ours(name, restored.pop(name), transpose_gating).items():
        out[ours] = place(ours, w)
  return traverse_util.unflatten_dict(out, sep="/")


def _restore(directory: str, names: Mapping[str, tuple[str, ...]]) -> dict[str, np.ndarray]:
  """{gemma name: numpy array in its stored dtype} of the named arrays only."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  item = traverse_util.unflatten_dict({p: 0 for p in names.values()})
  args = traverse_util.unflatten_dict(
      {p: ocp.RestoreArgs(restore_type=np.ndarray) for p in names.values()})
  with orbax_io.quiet_abandoned_reads():
    try:
      restored = ocp.PyTreeCheckpointer().restore(directory, args=ocp.args.PyTreeRestore(
          item=item, restore_args=args, partial_restore=True))
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(f"cannot read the Gemma checkpoint {directory}: "
                            f"{orbax_io.root_cause(e)}") from None
  return {n: np.asarray(tree_get(restored, p)) for n, p in names.items()}


def save_gemma_orbax(path: str, config: Any, params: Params, *, transpose_gating: bool = True,
                     layout: str = "flat", overwrite: bool = False) -> str:
  """Writes `params` as a Gemma orbax checkpoint the gemma library loads (float32).

  Args:
    path: the checkpoint directory to create (written beside it, then renamed into place).
    config: the DecoderConfig of `params`.
    params: our parameter tree.
    transpose_gating: False for Gemma 2 2B's [2, E, F] gating weights.
    layout: "flat" (as released) or "nested" (as `gm.ckpts.save_params`).
    overwrite: replace an existing `path`.

  Returns:
    `path`.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from spot_jax import fileio  # pylint: disable=g-import-not-at-top
  named = params_to_gemma(params, config, transpose_gating=transpose_gating)
  tree = checkpoint_tree(named, layout)
  path = os.path.abspath(os.fspath(path))
  if os.path.exists(path) and not overwrite:
    raise CheckpointError(f"{path} exists; pass overwrite=True to replace it, or another path")
  with fileio.staged_directory(path) as fresh:
    ocp.PyTreeCheckpointer().save(fresh, tree)
  return path
