"""/v1/completions and /v1/chat/completions on the continuous-batching engine, streamed or not.

A checked request (`generation`) becomes rows x n engine `Sequence`s, submitted together (429
with Retry-After when too many wait, 503 once the server is stopping). Tokens come back one by
one from the engine thread; with `stream: true` they are sent as they come as server-sent events
(`data: {...}`: one per choice for the tokens already there, e.g. a decode call's; the stream
ends with `data: [DONE]`), otherwise the answer is sent when every sequence has ended. A client
that goes away has its sequences cancelled: each frees its slot before the engine's next call.
"""
from __future__ import annotations

import asyncio
import collections
import json
import time
import uuid
from typing import Any, AsyncIterator, Callable, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from spot_jax.serve.http import api, detok
from spot_jax.serve.scheduler.batcher import PromptGone, QueueFull, Stopping
from spot_jax.serve.http import generation
from spot_jax.serve.scheduler.sequence import Sequence


class Choice:
  """One sequence's text and log-probabilities as they come.

  Attributes:
    index: the choice's index; prefix: echoed prompt text.
    ids: generated ids; entries: per token (id, logprob, top ids, top logprobs).
    sent: text already streamed; finish: "stop", "length", or None.
  """

  def __init__(self, index: int, prefix: str, vocab: Any, gen: generation.Generation,
               eos_id: int):
    self.index, self.prefix, self.vocab, self.gen, self.eos_id = index, prefix, vocab, gen, eos_id
    self.ids: list[int] = []
    self.entries: list[tuple] = []
    self.sent = ""
    self.finish: Optional[str] = None
    self.error: Optional[Exception] = None
    self._detok = detok.Detokenizer(vocab, eos_id)
    self._taken = 0  # ids given to the detokenizer
    self._cut: Optional[int] = None  # where the first stop string starts, once one is there
    self._searched = 0  # text searched for stop strings (none starts before it)

  def text(self) -> str:
    """The text so far, cut at the first stop string (then finished as "stop"); an incomplete
    character at the end is held back until the sequence finishes."""
    d = self._detok
    if self._taken < len(self.ids):
      d.extend(self.ids[self._taken:])
      self._taken = len(self.ids)
    if self.finish is not None:
      d.finish()
    text = d.text
    if not self.gen.stop:
      return text
    if self._cut is None:  # search only text a stop string could newly end in
      start = max(0, self._searched - max(len(s) for s in self.gen.stop) + 1)
      cuts = [i for i in (text.find(s, start) for s in self.gen.stop) if i >= 0]
      self._cut = min(cuts) if cuts else None
      self._searched = len(text)
    return text if self._cut is None else text[:self._cut]

  def delta(self) -> str:
    """New text to stream: all of it once finished, else held back while a stop string may be
    starting."""
    text = self.text()
    if self.finish is None and self.gen.stop:
      text = text[:max(len(self.sent), len(text) - max(len(s) for s in self.gen.stop) + 1)]
    new = text[len(self.sent):] if text.startswith(self.sent) else ""
    self.sent += new
    return new

  def token_text(self, token: int) -> str:
    return self.vocab.decode([int(token)]) if token != self.eos_id else ""

  def logprobs(self, entries: list[tuple]) -> Optional[dict]:
    """The entries' log-probabilities in the request kind's format, or None."""
    top = self.gen.logprobs
    if top is None:
      return None
    if self.gen.chat:
      return {"content": [{
          "token": self.token_text(t), "logprob": lp,
          "bytes": list(self.token_text(t).encode()),
          "top_logprobs": [{"token": self.token_text(i), "logprob": float(v),
                            "bytes": list(self.token_text(i).encode())}
                           for i, v in zip(ids[:top], values[:top])]}
          for t, lp, ids, values in entries]}
    return {"tokens": [self.token_text(t) for t, *_ in entries],
            "token_logprobs": [lp for _, lp, *_ in entries],
            "top_logprobs": [{self.token_text(i): float(v) for i, v in zip(ids[:top], values[:top])}
                             for _, _, ids, values in entries] if top else None}


def _sequences(service: Any, gen: generation.Generation, on_event: Any) -> list[Sequence]:
  """The request's sequences; `on_event(index, event)` hears each one's events (engine thread)."""
  out = []
  for r, row in enumerate(gen.tokens):
    for c in range(gen.n):
      emit = lambda *event, i=r * gen.n + c: on_event(i, event)
      text = engine_text(service.vocab, service.engine.eos_id) if gen.stop else None
      out.append(Sequence(gen.model, row, gen.max_tokens, emit, temperature=gen.temperature,
                          top_k=gen.top_k, top_p=gen.top_p, seed=gen.seed, choice=c,
                          stop=gen.stop, text=text))
  return out


