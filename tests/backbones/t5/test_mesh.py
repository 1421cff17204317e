"""Loading onto a (data=2, model=4) mesh of 8 fake CPU devices.

XLA_FLAGS must be set before jax is imported, so the check runs as a script in a subprocess;
it reports JSON that this test asserts on. For T5X legacy, orbax and Hugging Face checkpoints
of a tiny model: every array carries the rule-table sharding, holds the single-device values,
and the sharded forward pass equals the single-device one within 1e-5.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from flax import traverse_util

from spot_jax.backbones.t5 import save_checkpoint
from spot_jax.backbones.t5 import checkpoints, config_by_name
from tests.helpers import REPO as REPO_ROOT


SCRIPT = textwrap.dedent(r"""
    import json, sys
    import flax.linen as nn
    import jax, jax.numpy as jnp, numpy as np
    from flax import traverse_util
    from spot_jax import partitioning
    from spot_jax.backbones.t5 import Transformer, config_by_name, load_checkpoint
    from spot_jax.backbones.t5 import checkpoints

    paths, indivisible = json.loads(sys.argv[1]), sys.argv[2]
    config = config_by_name("t5_1_1_test")
    mesh = partitioning.create_mesh(num_partitions=4)
    rules = partitioning.DEFAULT_RULES
    _, boxed = checkpoints.abstract_params(config)
    want = traverse_util.flatten_dict(partitioning.param_shardings(boxed, mesh, rules), sep="/")
    model = Transformer(config)
    forward = lambda p, e, d, t: model.apply({"params": p}, e, d, t, enable_dropout=False)
    rng = np.random.RandomState(0)
    enc = rng.randint(2, config.vocab_size, size=(4, 12)); enc[1, 7:] = 0; enc[3, 2:] = 0
    tgt = rng.randint(2, config.vocab_size, size=(4, 6)); tgt[2, 3:] = 0
    dec = np.concatenate([np.zeros((4, 1), int), tgt[:, :-1]], 1); dec[tgt == 0] = 0
    batch = [jnp.asarray(x, jnp.int32) for x in (enc, dec, tgt)]
    report = {"devices": jax.device_count(), "mesh": dict(mesh.shape)}
    for fmt, path in paths.items():
      single = load_checkpoint(path, config)
      sharded = load_checkpoint(path, config, mesh=mesh)
      got = traverse_util.flatten_dict(sharded, sep="/")
      ref = traverse_util.flatten_dict(single, sep="/")
      wrong = [p for p, a in got.items() if not a.sharding.is_equivalent_to(want[p], a.ndim)
               or a.sharding.spec != want[p].spec]
      unequal = [p for p in ref if not np.array_equal(np.asarray(got[p]), np.asarray(ref[p]))]
      split = sorted(p for p, a in got.items()
                     if a.addressable_shards[0].data.shape != a.shape)
      logits_single = jax.jit(forward)(single, *batch)
      with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        data = partitioning.batch_sharding(mesh)
        logits_mesh = jax.jit(forward)(sharded, *[jax.device_put(x, data) for x in batch])
      valid = np.asarray(tgt) > 0
      diff = np.abs(np.asarray(logits_mesh) - np.asarray(logits_single))[valid].max()
      report[fmt] = {"params": len(got), "wrong_sharding": wrong, "unequal": unequal,
                     "split": split, "max_diff": float(diff),
                     "max_abs_logit": float(np.abs(np.asarray(logits_single))[valid].max())}
    try:
      load_checkpoint(indivisible, config.replace(num_heads=2), mesh=mesh)
      report["indivisible"] = "loaded"
    except ValueError as e:
      report["indivisible"] = str(e)
    print("REPORT " + json.dumps(report))
""")


def random_params(config, seed):
  """Random parameters at initialisation scale (kernels ~ N(0, 1/fan_in), norms ~ 1)."""
  rng = np.random.RandomState(seed)
  def draw(path, shape):
    if path.endswith("/scale"):
      return 1.0 + 0.1 * rng.standard_normal(shape)
    if path.endswith("/kernel"):
      return rng.standard_normal(shape) / np.sqrt(shape[0])
    return rng.standard_normal(shape)  # embedding, relative position biases
  shapes = checkpoints.abstract_params(config)[0]
  return traverse_util.unflatten_dict(
      {p: draw(p, s.shape).astype(np.float32) for p, s in shapes.items()}, sep="/")


def hf_checkpoint(directory) -> bool:
  """A random tiny T5.1.1 in Hugging Face format shaped like t5_1_1_test; False without torch."""
  try:
    import torch
    import transformers
  except ImportError:
    return False
  config = config_by_name("t5_1_1_test")
  hf_config = transformers.T5Config(
      vocab_size=config.vocab_size, d_model=config.emb_dim, d_kv=config.head_dim,
      d_ff=config.mlp_dim, num_layers=config.num_encoder_layers, num_heads=config.num_heads,
      relative_attention_num_buckets=config.relative_attention_num_buckets,
      relative_attention_max_distance=config.relative_attention_max_distance,
      feed_forward_proj="gated-gelu", tie_word_embeddings=False)
  torch.manual_seed(0)
  model = transformers.T5ForConditionalGeneration(hf_config)
  model.lm_head.weight = torch.nn.Parameter(torch.randn(config.vocab_size, config.emb_dim) * 0.2)
  model.save_pretrained(directory)
  return True


def test_loads_onto_8_device_mesh_with_rule_table_shardings(tmp_path):
  config = config_by_name("t5_1_1_test")
  paths = {
      "t5x": save_checkpoint(random_params(config, 0), str(tmp_path / "t5x")),
      "orbax": save_checkpoint(random_params(config, 1), str(tmp_path / "orbax"), format="orbax"),
  }
  if hf_checkpoint(tmp_path / "hf"):
    paths["hf"] = str(tmp_path / "hf")
  indivisible = save_checkpoint(random_params(config.replace(num_heads=2), 2),
                                str(tmp_path / "two_heads"))
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8",
             PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  run = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(paths), indivisible], env=env,
                       capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
  lines = [l for l in run.stdout.splitlines() if l.startswith("REPORT ")]
  print(lines[-1] if lines else run.stdout)
  assert run.returncode == 0 and lines, run.stderr[-3000:]
  report = json.loads(lines[-1][len("REPORT "):])
  assert report["devices"] == 8 and report["mesh"] == {"data": 2, "model": 4}
  for fmt in paths:
    r = report[fmt]
    assert r["params"] == len(checkpoints.abstract_params(config)[0])
    assert r["wrong_sharding"] == [], r["wrong_sharding"]
    assert r["unequal"] == [], r["unequal"]
    # The rule table really splits the big kernels over "model" (vocab, mlp, joined_kv, heads).
    for name in ("token_embedder/embedding", "decoder/logits_dense/kernel",
                 "encoder/layers_0/mlp/wi_0/kernel", "encoder/layers_0/attention/query/kernel",
                 "encoder/relpos_bias/rel_embedding"):
      assert name in r["split"], (fmt, name)
    assert "encoder/encoder_norm/scale" not in r["split"]
    assert r["max_diff"] < 1e-5, (fmt, r["max_diff"], r["max_abs_logit"])
  assert "relpos_bias/rel_embedding" in report["indivisible"]
  assert "cannot be split" in report["indivisible"]
  if "hf" not in paths:
    pytest.skip("torch/transformers absent: the Hugging Face mesh load was not checked")
