"""OpenAI completions and chat completions requests, checked before any reaches the engine.

`/v1/completions`: `prompt` a text, a list of texts, a list of token ids or a list of such lists
(texts get EOS appended, as the trainer's inputs; token ids are used as given). `/v1/chat/
completions`: `messages` rendered by the model's chat template (as transformers'
`apply_chat_template(..., add_generation_prompt=True)`), tokenized without BOS (the model adds
its own). Both: max_tokens, temperature, top_p, top_k, seed, stop, n, stream (+ stream_options.
include_usage), user; completions: logprobs (0-5), echo; chat: logprobs (bool), top_logprobs
(0-20). A bad or unsupported field is an `api.ApiError` (400) naming it.
"""
from __future__ import annotations

import dataclasses
import json
import secrets
from typing import Any, Optional, Sequence

import numpy as np

from spot_jax.errors import ConfigError, one_line
from spot_jax.serve.http import api
from spot_jax.serve.model.slots import TOP_LOGPROBS

SAMPLING_FIELDS = ("model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n",
                   "stream", "stream_options", "user")
COMPLETION_FIELDS = SAMPLING_FIELDS + ("prompt", "logprobs", "echo")
CHAT_FIELDS = SAMPLING_FIELDS + ("messages", "logprobs", "top_logprobs",
                                 "max_completion_tokens")
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for /v1/completions


@dataclasses.dataclass(frozen=True)
class Generation(api.Completion):
  """A checked request: `tokens` x n sequences (the batcher's `api.Completion` and more).

  Attributes:
    model: the prompt's name; texts: each row's prompt text (for echo; "" for token ids).
    tokens: each row's input ids.
    max_tokens, temperature, top_p, top_k, seed, n, stop: the settings (seed drawn when none).
    chat: a chat request (else completions).
    logprobs: top log-probabilities per token to return (None: no logprobs at all).
    echo: completions' text starts with its prompt.
    stream, include_usage: server-sent events; a last event with the usage.
  """
  chat: bool
  top_p: float
  seed: int
  logprobs: Optional[int]
  echo: bool
  stream: bool
  include_usage: bool


def _bool(body: dict, field: str) -> bool:
  value = body.get(field, False)
  if value is None:
    return False
  if not isinstance(value, bool):
    raise api.ApiError(400, f"{field}={json.dumps(value)[:60]} is invalid; give true or false",
                       field)
  return value


def _settings(body: dict, limits: api.Limits, slots: int, rows: int, max_field: str) -> dict:
  """The sampling settings every request kind shares."""
  options = body.get("stream_options")
  if options is not None and (not isinstance(options, dict)
                              or set(options) - {"include_usage"}):
    raise api.ApiError(400, "stream_options may hold only include_usage (true or false)",
                       "stream_options")
  top_p = body.get("top_p", 1.0)
  if top_p is None:
    top_p = 1.0
  if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
    raise api.ApiError(400, f"top_p={json.dumps(top_p)} is invalid; give a number in (0, 1]",
                       "top_p")
  n = api._int(body, "n", 1, 1, slots)  # pylint: disable=protected-access
  if rows * n > slots:
    raise api.ApiError(400, f"{rows} prompts x n={n} is {rows * n} sequences, more than the "
                            f"server's {slots} slots; give at most {slots}", "n")
  seed = body.get("seed")
  if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
    raise api.ApiError(400, f"seed={json.dumps(seed)[:60]} is invalid; give an integer", "seed")
  stream = _bool(body, "stream")
  return dict(
      max_tokens=api._int(body, max_field, min(16, limits.target_length), 1,  # pylint: disable=protected-access
                          limits.target_length),
      temperature=api._number(body, "temperature", 0.0, 0.0, 100.0),  # pylint: disable=protected-access
      top_p=float(top_p), top_k=api._int(body, "top_k", 0, 0, limits.vocab_size),  # pylint: disable=protected-access
      seed=secrets.randbits(32) if seed is None else seed, n=n, stop=api.stop_strings(body),
      stream=stream,
      include_usage=bool(stream and options and options.get("include_usage")))


