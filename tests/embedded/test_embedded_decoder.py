"""The embedded toy decoder: the committed checkpoint loads strictly at its stated size, it
answers a pretrained source task on its own, and its program reproduces its first losses."""
from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import pytest

from spot_jax import embedded
from spot_jax.embedded import decoder_config
from tasks import embedded as suite
from tests.helpers import REPO

COMMITTED = pathlib.Path(embedded.DECODER_DIR)
needs_model = pytest.mark.skipif(not (COMMITTED / "checkpoint").is_dir(),
                                 reason=f"no toy decoder at {COMMITTED}; run python -m "
                                        "spot_jax.embedded.pretrain_decoder")


@pytest.fixture(scope="module")
def committed():
  """(config, params, losses.json) of the committed toy decoder, loaded strictly."""
  from spot_jax.backbones.decoder import checkpoints  # pylint: disable=g-import-not-at-top
  config, params = checkpoints.load_checkpoint(embedded.DECODER_CHECKPOINT_PATH,
                                               decoder_config.toy_config())
  return config, params, json.loads((COMMITTED / "losses.json").read_text())


@needs_model
def test_committed_decoder_loads_strictly_at_its_stated_size(committed):
  config, params, log = committed
  assert config == decoder_config.toy_config()
  assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)) == log["num_parameters"]
  assert f"{log['num_parameters']:,} parameters" in (COMMITTED / "README.md").read_text()
  assert len(log["loss"]) == log["steps"] and log["loss"][-1] < log["loss"][0] / 3
  # One vocabulary for the suite: the decoder's copy is the toy T5's, and no piece nor sentinel
  # reaches the BOS row.
  assert (COMMITTED / "spm.model").read_bytes() == pathlib.Path(embedded.VOCAB_PATH).read_bytes()
  assert suite.get_vocabulary().vocab_size <= config.bos_id == decoder_config.BOS_ID
  size = sum(f.stat().st_size for f in COMMITTED.rglob("*") if f.is_file())
  assert size <= 8 * 2 ** 20, f"the embedded decoder's folder holds {size} bytes"
  gin_file = (COMMITTED / f"{decoder_config.NAME}.gin").read_text()
  assert (REPO / "gin" / "models" / f"{decoder_config.NAME}.gin").read_text() == gin_file


def _greedy_accuracy(config, params, key: str, examples: int) -> float:
  """Greedy exact-match accuracy (%) of the backbone alone on the first validation examples of
  the task `key`, with its task prefix (as eval.json scores every task)."""
  from spot_jax.backbones.decoder.network import DecoderLM  # pylint: disable=g-import-not-at-top
  from spot_jax.embedded import pretrain_decoder  # pylint: disable=g-import-not-at-top
  vocab = suite.get_vocabulary()
  inputs, targets = (x[:examples] for x in suite.examples(key, "validation"))
  answers = pretrain_decoder.greedy_answers(DecoderLM(config), params,
                                            [vocab.encode(x) for x in inputs])
  decoded = [pretrain_decoder.decode_answer(vocab.tokenizer, a) for a in answers]
  return 100.0 * float(np.mean([d == y for d, y in zip(decoded, targets)]))


@needs_model
@pytest.mark.parametrize("key", ["topic", "sentiment_movies"])
def test_the_backbone_alone_answers_a_pretrained_source_task(committed, key):
  config, params, _ = committed
  accuracy = _greedy_accuracy(config, params, key, examples=40)
  chance = suite.TASKS[key].chance
  assert accuracy >= chance + 30, (key, accuracy, chance)


@needs_model
def test_pretrain_decoder_reproduces_the_committed_first_losses(tmp_path):
  from spot_jax.backbones.decoder import checkpoints  # pylint: disable=g-import-not-at-top
  from spot_jax.embedded import pretrain_decoder  # pylint: disable=g-import-not-at-top
  log = json.loads((COMMITTED / "losses.json").read_text())
  steps = 3
  short = pretrain_decoder.pretrain(str(tmp_path), steps=log["schedule_steps"], seed=log["seed"],
                                    batch_size=log["batch_size"], stop_after=steps,
                                    evaluate=False)
  np.testing.assert_allclose(short["loss"], log["loss"][:steps], rtol=1e-5)
  checkpoints.load_checkpoint(str(tmp_path / "checkpoint"), decoder_config.toy_config())


def test_pretrain_decoder_bad_input_is_one_line(capsys, tmp_path):
  from spot_jax import cli  # pylint: disable=g-import-not-at-top
  from spot_jax.embedded.pretrain_decoder import main  # pylint: disable=g-import-not-at-top
  prog = "spot_jax.embedded.pretrain_decoder"
  assert cli.run(main, ["--steps=0", f"--output_dir={tmp_path}"], prog) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"{prog}: error: --steps=0 must be a positive"), err


def test_decoder_rows_score_text_everywhere_and_tasks_on_their_targets():
  from spot_jax.embedded import toy_data  # pylint: disable=g-import-not-at-top
  assert toy_data.decoder_row([5, 6]) == ([5, 6, 1], [1, 1, 1])
  assert toy_data.decoder_row([5, 6], [7]) == ([5, 6, 1, 7, 1], [0, 0, 0, 1, 1])


@needs_model
def test_transformers_llama_reads_the_committed_checkpoint_to_the_same_logits(committed):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from spot_jax.backbones.decoder.network import DecoderLM  # pylint: disable=g-import-not-at-top
  config, params, _ = committed
  reference = transformers.AutoModelForCausalLM.from_pretrained(
      embedded.DECODER_CHECKPOINT_PATH).eval()
  assert type(reference).__name__ == "LlamaForCausalLM"
  vocab = suite.get_vocabulary()
  tokens = np.array([[config.bos_id] + vocab.encode(suite.examples("topic", "validation")[0][0])
                     + [config.eos_id]])
  with torch.no_grad():
    want = reference(torch.tensor(tokens)).logits.numpy()
  got = np.asarray(DecoderLM(config).apply({"params": params}, tokens.astype(np.int32)))
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
