"""Files shipped with the package: the embedded toy T5 (`toy_t5/`), made by `spot_jax.embedded.pretrain`.

Attributes:
  TOY_DIR: the folder holding the toy model, its vocabulary, gin file, loss log and README.
  CHECKPOINT_PATH: its T5X checkpoint directory (load with `spot_jax.t5.load_checkpoint`).
  VOCAB_PATH: its SentencePiece model (the vocabulary of `tasks.embedded`).
  CONFIG_NAME: its `spot_jax.t5.config_by_name` name.
  TOY_DIR_ENV: environment variable naming another folder made by `pretrain_toy` to use
    instead (read at import).
"""
import os

TOY_DIR_ENV = "SPOT_JAX_TOY_DIR"
TOY_DIR = os.environ.get(TOY_DIR_ENV) or os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_t5")
CHECKPOINT_PATH = os.path.join(TOY_DIR, "checkpoint")
VOCAB_PATH = os.path.join(TOY_DIR, "spm.model")
CONFIG_NAME = "t5_1_1_toy"
