"""Files shipped with the package: the embedded toy T5 (`toy_t5/`), made by
`spot_jax.embedded.pretrain`, and the embedded toy decoder (`toy_decoder/`), made by
`spot_jax.embedded.pretrain_decoder`; both speak the suite's one vocabulary (`tasks.embedded`).

Attributes:
  TOY_DIR: the folder holding the toy model, its vocabulary, gin file, loss log and README.
  CHECKPOINT_PATH: its T5X checkpoint directory (load with `spot_jax.backbones.t5.load_checkpoint`).
  VOCAB_PATH: its SentencePiece model (the vocabulary of `tasks.embedded`).
  CONFIG_NAME: its `spot_jax.backbones.t5.config_by_name` name.
  TOY_DIR_ENV: environment variable naming another folder made by `pretrain_toy` to use
    instead (read at import).
  DECODER_DIR: the folder holding the toy decoder, its vocabulary copy, gin file, logs and
    README.
  DECODER_CHECKPOINT_PATH: its Hugging Face directory (load with
    `spot_jax.backbones.decoder.checkpoints.load_checkpoint`).
  DECODER_VOCAB_PATH: its SentencePiece model (the same bytes as VOCAB_PATH).
  DECODER_CONFIG_NAME: its config's name (`spot_jax.embedded.decoder_config.toy_config`).

Modules:
  pretrain   `python -m spot_jax.embedded.pretrain`: makes the toy T5 from nothing, on a CPU
  toy_data   the pretraining data: SentencePiece vocabulary, span corruption, task batches, and
             the decoder's rows of text and of "<task> <inputs> EOS <targets> EOS"
  pretrain_decoder  `python -m spot_jax.embedded.pretrain_decoder`: makes the toy decoder
  decoder_config    its config (`decoder_toy`, Llama-style, BOS a row of its own)
"""
import os

TOY_DIR_ENV = "SPOT_JAX_TOY_DIR"
TOY_DIR = (os.environ.get(TOY_DIR_ENV)
           or os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_t5"))
CHECKPOINT_PATH = os.path.join(TOY_DIR, "checkpoint")
VOCAB_PATH = os.path.join(TOY_DIR, "spm.model")
CONFIG_NAME = "t5_1_1_toy"
DECODER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_decoder")
DECODER_CHECKPOINT_PATH = os.path.join(DECODER_DIR, "checkpoint")
DECODER_VOCAB_PATH = os.path.join(DECODER_DIR, "spm.model")
DECODER_CONFIG_NAME = "decoder_toy"

EMBEDDED_PREFIX = "embedded:"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def portable(path: str) -> str:
  """`path`, absolute; a file of this package's embedded folder as "embedded:<relative path>".

  Run records store paths this way, so a run of the embedded model still finds its checkpoint
  and vocabulary when the repository or the installed package moves.
  """
  absolute = os.path.abspath(path)
  for root in {_PACKAGE_DIR, os.path.dirname(os.path.abspath(TOY_DIR))}:
    if absolute == root or absolute.startswith(root + os.sep):
      return (EMBEDDED_PREFIX + os.path.relpath(absolute,
                                                _PACKAGE_DIR if root == _PACKAGE_DIR else root))
  return absolute


def resolve(path: str) -> str:
  """The local path of a `portable` one ("embedded:..." under this package's embedded folder)."""
  if path.startswith(EMBEDDED_PREFIX):
    return os.path.join(_PACKAGE_DIR, path[len(EMBEDDED_PREFIX):])
  return path
