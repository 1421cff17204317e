"""Strict T5 checkpoint loading and saving: the real T5X fixture, damaged copies, round trips.

The reference reader `read_t5x_raw` below reads a legacy T5X checkpoint the way t5x does
(msgpack tree, tensorstore specs relative to the checkpoint directory), independently of
`spot_jax.backbones.t5.checkpoints`, so the loader's values and our writer's files are both checked
against it.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts
from flax import serialization, traverse_util

from spot_jax.backbones.t5 import (CheckpointError, Transformer, config_by_name, load_checkpoint,
                         save_checkpoint)
from spot_jax.backbones.t5 import checkpoints
from spot_jax.backbones.t5.checkpoints import save as save_lib
from spot_jax.errors import ConfigError

TINY = config_by_name("t5_1_1_tiny")


# ----------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def fixture_dir(t5_fixtures):
  return t5_fixtures / "test_t5_1_1_tiny" / "checkpoint_3"


def writable_copy(src, dst) -> str:
  """Copies a (read-only) checkpoint so a test may damage it."""
  shutil.copytree(src, dst)
  for root, _, files in os.walk(dst):
    os.chmod(root, 0o755)
    for name in files:
      os.chmod(os.path.join(root, name), 0o644)
  return str(dst)


def edit_msgpack(ckpt_dir, edit) -> None:
  path = os.path.join(ckpt_dir, "checkpoint")
  with open(path, "rb") as f:
    contents = serialization.msgpack_restore(f.read())
  edit(contents)
  with open(path, "wb") as f:
    f.write(serialization.msgpack_serialize(contents))


def read_t5x_raw(ckpt_dir) -> dict[str, np.ndarray]:
  """Every array under optimizer/target, read as t5x reads it: {path: stored array}."""
  with open(os.path.join(ckpt_dir, "checkpoint"), "rb") as f:
    contents = serialization.msgpack_restore(f.read())
  assert contents["version"] == 3
  out = {}
  def walk(node, prefix):
    if isinstance(node, dict) and "driver" in node:
      spec = {"driver": node["driver"], "kvstore": {
          "driver": "file", "path": os.path.join(str(ckpt_dir), node["kvstore"]["path"])}}
      store = ts.open(spec, open=True).result()
      assert list(store.shape) == node["metadata"]["shape"]
      out[prefix] = np.asarray(store.read().result())
    elif isinstance(node, dict):
      for k, v in node.items():
        walk(v, f"{prefix}/{k}" if prefix else k)
    else:
      out[prefix] = np.asarray(node)
  walk(contents["optimizer"]["target"], "")
  return out


def flat(params) -> dict[str, np.ndarray]:
  return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(params, sep="/").items()}


def random_params(config, seed=0):
  """Random numpy parameters with the shapes `Transformer(config)` expects."""
  rng = np.random.RandomState(seed)
  shapes = checkpoints.abstract_params(config)[0]
  return traverse_util.unflatten_dict(
      {p: rng.standard_normal(s.shape).astype(np.float32) for p, s in shapes.items()}, sep="/")


def assert_identical(a, b):
  fa, fb = flat(a), flat(b)
  assert sorted(fa) == sorted(fb)
  for k in fa:
    assert fa[k].dtype == fb[k].dtype, k
    assert np.array_equal(fa[k], fb[k]), k


# ----------------------------------------------------------------------------- the real fixture


def test_real_t5x_checkpoint_loads_every_tensor(fixture_dir):
  raw = read_t5x_raw(fixture_dir)
  params = load_checkpoint(str(fixture_dir), TINY)
  got = flat(params)
  assert sorted(got) == sorted(raw)  # every stored tensor consumed, nothing else
  for name, value in raw.items():
    assert got[name].shape == value.shape and got[name].dtype == np.float32, name
    assert np.array_equal(got[name], value), name
  enc = jnp.array([[5, 6, 7, 1, 0, 0], [9, 1, 0, 0, 0, 0]])
  dec_in = jnp.array([[0, 8, 9], [0, 4, 0]])
  tgt = jnp.array([[8, 9, 1], [4, 1, 0]])
  apply = jax.jit(lambda p, *batch: Transformer(TINY).apply({"params": p}, *batch,
                                                            enable_dropout=False))
  logits = apply(params, enc, dec_in, tgt)
  assert logits.shape == (2, 3, TINY.vocab_size)
  assert bool(jnp.isfinite(logits).all())
  assert float(jnp.abs(logits).max()) > 0


def test_fixture_via_checkpoint_file_and_bfloat16(fixture_dir):
  raw = read_t5x_raw(fixture_dir)
  params = load_checkpoint(str(fixture_dir / "checkpoint"), TINY, dtype=jnp.bfloat16)
  for name, value in flat(params).items():
    assert value.dtype == jnp.bfloat16
    assert np.array_equal(value, raw[name].astype(ml_dtypes.bfloat16)), name


def test_load_embedding_reads_only_the_table(fixture_dir):
  table = checkpoints.load_embedding(str(fixture_dir), TINY)
  assert table.shape == (32128, 4) and table.dtype == np.float32
  assert np.array_equal(table, read_t5x_raw(fixture_dir)["token_embedder/embedding"])
  with pytest.raises(CheckpointError,
                     match=r"token_embedder/embedding: expected shape \[32128, 8\]"):
    checkpoints.load_embedding(str(fixture_dir), TINY.replace(emb_dim=8))


def test_newer_layout_with_target_at_the_top(fixture_dir, tmp_path):
  ckpt = writable_copy(fixture_dir, tmp_path / "ckpt")
  def flatten_optimizer(c):
    optimizer = c.pop("optimizer")
    c["target"], c["state"] = optimizer["target"], optimizer["state"]
  edit_msgpack(ckpt, flatten_optimizer)
  assert_identical(load_checkpoint(ckpt, TINY), load_checkpoint(str(fixture_dir), TINY))


# ----------------------------------------------------------------------------- damaged checkpoints


@pytest.mark.parametrize("changes, needle", [
    ({"num_encoder_layers": 3}, r"missing encoder/layers_2/attention/key/kernel \[4, 4\]"),
    ({"num_decoder_layers": 1}, r"unexpected decoder/layers_1/"),
    ({"mlp_dim": 16},
     r"decoder/layers_0/mlp/wi_0/kernel: expected shape \[4, 16\], found \[4, 8\]"),
    ({"emb_dim": 8}, r"decoder/decoder_norm/scale: expected shape \[8\], found \[4\]"),
    ({"num_heads": 4}, r"\(26 problems\): decoder/layers_0/encoder_decoder_attention/key/kernel: "
                       r"expected shape \[4, 8\], found \[4, 4\]"),
    ({"logits_via_embedding": True}, r"unexpected decoder/logits_dense/kernel \[4, 32128\]"),
    ({"vocab_size": 32100}, r"token_embedder/embedding: expected shape \[32100, 4\]"),
])
def test_config_mismatch_names_the_parameter(fixture_dir, changes, needle):
  with pytest.raises(CheckpointError, match=needle):
    load_checkpoint(str(fixture_dir), TINY.replace(**changes))


def test_missing_array_directory(fixture_dir, tmp_path):
  ckpt = writable_copy(fixture_dir, tmp_path / "ckpt")
  shutil.rmtree(os.path.join(ckpt, "target.encoder.layers_1.attention.key.kernel"))
  with pytest.raises(CheckpointError,
                     match=r"encoder/layers_1/attention/key/kernel.*does not exist"):
    load_checkpoint(ckpt, TINY)


def test_missing_msgpack_entry(fixture_dir, tmp_path):
  ckpt = writable_copy(fixture_dir, tmp_path / "ckpt")
  edit_msgpack(ckpt, lambda c: c["optimizer"]["target"]["encoder"].pop("encoder_norm"))
  with pytest.raises(CheckpointError, match=r"missing encoder/encoder_norm/scale \[4\]"):
    load_checkpoint(ckpt, TINY)


def test_truncated_chunk_file(fixture_dir, tmp_path):
  ckpt = writable_copy(fixture_dir, tmp_path / "ckpt")
  chunk = os.path.join(ckpt, "target.token_embedder.embedding", "3.0")
  with open(chunk, "rb") as f:
    data = f.read()
  with open(chunk, "wb") as f:
    f.write(data[:len(data) // 2])
  with pytest.raises(CheckpointError,
                     match=r"cannot read token_embedder/embedding "
                           r".*target.token_embedder.embedding/3.0"):
    load_checkpoint(ckpt, TINY)


def test_deleted_chunk_file_is_not_read_as_zeros(fixture_dir, tmp_path):
  ckpt = writable_copy(fixture_dir, tmp_path / "ckpt")
  os.remove(os.path.join(ckpt, "target.decoder.logits_dense.kernel", "0.5"))
  with pytest.raises(CheckpointError, match=r"cannot read decoder/logits_dense/kernel .*missing"):
    load_checkpoint(ckpt, TINY)


def test_array_shape_disagrees_with_msgpack(fixture_dir, tmp_path):
  ckpt = writable_copy(fixture_dir, tmp_path / "ckpt")
  zarray = os.path.join(ckpt, "target.encoder.layers_1.mlp.wo.kernel", ".zarray")
  with open(zarray, encoding="utf-8") as f:
    meta = json.load(f)
  meta["shape"] = [8, 5]
  with open(zarray, "w", encoding="utf-8") as f:
    json.dump(meta, f)
  with pytest.raises(CheckpointError, match=r"cannot read encoder/layers_1/mlp/wo/kernel"):
    load_checkpoint(ckpt, TINY)


def test_unexpected_extra_tensor_and_allow_missing(fixture_dir, tmp_path):
  ckpt = writable_copy(fixture_dir, tmp_path / "ckpt")
  def add(c):
    target = c["optimizer"]["target"]
    target["encoder"]["layers_0"]["attention"]["bias"] = np.zeros(4, np.float32)
    target["prompt"] = {"prompt": np.ones((5, 4), np.float32)}
  edit_msgpack(ckpt, add)
  with pytest.raises(CheckpointError, match=r"unexpected encoder/layers_0/attention/bias \[4\]"):
    load_checkpoint(ckpt, TINY, allow_missing=("prompt",))
  with pytest.raises(CheckpointError, match=r"unexpected prompt/prompt \[5, 4\]"):
    load_checkpoint(ckpt, TINY, allow_missing=("encoder/layers_0/attention/bias",))
  params = load_checkpoint(ckpt, TINY, allow_missing=("prompt", "encoder/layers_0/attention/bias"))
  assert "prompt" not in params
  raw = read_t5x_raw(fixture_dir)
  assert sorted(flat(params)) == sorted(raw)


def test_allow_missing_exempts_absent_parameters(fixture_dir, tmp_path):
  ckpt = writable_copy(fixture_dir, tmp_path / "ckpt")
  edit_msgpack(ckpt, lambda c: c["optimizer"]["target"]["decoder"].pop("logits_dense"))
  with pytest.raises(CheckpointError, match=r"missing decoder/logits_dense/kernel \[4, 32128\]"):
    load_checkpoint(ckpt, TINY)
  params = load_checkpoint(ckpt, TINY, allow_missing=("decoder/logits_dense",))
  assert "logits_dense" not in params["decoder"]


def test_not_a_checkpoint(tmp_path):
  with pytest.raises(CheckpointError, match="does not exist"):
    load_checkpoint(str(tmp_path / "nowhere"), TINY)
  (tmp_path / "model" / "checkpoint_3").mkdir(parents=True)
  with pytest.raises(CheckpointError, match="checkpoint_3: pass one of those"):
    load_checkpoint(str(tmp_path / "model"), TINY)


# ----------------------------------------------------------------------------- Hugging Face damage


@pytest.fixture(scope="module")
def hf_original(tmp_path_factory):
  """A random tiny original-T5 (ReLU, tied) saved by transformers, and its T5Config."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  hf_config = transformers.T5Config(
      vocab_size=40, d_model=8, d_kv=4, d_ff=12, num_layers=2, num_heads=2,
      relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
      feed_forward_proj="relu")
  torch.manual_seed(0)
  directory = tmp_path_factory.mktemp("hf") / "t5"
  transformers.T5ForConditionalGeneration(hf_config).save_pretrained(directory)
  config = TINY.replace(vocab_size=40, emb_dim=8, head_dim=4, mlp_dim=12,
                        relative_attention_num_buckets=8, relative_attention_max_distance=16,
                        mlp_activations=("relu",), logits_via_embedding=True)
  return directory, config


