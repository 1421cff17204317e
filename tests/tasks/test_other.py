"""Source/target tasks beyond GLUE and SuperGLUE: exact strings, real-vocab tokens, metrics.

TFDS tasks read real TFDS datasets written offline from hand-made examples
(tasks.prepare); CR and CxC read local jsonl files. Expected strings follow
the formats documented in docs/tasks.md (SQuAD: T5's own, with its punctuation
padding and trailing space).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import seqio

import tasks
from tasks import names, prepare, scoring
from tests.helpers.task_checks import check_task_case

SEQ = {"inputs": 256, "targets": 32}
_EMPTY_TOKENS = {"offsets": [], "tokens": []}


def _mrqa(question, context, answers, qid):
  return {"subset": "x", "context": context, "context_tokens": _EMPTY_TOKENS, "qid": qid,
          "question": question, "question_tokens": _EMPTY_TOKENS,
          "detected_answers": {"char_spans": [], "text": [], "token_spans": []}, "answers": answers}


def _nli(hypothesis, premise, label, premise_key="premise"):
  return {"hypothesis": hypothesis, premise_key: premise, "label": label}


COSMOS = {"id": "c0", "context": "I missed the bus.", "question": "Why was I late?",
          "answer0": "I overslept.", "answer1": "It snowed.", "answer2": "I missed the bus.",
          "answer3": "None of the above choices.", "label": 2}
RACE_ARTICLE = "Tom has a red bike. He rides it to school every day."

DATA = {
    "doc_nli:1.0.0": {"validation": [
        _nli("Sales grew.",
             "The report, released Monday, says sales grew.", 1),
        _nli("Sales fell.", "The report, released Monday, says sales grew.", 0)]},
    "anli/r1:0.1.0": {"validation": [
        {**_nli("Ann is short.", "Ann is tall.", 2, "context"),
         "uid": "a"},
        {**_nli("Ann is a person.", "Ann is tall.", 0, "context"), "uid": "b"}]},
    "anli/r2:0.1.0": {"validation": [{**_nli("It rained.", "The street is wet.", 1, "context"),
                                      "uid": "a"}]},
    "anli/r3:0.1.0": {"validation": [{**_nli("Bo slept.", "Bo was asleep at noon.", 0, "context"),
                                      "uid": "a"}]},
    "snli:1.1.0": {"validation": [_nli("An animal moves.", "A dog runs.", 0), _nli("y", "x", -1),
                                  _nli("A cat sleeps.", "A dog runs.", 2)]},
    "yelp_polarity_reviews:0.2.0": {"test": [{"text": "The food was cold and the service slow.",
                                              "label": 0},
                                             {"text": "Great tacos!", "label": 1}]},
    "imdb_reviews/plain_text:1.0.0": {"test": [{"text": "A dull, lifeless film.", "label": 0},
                                               {"text": "A joy from start to end.", "label": 1}]},
    "winogrande:1.2.0": {
        "train_xl": [
            {"sentence": "The trophy does not fit in the suitcase because the _ is too big.",
             "option1": "trophy", "option2": "suitcase", "label": 0}],
        "validation": [
            {"sentence": "John moved the couch from the garage to the backyard to "
                         "create space. The _ is small.",
             "option1": "garage", "option2": "backyard", "label": 0},
            {"sentence": "The _ was heavy.", "option1": "box", "option2": "feather", "label": 0}]},
    "piqa:1.0.0": {"validation": [{"id": "p0", "goal": "To open a jar,", "sol1": "twist the lid.",
                                   "sol2": "paint the lid.", "label": 0},
                                  {"id": "p1", "goal": "To dry hair,", "sol1": "use water.",
                                   "sol2": "use a towel.", "label": 1}]},
    "cosmos_qa:1.0.0": {"validation": [COSMOS, {**COSMOS, "id": "c1", "label": 0}]},
    "hellaswag:1.1.0": {"validation": [
        {"context": "A man is standing on a ladder. He",
         "endings": ["paints the wall.", "eats the ladder.",
                      "flies away.", "sings loudly."],
         "activity_label": "Painting", "label": 0, "split_type": "indomain", "source_id": "s0"},
        {"context": "She opens the oven. She",
         "endings": ["swims.", "takes out a cake.", "reads.", "sleeps."],
         "activity_label": "Baking", "label": 1, "split_type": "indomain", "source_id": "s1"}]},
    "race/high:2.0.0": {"dev": [{"article": RACE_ARTICLE, "example_id": "high1.txt",
                                 "questions": ["What color is Tom's bike?",
                                               "How does Tom go to school?"],
                                 "answers": ["B", "D"],
                                 "options": [["Blue", "Red", "Green", "Black"],
                                             ["By bus", "On foot", "By car", "By bike"]]}]},
    "race/middle:2.0.0": {"dev": [{"article": "Mia likes cats.", "example_id": "middle1.txt",
                                   "questions": ["What does Mia like?"], "answers": ["A"],
                                   "options": [["Cats", "Dogs", "Birds", "Fish"]]}]},
    "squad/v1.1:3.0.0": {"validation": [
        {"id": "q1", "title": "T", "context": "Paris is the capital of France.",
         "question": "What is the capital of France?",
         "answers": {"text": ["Paris", "Paris."], "answer_start": [0, 0]}},
        {"id": "q2", "title": "T", "context": "The Eiffel Tower is tall.",
         "question": "What is tall?", "answers": {"text": ["Eiffel Tower"], "answer_start": [4]}}]},
    "drop:2.0.0": {"dev": [{"passage": "The Bears scored 3 touchdowns.",
                            "question": "How many touchdowns?",
                            "answer": "3", "validated_answers": ["3", "three"], "query_id": "d0"}]},
    **{f"mrqa/{c}:1.0.0": {"validation": [_mrqa("Where is Paris?", "Paris is in France.",
                                                ["France", "in France"], "m0")]}
       for c in ("squad", "news_qa", "trivia_qa", "search_qa", "hotpot_qa", "natural_questions")},
}

FILES = {
    "cr/validation.jsonl": [{"sentence": "the battery life is great .", "label": 1},
                            {"sentence": "the screen broke in a week .", "label": 0}],
    "cxc/validation.jsonl": [{"sentence1": f"s{i}", "sentence2": f"t{i}", "label": float(i),
                              "idx": i} for i in range(4)],
    "cxc/train.jsonl": [{"sentence1": "A man rides a horse.", "sentence2": "A person on a horse.",
                         "label": 1.25}],
}

_O, _E = names.OTHER, names.EXTRA
_SQUAD_1 = "question: What is the capital of France ? context: Paris is the capital of France . "

# task -> (split, [(inputs, targets) of the first examples], predictions, expected metrics).
CASES = {
    _O["doc_nli"]: ("validation", [("doc_nli hypothesis: Sales grew. premise: The report, released "
                                    "Monday, says sales grew.", "entailment"),
                                   ("doc_nli hypothesis: Sales fell. premise: The report, released "
                                    "Monday, says sales grew.", "not_entailment")],
                    ["entailment", "entailment"], {"accuracy": 50.0}),
    _E["anli_r1"]: ("validation",
                    [("anli_r1 hypothesis: Ann is short. context: Ann is tall.", "contradiction")],
                    ["contradiction", "neutral"], {"accuracy": 50.0}),
    _E["anli_r2"]: ("validation",
                    [("anli_r2 hypothesis: It rained. context: The street is wet.", "neutral")],
                    ["neutral"], {"accuracy": 100.0}),
    _E["anli_r3"]: ("validation", [("anli_r3 hypothesis: Bo slept. context: Bo was asleep at noon.",
                                    "entailment")],
                    ["e"], {"accuracy": 0.0}),
    # The unlabelled (-1) pair is dropped.
    _E["snli"]: ("validation",
                 [("snli hypothesis: An animal moves. premise: A dog runs.", "entailment"),
                  ("snli hypothesis: A cat sleeps. premise: A dog runs.", "contradiction")],
                 ["entailment", "contradiction"], {"accuracy": 100.0}),
    _O["yelp_polarity"]: (
        "validation", [("yelp_polarity text: The food was cold and the service slow.", "negative"),
                       ("yelp_polarity text: Great tacos!", "positive")],
        ["negative", "negative"], {"accuracy": 50.0}),
    _E["imdb"]: ("validation", [("imdb text: A dull, lifeless film.", "negative")],
                 ["negative", "positive"], {"accuracy": 100.0}),
    _O["cr"]: ("validation", [("cr sentence: the battery life is great .", "positive"),
                              ("cr sentence: the screen broke in a week .", "negative")],
               ["positive", "Positive"], {"accuracy": 50.0}),
    # Pearson and Spearman of (0,1,2,3) against (0,2,1,3): 4/5.
    _O["cxc"]: ("validation", [("cxc sentence1: s0 sentence2: t0", "0.0"),
                               ("cxc sentence1: s1 sentence2: t1", "1.0")],
                ["0.0", "2.0", "1.0", "3.0"],
                {"pearson_corrcoef": 80.0, "spearman_corrcoef": 80.0}),
    _O["winogrande"]: ("validation", [("winogrande sentence: John moved the couch from the garage "
                                       "to the backyard to create space. The _ is small. option1: "
                                       "garage option2: backyard", "option1")],
                       ["option1", "garage"], {"accuracy": 50.0}),
    _E["piqa"]: ("validation",
                 [("piqa goal: To open a jar, sol1: twist the lid. sol2: paint the lid.", "sol1"),
                  ("piqa goal: To dry hair, sol1: use water. sol2: use a towel.", "sol2")],
                 ["sol1", "sol2"], {"accuracy": 100.0}),
    _O["cosmos_qa"]: ("validation", [("cosmos_qa question: Why was I late? answer0: I overslept. "
                                      "answer1: It snowed. answer2: I missed the bus. answer3: "
                                      "None of the above choices. context: I missed the bus.",
                                      "answer2")],
                      ["answer2", "answer2"], {"accuracy": 50.0}),
    _O["hellaswag"]: ("validation", [("hellaswag context: A man is standing on a ladder. He "
                                      "ending0: paints the wall. ending1: eats the ladder. "
                                      "ending2: flies away. ending3: sings loudly.", "ending0")],
                      ["ending0", "ending3"], {"accuracy": 50.0}),
    _O["race_high"]: ("validation", [("race question: What color is Tom's bike? A: Blue B: Red C: "
                                      "Green D: Black article: " + RACE_ARTICLE, "B"),
                                     ("race question: How does Tom go to school? A: By bus B: On "
                                      "foot C: By car D: By bike article: " + RACE_ARTICLE, "D")],
                      ["B", "(D)"], {"accuracy": 50.0}),
    _O["race_middle"]: ("validation", [("race question: What does Mia like? A: Cats B: Dogs C: "
                                        "Birds D: Fish article: Mia likes cats.", "A")],
                        ["A"], {"accuracy": 100.0}),
    # "paris" matches exactly; "the Eiffel" vs "Eiffel Tower": EM 0, F1 2/3.
    _O["squad"]: ("validation", [(_SQUAD_1, "Paris"), ("question: What is tall ? context: The "
                                                       "Eiffel Tower is tall . ", "Eiffel Tower")],
                  ["paris", "the Eiffel"], {"em": 50.0, "f1": 100 * (1 + 2 / 3) / 2}),
    _O["drop"]: ("validation", [
        ("drop question: How many touchdowns ? context: The Bears scored 3 touchdowns . ", "3")],
                 ["three"], {"em": 100.0, "f1": 100.0}),
    **{_E[f"mrqa_{c}"]: ("validation", [
        (f"{c} question: Where is Paris ? context: Paris is in France . ", "France")],
                         ["In France."], {"em": 100.0, "f1": 100.0})
       for c in ("squad", "news_qa", "trivia_qa", "search_qa", "hotpot_qa", "natural_questions")},
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  tfds_dir = str(tmp_path_factory.mktemp("tfds"))
  for tfds_name, splits in DATA.items():
    prepare.write_tfds_dataset(tfds_name, tfds_dir, splits)
  files_dir = tmp_path_factory.mktemp("files")
  for relative, rows in FILES.items():
    path = files_dir / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  tasks.set_tfds_data_dir(tfds_dir)
  tasks.set_files_dir(str(files_dir))
  yield tfds_dir, files_dir
  tasks.set_tfds_data_dir(None)
  tasks.set_files_dir(None)


def test_every_other_task_has_a_case():
  expected = (set(names.OTHER.values()) | set(names.EXTRA.values())) - {_O["c4_prefix_lm"]}
  assert set(CASES) == expected


@pytest.mark.parametrize("name,taskless", [(n, t) for n in sorted(CASES) for t in (False, True)
                                           # SQuAD has no task name
                                           if not (t and n in names.NO_TASKLESS)])
def test_format_tokens_and_metrics(name, taskless, prepared, real_vocab):
  check_task_case(name, taskless, CASES[name], real_vocab, SEQ)


def test_train_split_mappings(prepared, real_vocab):
  """WinoGrande trains on train_xl; CxC rounds 1.25 (6.25 fifths) down to "1.2"."""
  wino = scoring.dataset_examples(_O["winogrande"], "train", SEQ)
  assert wino[0]["targets_pretokenized"] == b"option1"
  assert wino[0]["inputs_pretokenized"].startswith(b"winogrande sentence: The trophy")
  cxc = scoring.dataset_examples(_O["cxc"], "train", SEQ)
  assert [e["targets_pretokenized"] for e in cxc] == [b"1.2"]


def test_c4_prefix_lm_splits_segments_at_random_points(prepared, real_vocab):
  tfds_dir, _ = prepared
  text = " ".join(f"Sentence number {i} talks about topic {i % 7}." for i in range(12))
  meta = {"url": "u", "content-type": "text/plain", "content-length": "1", "timestamp": "t"}
  prepare.write_tfds_dataset("c4/en:3.1.0", tfds_dir,
                             {"train": [{"text": text, **meta}, {"text": "Hi", **meta}]})
  seq = {"inputs": 9, "targets": 16}
  task = seqio.get_mixture_or_task(names.OTHER["c4_prefix_lm"])
  runs = [list(task.get_dataset(seq, split="train", shuffle=False, seed=s).as_numpy_iterator())
          for s in (1, 1, 2)]
  tokens = real_vocab.encode(text)
  segments = [tokens[i:i + 8] for i in range(0, len(tokens), 8)]
  segments += [s for s in [real_vocab.encode("Hi")] if len(s) >= 2]
  examples = runs[0]
  assert len(examples) == len(segments)
  cuts = []
  for example, segment in zip(examples, segments):
    inputs, targets = example["inputs"].tolist(), example["targets"].tolist()
    assert inputs[-1] == 1 and targets[-1] == 1  # EOS
    assert inputs[:-1] + targets[:-1] == segment
    assert 1 <= len(inputs) - 1 <= len(segment) - 1
    assert example["inputs_pretokenized"].decode() == real_vocab.decode(inputs[:-1])
    cuts.append(len(inputs) - 1)
  assert len(set(cuts)) > 1  # split points vary across segments
  same_seed = [e["inputs"].tolist() for e in runs[1]]
  assert same_seed == [e["inputs"].tolist() for e in examples]
  assert [e["inputs"].tolist() for e in runs[2]] != same_seed
  assert np.all([len(e["targets"]) <= 16 for e in examples])
