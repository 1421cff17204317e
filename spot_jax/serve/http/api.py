"""The HTTP API's requests and responses: every field checked before a request is queued.

`POST /v1/completions` follows OpenAI's completions API (`model` is the prompt's name; `prompt`
a text or a list; `max_tokens`, `temperature`, `top_k`, `n`, `stop`); `POST /v1/classify`
ranks class labels by log-likelihood. A bad field is an `ApiError`: a status and an OpenAI-style
JSON error naming the field and what would be valid, so one bad request never reaches a batch.
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any, Optional, Sequence

import numpy as np

from spot_jax import validate
from spot_jax.serve.model import inputs

COMPLETION_FIELDS = ("model", "prompt", "max_tokens", "temperature", "top_k", "n", "stop",
                     "stream", "user")
CLASSIFY_FIELDS = ("model", "input", "labels", "user")
MAX_STOP = 4


class ApiError(Exception):
  """A request the service refuses: `status`, a one-line `message`, the `param` at fault."""

  def __init__(self, status: int, message: str, param: Optional[str] = None,
               headers: Optional[dict] = None):
    super().__init__(message)
    self.status, self.message, self.param, self.headers = status, message, param, headers or {}

  def body(self) -> dict:
    kind = "invalid_request_error" if self.status < 500 else "server_error"
    return {"error": {"message": self.message, "type": kind, "param": self.param,
                      "code": self.status}}


@dataclasses.dataclass(frozen=True)
class Limits:
  """What the server accepts.

  Attributes:
    input_length: ids per input, EOS included (longer: refused, or cut with `truncate`).
    target_length: the largest max_tokens (decoded ids, EOS included).
    max_rows: rows one request may fill (texts x n), the batch size.
    vocab_size: top_k's bound.
    truncate: cut long inputs instead of refusing them.
    labels: classify's labels when a request gives none.
  """
  input_length: int
  target_length: int
  max_rows: int
  vocab_size: int
  truncate: bool = False
  labels: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Completion:
  """A checked completions request: its rows are `tokens` x n."""
  model: str
  texts: tuple[str, ...]
  tokens: tuple[np.ndarray, ...]
  max_tokens: int
  temperature: float
  top_k: int
  n: int
  stop: tuple[str, ...]

  @property
  def key(self) -> tuple[str, float, int]:
    """The decoding setting (see `catalog.DecodeKey`)."""
    if self.temperature == 0:
      return ("greedy", 0.0, 0)
    return ("sample", self.temperature, self.top_k)


@dataclasses.dataclass(frozen=True)
class Classify:
  """A checked classify request."""
  model: str
  texts: tuple[str, ...]
  tokens: tuple[np.ndarray, ...]
  labels: tuple[str, ...]
  label_tokens: np.ndarray
  label_valid: np.ndarray


def parse_json(raw: bytes) -> dict:
  """The request body as a JSON object."""
  try:
    body = json.loads(raw)
  except (ValueError, UnicodeDecodeError) as e:
    raise ApiError(400, f"the body is not valid JSON ({e}); send a JSON object") from None
  if not isinstance(body, dict):
    raise ApiError(400, f"the body is a JSON {type(body).__name__}, not an object; send "
                        f"{{\"model\": ..., ...}}")
  return body


def _fields(body: dict, valid: Sequence[str]) -> None:
  for field in body:
    if field not in valid:
      raise ApiError(400, f"field {field!r} is not supported; valid fields: {', '.join(valid)}",
                     field)


def _int(body: dict, field: str, default: int, low: int, high: int) -> int:
  value = body.get(field, default)
  if value is None:
    value = default
  if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
    raise ApiError(400, f"{field}={json.dumps(value)} is invalid; give an integer from {low} "
                        f"to {high}", field)
  return value


def _number(body: dict, field: str, default: float, low: float, high: float) -> float:
  value = body.get(field, default)
  if value is None:
    value = default
  if (isinstance(value, bool) or not isinstance(value, (int, float))
      or not low <= value <= high):
    raise ApiError(400, f"{field}={json.dumps(value)} is invalid; give a number from {low} to "
                        f"{high}", field)
  return float(value)


def _texts(body: dict, field: str, max_rows: int) -> tuple[str, ...]:
  if field not in body:
    raise ApiError(400, f"field {field!r} is missing; give the input text or a list of texts",
                   field)
  value = body[field]
  texts = [value] if isinstance(value, str) else value
  if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
    raise ApiError(400, f"{field} must be a string or a list of strings, not "
                        f"{json.dumps(value)[:60]}", field)
  if not 1 <= len(texts) <= max_rows:
    raise ApiError(400, f"{field} holds {len(texts)} texts; give 1 to {max_rows} (the batch "
                        f"size)", field)
  return tuple(texts)


def model_name(body: dict, names: Sequence[str]) -> str:
  """The `model` field: a served prompt's name (unknown: 404)."""
  if "model" not in body:
    raise ApiError(400, "field 'model' is missing; give a prompt's name (GET /v1/models lists "
                        "them)", "model")
  name = body["model"]
  if not isinstance(name, str):
    raise ApiError(400, f"model must be a string (a prompt's name), not {json.dumps(name)[:60]}",
                   "model")
  if name not in names:
    close = validate.close_names(name, names)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ApiError(404, f"model {name!r} is not a served prompt{hint}; GET /v1/models lists the "
                        f"served prompts", "model")
  return name


