"""Your own instruction task: `register_chat_task` registers a seqio task from JSONL files in TRL
SFTTrainer's shapes, rendered with the model's chat template, trained on the answers only.

  import tasks
  tasks.register_chat_task("my_math_v1", train="train.jsonl", validation="validation.jsonl",
                           tokenizer="/models/Llama-3.2-1B-Instruct", answer="gsm8k")

Rows and what is trained: `tasks.chat_format`. The examples are tokenized here, once: inputs
without EOS (generation continues them), targets with the tokenizer's EOS appended (unless the
template already ends the turn with it), so the decoder-only layout trains on the targets'
tokens only (loss weights 0 on the inputs and padding) and evaluation generates after the
inputs until EOS. The texts kept beside the ids are the rendered inputs and the answer itself
(the assistant's content, or the completion), what evaluation and `infer --task` compare with.

`tokenizer` is the model's: a Hugging Face model directory (tokenizer.json or tokenizer.model,
its chat template from chat_template.jinja or tokenizer_config.json) or "embedded_decoder" (the
embedded toy decoder and its chat template). `template`: "model" (its own; the plain template
for text prompt/completion rows when it has none), "plain" (never a chat template: the prompt
then the completion, as written; messages refused) or the path of a .jinja file.

Evaluation generates and compares answers: `answer` is an extractor (`tasks.answers`: "gsm8k"
or a regular expression) and the metric is "exact_match" on the extracted answers; None
compares the whole stripped texts ("exact_match" too).

Problems are one `ConfigError` line naming the file and line. Registering the same name with
the same arguments again does nothing; names carry a version (`<name>_v<N>`).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
import seqio
import tensorflow as tf

from spot_jax.backbones.decoder import chat_template as chat_lib
from spot_jax.errors import ConfigError
from tasks import answers as answers_lib
from tasks import chat_format, postprocessors
from tasks import vocab as vocab_lib

PathLike = Union[str, "os.PathLike[str]"]
EMBEDDED = "embedded_decoder"
TEMPLATES = ("model", "plain")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*_v[0-9]+$")
_REGISTERED: Dict[str, tuple] = {}


class ChatSource(seqio.DataSource):
  """Tokenized examples held in memory: inputs, targets (int32 ids) and their texts."""

  def __init__(self, examples: Dict[str, List[Dict[str, Any]]], description: str):
    super().__init__(splits=tuple(examples))
    self._examples = examples
    self._description = description

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return False

  def list_shards(self, split: str) -> List[str]:
    return [split]

  def num_input_examples(self, split: str) -> int:
    return len(self._examples[split])

  def describe(self) -> str:
    return self._description

  def get_dataset(self, split: str = "train", shuffle: bool = True, seed: Optional[int] = None,
                  shard_info=None, **unused_kwargs) -> tf.data.Dataset:
    if split not in self._examples:
      raise ConfigError(f"split {split!r} is not one of {list(self._examples)} for "
                        f"{self._description}")
    rows = self._examples[split]
    signature = {"inputs": tf.TensorSpec([None], tf.int32),
                 "targets": tf.TensorSpec([None], tf.int32),
                 "inputs_pretokenized": tf.TensorSpec([], tf.string),
                 "targets_pretokenized": tf.TensorSpec([], tf.string)}
    ds = tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=signature)
    ds = ds.apply(tf.data.experimental.assert_cardinality(len(rows)))
    if shard_info is not None:
      ds = ds.shard(shard_info.num_shards, shard_info.index)
    if shuffle:
      ds = ds.shuffle(max(len(rows), 1), seed=seed)
    return ds


def _resolve_tokenizer(tokenizer: PathLike) -> tuple[seqio.Vocabulary, Optional[str], str]:
  """(seqio vocabulary, the directory whose chat template is the model's or None, its name)."""
  if tokenizer == EMBEDDED:
    from spot_jax import embedded  # pylint: disable=g-import-not-at-top
    from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
    return (seqio.SentencePieceVocabulary(embedded.DECODER_VOCAB_PATH, extra_ids=suite.EXTRA_IDS),
            embedded.DECODER_DIR, "the embedded toy decoder")
  if not isinstance(tokenizer, (str, os.PathLike)):
    raise ConfigError(f"tokenizer={tokenizer!r}; give the model's directory (tokenizer.json or "
                      f"tokenizer.model) or {EMBEDDED!r}")
  path = os.path.abspath(os.path.expanduser(os.fspath(tokenizer)))
  if not os.path.exists(path):
    raise ConfigError(f"tokenizer {path} does not exist; give the model's directory "
                      f"(tokenizer.json or tokenizer.model) or {EMBEDDED!r}")
  return vocab_lib.TokenizerVocabulary(path), path if os.path.isdir(path) else None, path


def _template(template: str, model_dir: Optional[str],
              name: str) -> tuple[Optional[chat_lib.ChatTemplate], str]:
  """(the chat template or None for the plain one, why there is none)."""
  if template == "plain":
    return None, "template='plain' uses none"
  if template == "model":
    found = chat_lib.load_chat_template(model_dir) if model_dir else None
    if found is None:
      return None, (f"the tokenizer {name} has none (no chat_template.jinja, no "
                    f"\"chat_template\" in tokenizer_config.json)")
    return found, ""
  if not isinstance(template, str) or not template.endswith(".jinja"):
    raise ConfigError(f"template={template!r}; valid: 'model', 'plain' or the path of a .jinja "
                      f"file")
  path = os.path.abspath(os.path.expanduser(template))
  try:
    with open(path, encoding="utf-8") as f:
      source = f.read()
  except OSError as e:
    raise ConfigError(f"template {path} cannot be read ({e.strerror}); give a .jinja file") \
        from None
  special = {}
  if model_dir:
    base = chat_lib.load_chat_template(model_dir)
    special = dict(base.special_tokens) if base is not None else {}
  return chat_lib.ChatTemplate(source, special, path), ""


def _rows(path: str) -> List[tuple[int, Dict[str, Any]]]:
  name = os.path.basename(path)
  rows = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ConfigError(f"{name} line {number} is not JSON ({e.msg}); write one JSON object "
                          "per line") from None
      if not isinstance(row, dict):
        raise ConfigError(f"{name} line {number} is a JSON {type(row).__name__}, not an object; "
                          f"write {chat_format.SHAPES}")
      rows.append((number, row))
  if not rows:
    raise ConfigError(f"{path} has no examples; write one JSON object per line, "
                      f"{chat_format.SHAPES}")
  return rows


def read_examples(path: str, vocabulary: seqio.Vocabulary,
                  template: Optional[chat_lib.ChatTemplate],
                  no_template: str = "") -> List[Dict[str, Any]]:
  """The tokenized examples of one JSONL file (one per trained assistant turn).

  Raises:
    ConfigError: one line naming the file and line (shape, role, template, empty completion).
  """
  return tokenize(_rows(path), os.path.basename(path), vocabulary, template, no_template)


def tokenize(rows: List[tuple[int, Dict[str, Any]]], source: str, vocabulary: seqio.Vocabulary,
             template: Optional[chat_lib.ChatTemplate],
             no_template: str = "") -> List[Dict[str, Any]]:
  """The tokenized examples of (line number, row) pairs read from `source` (a file name)."""
  eos = int(vocabulary.eos_id)
  out = []
  for number, row in rows:
    where = f"{source} line {number}"
    for inputs, targets, answer in chat_format.examples(row, where, template, no_template):
      if not [i for i in vocabulary.encode(answer) if i != eos]:
        raise ConfigError(f"{where}: the completion {answer!r} tokenizes to nothing; give every "
                          "answer some text")
      target_ids = [int(i) for i in vocabulary.encode(targets)]
      if not target_ids or target_ids[-1] != eos:
        target_ids.append(eos)
      out.append({"inputs": np.asarray(vocabulary.encode(inputs), np.int32),
                  "targets": np.asarray(target_ids, np.int32),
                  "inputs_pretokenized": inputs, "targets_pretokenized": answer})
  return out


def _check_file(split: str, path: PathLike) -> str:
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if not path.endswith(".jsonl"):
    raise ConfigError(f"{split} file {path!r} is not a .jsonl file; give JSON lines")
  if not os.path.isfile(path):
    raise ConfigError(f"{split} file {path} does not exist; give the path of a .jsonl file "
                      f"(relative paths start at the working directory, {os.getcwd()})")
  return path


def _strip_text(output, example=None, is_target=False) -> str:
  del example, is_target
  return postprocessors.as_text(output).strip()


def _exact_text(targets, predictions) -> Dict[str, float]:
  return answers_lib.exact_match(list(targets), list(predictions))


def register_chat_task(name: str, train: Optional[PathLike] = None,
                       validation: Optional[PathLike] = None, test: Optional[PathLike] = None, *,
                       tokenizer: PathLike, template: str = "model",
                       answer: Optional[str] = None,
                       rows: Optional[Dict[str, List[Dict[str, Any]]]] = None) -> str:
  """Registers seqio task `name` from instruction data; returns `name`.

  Args:
    name: the task's name, versioned: `<name>_v<N>`.
    train, validation, test: .jsonl files of the splits (None: no such split).
    tokenizer: the model's tokenizer directory, or "embedded_decoder".
    template: "model", "plain" or a .jinja file (module docstring).
    answer: the answer extractor of evaluation ("gsm8k" or a regular expression), or None to
      compare whole texts.
    rows: instead of files, {split: [row, ...]} made in code (the embedded toy task's).

  Raises:
    ConfigError: one line naming what is wrong (name, file and line, template, tokenizer).
  """
  if not isinstance(name, str) or not _NAME.match(name):
    raise ConfigError(f"task name {name!r} must be a word ending with a version, e.g. "
                      "'my_chat_v1' (letters, digits, underscores)")
  given = {"train": train, "validation": validation, "test": test}
  files = {split: _check_file(split, p) for split, p in given.items() if p is not None}
  if not files and not rows:
    raise ConfigError(f"register_chat_task({name!r}) needs train= (a .jsonl file)")
  key = (tuple((s, p, os.path.getmtime(p)) for s, p in files.items()), os.fspath(tokenizer),
         template, answer, None if rows is None else json.dumps(rows, sort_keys=True))
  if name in seqio.TaskRegistry.names():
    if _REGISTERED.get(name) == key:
      return name
    if name not in _REGISTERED:
      raise ConfigError(f"a task named {name!r} is already registered by another module; choose "
                        "another name")
  vocabulary, model_dir, tokenizer_name = _resolve_tokenizer(tokenizer)
  chat, no_template = _template(template, model_dir, tokenizer_name)
  postprocess: Callable[..., Any] = _strip_text
  metric: Callable[..., Any] = _exact_text
  if answer is not None:
    postprocess, metric = answers_lib.postprocessor(answer), answers_lib.exact_match
  examples = {s: read_examples(p, vocabulary, chat, no_template) for s, p in files.items()}
  for split, split_rows in (rows or {}).items():
    examples[split] = tokenize(list(enumerate(split_rows, start=1)), f"{name} {split}",
                               vocabulary, chat, no_template)
  description = "chat:" + ",".join(f"{s}={p}" for s, p in files.items()) if files else \
      f"chat:{name} (in code)"
  features = {"inputs": seqio.Feature(vocabulary, add_eos=False, required=False),
              "targets": seqio.Feature(vocabulary, add_eos=True)}
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)  # ours, redefined (e.g. an edited file)
  seqio.TaskRegistry.add(name, source=ChatSource(examples, description), preprocessors=[],
                         output_features=features, postprocess_fn=postprocess,
                         metric_fns=[metric])
  _REGISTERED[name] = key
  return name


