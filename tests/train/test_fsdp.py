"""FSDP of the frozen weights on 8 fake CPU devices: the trainer's step changes no gradient.

XLA_FLAGS must be set before jax is imported, so the check runs as a script in a subprocess that
reports JSON. For T5 and a decoder-only model (tiny, float32, no dropout), the trainer's jitted
step (`train.step.jit_step`, SGD at rate 1, so the update is the gradient) runs once on one
device and once on a (data=8, model=1) mesh whose frozen weights are sharded by
`partitioning.frozen_rules(rules, fsdp=True)`: the prompt after the step agrees within 1e-6, the
prompt stays replicated, and every frozen weight with an "embed" axis is split 8 ways. A width
that 8 does not divide is refused in one line naming the parameter, its shape and the mesh.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.helpers import REPO

SCRIPT = textwrap.dedent(r"""
    import json
    import flax.linen as nn
    import jax, jax.numpy as jnp, numpy as np, optax
    from spot_jax import backbone as backbone_lib, models, partitioning, prompts
    from spot_jax.backbones import decoder, t5
    from spot_jax.errors import ConfigError
    from spot_jax.train import step as step_lib
    from spot_jax.train.state import TrainState

    def build(kind, width=32):
      prompt = prompts.PromptTuning(length=4)
      if kind == "t5":
        config = t5.config_by_name("t5_1_1_test").replace(dropout_rate=0.0, emb_dim=width)
        return models.EncoderDecoderModel(t5.Transformer(config, prompt=prompt), z_loss=0.0)
      config = decoder.config_by_name("decoder_tiny_llama").replace(emb_dim=width)
      return models.DecoderOnlyModel(decoder.DecoderLM(config, prompt=prompt)).for_batches(
          {"inputs": 12, "targets": 6})

    def batch_of(model, vocab):
      rng = np.random.RandomState(0)
      batch = {k: np.asarray(v) for k, v in model.dummy_batch(12, 6, 8).items()}
      for k in batch:
        if k != "decoder_loss_weights":
          batch[k] = rng.randint(3, vocab, size=batch[k].shape).astype(np.int32)
      if "decoder_loss_weights" in batch:
        batch["decoder_loss_weights"] = np.concatenate(
            [np.zeros((8, 12), np.int32), np.ones((8, 6), np.int32)], 1)
      return batch

    def one_step(model, frozen, prompt, batch, mesh, fsdp):
      rules = partitioning.logical_rules()
      tx = optax.sgd(1.0)
      dummy = model.dummy_batch(12, 6)
      abstract = jax.eval_shape(model.init_backbone, jax.random.PRNGKey(0), dummy)
      frozen_sh = partitioning.param_shardings(
          abstract, mesh, partitioning.frozen_rules(rules, fsdp))
      with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        frozen = jax.device_put(frozen, frozen_sh)
        state = TrainState.create(jax.tree.map(np.array, prompt), tx, jax.random.PRNGKey(1))
        state_sh = jax.tree.map(lambda _: partitioning.replicated(mesh), state)
        state = jax.device_put(state, state_sh)
        fn = step_lib.jit_step(model, tx, mesh, state_shardings=state_sh,
                               frozen_shardings=frozen_sh,
                               batch_sharding=partitioning.batch_sharding(mesh))
        new, metrics = fn(state, frozen, jax.device_put(batch, partitioning.batch_sharding(mesh)))
      leaf = new.params["prompt"]["prompt"]
      split = {jax.tree_util.keystr(p): x.addressable_shards[0].data.shape != x.shape
               for p, x in jax.tree_util.tree_flatten_with_path(frozen)[0]}
      return np.asarray(leaf), float(metrics["loss"]), leaf.sharding.is_fully_replicated, split

    report = {"devices": jax.device_count()}
    one = partitioning.create_mesh(1, devices=jax.devices()[:1])
    eight = partitioning.create_mesh(1)
    for kind in ("t5", "decoder"):
      model = build(kind)
      dummy = model.dummy_batch(12, 6)
      frozen = models.unbox(model.init_backbone(jax.random.PRNGKey(0), dummy))
      prompt = models.unbox(model.init_prompt(jax.random.PRNGKey(2), frozen, dummy))
      batch = batch_of(model, model.config.vocab_size)
      ref, ref_loss, _, _ = one_step(model, frozen, prompt, batch, one, False)
      got, loss, replicated, split = one_step(model, frozen, prompt, batch, eight, True)
      start = np.asarray(prompt["prompt"]["prompt"])
      report[kind] = {"max_diff": float(np.abs(got - ref).max()),
                      "max_grad": float(np.abs(ref - start).max()),
                      "loss_diff": abs(loss - ref_loss), "prompt_replicated": replicated,
                      "split": split}
    try:
      model = build("decoder", width=36)
      backbone_lib.load_backbone(model, model.dummy_batch(12, 6), None, 0, eight,
                                 partitioning.frozen_rules(partitioning.logical_rules(), True),
                                 info=lambda _: None)
      report["indivisible"] = "loaded"
    except ConfigError as e:
      report["indivisible"] = str(e)
    print("REPORT " + json.dumps(report))
""")


def test_fsdp_changes_no_gradient_on_both_backbones():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       cwd=REPO, timeout=600, check=False)
  lines = [l for l in run.stdout.splitlines() if l.startswith("REPORT ")]
  assert lines, run.stderr[-3000:]
  report = json.loads(lines[0][len("REPORT "):])
  assert report["devices"] == 8
  for kind in ("t5", "decoder"):
    r = report[kind]
    assert r["max_grad"] > 1e-3, r  # the step moved the prompt: the comparison can fail
    assert r["max_diff"] <= 1e-6, r
    assert r["loss_diff"] <= 1e-6, r
    assert r["prompt_replicated"], r
    # every frozen weight has an "embed" axis except T5's relative position biases [heads, buckets]
    whole = sorted(p for p, split in r["split"].items() if not split)
    assert len(r["split"]) > 10 and all("relpos_bias" in p for p in whole), whole
  message = report["indivisible"]
  assert "does not divide over the mesh (data=8 x model=1)" in message, message
  assert "of shape [36]" in message and "FSDP=False" in message, message
  assert "\n" not in message