def token_rows(vocab: Any, texts: Sequence[str], field: str, limits: Limits,
               offset_length: int = 0) -> tuple[np.ndarray, ...]:
  """Each text's ids ending in the vocabulary's EOS (no padding: every id is a token), checked
  against the input length (and a DePT offset)."""
  rows, eos_id = [], inputs.eos_of(vocab)
  for i, text in enumerate(texts):
    ids = list(vocab.encode(text)) + [eos_id]
    where = field if len(texts) == 1 else f"{field}[{i}]"
    if len(ids) > limits.input_length:
      if not limits.truncate:
        raise ApiError(400, f"{where} is {len(ids)} tokens (EOS included), longer than the "
                            f"server's input length {limits.input_length}; shorten it (or start "
                            f"the server with --truncate)", field)
      ids = ids[:limits.input_length - 1] + [eos_id]
    if max(ids) >= limits.vocab_size:
      raise ApiError(400, f"{where} encodes to id {max(ids)}, beyond the model's table of "
                          f"{limits.vocab_size} ids; give text the model was trained on", field)
    if offset_length and len(ids) > offset_length:
      raise ApiError(400, f"{where} is {len(ids)} tokens (EOS included) but the prompt offsets "
                          f"only its first {offset_length} input positions (DePT); give at most "
                          f"{offset_length}", field)
    rows.append(np.asarray(ids, np.int32))
  return tuple(rows)


def completion(body: dict, names: Sequence[str], vocab: Any, limits: Limits,
               offset_length: int = 0) -> Completion:
  """A checked completions request (raises ApiError)."""
  _fields(body, COMPLETION_FIELDS)
  if body.get("stream") not in (None, False):
    raise ApiError(400, "stream=true is not supported: the decoding loop runs whole in one "
                        "compiled call, so tokens come back together; send stream=false", "stream")
  model = model_name(body, names)
  texts = _texts(body, "prompt", limits.max_rows)
  max_tokens = _int(body, "max_tokens", min(16, limits.target_length), 1, limits.target_length)
  temperature = _number(body, "temperature", 0.0, 0.0, 100.0)
  top_k = _int(body, "top_k", 0, 0, limits.vocab_size)
  n = _int(body, "n", 1, 1, limits.max_rows)
  if len(texts) * n > limits.max_rows:
    raise ApiError(400, f"{len(texts)} texts x n={n} is {len(texts) * n} rows; give at most "
                        f"{limits.max_rows} (the batch size)", "n")
  stop = stop_strings(body)
  tokens = token_rows(vocab, texts, "prompt", limits, offset_length)
  return Completion(model, texts, tokens, max_tokens, temperature, top_k, n, stop)