def engine_text(vocab: Any, eos_id: int) -> Callable[[list[int]], str]:
  """`text(ids)` = `inputs.decode(vocab, ids, eos_id)` for one sequence's growing ids (what the
  engine searches for stop strings per token), decoding only the ids new since the last call."""
  state = [detok.Detokenizer(vocab, eos_id), 0]

  def text(ids: list[int]) -> str:
    if len(ids) < state[1]:  # not the ids seen so far grown: start again
      state[:] = [detok.Detokenizer(vocab, eos_id), 0]
    state[0].extend(ids[state[1]:])
    state[1] = len(ids)
    return state[0].peek()
  return text


def _record(choice: Choice, event: tuple) -> list[tuple]:
  """Applies an engine event to `choice`; the new (token, logprob, top ids, top lps) entries."""
  kind = event[0]
  if kind == "token":
    _, token, logprob, top_ids, top_lps = event
    choice.ids.append(token)
    entry = (token, logprob, top_ids, top_lps)
    choice.entries.append(entry)
    return [entry]
  if kind == "end":
    reason = event[1]
    choice.finish = "length" if reason == "length" else "stop"
    if reason == "cancelled":
      choice.finish = "cancelled"
  else:
    choice.error = event[1]
    choice.finish = "error"
  return []


def _raise_error(choices: list[Choice]) -> None:
  for c in choices:
    if isinstance(c.error, PromptGone):
      raise api.ApiError(404, f"model {c.error.args[0]!r} was removed before the request ran; "
                              f"GET /v1/models lists the served prompts", "model")
    if c.error is not None:
      raise api.ApiError(500, f"the model failed: {type(c.error).__name__}: {c.error}")


def _usage(gen: generation.Generation, choices: list[Choice]) -> dict:
  prompt = sum(len(r) for r in gen.tokens) * gen.n
  completion = sum(len(c.ids) for c in choices)
  return {"prompt_tokens": prompt, "completion_tokens": completion,
          "total_tokens": prompt + completion}


def _body(gen: generation.Generation, choices: list[Choice], ident: str, created: int) -> dict:
  out = []
  for c in choices:
    text = c.prefix + c.text()
    if gen.chat:
      out.append({"index": c.index, "message": {"role": "assistant", "content": text},
                  "logprobs": c.logprobs(c.entries), "finish_reason": c.finish})
    else:
      out.append({"index": c.index, "text": text, "logprobs": c.logprobs(c.entries),
                  "finish_reason": c.finish})
  kind = "chat.completion" if gen.chat else "text_completion"
  return {"id": ident, "object": kind, "created": created, "model": gen.model, "choices": out,
          "usage": _usage(gen, choices)}


def _chunk(gen: generation.Generation, head: str, choice: Choice, text: str,
           entries: list[tuple], finish: Optional[str], first: bool) -> str:
  """One choice's event: `head` (the chunk's fields, as `_event` writes them) and its body."""
  if gen.chat:
    delta = {"role": "assistant", "content": text} if first else {"content": text}
    body = {"index": choice.index, "delta": delta if text or first else {},
            "logprobs": choice.logprobs(entries) if entries else None, "finish_reason": finish}
  else:
    body = {"index": choice.index, "text": text,
            "logprobs": choice.logprobs(entries) if entries else None, "finish_reason": finish}
  return f"{head}{_dumps(body)}]}}\n\n"


_dumps = json.JSONEncoder().encode  # json.dumps' default settings, without its per-call checks


def _event(data: dict) -> str:
  return f"data: {_dumps(data)}\n\n"


async def _disconnect(request: Request) -> None:
  """Returns when the client closes its connection."""
  while (await request.receive())["type"] != "http.disconnect":
    pass


def submit(queue: Callable[[], None], waiting: Callable[[], str]) -> None:
  """Runs `queue()`; its refusals as `api.ApiError`s: 429 with Retry-After (`waiting()` says
  what waits already) and 503 while the server stops."""
  try:
    queue()
  except QueueFull as e:
    raise api.ApiError(429, f"{e}: {waiting()}",
                       headers={"Retry-After": str(e.retry_after)}) from None
  except Stopping:
    raise api.ApiError(503, "the server is shutting down; send the request to another one") \
        from None