def check_lines(path: PathLike, tokenizer: PathLike, template: str = "model",
                show: int = 2) -> List[str]:
  """What `python -m tasks chat` prints: the file's examples, their token lengths (the
  TASK_FEATURE_LENGTHS that hold them) and the first `show` examples as the model reads them.

  Raises:
    ConfigError: as `register_chat_task`, one line naming the file and line.
  """
  path = _check_file("--file", path)
  vocabulary, model_dir, tokenizer_name = _resolve_tokenizer(tokenizer)
  chat_template, no_template = _template(template, model_dir, tokenizer_name)
  rows = _rows(path)
  examples = tokenize(rows, os.path.basename(path), vocabulary, chat_template, no_template)
  inputs = [len(e["inputs"]) for e in examples]
  targets = [len(e["targets"]) for e in examples]
  kind = ("plain (prompt, then completion)" if chat_template is None
          else f"chat template of {chat_template.origin}")
  lines = [f"{path}: {len(rows)} lines -> {len(examples)} examples (one per assistant turn); "
           f"{kind}",
           f"tokens: inputs longest {max(inputs)}, mean {np.mean(inputs):.1f}; targets (EOS "
           f"included) longest {max(targets)}, mean {np.mean(targets):.1f}",
           f"holds every example: TASK_FEATURE_LENGTHS={{'inputs': {max(inputs)}, "
           f"'targets': {max(targets)}}}"]
  for i, example in enumerate(examples[:max(int(show), 0)]):
    lines += [f"--- example {i + 1}: inputs (no loss)", example["inputs_pretokenized"],
              "--- targets (the loss; then EOS)", example["targets_pretokenized"]]
  return lines
