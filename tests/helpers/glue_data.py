"""Hand-made GLUE and SuperGLUE examples and their expected strings and metrics.

Shared by tests/backbones/t5/test_parity_tasks.py, tests/tasks/test_glue.py.
"""
from __future__ import annotations

import math

import pytest

import tasks
from tasks import names, prepare

WSC_TEXT = ("Mark told Pete many lies about himself, which Pete included in his book. He should "
            "have been more truthful.")
WSC_SPECIAL = ('The boy continued to whip the pony , and eventually the pony threw him over. John '
               'laughed out quite loud. "Good for him," he said. ')
REC_PASSAGE = "The cat sat.\n@highlight\nCats like mats\n@highlight\nMats are soft"
MULTIRC_PARAGRAPH = "<b>Sent 1: </b>Alice went home.<br><b>Sent 2: </b>She slept.<br>"


def _wic(s1, s2, word, label, idx):
  return {"sentence1": s1, "sentence2": s2, "word": word, "start1": 0, "end1": 1, "start2": 0,
          "end2": 1, "label": label, "idx": idx}


def _wsc(span1, span1_index, label, idx, text=WSC_TEXT, span2="He", span2_index=13):
  return {"text": text, "span1_text": span1, "span1_index": span1_index, "span2_text": span2,
          "span2_index": span2_index, "label": label, "idx": idx}


