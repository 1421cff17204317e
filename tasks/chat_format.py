"""Instruction data in TRL SFTTrainer's shapes -> (inputs, targets) texts, loss on the answers.

A row (one JSONL line) is one of
  {"prompt": "...", "completion": "..."}                       prompt and completion as text
  {"prompt": [messages], "completion": [messages]}             conversational prompt/completion
  {"messages": [{"role": "user", "content": "..."}, ...]}      a conversation
with roles system, user, assistant and tool. Each assistant turn becomes one example: its inputs
are the conversation before it rendered with the chat template and its generation prompt
(`add_generation_prompt=True`), its targets what the template writes for the turn (the content
and the template's end of turn). The model is trained on the targets only, so every assistant
token is trained once and nothing else is. A text prompt/completion with a chat template is the
user turn and the assistant turn; without one (`template=None`, the "plain" template) the inputs
are the prompt and the targets the completion, as written.

The template's leading BOS text (`<|begin_of_text|>`, `<bos>`) is dropped from the inputs: the
model puts its BOS first itself.
"""
from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence

from spot_jax.backbones.decoder.chat_template import ChatTemplate, ChatTemplateError
from spot_jax.errors import ConfigError

ROLES = ("system", "user", "assistant", "tool")
SHAPES = ('{"prompt": "...", "completion": "..."} or {"messages": [{"role": "user", '
          '"content": "..."}, {"role": "assistant", "content": "..."}]}')


def _messages(value: Any, where: str, field: str) -> List[dict]:
  """The checked messages of a row's field."""
  if not isinstance(value, list) or not value:
    raise ConfigError(f"{where}: {field!r} must be a non-empty list of messages, each "
                      f"{{\"role\": ..., \"content\": ...}}")
  out = []
  for i, message in enumerate(value):
    if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
      raise ConfigError(f"{where}: {field} message {i} is not an object with \"role\" and "
                        f"\"content\"; write {{\"role\": \"user\", \"content\": \"...\"}}")
    role = message["role"]
    if role not in ROLES:
      raise ConfigError(f"{where}: {field} message {i} has the unknown role {role!r}; valid: "
                        f"{', '.join(ROLES)}")
    if not isinstance(message["content"], str):
      raise ConfigError(f"{where}: {field} message {i} ({role}) has content of type "
                        f"{type(message['content']).__name__}; give text")
    out.append(dict(message))
  return out


def _text(value: Any, where: str, field: str) -> str:
  if not isinstance(value, str):
    raise ConfigError(f"{where}: {field!r} holds a JSON {type(value).__name__}; give text, or "
                      f"lists of messages in both \"prompt\" and \"completion\"")
  return value


def conversation(row: Mapping[str, Any], where: str) -> tuple[Optional[List[dict]], int]:
  """(messages, index of the first trained turn) of a row; (None, 0) for text prompt/completion.

  Raises:
    ConfigError: the row has neither shape, or a message is malformed (naming `where`).
  """
  if "messages" in row:
    messages = _messages(row["messages"], where, "messages")
    first = 0
  elif "prompt" in row and "completion" in row:
    if isinstance(row["prompt"], str) and isinstance(row["completion"], str):
      return None, 0
    prompt = _messages(row["prompt"], where, "prompt")
    messages = prompt + _messages(row["completion"], where, "completion")
    first = len(prompt)
  else:
    keys = ", ".join(map(repr, row)) or "none"
    raise ConfigError(f"{where} has neither \"messages\" nor \"prompt\" and \"completion\" "
                      f"(its keys: {keys}); write {SHAPES}")
  if not any(m["role"] == "assistant" for m in messages[first:]):
    raise ConfigError(f"{where}: no assistant message to train on; end the conversation (or the "
                      f"completion) with {{\"role\": \"assistant\", \"content\": \"...\"}}")
  return messages, first


def _render(template: ChatTemplate, messages: Sequence[dict], where: str, **kwargs) -> str:
  try:
    return template.render(messages, **kwargs)
  except ChatTemplateError as e:
    raise ChatTemplateError(f"{where}: {e}") from None


def _without_bos(text: str, template: ChatTemplate) -> str:
  bos = template.bos_token
  return text[len(bos):] if bos and text.startswith(bos) else text


def examples(row: Mapping[str, Any], where: str, template: Optional[ChatTemplate],
             no_template: str = "the tokenizer has no chat template"
             ) -> List[tuple[str, str, str]]:
  """The (inputs, targets, answer) texts of one row, one per trained assistant turn: answer is
  the turn's content (or the completion), which must not be empty.

  Args:
    row: a JSONL object in one of the shapes above.
    where: "<file> line <n>", for messages.
    template: the chat template, or None for the plain one (text prompt/completion only).
    no_template: why there is no template, for the refusal of messages without one.

  Raises:
    ConfigError: a malformed row, messages without a template, a template that fails to render
      or that renders a conversation's start differently once a turn follows.
  """
  messages, first = conversation(row, where)
  if messages is None:
    prompt = _text(row["prompt"], where, "prompt")
    completion = _text(row["completion"], where, "completion")
    if template is None:
      return [(prompt, completion, completion)]
    messages, first = [{"role": "user", "content": prompt},
                       {"role": "assistant", "content": completion}], 1
  if template is None:
    raise ConfigError(f"{where}: chat messages need a chat template and {no_template}; give "
                      "a template (template=, --template: a .jinja file), or write {\"prompt\": "
                      "..., \"completion\": ...} text")
  pairs = []
  for k in range(first, len(messages)):
    if messages[k]["role"] != "assistant":
      continue
    context = _render(template, messages[:k], where, add_generation_prompt=True)
    whole = _render(template, messages[:k + 1], where)
    if not whole.startswith(context):
      raise ChatTemplateError(
          f"{where}: the chat template renders the conversation before assistant message {k} "
          f"differently once that message follows, so its tokens cannot be told apart; use a "
          f"template whose generation prompt starts each assistant turn")
    pairs.append((_without_bos(context, template), whole[len(context):],
                  messages[k]["content"]))
  return pairs
