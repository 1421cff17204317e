"""Text-to-text preprocessors: raw TFDS-shaped examples -> {"inputs", "targets"} strings.

The GLUE / SuperGLUE / SQuAD formats reproduce T5's published ones
(`t5.data.preprocessors`: glue, stsb, record, wsc_simple, squad); the formats of
the other tasks follow the same "<task> key: value key: value" style and are
listed in docs/tasks.md. All are tf.data maps usable as seqio preprocessors.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

import seqio
import tensorflow as tf

from spot_jax.errors import ConfigError

Example = Mapping[str, tf.Tensor]


def join(parts: Sequence[tf.Tensor]) -> tf.Tensor:
  """Joins strings with single spaces (no squeezing: T5's glue format keeps inner spacing)."""
  return tf.strings.join(list(parts), separator=" ")


def squeeze_join(parts: Sequence[tf.Tensor]) -> tf.Tensor:
  """Joins with spaces and collapses every whitespace run to one space."""
  return tf.strings.regex_replace(join(parts), r"\s+", " ")


def pad_punctuation(text: tf.Tensor) -> tf.Tensor:
  """Surrounds ASCII punctuation with spaces, then collapses whitespace (T5's SQuAD format)."""
  text = tf.strings.regex_replace(text, r"([[:punct:]])", r" \1 ")
  return tf.strings.regex_replace(text, r"\s+", " ")


def label_text(label: tf.Tensor, label_names: Sequence[str]) -> tf.Tensor:
  """The label's name, or "<unk>" for unlabelled examples (label -1)."""
  label = tf.cast(label, tf.int64)
  names = tf.constant(list(label_names))
  name = tf.gather(names, tf.clip_by_value(label, 0, len(label_names) - 1))
  return tf.where(label < 0, tf.constant("<unk>"), name)


def _key_value_parts(x: Example, task: str, keys: Sequence[str]) -> list:
  parts = [tf.constant(task)]
  for key in keys:
    parts += [tf.constant(f"{key}:"), x[key]]
  return parts


@seqio.map_over_dataset
def glue(x: Example, benchmark: str, label_names: Sequence[str],
         feature_names: Sequence[str]) -> Dict[str, tf.Tensor]:
  """"<benchmark> k1: v1 k2: v2 ..." -> label name (T5's `glue` format).

  MultiRC additionally drops HTML (<br> becomes a space, <b> tags vanish) and
  keeps its idx/paragraph, idx/question, idx/answer ids for grouping.
  """
  inputs = join(_key_value_parts(x, benchmark, feature_names))
  out = {"targets": label_text(x["label"], label_names)}
  if benchmark == "multirc":
    inputs = tf.strings.regex_replace(inputs, "<br>", " ")
    inputs = tf.strings.regex_replace(inputs, "<(/)?b>", "")
    for key in ("paragraph", "question", "answer"):
      out[f"idx/{key}"] = x["idx"][key]
  else:
    out["idx"] = x["idx"]
  out["inputs"] = inputs
  return out


def similarity_target(score: tf.Tensor) -> tf.Tensor:
  """A 0-5 similarity score rounded to the nearest 0.2, as text with one decimal ("3.8")."""
  return tf.strings.as_string(tf.round(tf.cast(score, tf.float32) * 5) / 5, precision=1)


@seqio.map_over_dataset
def similarity(x: Example, benchmark: str = "stsb") -> Dict[str, tf.Tensor]:
  """"stsb sentence1: .. sentence2: .." -> the score rounded to 0.2 (T5's `stsb`)."""
  inputs = join([tf.constant(f"{benchmark} sentence1:"), x["sentence1"], tf.constant("sentence2:"),
                 x["sentence2"]])
  return {"inputs": inputs, "targets": similarity_target(x["label"]), "idx": x["idx"]}


# Two WSC texts whose pronoun index does not point at the pronoun; T5 fixes them by hand.
_WSC_SPECIAL_CASES = {
    'The boy continued to whip the pony , and eventually the pony threw him over. John laughed out '
    'quite loud. "Good for him," he said. ':
        'The boy continued to whip the pony , and eventually the pony threw him over. John laughed '
        'out quite loud. "Good for X ," he said.',
    'When they had eventually calmed down a bit , and had gotten home, Mr. Farley put the magic '
    'pebble in an iron safe . Some day they might want to use it , but really for now, what more '
    'could they wish for?':
        'When they had eventually calmed down a bit , and had gotten home, Mr. Farley put the '
        'magic pebble in an iron safe . Some day they might want to use X , but really for now, '
        'what more could they wish for?',
}


def _wsc_blanked_text(x: Example) -> tf.Tensor:
  """The text with the pronoun (word span2_index, split on " ") replaced by "X"."""
  words = tf.strings.split(x["text"], sep=" ")
  index = tf.cast(x["span2_index"], tf.int32)
  blanked = join([tf.strings.reduce_join(words[:index], separator=" "), tf.constant("X"),
                  tf.strings.reduce_join(words[index + 1:], separator=" ")])
  for text, fixed in _WSC_SPECIAL_CASES.items():
    blanked = tf.where(tf.equal(x["text"], text), tf.constant(fixed), blanked)
  return blanked


@seqio.map_over_dataset
def wsc_simple(x: Example) -> Dict[str, tf.Tensor]:
  """"wsc: <text with the pronoun as *pronoun*>" -> the candidate referent (T5's `wsc_simple`).

  The target is always the candidate (span1) text; whether it is the right
  referent is the label, which the `wsc_simple` postprocessor compares against.
  """
  marked = tf.strings.regex_replace(_wsc_blanked_text(x), r" X ",
                                    tf.strings.join([" *", x["span2_text"], "* "]))
  # T5 asserts when the pronoun is the first word; the blanked text then starts with " X ", which
  # would leave "wsc:  *he* ..." (two spaces). Elsewhere the string stays exactly T5's.
  marked = tf.where(tf.equal(tf.cast(x["span2_index"], tf.int32), 0),
                    tf.strings.strip(marked), marked)
  return {"inputs": join([tf.constant("wsc:"), marked]), "targets": x["span1_text"],
          "label": tf.cast(x["label"], tf.int64), "idx": x["idx"]}


def wsc_correct_referent(x: Example) -> tf.Tensor:
  """Train-split filter of T5's WSC: keep only examples whose candidate is the referent."""
  return tf.equal(tf.cast(x["label"], tf.int64), 1)


def record(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """ReCoRD: one example per gold answer (or one "<unk>" example when there is none).

  inputs: "record query: <query> entities: e1, e2, ... passage: <passage>" where
  "\\n@highlight\\n" becomes ". " (or just " " after . ? ! " ').
  """

  def per_answer(x):
    answers = x["answers"]
    n = tf.size(answers)
    targets = tf.cond(n > 0, lambda: answers, lambda: tf.constant(["<unk>"]))
    copies = tf.maximum(n, 1)
    passage = tf.strings.regex_replace(x["passage"], r"(\.|\?|\!|\"|\')\n@highlight\n", r"\1 ")
    passage = tf.strings.regex_replace(passage, r"\n@highlight\n", ". ")
    inputs = join([tf.constant("record query:"), x["query"], tf.constant("entities:"),
                   tf.strings.reduce_join(x["entities"], separator=", "),
                   tf.constant("passage:"), passage])
    repeat = lambda t: tf.repeat(tf.expand_dims(t, 0), copies, axis=0)
    return {"inputs": repeat(inputs), "targets": targets, "answers": repeat(answers),
            "idx/passage": repeat(x["idx"]["passage"]), "idx/query": repeat(x["idx"]["query"])}

  return dataset.map(per_answer, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


@seqio.map_over_dataset
def squad(x: Example, task: Optional[str] = None,
          answers_key: str = "answers/text") -> Dict[str, tf.Tensor]:
  """"[task ]question: <q> context: <c>" -> first answer, punctuation padded (T5's `squad`).

  `answers_key` names the answer list ("answers/text" is SQuAD's nested field).
  """
  answers = x
  for part in answers_key.split("/"):
    answers = answers[part]
  answers = pad_punctuation(answers)
  question, context = pad_punctuation(x["question"]), pad_punctuation(x["context"])
  parts = [tf.constant("question:"), question, tf.constant("context:"), context]
  if task:
    parts = [tf.constant(task)] + parts
  return {"inputs": squeeze_join(parts), "targets": answers[0], "answers": answers,
          "question": question, "context": context}


@seqio.map_over_dataset
def drop_qa(x: Example) -> Dict[str, tf.Tensor]:
  """DROP in SQuAD's style: "drop question: <q> context: <passage>" -> answer.

  Gold answers for evaluation are the answer followed by the validated answers.
  """
  answers = pad_punctuation(tf.concat([tf.expand_dims(x["answer"], 0),
                                       x["validated_answers"]], axis=0))
  question, passage = pad_punctuation(x["question"]), pad_punctuation(x["passage"])
  inputs = squeeze_join([tf.constant("drop question:"), question, tf.constant("context:"), passage])
  return {"inputs": inputs, "targets": answers[0], "answers": answers}


@seqio.map_over_dataset
def classify(x: Example, task: str, keys: Sequence[str], label_names: Sequence[str],
             renames: Optional[Mapping[str, str]] = None) -> Dict[str, tf.Tensor]:
  """"<task> k1: v1 k2: v2" -> label name, for the tasks T5 never defined.

  `renames` maps a shown key to the example's field (e.g. {"text": "review"}).
  """
  renames = renames or {}
  parts = [tf.constant(task)]
  for key in keys:
    parts += [tf.constant(f"{key}:"), x[renames.get(key, key)]]
  return {"inputs": join(parts), "targets": label_text(x["label"], label_names)}


@seqio.map_over_dataset
def hellaswag(x: Example) -> Dict[str, tf.Tensor]:
  """"hellaswag context: <ctx> ending0: .. ending3: .." -> "ending<label>"."""
  parts = [tf.constant("hellaswag context:"), x["context"]]
  for i in range(4):
    parts += [tf.constant(f"ending{i}:"), x["endings"][i]]
  return {"inputs": join(parts),
          "targets": label_text(x["label"], [f"ending{i}" for i in range(4)])}


RACE_LETTERS = ("A", "B", "C", "D")


def race(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """RACE: one example per question.

  "race question: <q> A: <o1> B: <o2> C: <o3> D: <o4> article: <article>" -> letter.
  """

  def per_question(x):
    options = x["options"]
    if isinstance(options, tf.RaggedTensor):
      options = options.to_tensor()
    n = tf.size(x["questions"])
    parts = [tf.fill([n], "race question:"), x["questions"]]
    for i, letter in enumerate(RACE_LETTERS):
      parts += [tf.fill([n], f"{letter}:"), options[:, i]]
    parts += [tf.fill([n], "article:"), tf.fill([n], x["article"])]
    return {"inputs": tf.strings.join(parts, separator=" "), "targets": x["answers"]}

  return dataset.map(per_question, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


@seqio.map_over_dataset
def drop_task_name(x: Example) -> Dict[str, tf.Tensor]:
  """Removes the leading task name (first space-delimited word) from "inputs" (taskless tasks)."""
  out = dict(x)
  out["inputs"] = tf.strings.regex_replace(x["inputs"], r"^[^ ]* ", "", replace_global=False)
  return out


@seqio.map_over_dataset
def c4_text(x: Example) -> Dict[str, tf.Tensor]:
  """C4: the whole document as "targets" (split into inputs/targets after tokenization)."""
  return {"targets": x["text"]}


def prefix_lm(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
              output_features: Mapping[str, seqio.Feature]) -> tf.data.Dataset:
  """Prefix-LM on token ids (after `tokenize`), as T5's `prefix_lm`.

  Each document's tokens are cut into segments of `sequence_length["inputs"] - 1`
  tokens; each segment of at least 2 tokens is split at a point drawn uniformly
  from [1, len - 1]: the prefix is "inputs", the continuation "targets". The
  pretokenized strings are the decoded token pieces.
  """
  if not sequence_length or "inputs" not in sequence_length:
    raise ValueError("C4 prefix-LM needs sequence_length with an 'inputs' length; got "
                     f"{sequence_length!r}")
  segment = sequence_length["inputs"] - int(output_features["inputs"].add_eos)
  if segment < 2:
    raise ConfigError(
        f"sequence_length['inputs'] must be at least {2 + int(output_features['inputs'].add_eos)}; "
        f"got {sequence_length['inputs']}")

  def segments(x):
    tokens = x["targets"]
    n = tf.size(tokens, out_type=tf.int64)
    starts = tf.range((n + segment - 1) // segment, dtype=tf.int64) * segment
    return {"targets": tf.RaggedTensor.from_row_lengths(
        tokens, tf.minimum(tf.cast(segment, tf.int64), n - starts))}

  dataset = dataset.map(segments, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
  dataset = dataset.filter(lambda x: tf.size(x["targets"]) >= 2)
  vocabulary = output_features["targets"].vocabulary

  @seqio.map_over_dataset(num_seeds=1)
  def split(x, seed):
    tokens = x["targets"]
    cut = tf.random.stateless_uniform([], seed=seed, minval=1, maxval=tf.size(tokens),
                                      dtype=tf.int32)
    inputs, targets = tokens[:cut], tokens[cut:]
    return {"inputs": inputs, "targets": targets,
            "inputs_pretokenized": vocabulary.decode_tf(inputs),
            "targets_pretokenized": vocabulary.decode_tf(targets)}

  return split(dataset)
