"""Answer extraction for evaluation by generation: GSM8K's and MetaMathQA's answers, numbers
compared by value, patterns of the user's, and exact match over hand-made cases."""
import pytest

from spot_jax.errors import ConfigError
from tasks import answers

GSM8K_CASES = [
    # (generated or reference text, the answer)
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72", "72"),
    ("She pays 1,000 + 250 = 1,250 dollars.\n#### 1,250", "1250"),
    ("So the answer is 3.\nThe answer is: 18", "18"),
    ("The final answer is $-4.50.", "-4.5"),
    ("#### 12\nThen more text follows #### 13 and stops", "13"),
    ("The answer is: 6/4", "1.5"),
    ("Half of 10 is 5, so she keeps five.", None),
    ("", None),
]


@pytest.mark.parametrize("text, expected", GSM8K_CASES)
def test_gsm8k_extracts_the_last_marked_number(text, expected):
  assert answers.extractor("gsm8k")(text) == expected


def test_numbers_compare_by_value_text_as_text():
  assert answers.normalize("1,000.00") == answers.normalize("1000") == "1000"
  assert answers.normalize("$0.50") == "0.5" and answers.normalize("-0") == "0"
  assert answers.normalize(" Paris. ") == "Paris" and answers.normalize(None) is None


def test_a_pattern_of_ones_own_with_or_without_a_group():
  assert answers.extractor(r"Answer: (\w+)")("Answer: no. Answer: yes") == "yes"
  assert answers.extractor(r"[0-9]+")("3 then 4") == "4"
  assert answers.extractor(r"Answer: (\w+)")("no answer here") is None


def test_exact_match_over_hand_made_generations():
  """4 generations against GSM8K references: right, right in another spelling, wrong, none."""
  post = answers.postprocessor("gsm8k")
  references = ["... #### 72", "... #### 1,250", "... #### 5", "... #### 9"]
  generated = ["so 72 in all. The answer is: 72", "The answer is: 1250.0",
               "The answer is: 6", "I do not know"]
  targets = [post(t, is_target=True) for t in references]
  predictions = [post(g.encode()) for g in generated]  # decoded bytes, as seqio hands them
  assert targets == ["72", "1250", "5", "9"]
  assert predictions == ["72", "1250", "6", None]
  assert answers.exact_match(targets, predictions) == {"exact_match": 50.0}
  assert answers.exact_match([None], [None]) == {"exact_match": 0.0}  # no answer: wrong


@pytest.mark.parametrize("answer, message", [
    ("(", "is not a regular expression"),
    (r"(a)(b)", "has 2 groups; give one group"),
    ("", "give a built-in extractor (gsm8k)"),
])
def test_bad_extractors_are_one_line(answer, message):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    answers.compile_pattern(answer)


def test_a_file_task_scores_extracted_answers(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  import seqio  # pylint: disable=g-import-not-at-top
  import tasks  # pylint: disable=g-import-not-at-top
  path = tmp_path / "train.jsonl"
  path.write_text(json.dumps({"inputs": "question: 2 plus 2", "targets": "so 4 #### 4"}) + "\n")
  name = tasks.register_file_task("test_answer_file_v1", train=str(path), vocabulary="embedded",
                                  answer="gsm8k")
  task = seqio.get_mixture_or_task(name)
  assert task.postprocess_fn("so 4 #### 4", is_target=True) == "4"
  assert task.postprocess_fn(b"The answer is: 4.0") == "4"  # a decoded prediction
  assert task.metric_fns[0](["4", "5"], ["4", None]) == {"exact_match": 50.0}
  with pytest.raises(ConfigError, match="give it without labels= and metric="):
    tasks.register_file_task("test_answer_labels_v1", train=str(path), vocabulary="embedded",
                             answer="gsm8k", metric="accuracy")