def _prompt_rows(body: dict, vocab: Any, limits: api.Limits, offset: int
                 ) -> tuple[tuple[str, ...], tuple[np.ndarray, ...]]:
  """`prompt` as texts (EOS appended) or token ids (as given)."""
  value = body.get("prompt")
  is_ids = lambda v: isinstance(v, list) and v and all(  # noqa: E731
      isinstance(t, int) and not isinstance(t, bool) for t in v)
  if is_ids(value) or (isinstance(value, list) and value and all(is_ids(v) for v in value)):
    lists = [value] if is_ids(value) else value
    if len(lists) > limits.max_rows:
      raise api.ApiError(400, f"prompt holds {len(lists)} token lists; give 1 to "
                              f"{limits.max_rows}", "prompt")
    rows = []
    for ids in lists:
      if len(ids) > limits.input_length:
        raise api.ApiError(400, f"prompt is {len(ids)} tokens, longer than the server's context "
                                f"for inputs, {limits.input_length}; shorten it", "prompt")
      if not all(0 <= t < limits.vocab_size for t in ids):
        raise api.ApiError(400, f"prompt holds a token id outside [0, {limits.vocab_size})",
                           "prompt")
      rows.append(np.asarray(ids, np.int32))
    return ("",) * len(rows), tuple(rows)
  texts = api._texts(body, "prompt", limits.max_rows)  # pylint: disable=protected-access
  return texts, api.token_rows(vocab, texts, "prompt", limits, offset)


def completion(body: dict, names: Sequence[str], vocab: Any, limits: api.Limits, slots: int,
               offset: int = 0) -> Generation:
  """A checked /v1/completions request (raises ApiError)."""
  api._fields(body, COMPLETION_FIELDS)  # pylint: disable=protected-access
  model = api.model_name(body, names)
  texts, rows = _prompt_rows(body, vocab, limits, offset)
  settings = _settings(body, limits, slots, len(rows), "max_tokens")
  logprobs = body.get("logprobs")
  if logprobs is not None:
    logprobs = api._int(body, "logprobs", 0, 0, MAX_COMPLETION_LOGPROBS)  # pylint: disable=protected-access
  return Generation(chat=False, model=model, texts=texts, tokens=rows, logprobs=logprobs,
                    echo=_bool(body, "echo"), **settings)


def chat(body: dict, names: Sequence[str], vocab: Any, limits: api.Limits, slots: int,
         template: Any, bos_id: int) -> Generation:
  """A checked /v1/chat/completions request (raises ApiError)."""
  api._fields(body, CHAT_FIELDS)  # pylint: disable=protected-access
  model = api.model_name(body, names)
  messages = body.get("messages")
  if not isinstance(messages, list) or not messages:
    raise api.ApiError(400, "messages must be a non-empty list of {\"role\", \"content\"} "
                            "objects", "messages")
  for i, message in enumerate(messages):
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
      raise api.ApiError(400, f"messages[{i}] has no role; give each message a \"role\" "
                              f"(system, user or assistant) and its \"content\"", "messages")
  if template is None:
    raise api.ApiError(400, "this server has no chat template (the model directory's "
                            "tokenizer_config.json has none); start it with --chat_template, "
                            "or use /v1/completions", "messages")
  try:
    text = template.render(messages, add_generation_prompt=True)
  except ConfigError as e:
    raise api.ApiError(400, one_line(e), "messages") from None
  ids = [int(t) for t in vocab.encode(text)]
  if ids and ids[0] == bos_id:  # the template wrote BOS; the model adds its own
    ids = ids[1:]
  if not ids or len(ids) > limits.input_length:
    raise api.ApiError(400, f"the rendered messages are {len(ids)} tokens; give 1 to the "
                            f"server's context for inputs, {limits.input_length}", "messages")
  if body.get("max_completion_tokens") is not None:
    body = {**body, "max_tokens": body["max_completion_tokens"]}
  settings = _settings(body, limits, slots, 1, "max_tokens")
  top = api._int(body, "top_logprobs", 0, 0, TOP_LOGPROBS)  # pylint: disable=protected-access
  if body.get("top_logprobs") is not None and not _bool(body, "logprobs"):
    raise api.ApiError(400, "top_logprobs needs logprobs=true", "top_logprobs")
  return Generation(chat=True, model=model, texts=(text,), tokens=(np.asarray(ids, np.int32),),
                    logprobs=top if _bool(body, "logprobs") else None, echo=False, **settings)
