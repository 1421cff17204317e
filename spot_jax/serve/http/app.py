"""The HTTP front (Starlette): routes, waiting for a request's batch, errors as JSON.

  POST   /v1/completions      OpenAI-compatible completions; `model` names the prompt
  POST   /v1/chat/completions  chat, with the model's chat template (`--engine=continuous`)
  POST   /v1/classify         label log-likelihoods (one encoder pass per input)
  GET    /v1/models           the served prompts: method, length, backbone
  POST   /v1/prompts/{name}   {"path": ...}: serve another prompt, no restart
  DELETE /v1/prompts/{name}   stop serving one
  GET    /health, /metrics    liveness and Prometheus metrics

Each request is checked (`api`), queued (`batcher`), and awaited here; a client that goes away
while its request waits has it dropped, and a request not answered within `timeout` seconds
gets 504 (and is dropped if still waiting). With `--engine=continuous` (decoder-only backbones)
completions and chat run on the continuous-batching engine (`http.openai`): streamed with
`stream: true`, sampled per request (top_p, seed), with log-probabilities.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from spot_jax.errors import ConfigError, one_line
from spot_jax.serve.http import api
from spot_jax.serve.scheduler.batcher import Batcher, PromptGone, Work
from spot_jax.serve.http.metrics import Metrics
from spot_jax.serve.http import generation, openai
from spot_jax.serve.model import prefix_cache


@dataclasses.dataclass
class Service:
  """What the routes share.

  Attributes:
    catalog, batcher, metrics: the prompts (a `catalog.Catalog`), the batching loop, the
      metrics.
    vocab: the input vocabulary; limits: `api.Limits`.
    backbone: the backbone's description, for /v1/models.
    timeout: seconds a request may wait for its answer.
    started: time.time() at start-up.
    engine: the continuous-batching `scheduler.continuous.Engine`, or None (the batcher
      decodes).
    chat_template: the model's `ChatTemplate`, or None; bos_id: the model's BOS.
  """
  catalog: Any
  batcher: Batcher
  metrics: Metrics
  vocab: Any
  limits: api.Limits
  backbone: str
  timeout: float
  started: float = dataclasses.field(default_factory=time.time)
  engine: Any = None
  chat_template: Any = None
  bos_id: int = 2


async def _answer(service: Service, request: Request, work_args: dict) -> Any:
  """Queues a request's rows, waits for them; the rows' results (raises ApiError)."""
  loop, future = asyncio.get_running_loop(), None
  future = loop.create_future()

  def done(result: Any) -> None:
    loop.call_soon_threadsafe(lambda: future.done() or future.set_result(result))

  work = Work(done=done, **work_args)
  openai.submit(lambda: service.batcher.submit(work),
                lambda: f"{service.batcher.max_queue} requests wait already")
  reason = await openai.wait(request, future, service.timeout)
  if reason is not None:
    if service.batcher.cancel(work):
      service.metrics.dropped.labels(reason).inc()
    if reason == "timeout":
      raise api.ApiError(504, f"no answer within the server's {service.timeout:g} s request "
                              f"timeout; retry, or send fewer rows")
    raise api.ApiError(499, "the client closed the connection")
  result = future.result()
  if isinstance(result, PromptGone):
    raise api.ApiError(404, f"model {result.args[0]!r} was removed before the request ran; "
                            f"GET /v1/models lists the served prompts", "model")
  if isinstance(result, Exception):
    raise api.ApiError(500, f"the model failed: {type(result).__name__}: {one_line(result)}")
  return result


def _route(service: Service, endpoint: str, handler: Callable) -> Callable:
  """`handler(request) -> dict` as an endpoint: JSON, errors as JSON, counted and timed."""
  async def endpoint_fn(request: Request) -> Response:
    start = time.monotonic()
    try:
      result = await handler(service, request)
      response = result if isinstance(result, Response) else JSONResponse(result)
    except api.ApiError as e:
      response = JSONResponse(e.body(), status_code=e.status, headers=e.headers)
    service.metrics.requests.labels(endpoint, str(response.status_code)).inc()
    service.metrics.latency.labels(endpoint).observe(time.monotonic() - start)
    return response
  return endpoint_fn


def _offset(service: Service, name: str) -> int:
  return service.catalog.table.offset_lengths().get(name, 0)


async def completions(service: Service, request: Request) -> Any:
  body = api.parse_json(await request.body())
  names = service.catalog.table.names
  if service.engine is not None:
    gen = generation.completion(body, names, service.vocab, service.limits,
                                service.engine.slots, _offset(service, body.get("model"))
                                if body.get("model") in names else 0)
    return await openai.respond(service, request, gen)
  req = api.completion(body, names, service.vocab, service.limits,
                       _offset(service, body.get("model")) if body.get("model") in names else 0)
  rows = [t for t in req.tokens for _ in range(req.n)]
  result = await _answer(service, request, dict(kind="generate", key=req.key,
                                                names=[req.model] * len(rows), tokens=rows))
  return api.completion_body(req, result, service.vocab)


async def chat(service: Service, request: Request) -> Any:
  body = api.parse_json(await request.body())
  if service.engine is None:
    raise api.ApiError(404, "chat completions need the continuous-batching engine of a "
                            "decoder-only backbone; start the server with --engine=continuous")
  gen = generation.chat(body, service.catalog.table.names, service.vocab, service.limits,
                        service.engine.slots, service.chat_template, service.bos_id)
  return await openai.respond(service, request, gen)


async def classify(service: Service, request: Request) -> dict:
  body = api.parse_json(await request.body())
  names = service.catalog.table.names
  req = api.classify(body, names, service.vocab, service.limits,
                     _offset(service, body.get("model")) if body.get("model") in names else 0)
  result = await _answer(service, request, dict(
      kind="classify", key=req.labels, names=[req.model] * len(req.tokens), tokens=req.tokens,
      labels=req.label_tokens, label_valid=req.label_valid))
  return api.classify_body(req, result)


async def models(service: Service, unused_request: Request) -> dict:
  return {"object": "list", "data": [
      {"id": e.name, "object": "model", "created": int(service.started), "owned_by": "spot-jax",
       "method": api.method_name(e), "length": e.length, "num_prompts": e.num_prompts,
       "source": e.source, "backbone": service.backbone,
       **({"kv_prefix_cache": prefix_cache.cacheable(e),
           "prefill": "the prompt's keys and values are cached; each request prefills its "
                      "input only" if prefix_cache.cacheable(e) else "the prompt reads its "
                      "input, so each request prefills the prompt too"}
          if service.engine is not None else {})}
      for e in service.catalog.table.entries]}


async def add_prompt(service: Service, request: Request) -> dict:
  name = request.path_params["name"]
  body = api.parse_json(await request.body())
  path = body.get("path")
  if not isinstance(path, str) or not path:
    raise api.ApiError(400, "field 'path' must name the prompt on the server: a run directory, "
                            "a .npy file, a PEFT adapter or LIBRARY_DIR#ENTRY_ID", "path")
  before = service.catalog.capacity
  try:
    added = await run_in_threadpool(service.catalog.add, name, path)
  except ConfigError as e:
    status = 409 if "already served" in str(e) else 400
    raise api.ApiError(status, one_line(e), "path" if status == 400 else "name") from None
  grew = service.catalog.capacity != before
  return {"added": added, "prompts": len(service.catalog.table), "table_grew": grew}


async def remove_prompt(service: Service, request: Request) -> dict:
  name = request.path_params["name"]
  try:
    removed = await run_in_threadpool(service.catalog.remove, name)
  except KeyError:
    raise api.ApiError(404, f"prompt {name!r} is not served; GET /v1/models lists the served "
                            f"prompts", "name") from None
  except ConfigError as e:
    raise api.ApiError(409, one_line(e), "name") from None
  return {"removed": removed, "prompts": len(service.catalog.table)}


async def health(service: Service, unused_request: Request) -> dict:
  engine = service.engine
  extra = {} if engine is None else {"running": engine.running(), "waiting": engine.waiting(),
                                     "slots": engine.slots, "decode_steps": engine.steps,
                                     "prefix_cache_hits": engine.prefixes.hits}
  return {"status": "ok", "prompts": len(service.catalog.table), **extra,
          "queue_depth": service.batcher.depth(), "batches": service.batcher.batches,
          "compiles": service.metrics.compiles,
          "table_rows": service.catalog.capacity.rows}


def _refresh(service: Service) -> None:
  if service.engine is not None:
    running, slots = service.engine.running(), service.engine.slots
    service.metrics.running.set(running)
    service.metrics.waiting.set(service.engine.waiting())
    service.metrics.slots.set(slots)
    service.metrics.slot_use.set(running / slots)
  service.metrics.queue_depth.set(service.batcher.depth())
  service.metrics.prompts.set(len(service.catalog.table))
  service.metrics.table_rows.set(service.catalog.capacity.rows)


def create(service: Service) -> Starlette:
  """The Starlette application of `service`."""
  def metrics(unused_request: Request) -> Response:
    text, kind = service.metrics.exposition(lambda: _refresh(service))
    return Response(text, media_type=kind)

  async def http_error(unused_request: Request, e: HTTPException) -> Response:
    return JSONResponse(api.ApiError(e.status_code, f"{e.detail}; the API is POST "
                                                    f"/v1/completions, POST /v1/classify, GET "
                                                    f"/v1/models").body(),
                        status_code=e.status_code)

  r = lambda path, handler, methods, name: Route(path, _route(service, name, handler),
                                                 methods=methods)
  routes = [r("/v1/completions", completions, ["POST"], "completions"),
            r("/v1/chat/completions", chat, ["POST"], "chat"),
            r("/v1/classify", classify, ["POST"], "classify"),
            r("/v1/models", models, ["GET"], "models"),
            r("/v1/prompts/{name:path}", add_prompt, ["POST"], "add_prompt"),
            r("/v1/prompts/{name:path}", remove_prompt, ["DELETE"], "remove_prompt"),
            r("/health", health, ["GET"], "health"),
            Route("/metrics", metrics, methods=["GET"])]
  return Starlette(routes=routes, exception_handlers={HTTPException: http_error})
