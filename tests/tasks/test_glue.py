"""GLUE and SuperGLUE tasks: exact T5 strings, real-vocab tokens, postprocessors and metrics.

Each task reads a real TFDS dataset written offline (tasks.prepare) from
hand-made examples. Expected strings are written by hand from T5's published
preprocessors (t5.data.preprocessors.glue / stsb / record / wsc_simple), and
expected scores are computed by hand in the comments.
"""
from __future__ import annotations


import pytest
import seqio

import tasks
from tasks import names, scoring
from tests.helpers.glue_data import CASES
from tests.helpers.task_checks import check_task_case

SEQ = {"inputs": 256, "targets": 32}


def test_every_glue_and_super_glue_task_has_a_case():
  assert set(CASES) == set(names.GLUE.values()) | set(names.SUPER_GLUE.values())


@pytest.mark.parametrize("taskless", [False, True], ids=["named", "taskless"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_t5_format_tokens_and_metrics(name, taskless, prepared, real_vocab):
  check_task_case(name, taskless, CASES[name], real_vocab, SEQ)


def test_mnli_split_routing(prepared, real_vocab):
  """The matched / mismatched tasks read their own validation sets; MNLI trains on train."""
  train = scoring.dataset_examples(names.GLUE["glue_mnli"], "train", SEQ)
  assert ([e["inputs_pretokenized"].decode() for e in train]
          == ["mnli hypothesis: A person eats. premise: A man is eating."])
  mism = scoring.dataset_examples(names.GLUE["glue_mnli"], "validation_mismatched", SEQ)
  assert (mism[0]["inputs_pretokenized"].decode() == "mnli hypothesis: Prices rose. premise: "
                                                     "Prices went up in May.")
  assert "validation" not in tasks.registry.SPECS[names.GLUE["glue_mnli"]].source.splits


def test_wsc_trains_on_correct_referents_only(prepared, real_vocab):
  train = scoring.dataset_examples(names.SUPER_GLUE["super_glue_wsc"], "train", SEQ)
  assert [(e["targets_pretokenized"].decode(), int(e["label"])) for e in train] == [("Mark", 1)]


def test_record_without_answers_gives_one_unk_example(prepared, real_vocab):
  test = scoring.dataset_examples(names.SUPER_GLUE["super_glue_record"], "test", SEQ)
  assert [(e["inputs_pretokenized"].decode(), e["targets_pretokenized"].decode())
          for e in test] == [
              ("record query: @placeholder met Y. entities: X, Y passage: X met Y.", "<unk>")]


@pytest.mark.parametrize("name", [names.SUPER_GLUE["super_glue_record"],
                                  names.SUPER_GLUE["super_glue_multirc"],
                                  names.SUPER_GLUE["super_glue_wsc"],
                                  names.SUPER_GLUE["super_glue_cb"], names.GLUE["glue_mrpc"]])
def test_seqio_evaluator_agrees_with_scoring(name, prepared, real_vocab):
  """seqio.Evaluator (EncDecFeatureConverter, pack=False) computes the same metrics
  as tasks.scoring.

  The predict_fn echoes each example's padded target tokens (fixed length, as a model's
  decoder returns them), so predictions equal the gold targets.
  """
  evaluator = seqio.Evaluator(name, feature_converter=seqio.EncDecFeatureConverter(pack=False),
                              eval_split="validation", sequence_length=SEQ)

  def predict_fn(ds, model_feature_shapes=None):
    del model_feature_shapes
    return [(i, ex["decoder_target_tokens"].tolist()) for i, ex in ds.as_numpy_iterator()]

  results, _ = evaluator.evaluate(compute_metrics=True, predict_fn=predict_fn)
  got = results.result()[name]
  examples = scoring.dataset_examples(name, "validation", SEQ)
  expected = scoring.score(name, examples, [e["targets_pretokenized"].decode() for e in examples])
  assert got == pytest.approx(expected, rel=1e-6)
  if name == names.SUPER_GLUE["super_glue_wsc"]:
    # naming the wrong candidate of a label-0 example
    assert expected == {"accuracy": pytest.approx(100 * 2 / 3)}
  else:
    assert all(v == pytest.approx(100.0) for v in expected.values())


@pytest.mark.parametrize("text, index, expected", [
    ("He told Mark lies.", 0, "wsc: *He* told Mark lies."),  # T5's own code asserts here
    # T5's string (see the parity test)
    ("Mark told Pete he lied.", 3, "wsc: Mark told Pete *he* lied."),
])
def test_wsc_simple_is_well_formed_when_the_pronoun_is_the_first_word(text, index, expected):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tasks import preprocessors  # pylint: disable=g-import-not-at-top
  example = {"text": text, "span1_text": "Mark", "span1_index": 1,
             "span2_text": text.split()[index], "span2_index": index, "label": 1, "idx": 0}
  (out,) = list(preprocessors.wsc_simple(tf.data.Dataset.from_tensors(example)).as_numpy_iterator())
  assert out["inputs"].decode() == expected
  assert "  " not in out["inputs"].decode()
