"""Decoder checkpoints on disk: tiny random HF Llama / Gemma 2 / Gemma 3 models saved with
`save_pretrained`, our own HF directories loaded back by transformers, Gemma orbax checkpoints in
the gemma library's layouts, and damaged copies of each refused in one line naming the array.

The Gemma trees are built here from the HF state dict with explicit numpy transposes
(`gemma_tree_from_hf`), following the library's einsums (gemma/gm/nn/_modules.py) and
transformers' orbax-to-HF converter, so the loader's mapping is checked against a construction
of its own rather than against its inverse.
"""
from __future__ import annotations

import json
import os
import shutil

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import traverse_util

from spot_jax.backbones.decoder import checkpoints
from spot_jax.backbones.decoder.checkpoints import CheckpointError
from spot_jax.errors import ConfigError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("spot_jax.backbones.decoder.hf")

VOCAB, EMBED, MLP, HEADS, HEAD_DIM, LAYERS = 96, 32, 48, 4, 8, 2
TOKENS = np.array([[2, 5, 17, 33, 8, 61, 90, 4, 11, 3]], np.int32)


def _hf_config(family: str):
  common = dict(vocab_size=VOCAB, hidden_size=EMBED, intermediate_size=MLP,
                num_hidden_layers=LAYERS, num_attention_heads=HEADS, head_dim=HEAD_DIM,
                max_position_embeddings=64, rms_norm_eps=1e-6)
  if family == "llama":
    return transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **common)
  if family == "gemma2":  # K == N: the gemma library stores qkv_einsum
    return transformers.Gemma2Config(num_key_value_heads=HEADS, query_pre_attn_scalar=HEAD_DIM,
                                     sliding_window=4, **common)
  return transformers.Gemma3TextConfig(
      num_key_value_heads=2, query_pre_attn_scalar=HEAD_DIM, sliding_window=4,
      layer_types=["sliding_attention", "full_attention"], **common)


_CLASSES = {"llama": "LlamaForCausalLM", "gemma2": "Gemma2ForCausalLM",
            "gemma3": "Gemma3ForCausalLM"}


def _hf_model(family: str, seed: int = 0):
  """A random HF model whose every weight (norm scales too) is non-trivial."""
  torch.manual_seed(seed)
  config = _hf_config(family)
  config._attn_implementation = "eager"  # pylint: disable=protected-access  (softcaps, windows)
  model = getattr(transformers, _CLASSES[family])(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.normal_(0.0, 0.2 if p.ndim == 1 else 0.08)
  return model


def _state(model) -> dict[str, np.ndarray]:
  """The tensors save_pretrained writes (a tied lm_head is not written)."""
  tied = model.config.tie_word_embeddings
  return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()
          if not (tied and k == "lm_head.weight")}


def _flat(params) -> dict[str, np.ndarray]:
  return {p: np.asarray(x) for p, x in traverse_util.flatten_dict(params, sep="/").items()}


def _assert_same_tree(got, want):
  got, want = _flat(got), _flat(want)
  assert sorted(got) == sorted(want)
  for p in want:
    np.testing.assert_array_equal(got[p], want[p], err_msg=p)


def _one_line(info) -> str:
  message = str(info.value)
  assert "\n" not in message, message
  return message


@pytest.fixture(scope="module", params=["llama", "gemma2", "gemma3"])
def saved(request, tmp_path_factory):
  """(family, HF model, its save_pretrained directory)."""
  model = _hf_model(request.param)
  folder = tmp_path_factory.mktemp(request.param) / "hf"
  model.save_pretrained(str(folder), safe_serialization=True)
  return request.param, model, str(folder)


# ----------------------------------------------------------------------------- Hugging Face


def test_hf_dir_loads_as_params_from_hf_of_its_state_dict(saved):
  family, model, folder = saved
  config, params = checkpoints.load_hf_dir(folder)
  with open(os.path.join(folder, "config.json")) as f:
    assert config == hf.config_from_hf(json.load(f))
  _assert_same_tree(params, hf.params_from_hf(_state(model), config))
  assert all(x.dtype == np.float32 for x in _flat(params).values())
  assert ("logits_dense" in params) == (family == "llama")  # Gemma ties the output layer


def test_sharded_and_bfloat16_hf_dirs(tmp_path):
  model = _hf_model("llama", seed=1)
  sharded = tmp_path / "sharded"
  model.save_pretrained(str(sharded), safe_serialization=True, max_shard_size="20KB")
  assert (sharded / "model.safetensors.index.json").is_file()
  assert len(list(sharded.glob("model-*.safetensors"))) > 2
  config, params = checkpoints.load_hf_dir(str(sharded))
  _assert_same_tree(params, hf.params_from_hf(_state(model), config))

  half = tmp_path / "bf16"
  model.to(torch.bfloat16).save_pretrained(str(half), safe_serialization=True)
  _, params = checkpoints.load_hf_dir(str(half))
  state = {k: v.float().numpy() for k, v in model.state_dict().items()}  # bf16 values, exactly
  _assert_same_tree(params, hf.params_from_hf(state, config))