def stop_strings(body: dict) -> tuple[str, ...]:
  """The `stop` field: a string or a list of up to MAX_STOP non-empty strings."""
  stop = body.get("stop") or []
  stop = [stop] if isinstance(stop, str) else stop
  if (not isinstance(stop, list) or len(stop) > MAX_STOP
      or not all(isinstance(s, str) and s for s in stop)):
    raise ApiError(400, f"stop must be a non-empty string or a list of up to {MAX_STOP}, not "
                        f"{json.dumps(body.get('stop'))[:60]}", "stop")
  return tuple(stop)


def classify(body: dict, names: Sequence[str], vocab: Any, limits: Limits,
             offset_length: int = 0) -> Classify:
  """A checked classify request (raises ApiError)."""
  _fields(body, CLASSIFY_FIELDS)
  model = model_name(body, names)
  texts = _texts(body, "input", limits.max_rows)
  labels = body.get("labels", list(limits.labels))
  if (not isinstance(labels, list) or not labels
      or not all(isinstance(l, str) for l in labels)):
    raise ApiError(400, f"labels must be a non-empty list of strings, not "
                        f"{json.dumps(labels)[:60]} (the server has no --label default)"
                   if not limits.labels else "labels must be a non-empty list of strings",
                   "labels")
  try:
    label_tokens, label_valid = inputs.label_rows(vocab, labels, limits.target_length)
  except ValueError as e:
    raise ApiError(400, str(e).replace("--label entry", "labels entry"), "labels") from None
  tokens = token_rows(vocab, texts, "input", limits, offset_length)
  return Classify(model, texts, tokens, tuple(labels), label_tokens, label_valid)


def method_name(entry: Any) -> str:
  """What kind of prompt a `table.ServedPrompt` serves, for listings."""
  if entry.deep:
    return "deep prompt (per-layer prefixes)" + (" + input prompt" if entry.length else "")
  if entry.offset is not None:
    return "DePT (prompt + input offset)"
  if entry.attention is not None:
    return "ATTEMPT (attention over prompts)"
  if entry.num_prompts > 1:
    return f"SMoP ({entry.num_prompts} prompts, {entry.routing} routing)"
  return "prompt"


def completion_body(req: Completion, rows: Sequence[tuple[np.ndarray, float]], vocab: Any
                    ) -> dict:
  """The OpenAI completion object of `req`'s decoded rows (texts x n, in that order): each
  row's tokens run to its first EOS (what follows is padding), or fill max_tokens."""
  choices, completion_tokens, eos_id = [], 0, inputs.eos_of(vocab)
  for index, (ids, _) in enumerate(rows):
    ids = [int(t) for t in ids[:req.max_tokens]]
    ended = eos_id in ids
    completion_tokens += ids.index(eos_id) + 1 if ended else len(ids)
    text = inputs.decode(vocab, np.asarray(ids), eos_id)
    cuts = [text.find(s) for s in req.stop if s in text]
    if cuts:
      text, ended = text[:min(cuts)], True
    choices.append({"text": text, "index": index, "logprobs": None,
                    "finish_reason": "stop" if ended else "length"})
  prompt_tokens = sum(len(t) for t in req.tokens) * req.n
  return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
          "created": int(time.time()), "model": req.model, "choices": choices,
          "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens}}


def classify_body(req: Classify, rows: Sequence[np.ndarray]) -> dict:
  """Each input's label log-likelihoods and best label."""
  data = []
  for index, scores in enumerate(rows):
    scores = [float(s) for s in scores]
    data.append({"index": index, "label": req.labels[int(np.argmax(scores))],
                 "scores": dict(zip(req.labels, scores))})
  prompt_tokens = sum(len(t) for t in req.tokens)
  return {"object": "classification", "model": req.model, "labels": list(req.labels),
          "data": data, "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
