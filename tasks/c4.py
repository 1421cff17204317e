"""C4 prefix language modelling, the LM objective SPoT uses as a source task.

Each document of TFDS c4/en 3.1.0 is tokenized, cut into segments of
`sequence_length["inputs"] - 1` tokens, and every segment is split at a
uniformly drawn point: the prefix is the input, the continuation the target
(T5's `prefix_lm`, without its preliminary random 65,536-token chunk, so every
token of a document is used). No metrics: it is a training task.
"""
from __future__ import annotations

from tasks import names, registry, sources
from tasks import preprocessors as pp

TFDS_NAME = "c4/en:3.1.0"


def register_all() -> None:
  registry.register(registry.TaskSpec(
      name=names.OTHER["c4_prefix_lm"],
      source=sources.TfdsSource(TFDS_NAME, {"train": "train", "validation": "validation"}),
      text_preprocessors=[pp.c4_text],
      token_preprocessors=[pp.prefix_lm],
      schema={"text": "str"},
      formats="first tokens of a segment -> the rest (split point uniform in [1, len-1])"))