async def wait(request: Request, future: asyncio.Future, timeout: float) -> Optional[str]:
  """Waits for `future`: None once it is done, else why not ("disconnect" or "timeout")."""
  gone = asyncio.ensure_future(_disconnect(request))
  try:
    done, _ = await asyncio.wait({future, gone}, timeout=timeout,
                                 return_when=asyncio.FIRST_COMPLETED)
  finally:
    gone.cancel()
  if future in done:
    return None
  return "disconnect" if gone in done else "timeout"


async def respond(service: Any, request: Request, gen: generation.Generation) -> Response:
  """Runs `gen` on the engine: a JSON answer, or a stream of server-sent events."""
  loop = asyncio.get_running_loop()
  eos, count = service.engine.eos_id, len(gen.tokens) * gen.n
  choices = [Choice(i, gen.texts[i // gen.n] if gen.echo else "", service.vocab, gen, eos)
             for i in range(count)]
  finished = loop.create_future()

  def record(index: int, event: tuple) -> None:
    """A whole answer: events recorded in the engine thread; the loop hears only the end."""
    _record(choices[index], event)
    if all(c.finish is not None for c in choices):
      loop.call_soon_threadsafe(lambda: finished.done() or finished.set_result(True))

  events, wake = collections.deque(), asyncio.Event()

  def stream(index: int, event: tuple) -> None:
    """A stream: events buffered in the engine thread; the loop is woken once per delivery
    (when the buffer was empty: a wakeup is pending otherwise). One producer thread."""
    events.append((index, event))
    if len(events) == 1:
      loop.call_soon_threadsafe(wake.set)

  sequences = _sequences(service, gen, stream if gen.stream else record)
  submit(lambda: service.engine.submit(sequences),
         lambda: f"{service.engine.waiting()} sequences wait for a slot already")
  ident = f"{'chatcmpl' if gen.chat else 'cmpl'}-{uuid.uuid4().hex}"
  created = int(time.time())
  cancel = lambda: [service.engine.cancel(s) for s in sequences]  # noqa: E731
  if gen.stream:
    return StreamingResponse(_stream(gen, choices, (events, wake), cancel, ident, created),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
  reason = await wait(request, finished, service.timeout)
  if reason is not None:
    cancel()
    service.metrics.dropped.labels(reason).inc()
    if reason == "disconnect":
      raise api.ApiError(499, "the client closed the connection")
    raise api.ApiError(504, f"no answer within the server's {service.timeout:g} s request "
                            f"timeout; retry with fewer max_tokens")
  _raise_error(choices)
  return JSONResponse(_body(gen, choices, ident, created))


async def _stream(gen: generation.Generation, choices: list[Choice], buffer: tuple,
                  cancel: Any, ident: str, created: int) -> AsyncIterator[str]:
  """The server-sent events of `choices`; the sequences are cancelled if the client leaves.
  `buffer` is (deque of (index, event), asyncio.Event set when events came)."""
  events, wake = buffer
  kind = "chat.completion.chunk" if gen.chat else "text_completion"
  head = json.dumps({"id": ident, "object": kind, "created": created, "model": gen.model})
  head = "data: " + head[:-1] + ', "choices": ['  # every chunk's fields before its choice
  started = [False] * len(choices)
  try:
    for c in choices:
      if c.prefix:
        started[c.index] = True
        yield _chunk(gen, head, c, c.prefix, [], None, True)
    while any(c.finish is None for c in choices):
      await wake.wait()
      wake.clear()  # before draining: an event appended from now on sets it again
      entries: dict[int, list] = {}
      while events:  # every event already here (a decode call's tokens): one chunk a choice
        index, event = events.popleft()
        entries.setdefault(index, []).extend(_record(choices[index], event))
      out = []
      for index, new in entries.items():
        c = choices[index]
        if c.error is not None:
          out.append(_event({"error": api.ApiError(500, f"the model failed: {c.error}"
                                                   ).body()["error"]}))
          continue
        text = c.delta()
        finish = c.finish if c.finish != "cancelled" else None
        if text or new or finish:
          out.append(_chunk(gen, head, c, text, new, finish, not started[index]))
          started[index] = True
      if out:
        yield "".join(out)  # one send for the choices' chunks
    if gen.include_usage:
      yield _event({"id": ident, "object": kind, "created": created, "model": gen.model,
                    "choices": [], "usage": _usage(gen, choices)})
    yield "data: [DONE]\n\n"
  finally:
    cancel()  # a no-op for finished sequences