# tfds name -> split -> examples.
DATA = {
    "glue/cola:2.0.0": {"validation": [
        {"sentence": "They drank the pub.", "label": 0, "idx": 0},
        {"sentence": "The more we study verbs, the crazier they get.", "label": 1, "idx": 1},
        {"sentence": "Day and night the wind blow.", "label": 1, "idx": 2},
        {"sentence": "Him saw I.", "label": 0, "idx": 3}]},
    "glue/sst2:2.0.0": {"validation": [
        {"sentence": "it 's a charming and often affecting journey . ", "label": 1, "idx": 0},
        {"sentence": "unflinchingly bleak and desperate ", "label": 0, "idx": 1}]},
    "glue/mrpc:2.0.0": {"validation": [
        {"sentence1": "He said the food was good.", "sentence2": "The food was good, he said.",
         "label": 1, "idx": 0},
        {"sentence1": "It rained.", "sentence2": "The sun shone.", "label": 0, "idx": 1},
        {"sentence1": "Stocks rose.", "sentence2": "Shares went up.", "label": 1, "idx": 2},
        {"sentence1": "She left early.", "sentence2": "She departed early.", "label": 1,
         "idx": 3}]},
    "glue/qqp:2.0.0": {"validation": [
        {"question1": "How do I learn Python?",
         "question2": "What is the best way to learn Python?", "label": 1, "idx": 0},
        {"question1": "Why is the sky blue?", "question2": "How tall is Everest?", "label": 0,
         "idx": 1}]},
    "glue/stsb:2.0.0": {
        "train": [
            {"sentence1": "A man plays.", "sentence2": "A man is playing.", "label": 2.5, "idx": 0},
            {"sentence1": "A cat.", "sentence2": "A kitten.", "label": 4.75, "idx": 1},
            {"sentence1": "A dog runs.", "sentence2": "A dog is running.", "label": 3.8, "idx": 2},
            {"sentence1": "Hi.", "sentence2": "Hi.", "label": 5.0, "idx": 3}],
        "validation": [
            {"sentence1": "s0", "sentence2": "t0", "label": 0.0, "idx": 0},
            {"sentence1": "s1", "sentence2": "t1", "label": 1.0, "idx": 1},
            {"sentence1": "s2", "sentence2": "t2", "label": 2.0, "idx": 2},
            {"sentence1": "s3", "sentence2": "t3", "label": 3.0, "idx": 3}]},
    "glue/mnli:2.0.0": {
        "train": [{"premise": "A man is eating.", "hypothesis": "A person eats.",
                   "label": 0, "idx": 0}],
        "validation_matched": [
            {"premise": "The cat sleeps.", "hypothesis": "An animal rests.", "label": 0, "idx": 0},
            {"premise": "The cat sleeps.", "hypothesis": "The cat is awake.",
             "label": 2, "idx": 1}],
        "validation_mismatched": [
            {"premise": "Prices went up in May.", "hypothesis": "Prices rose.",
             "label": 0, "idx": 0},
            {"premise": "Prices went up in May.", "hypothesis": "It was June.", "label": 1,
             "idx": 1}]},
    "glue/qnli:2.0.0": {"validation": [
        {"question": "Where is Paris?", "sentence": "Paris is in France.", "label": 0, "idx": 0},
        {"question": "Who wrote it?", "sentence": "It is long.", "label": 1, "idx": 1}]},
    "glue/rte:2.0.0": {"validation": [
        {"sentence1": "No weapons were found in Iraq.", "sentence2": "Weapons were found in Iraq.",
         "label": 1, "idx": 0},
        {"sentence1": "A dog barked loudly.", "sentence2": "A dog barked.", "label": 0, "idx": 1}]},
    "super_glue/boolq:1.0.2": {"validation": [
        {"question": "is the sky blue", "passage": "The sky is blue on clear days.",
         "label": 1, "idx": 0},
        {"question": "is fire cold", "passage": "Fire is hot.", "label": 0, "idx": 1}]},
    "super_glue/cb:1.0.2": {"validation": [
        {"premise": "It is raining.", "hypothesis": "It is wet.", "label": 0, "idx": 0},
        {"premise": "It is raining.", "hypothesis": "It is dry.", "label": 1, "idx": 1},
        {"premise": "She may come.", "hypothesis": "She comes.", "label": 2, "idx": 2},
        {"premise": "He won.", "hypothesis": "He competed.", "label": 0, "idx": 3}]},
    "super_glue/copa:1.0.2": {"validation": [
        {"premise": "My body cast a shadow over the grass.", "choice1": "The sun was rising.",
         "choice2": "The grass was cut.", "question": "cause", "label": 0, "idx": 0},
        {"premise": "The woman tolerated her friend's difficult behavior.",
         "choice1": "The woman knew her friend was going through a hard time.",
         "choice2": "The woman felt that her friend took advantage of her kindness.",
         "question": "cause", "label": 0, "idx": 1}]},
    "super_glue/multirc:1.0.2": {"validation": [
        {"paragraph": MULTIRC_PARAGRAPH, "question": "Where did Alice go?", "answer": "Home",
         "label": 1, "idx": {"paragraph": 0, "question": 0, "answer": 0}},
        {"paragraph": MULTIRC_PARAGRAPH, "question": "Where did Alice go?", "answer": "School",
         "label": 0, "idx": {"paragraph": 0, "question": 0, "answer": 1}},
        {"paragraph": MULTIRC_PARAGRAPH, "question": "What did she do?", "answer": "Slept",
         "label": 1, "idx": {"paragraph": 0, "question": 1, "answer": 0}}]},
    "super_glue/record:1.0.2": {"validation": [
        {"passage": REC_PASSAGE, "query": "The @placeholder sat.", "entities": ["cat", "mats"],
         "answers": ["cat", "The cat"], "idx": {"passage": 0, "query": 0}},
        {"passage": "Bob Smith met Ann.", "query": "@placeholder met Ann.",
         "entities": ["Bob Smith", "Ann"], "answers": ["Bob Smith"],
         "idx": {"passage": 1, "query": 1}}],
        "test": [{"passage": "X met Y.", "query": "@placeholder met Y.", "entities": ["X", "Y"],
                  "answers": [], "idx": {"passage": 2, "query": 2}}]},
    "super_glue/rte:1.0.2": {"validation": [
        {"premise": "Dana Reeve died of lung cancer.",
         "hypothesis": "Christopher Reeve had an accident.", "label": 1, "idx": 0},
        {"premise": "Yet another dog barked.", "hypothesis": "A dog barked.", "label": 0,
         "idx": 1}]},
    "super_glue/wic:1.0.2": {"validation": [
        _wic("Do you want to come over to my place later?",
             "A political system with no place for the less prominent groups.", "place", 0, 0),
        _wic("He wore a jacket.", "She wore a coat.", "wore", 1, 1)]},
    "super_glue/wsc.fixed:1.0.2": {
        "train": [_wsc("Mark", 0, 1, 0), _wsc("Pete", 2, 0, 1)],
        "validation": [_wsc("Mark", 0, 1, 0), _wsc("Pete", 2, 0, 1),
                       _wsc("the pony", 7, 1, 2, text=WSC_SPECIAL, span2="him", span2_index=22)]},
}

