"""Id 0 is a token in the trainer's evaluation: a seqio task in a Llama-3-style tokenizer whose
"!" is id 0 (`TokenizerVocabulary`), inputs and targets full of "!", evaluated by `Evaluator` on
a tiny random Llama with a soft prompt. Its exact-match accuracy (greedy decoding) and mean
target log-likelihood (scoring) are the ones computed with transformers (1e-5)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
seqio = pytest.importorskip("seqio")

from spot_jax import models, prompts  # noqa: E402
from spot_jax.backbones.decoder.network import DecoderLM  # noqa: E402
from spot_jax.train import evaluator as evaluator_lib  # noqa: E402
from tests.helpers import bang_token as bang  # noqa: E402

TOL = 1e-5
LENGTHS = {"inputs": 16, "targets": 6}
INPUTS = ["wow! great!!", "!!!", "no way!", "ok!"]
TASK = "test_eval_token_zero"


def _accuracy(targets, predictions):
  return {"accuracy": float(np.mean([t == p for t, p in zip(targets, predictions)]))}


def _log_likelihood(targets, scores):
  del targets
  return {"log_likelihood": float(np.mean(scores))}


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
  """(tokenizer, torch model, DecoderConfig, params with the prompt, [P, E] prompt, targets)."""
  from tasks.vocab import TokenizerVocabulary  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  folder = bang.write_tokenizer(tmp_path_factory.mktemp("eval_bang"))
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
  model, cfg, params = bang.tiny_llama(tokenizer, likely_bang=True)
  prompt = np.random.RandomState(1).normal(0, 0.5, (3, cfg.emb_dim)).astype(np.float32)
  params = {**params, "prompt": {"prompt": prompt}}
  # Targets: the greedy answer of the first two inputs (hits), then two texts with "!".
  answers = [_answer(tokenizer, _greedy(tokenizer, model, text, prompt)) for text in INPUTS[:2]]
  targets = answers + ["yes!", "!no"]
  if TASK in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(TASK)
  vocab = TokenizerVocabulary(str(folder))
  source = seqio.FunctionDataSource(
      lambda split, shuffle_files, seed=None: tf.data.Dataset.from_tensor_slices(
          {"inputs": INPUTS, "targets": targets}), splits=["validation"])
  seqio.TaskRegistry.add(
      TASK, source=source,
      preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
      output_features={"inputs": seqio.Feature(vocab, add_eos=True),
                       "targets": seqio.Feature(vocab, add_eos=True)},
      metric_fns=[_accuracy, _log_likelihood])
  return tokenizer, model, cfg, params, prompt, targets


def _ids(tokenizer, text: str) -> list[int]:
  return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def _greedy(tokenizer, model, text, prompt) -> list[int]:
  return bang.greedy(model, [tokenizer.bos_token_id] + _ids(tokenizer, text),
                     LENGTHS["targets"], tokenizer.eos_token_id, prompt)[0]


def _answer(tokenizer, tokens: list[int]) -> str:
  eos = tokenizer.eos_token_id
  return tokenizer.decode(tokens[:tokens.index(eos)] if eos in tokens else tokens)


def test_evaluation_equals_transformers(setting, tmp_path):
  tokenizer, model, cfg, params, prompt, targets = setting
  ids = [_ids(tokenizer, t) for t in INPUTS + targets[2:]]
  assert all(0 in row for row in ids)  # every input and the last targets hold "!" = id 0 ...
  answers = [_answer(tokenizer, _greedy(tokenizer, model, t, prompt)) for t in INPUTS]
  assert any("!" in a for a in answers)  # ... and so do answers
  want_accuracy = float(np.mean([a == t for a, t in zip(answers, targets)]))
  scores = []
  for text, target in zip(INPUTS, targets):
    row = [tokenizer.bos_token_id] + _ids(tokenizer, text)
    target_ids = _ids(tokenizer, target)  # cut to the target length as the task cuts it
    if len(target_ids) > LENGTHS["targets"]:
      target_ids = target_ids[:LENGTHS["targets"] - 1] + target_ids[-1:]
    scores.append(bang.row_log_probs(model, row + target_ids, len(row), prompt).sum())
  lm = models.DecoderOnlyModel(DecoderLM(cfg, prompt=prompts.PromptTuning(length=len(prompt))))
  evaluator = evaluator_lib.Evaluator(
      lm, evaluator_lib.EvalConfig(TASK, LENGTHS, batch_size=4), log_dir=str(tmp_path))
  got = evaluator.evaluate(params, step=1)[TASK]
  assert got["accuracy"] == want_accuracy and 0 < want_accuracy < 1
  np.testing.assert_allclose(got["log_likelihood"], np.mean(scores), rtol=0, atol=TOL)