def _our_logits(config, params, tokens) -> np.ndarray:
  from spot_jax.backbones.decoder import network  # pylint: disable=g-import-not-at-top
  return np.asarray(network.DecoderLM(config).apply({"params": params}, tokens))


def _hf_logits(model, tokens) -> np.ndarray:
  with torch.no_grad():
    return model.float()(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


def test_loaded_hf_dir_gives_the_logits_of_transformers(saved):
  _, model, folder = saved
  config, params = checkpoints.load_checkpoint(folder)
  np.testing.assert_allclose(_our_logits(config, params, TOKENS), _hf_logits(model, TOKENS),
                             atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shard_size", [checkpoints.huggingface.DEFAULT_SHARD_SIZE, 30_000])
def test_save_hf_dir_loads_in_transformers(saved, tmp_path, shard_size):
  family, model, folder = saved
  config, params = checkpoints.load_hf_dir(folder)
  out = checkpoints.save_hf_dir(str(tmp_path / "out"), config, params, shard_size=shard_size)
  assert (shard_size < 1e6) == os.path.isfile(os.path.join(out, "model.safetensors.index.json"))
  assert sorted(os.listdir(tmp_path)) == ["out"]  # nothing left beside it
  back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
  assert type(back).__name__ == _CLASSES[family]
  want, got = _state(model), _state(back)
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  again_config, again = checkpoints.load_hf_dir(out)
  assert again_config == config
  _assert_same_tree(again, params)
  with pytest.raises(CheckpointError, match="exists; pass overwrite=True"):
    checkpoints.save_hf_dir(out, config, params)


def _rewrite(folder: str, edit) -> None:
  """Applies `edit` to the {name: array} of the single model.safetensors of `folder`."""
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  path = os.path.join(folder, "model.safetensors")
  tensors = load_file(path)
  edit(tensors)
  save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("damage, named", [
    (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "model.layers.1.mlp.up_proj.weight"),
    (lambda t: t.__setitem__("model.layers.1.mlp.extra.weight", np.ones(3, np.float32)),
     "model.layers.1.mlp.extra.weight"),
    (lambda t: t.__setitem__("model.layers.0.self_attn.k_proj.weight",
                             np.ones((8, EMBED), np.float32)),
     "model.layers.0.self_attn.k_proj.weight"),
])
def test_a_damaged_hf_dir_is_one_line_naming_the_tensor(tmp_path, damage, named):
  folder = str(tmp_path / "hf")
  _hf_model("gemma3").save_pretrained(folder, safe_serialization=True)
  _rewrite(folder, damage)
  with pytest.raises(ConfigError) as info:
    checkpoints.load_hf_dir(folder)
  assert named in _one_line(info)


def test_missing_shard_and_config_are_named(tmp_path):
  folder = tmp_path / "sharded"
  _hf_model("llama").save_pretrained(str(folder), safe_serialization=True, max_shard_size="20KB")
  shard = sorted(folder.glob("model-*.safetensors"))[1]
  shard.unlink()
  with pytest.raises(CheckpointError) as info:
    checkpoints.load_hf_dir(str(folder))
  assert f"the shard {shard.name} is missing" in _one_line(info)

  (folder / "config.json").unlink()
  with pytest.raises(CheckpointError) as info:
    checkpoints.load_hf_dir(str(folder))
  message = _one_line(info)
  assert "has no config.json" in message and "model.safetensors.index.json" in message
  with pytest.raises(CheckpointError, match="has no config.json"):
    checkpoints.load_checkpoint(str(folder))
  for shard in folder.glob("model*"):
    shard.unlink()
  with pytest.raises(CheckpointError, match="is not a decoder checkpoint; give a Hugging Face"):
    checkpoints.load_checkpoint(str(folder))


# ----------------------------------------------------------------------------- Gemma orbax


def gemma_tree_from_hf(model, transpose_gating: bool = True) -> dict[str, dict[str, np.ndarray]]:
  """The released (flat) gemma layout of an HF Gemma, built independently of the loader.

  HF stores q_proj as [N*H, E] (rows head-major) and o_proj as [E, N*H]; the library's einsums
  are 'BTD,NDH->BTNH' (q_einsum [N, E, H]), 'BTNH,NHD->BTD' (attn_vec_einsum [N, H, E]) and
  '...F,NHF->...NH' (gating_einsum [2, F, E] when transposed, else '...F,NFH' on [2, E, F]).
  """
  s = _state(model)
  c = model.config
  n, k, h, e = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size
  tree = {"transformer/embedder": {"input_embedding": s["model.embed_tokens.weight"]},
          "transformer/final_norm": {"scale": s["model.norm.weight"]}}
  for i in range(c.num_hidden_layers):
    p, at = f"model.layers.{i}.", f"transformer/layer_{i}"
    heads = lambda name, count: s[p + name].reshape(count, h, e).transpose(0, 2, 1)  # noqa: E731
    q, kk, v = (heads("self_attn.q_proj.weight", n), heads("self_attn.k_proj.weight", k),
                heads("self_attn.v_proj.weight", k))
    if k == n:
      tree[f"{at}/attn/qkv_einsum"] = {"w": np.stack([q, kk, v])}
    else:
      tree[f"{at}/attn/q_einsum"] = {"w": q}
      tree[f"{at}/attn/kv_einsum"] = {"w": np.stack([kk, v])}
    tree[f"{at}/attn/attn_vec_einsum"] = {"w": s[p + "self_attn.o_proj.weight"].T.reshape(n, h, e)}
    gate, up = s[p + "mlp.gate_proj.weight"], s[p + "mlp.up_proj.weight"]  # [F, E]
    tree[f"{at}/mlp/gating_einsum"] = {
        "w": np.stack([gate, up]) if transpose_gating else np.stack([gate.T, up.T])}
    tree[f"{at}/mlp/linear"] = {"w": s[p + "mlp.down_proj.weight"].T}
    for theirs, ours in (("input_layernorm", "pre_attention_norm"),
                         ("post_attention_layernorm", "post_attention_norm"),
                         ("pre_feedforward_layernorm", "pre_ffw_norm"),
                         ("post_feedforward_layernorm", "post_ffw_norm"),
                         ("self_attn.q_norm", "attn/_query_norm"),
                         ("self_attn.k_norm", "attn/_key_norm")):
      if p + theirs + ".weight" in s:
        tree[f"{at}/{ours}"] = {"scale": s[p + theirs + ".weight"]}
  return tree


def _nested(flat_tree) -> dict:
  """model.init's params: no `transformer` scope, the MLP weights bare (nn.share_scope)."""
  paths = {}
  for module, leaves in flat_tree.items():
    for leaf, value in leaves.items():
      keys = tuple(module.split("/")[1:])
      paths[keys if "/mlp/" in module else keys + (leaf,)] = value
  return traverse_util.unflatten_dict(paths)


def _write_orbax(path, tree) -> str:
  ocp.PyTreeCheckpointer().save(str(path), tree)
  return str(path)


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def gemma(request, tmp_path_factory):
  """(HF model, its DecoderConfig, params_from_hf of its state, a folder for checkpoints)."""
  model = _hf_model(request.param, seed=2)
  config = hf.config_from_hf(model.config.to_dict())
  return model, config, hf.params_from_hf(_state(model), config), tmp_path_factory.mktemp("g")


@pytest.mark.parametrize("layout", ["flat", "nested", "kauldron"])
def test_gemma_orbax_in_the_library_layouts_restores_to_the_hf_params(gemma, layout):
  model, config, want, folder = gemma
  tree = gemma_tree_from_hf(model)
  if layout != "flat":
    tree = _nested(tree)
  if layout == "kauldron":
    tree = {"params": tree, "opt_state": {"mu": np.zeros(2, np.float32)},
            "step": np.asarray(7), "collections": {"x": np.zeros(1, np.float32)}}
  path = _write_orbax(folder / layout, tree)
  _assert_same_tree(checkpoints.load_gemma_orbax(path, config), want)
  loaded_config, placed = checkpoints.load_checkpoint(path, config)
  assert loaded_config is config
  assert isinstance(traverse_util.flatten_dict(placed, sep="/")["final_norm/scale"], jax.Array)


def test_untransposed_gating_and_multimodal_weights(gemma, tmp_path):
  model, config, want, _ = gemma
  tree = gemma_tree_from_hf(model, transpose_gating=False)  # Gemma 2 2B's layout
  tree["SigLiPFromPatches_0/siglip_encoder/embedding"] = {"kernel": np.ones((2, 3), np.float32)}
  tree["transformer/embedder"]["mm_input_embedding_extra"] = np.ones((4, EMBED), np.float32)
  path = _write_orbax(tmp_path / "ck", tree)
  _assert_same_tree(checkpoints.load_gemma_orbax(path, config), want)


def test_bfloat16_gemma_orbax_restores_as_float32(gemma, tmp_path):
  model, config, want, _ = gemma
  half = jax.tree.map(lambda x: x.astype(ml_dtypes.bfloat16), gemma_tree_from_hf(model))
  got = checkpoints.load_gemma_orbax(_write_orbax(tmp_path / "bf16", half), config)
  rounded = jax.tree.map(lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float32), want)
  _assert_same_tree(got, rounded)
  assert all(x.dtype == np.float32 for x in _flat(got).values())


def test_save_gemma_orbax_writes_the_library_layout(gemma, tmp_path):
  model, config, params, _ = gemma
  for layout in ("flat", "nested"):
    path = checkpoints.save_gemma_orbax(str(tmp_path / layout), config, params, layout=layout)
    stored = ocp.PyTreeCheckpointer().metadata(path)
    stored = getattr(getattr(stored, "item_metadata", stored), "tree", stored)
    expected = gemma_tree_from_hf(model)
    expected = expected if layout == "flat" else _nested(expected)
    shapes = lambda t: {p: tuple(x.shape) for p, x in traverse_util.flatten_dict(t).items()}  # noqa: E731
    assert shapes(stored) == shapes(expected)
    _assert_same_tree(checkpoints.load_gemma_orbax(path, config), params)
  assert sorted(os.listdir(tmp_path)) == ["flat", "nested"]
  named = checkpoints.params_to_gemma(params, config)
  _assert_same_tree(checkpoints.params_from_gemma(named, config), params)


def test_gemma_logits_match_transformers(gemma, tmp_path):
  model, config, _, _ = gemma
  path = _write_orbax(tmp_path / "ck", gemma_tree_from_hf(model))
  _, params = checkpoints.load_checkpoint(path, config)
  np.testing.assert_allclose(_our_logits(config, params, TOKENS), _hf_logits(model, TOKENS),
                             atol=1e-5, rtol=1e-5)


def test_a_damaged_gemma_orbax_is_one_line_naming_the_array(tmp_path):
  model = _hf_model("gemma3", seed=3)
  config = hf.config_from_hf(model.config.to_dict())
  dropped = gemma_tree_from_hf(model)
  del dropped["transformer/layer_1/mlp/linear"]
  with pytest.raises(CheckpointError) as info:
    checkpoints.load_gemma_orbax(_write_orbax(tmp_path / "dropped", dropped), config)
  assert f"transformer/layer_1/mlp/linear/w ({MLP}, {EMBED}) is missing" in _one_line(info)

  reshaped = gemma_tree_from_hf(model)
  reshaped["transformer/layer_1/attn/kv_einsum"]["w"] = np.ones((2, 1, EMBED, HEAD_DIM),
                                                                np.float32)
  with pytest.raises(CheckpointError) as info:
    checkpoints.load_gemma_orbax(_write_orbax(tmp_path / "reshaped", reshaped), config)
  assert (f"transformer/layer_1/attn/kv_einsum/w has shape (2, 1, {EMBED}, {HEAD_DIM}), "
          f"expected (2, 2, {EMBED}, {HEAD_DIM})") in _one_line(info)

  with pytest.raises(CheckpointError, match="carries no config; name its config"):
    checkpoints.load_checkpoint(str(tmp_path / "reshaped"))


def test_load_checkpoint_places_arrays_on_a_mesh_and_checks_the_config(saved):
  _, _, folder = saved
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
  config, params = checkpoints.load_checkpoint(folder, mesh=mesh)
  placed = traverse_util.flatten_dict(params, sep="/")["token_embedder/embedding"]
  assert placed.shape == (VOCAB, EMBED) and placed.sharding.mesh.shape == mesh.shape
  half = config.replace(dtype="bfloat16")  # the activation dtype is the caller's choice
  assert checkpoints.load_checkpoint(folder, half)[0] is half
  with pytest.raises(CheckpointError) as info:
    checkpoints.load_checkpoint(folder, config.replace(mlp_dim=2 * MLP))
  assert f"mlp_dim={2 * MLP} (the checkpoint has {MLP})" in _one_line(info)


def test_saving_refuses_a_tree_or_config_a_gemma_checkpoint_cannot_hold(gemma, tmp_path):
  _, config, params, _ = gemma
  partial = {k: v for k, v in params.items() if k != "final_norm"}
  with pytest.raises(CheckpointError) as info:
    checkpoints.save_gemma_orbax(str(tmp_path / "a"), config, partial)
  assert f"final_norm/scale ({EMBED},) is missing" in _one_line(info)
  with pytest.raises(CheckpointError) as info:
    checkpoints.save_gemma_orbax(str(tmp_path / "b"), config.replace(mlp_activation="silu"),
                                 params)
  assert "mlp_activation='silu' (the gemma library has" in _one_line(info)
  assert not os.listdir(tmp_path)  # a refusal writes nothing