WSC_INPUT = ("wsc: Mark told Pete many lies about himself, which Pete included in his book. *He* "
             "should have been more truthful.")

# task -> (split, [(inputs, targets) for the first examples], predictions for every example,
# expected metrics).
CASES = {
    names.GLUE["glue_cola"]: ("validation", [
        ("cola sentence: They drank the pub.", "unacceptable"),
        ("cola sentence: The more we study verbs, the crazier they get.", "acceptable")],
                              # ids [1,1,0,-1] vs [0,1,1,0]: confusion over {-1,0,1}, trace 1, n 4,
                              # true counts (0,2,2), predicted (1,1,2) -> (4-6)/sqrt((16-6)(16-8)).
                              ["acceptable", "acceptable", "unacceptable", "maybe"],
                              {"matthews_corrcoef": 100 * -2 / math.sqrt(80)}),
    names.GLUE["glue_sst2"]: ("validation", [
        ("sst2 sentence: it 's a charming and often affecting journey . ", "positive"),
        ("sst2 sentence: unflinchingly bleak and desperate ", "negative")],
                              ["positive", "positive"], {"accuracy": 50.0}),
    # ids [1,1,0,-1] vs [1,0,1,1]; the invalid one becomes 0 -> tp 1, fp 1, fn 2 -> F1 2/5.
    names.GLUE["glue_mrpc"]: ("validation",
                              [("mrpc sentence1: He said the food was good. sentence2: The food "
                                "was good, he said.", "equivalent"),
                               ("mrpc sentence1: It rained. sentence2: The sun shone.",
                                "not_equivalent")],
                              ["equivalent", "equivalent", "not_equivalent", "maybe"],
                              {"f1": 40.0, "accuracy": 25.0}),
    names.GLUE["glue_qqp"]: ("validation", [("qqp question1: How do I learn Python? question2: "
                                             "What is the best way to learn Python?", "duplicate")],
                             ["duplicate", "duplicate"], {"f1": 100 * 2 / 3, "accuracy": 50.0}),
    names.GLUE["glue_stsb"]: ("train", [("stsb sentence1: A man plays. sentence2: A man "
                                         "is playing.", "2.4"),  # 12.5 rounds half to even
                                        ("stsb sentence1: A cat. sentence2: A kitten.", "4.8"),
                                        ("stsb sentence1: A dog runs. sentence2: A dog "
                                         "is running.", "3.8"),
                                        ("stsb sentence1: Hi. sentence2: Hi.", "5.0")],
                              ["2.4", "4.8", "3.8", "5.0"],
                              {"pearson_corrcoef": 100.0, "spearman_corrcoef": 100.0}),
    names.GLUE["glue_mnli"]: ("validation_matched", [
        ("mnli hypothesis: An animal rests. premise: The cat sleeps.", "entailment"),
        ("mnli hypothesis: The cat is awake. premise: The cat sleeps.", "contradiction")],
                              ["entailment", "neutral"], {"accuracy": 50.0}),
    names.GLUE["glue_mnli_matched"]: ("validation", [
        ("mnli hypothesis: An animal rests. premise: The cat sleeps.", "entailment")],
                                      ["entailment", "contradiction"], {"accuracy": 100.0}),
    names.GLUE["glue_mnli_mismatched"]: ("validation", [
        ("mnli hypothesis: Prices rose. premise: Prices went up in May.", "entailment"),
        ("mnli hypothesis: It was June. premise: Prices went up in May.", "neutral")],
                                         ["entailment", "Neutral"], {"accuracy": 50.0}),
    names.GLUE["glue_qnli"]: ("validation", [
        ("qnli question: Where is Paris? sentence: Paris is in France.", "entailment")],
                              ["entailment", "not_entailment"], {"accuracy": 100.0}),
    names.GLUE["glue_rte"]: ("validation",
                             [("rte sentence1: No weapons were found in Iraq. sentence2: Weapons "
                               "were found in Iraq.", "not_entailment")],
                             ["entailment", "entailment"], {"accuracy": 50.0}),
    names.SUPER_GLUE["super_glue_boolq"]: ("validation", [
        ("boolq passage: The sky is blue on clear days. question: is the sky blue", "True"),
        ("boolq passage: Fire is hot. question: is fire cold", "False")],
                                           ["True", "yes"], {"accuracy": 50.0}),
    # ids [0,2,2,-1] vs [0,1,2,0]: F1 class0 2/3, class1 0, class2 2/3 -> mean 4/9.
    names.SUPER_GLUE["super_glue_cb"]: (
        "validation", [("cb hypothesis: It is wet. premise: It is raining.", "entailment"),
                       ("cb hypothesis: It is dry. premise: It is raining.", "contradiction"),
                       ("cb hypothesis: She comes. premise: She may come.", "neutral")],
        ["entailment", "neutral", "neutral", "unsure"],
        {"mean_3class_f1": 100 * 4 / 9, "accuracy": 50.0}),
    names.SUPER_GLUE["super_glue_copa"]: (
        "validation", [("copa choice1: The sun was rising. choice2: The grass was cut. premise: My "
                        "body cast a shadow over the grass. question: cause", "choice1")],
        ["choice1", "choice2"], {"accuracy": 50.0}),
    # F1a over answers [1,0,1] vs [1,0,0] = 2/3; exact match per question: q0 100, q1 0.
    names.SUPER_GLUE["super_glue_multirc"]: ("validation", [
        ("multirc question: Where did Alice go? answer: Home paragraph: Sent 1: Alice went home. "
         "Sent 2: She slept. ", "True"),
        ("multirc question: Where did Alice go? answer: School paragraph: Sent 1: Alice went home. "
         "Sent 2: She slept. ", "False")],
        ["True", "False", "False"], {"f1": 100 * 2 / 3, "exact_match": 50.0}),
    # One example per answer; only the first copy of each query counts: "The cat." -> EM 1;
    # "Bob" vs "Bob Smith" -> EM 0, F1 2/3.
    names.SUPER_GLUE["super_glue_record"]: ("validation", [
        ("record query: The @placeholder sat. entities: cat, mats passage: The cat sat. Cats like "
         "mats. Mats are soft", "cat"),
        ("record query: The @placeholder sat. entities: cat, mats passage: The cat sat. Cats like "
         "mats. Mats are soft", "The cat"),
        ("record query: @placeholder met Ann. entities: Bob Smith, Ann passage: Bob Smith met Ann.",
         "Bob Smith")],
        ["The cat.", "dog", "Bob"], {"em": 50.0, "f1": 100 * (1 + 2 / 3) / 2}),
    names.SUPER_GLUE["super_glue_rte"]: (
        "validation", [("rte hypothesis: Christopher Reeve had an accident. premise: Dana Reeve "
                        "died of lung cancer.", "not_entailment")],
        ["not_entailment", "not_entailment"], {"accuracy": 50.0}),
    names.SUPER_GLUE["super_glue_wic"]: ("validation", [
        ("wic sentence1: Do you want to come over to my place later? sentence2: A political system "
         "with no place for the less prominent groups. word: place", "False")],
                                         ["False", "True"], {"accuracy": 100.0}),
    # Referent matching: "mark" == "mark" -> 1 (label 1); "pete" -> 1 (label 0); "pony" vs "the
    # pony" -> 1 (label 1).
    names.SUPER_GLUE["super_glue_wsc"]: ("validation", [
        (WSC_INPUT, "Mark"), (WSC_INPUT, "Pete"),
        ('wsc: The boy continued to whip the pony , and eventually the pony threw him over. John '
         'laughed out quite loud. "Good for *him* ," he said.', "the pony")],
        ["Mark", "pete", "Pony"], {"accuracy": 100 * 2 / 3}),
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  for tfds_name, splits in DATA.items():
    prepare.write_tfds_dataset(tfds_name, data_dir, splits)
  tasks.set_tfds_data_dir(data_dir)
  yield data_dir
  tasks.set_tfds_data_dir(None)
