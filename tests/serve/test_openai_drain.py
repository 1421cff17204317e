"""Overload and shutdown of `python -m spot_jax.serve --engine=continuous` (one slot, a queue of
one): a request beyond the queue gets 429 with Retry-After; on SIGTERM every accepted request,
the one streaming included, finishes, nothing new is taken, and the process exits 0."""
from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from tests.helpers import serve_http as util

LONG = 1000


@pytest.fixture()
def server(tmp_path):
  prompts = util.make_decoder_prompts(tmp_path)
  served = util.start({"pt": prompts["pt"]}, [
      "--engine=continuous", "--slots=1", "--max_queue=1", "--input_length=16",
      f"--target_length={LONG}", "--length_buckets=16"], backbone=util.DECODER_BACKBONE)
  yield served
  served.stop()


def _stream(url: str, started: concurrent.futures.Future) -> list[str]:
  """The events of a long streamed completion; `started` is set at its first one."""
  body = {"model": "pt", "prompt": "a long story", "max_tokens": LONG, "stream": True,
          "stream_options": {"include_usage": True}}
  events = []
  with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
    assert r.status_code == 200
    for line in r.iter_lines():
      if line.startswith("data: "):
        events.append(line[len("data: "):])
        if not started.done():
          started.set_result(True)
  return events


def test_429_beyond_the_queue_then_sigterm_drains_every_accepted_request(server):
  started = concurrent.futures.Future()
  short = {"model": "pt", "prompt": "short", "max_tokens": 8}
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    streaming = pool.submit(_stream, server.url, started)
    started.result(timeout=120)  # the stream holds the only slot
    waiting = pool.submit(httpx.post, server.url + "/v1/completions", json=short, timeout=300)
    deadline = time.monotonic() + 30
    while server.metric("spot_serve_waiting_requests") < 1:
      assert time.monotonic() < deadline and not waiting.done()
      time.sleep(0.01)
    refused = httpx.post(server.url + "/v1/completions", json=short, timeout=60)
    assert refused.status_code == 429, refused.text
    assert int(refused.headers["Retry-After"]) >= 1
    assert "retry after" in refused.json()["error"]["message"]
    server.proc.terminate()  # SIGTERM while one request streams and one waits
    time.sleep(0.5)
    try:
      late = httpx.post(server.url + "/v1/completions", json=short, timeout=60).status_code
    except httpx.TransportError:
      late = None  # the listening socket is closed
    assert late in (None, 503)
    events = streaming.result(timeout=300)
    answered = waiting.result(timeout=300)
  assert events[-1] == "[DONE]"
  usage = json.loads(events[-2])["usage"]
  finish = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-2]]
  assert finish[-1] in ("length", "stop") and all(f is None for f in finish[:-1])
  assert usage["completion_tokens"] == LONG or finish[-1] == "stop"
  assert answered.status_code == 200 and answered.json()["choices"][0]["finish_reason"]
  assert server.proc.wait(120) == 0
  assert "every accepted request answered" in server.proc.stdout.read()
