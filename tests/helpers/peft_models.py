"""What the PEFT interop tests share: a fixed padded batch and a random T5 on both sides."""
from __future__ import annotations

import jax
import numpy as np

from spot_jax.backbones.t5 import checkpoints, config_by_name
from tests.helpers.prompt_train import frozen_backbone


def padded_batch(vocab: int, rows: int = 3, target_length: int = 5, target_padding: int = 3):
  """(enc, dec_in, tgt) int64: row 1's input padded from 6, row 2's from 3, row 0's target from
  `target_padding`; the decoder input is the target shifted right."""
  rng = np.random.RandomState(3)
  enc = rng.randint(2, vocab, size=(rows, 9))
  enc[1, 6:] = 0
  enc[2, 3:] = 0
  tgt = rng.randint(2, vocab, size=(rows, target_length))
  tgt[0, target_padding:] = 0
  dec_in = np.concatenate([np.zeros((rows, 1), np.int64), tgt[:, :-1]], axis=1)
  return enc, dec_in, tgt


def peft_base(name: str, tmp_path_factory):
  """A random backbone of the named config (NumPy tree) saved as a T5X checkpoint in a fresh
  folder and converted to a Hugging Face directory by `spot_jax.convert`;
  -> (config, the folder, backbone, hf dir)."""
  from spot_jax import convert  # pylint: disable=g-import-not-at-top
  config = config_by_name(name, dropout_rate=0.0)
  root = tmp_path_factory.mktemp(name)
  backbone = jax.tree_util.tree_map(np.asarray, frozen_backbone(config, 0))
  checkpoints.save_checkpoint(backbone, str(root / "checkpoint_0"), format="t5x")
  assert convert.main(["--checkpoint", str(root / "checkpoint_0"), "--model", name,
                       "--output_dir", str(root / "hf")]) == 0
  return config, root, backbone, root / "hf"