@pytest.fixture
def hf_dir(hf_original, tmp_path):
  """A private copy of `hf_original` that a test may damage."""
  directory, config = hf_original
  return Path(shutil.copytree(directory, tmp_path / "hf")), config


def edit_safetensors(directory, edit) -> None:
  from safetensors.numpy import load_file, save_file
  path = os.path.join(directory, "model.safetensors")
  tensors = load_file(path)
  edit(tensors)
  save_file(tensors, path)


def test_hf_loads_and_matches_the_stored_tensors(hf_dir):
  from safetensors.numpy import load_file
  directory, config = hf_dir
  params = load_checkpoint(str(directory), config)
  stored = load_file(os.path.join(directory, "model.safetensors"))
  got = flat(params)
  assert np.array_equal(got["token_embedder/embedding"], stored["shared.weight"])
  assert np.array_equal(got["encoder/layers_1/attention/query/kernel"],
                        stored["encoder.block.1.layer.0.SelfAttention.q.weight"].T)
  assert np.array_equal(got["decoder/relpos_bias/rel_embedding"],
                        stored["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].T)
  assert np.array_equal(checkpoints.load_embedding(str(directory), config), stored["shared.weight"])


def test_hf_missing_key(hf_dir):
  directory, config = hf_dir
  edit_safetensors(directory, lambda t: t.pop("encoder.block.1.layer.0.SelfAttention.k.weight"))
  with pytest.raises(CheckpointError,
                     match=r"missing encoder/layers_1/attention/key/kernel \[8, 8\]"):
    load_checkpoint(str(directory), config)


def test_hf_unexpected_key(hf_dir):
  directory, config = hf_dir
  def add(t):
    t["encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"] = np.zeros(
        (8, 2), np.float32)
  edit_safetensors(directory, add)
  with pytest.raises(CheckpointError,
                     match=r"unexpected "
                           r"encoder\.block\.1\.layer\.0\.SelfAttention\.relative_attention_bias"):
    load_checkpoint(str(directory), config)


def test_hf_unused_cross_attention_bias_is_skipped(hf_dir):
  """Old HF exports carry a relative bias in decoder cross-attention that T5 never uses."""
  directory, config = hf_dir
  reference = load_checkpoint(str(directory), config)
  def add(t):
    t["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"] = np.ones(
        (8, 2), np.float32)
  edit_safetensors(directory, add)
  assert_identical(load_checkpoint(str(directory), config), reference)


def test_hf_config_mismatch_names_the_field(hf_dir):
  directory, config = hf_dir
  with pytest.raises(CheckpointError, match=r"d_ff=12 but T5Config.mlp_dim=16"):
    load_checkpoint(str(directory), config.replace(mlp_dim=16))
  with pytest.raises(CheckpointError, match=r"num_layers=2 but T5Config.num_encoder_layers=3"):
    load_checkpoint(str(directory), config.replace(num_encoder_layers=3))
  with pytest.raises(CheckpointError, match=r"feed_forward_proj=\('relu',\)"):
    load_checkpoint(str(directory), config.replace(mlp_activations=("gelu", "linear")))


def test_hf_tied_config_with_distinct_lm_head(hf_dir):
  directory, config = hf_dir
  edit_safetensors(directory,
                   lambda t: t.__setitem__("lm_head.weight", np.ones((40, 8), np.float32)))
  with pytest.raises(CheckpointError, match=r"lm_head\.weight differs from shared\.weight"):
    load_checkpoint(str(directory), config)


def test_hf_directory_without_weights(hf_dir):
  directory, config = hf_dir
  os.remove(os.path.join(directory, "model.safetensors"))
  with pytest.raises(CheckpointError, match="holds no Hugging Face weights"):
    load_checkpoint(str(directory), config)


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", ["t5_1_1_test", "t5_test"])
def test_t5x_round_trip_is_bit_identical(name, tmp_path):
  config = config_by_name(name)
  params = random_params(config)
  out = save_checkpoint(params, str(tmp_path / "checkpoint_7"), step=7)
  assert out == str(tmp_path / "checkpoint_7")
  assert_identical(load_checkpoint(out, config), params)
  # The files are what t5x reads: version 3, optimizer/target, gzip zarr arrays, relative paths.
  raw = read_t5x_raw(out)
  assert_identical(traverse_util.unflatten_dict(raw, sep="/"), params)
  with open(os.path.join(out, "checkpoint"), "rb") as f:
    contents = serialization.msgpack_restore(f.read())
  assert int(contents["optimizer"]["state"]["step"]) == 7
  spec = contents["optimizer"]["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
  assert spec["driver"] == "zarr" and spec["metadata"]["compressor"]["id"] == "gzip"
  assert spec["kvstore"]["path"] == "target.encoder.layers_0.attention.query.kernel"
  assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_orbax_round_trip_is_bit_identical(tmp_path):
  config = config_by_name("t5_1_1_test")
  params = random_params(config, seed=1)
  out = save_checkpoint(params, str(tmp_path / "orbax"), format="orbax", step=3)
  assert checkpoints.detect_format(out) == ("orbax", out)
  assert_identical(load_checkpoint(out, config), params)
  assert np.array_equal(checkpoints.load_embedding(out, config),
                        params["token_embedder"]["embedding"])


def test_orbax_layouts_and_strictness(tmp_path):
  import orbax.checkpoint as ocp
  config = config_by_name("t5_test")
  params = random_params(config, seed=2)
  standard = ocp.StandardCheckpointer()
  standard.save(tmp_path / "root", params)
  standard.wait_until_finished()
  assert_identical(load_checkpoint(str(tmp_path / "root"), config), params)
  state = {"param_states": {"m": np.zeros(3, np.float32)}, "step": np.int32(5)}
  ocp.PyTreeCheckpointer().save(tmp_path / "nested",
                                {"optimizer": {"target": params, "state": state}})
  assert_identical(load_checkpoint(str(tmp_path / "nested"), config), params)
  ocp.PyTreeCheckpointer().save(tmp_path / "variables", {"params": params})
  assert_identical(load_checkpoint(str(tmp_path / "variables"), config), params)
  partial = jax.tree.map(lambda x: x, params)
  del partial["encoder"]["layers_1"]["mlp"]["wo"]
  ocp.PyTreeCheckpointer().save(tmp_path / "partial", {"target": partial})
  with pytest.raises(CheckpointError, match=r"missing encoder/layers_1/mlp/wo/kernel \[64, 32\]"):
    load_checkpoint(str(tmp_path / "partial"), config)
  with pytest.raises(CheckpointError, match=r"expected shape \[32, 32\], found \[32, 64\]|"
                     r"expected shape \[64, 32\], found \[32, 32\]"):
    load_checkpoint(str(tmp_path / "root"), config.replace(mlp_dim=32))


def test_bfloat16_round_trip(tmp_path):
  config = config_by_name("t5_1_1_test")
  params = jax.tree.map(lambda x: x.astype(ml_dtypes.bfloat16), random_params(config))
  out = save_checkpoint(params, str(tmp_path / "bf16"))
  with open(os.path.join(out, "checkpoint"), "rb") as f:
    contents = serialization.msgpack_restore(f.read())
  assert (contents["optimizer"]["target"]["token_embedder"]["embedding"]["metadata"]["dtype"]
          == "bfloat16")
  assert_identical(load_checkpoint(out, config, dtype=jnp.bfloat16), params)


def test_streamed_save_of_stored_arrays(fixture_dir, tmp_path):
  stored = checkpoints.stored_arrays(str(fixture_dir), TINY)
  out = save_checkpoint(traverse_util.unflatten_dict(stored, sep="/"), str(tmp_path / "copy"))
  assert_identical(load_checkpoint(out, TINY), load_checkpoint(str(fixture_dir), TINY))


def test_save_never_overwrites_silently(tmp_path):
  config = config_by_name("t5_test")
  first, second = random_params(config, seed=0), random_params(config, seed=1)
  path = str(tmp_path / "ckpt")
  save_checkpoint(first, path)
  with pytest.raises(ConfigError, match="overwrite=True"):
    save_checkpoint(second, path)
  with pytest.raises(ConfigError):
    save_checkpoint(second, path, format="orbax")
  assert_identical(load_checkpoint(path, config), first)
  save_checkpoint(second, path, overwrite=True)
  assert_identical(load_checkpoint(path, config), second)
  assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_save_rejects_bad_arguments(tmp_path):
  params = random_params(config_by_name("t5_test"))
  with pytest.raises(ValueError, match="format must be"):
    save_checkpoint(params, str(tmp_path / "x"), format="npz")
  with pytest.raises(ValueError, match=r"variables\['params'\]"):
    save_checkpoint({"params": params}, str(tmp_path / "y"))


def test_chunk_shape_divides_and_fits():
  for shape, itemsize in [((32128, 4096), 4), ((4096, 10240), 4), ((64, 32), 4),
                          ((10240, 4096), 2)]:
    chunks = save_lib._chunk_shape(shape, itemsize)  # pylint: disable=protected-access
    assert all(s % c == 0 for s, c in zip(shape, chunks))
    assert np.prod(chunks) * itemsize <= 64 * 2 ** 20
