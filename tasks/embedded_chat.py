"""The embedded chat task: the suite's sums as conversations, for the embedded toy decoder.

`spot_toy_chat_sum_v1`: a user asks `numbers: 7 and 8`, the assistant answers `15`, rendered
with the toy decoder's chat template (`spot_jax/embedded/toy_decoder/chat_template.jinja`) as
`question: numbers: 7 and 8 answer: 15`; the loss is on ` 15` and EOS only. Made here from
`tasks.embedded`'s sum examples (train 4000, validation the first 200), nothing downloaded;
evaluation generates and scores exact match of the number (`tasks.answers`). Import
explicitly: MIXTURE_OR_TASK_MODULE='tasks.embedded_chat'.
"""
from __future__ import annotations

from tasks import chat
from tasks import embedded

TASK = "spot_toy_chat_sum_v1"
SIZES = {"train": 4000, "validation": 200}
NUMBER = r"(-?[0-9]+)"


def rows(split: str) -> list[dict]:
  """The conversations of one split (the sum task's examples, without its task name)."""
  inputs, targets = embedded.examples("sum", split)
  return [{"messages": [{"role": "user", "content": text[len("sum "):]},
                        {"role": "assistant", "content": answer}]}
          for text, answer in zip(inputs[:SIZES[split]], targets[:SIZES[split]])]


def register() -> str:
  """Registers TASK (idempotent)."""
  return chat.register_chat_task(TASK, tokenizer=chat.EMBEDDED, answer=NUMBER,
                                 rows={split: rows(split) for split in SIZES})


register()
