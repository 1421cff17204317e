"""A frozen backbone is named as a user writes it (config name, checkpoint path or random seed)
beside its fingerprint, the proof: refusals of another backbone name both sides."""
from __future__ import annotations

import pytest

from spot_jax import backbone as backbone_lib
from spot_jax import embedded
from spot_jax.cli import flags
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import config_by_name


def test_the_shipped_checkpoint_and_a_gin_model_file_by_their_names(tmp_path, monkeypatch):
  toy = backbone_lib.fingerprint(flags.model_config("gin/models/t5_1_1_toy.gin"),
                                 embedded.CHECKPOINT_PATH)
  assert toy["model"] == "t5_1_1_toy + checkpoint spot_jax/embedded/toy_t5/checkpoint"
  monkeypatch.chdir(tmp_path)  # a relative path to the shipped checkpoint, from anywhere
  assert backbone_lib.fingerprint(config_by_name("t5_1_1_toy"),
                                  "spot_jax/embedded/toy_t5/checkpoint") == toy
  small = backbone_lib.fingerprint(config_by_name("t5_1_1_small"), None, 0)
  assert small["model"] == "t5_1_1_small or t5_1_1_lm100k_small + random weights of seed 0"
  with pytest.raises(ConfigError) as refused:
    backbone_lib.check_same(toy, small, "--prompt run1k", "--allow_backbone_change")
  assert str(refused.value) == (
      f"--prompt run1k was trained against frozen model t5_1_1_toy + checkpoint "
      f"spot_jax/embedded/toy_t5/checkpoint (fingerprint {toy['id']}), not t5_1_1_small or "
      f"t5_1_1_lm100k_small + random weights of seed 0 (fingerprint {small['id']}) given now; "
      f"give the backbone it was trained with (config and checkpoint), or "
      f"--allow_backbone_change to move the prompt on purpose")


def test_an_unregistered_config_and_an_old_record():
  odd = config_by_name("t5_1_1_test").replace(mlp_dim=48)
  fp = backbone_lib.fingerprint(odd, None, 3)
  assert fp["model"] == f"config {fp['config'][:16]} + random weights of seed 3"
  old = {k: v for k, v in fp.items() if k != "model"}  # recorded before names were kept
  assert backbone_lib.describe(old) == f"{fp['id']} (random:3)"
  assert backbone_lib.same_model(old, fp)
