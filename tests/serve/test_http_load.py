"""`python -m spot_jax.serve` under load and faults, one real server for the module: a client
that goes away has its request dropped before any batch; a full queue answers 429 with
Retry-After and then serves again; SIGTERM with requests queued answers every one and exits 0.

The server waits up to 2 s for 8 rows before a batch runs, so requests stay queued long enough
to act on them."""
from __future__ import annotations

import concurrent.futures
import json
import signal
import socket
import time
import urllib.parse

import httpx
import pytest

from tests.helpers import serve_http as util

QUEUE = 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  prompts = util.make_prompts(tmp_path_factory.mktemp("serve_load"))
  server = util.start({n: prompts[n] for n in ("pt", "smop")}, [
      "--input_length=16", "--target_length=8", "--max_batch_size=8", "--batch_buckets=8",
      "--length_buckets=16", "--max_wait_ms=2000", f"--max_queue={QUEUE}"])
  yield server
  server.stop()


def _ask(server, text: str = "a good film") -> httpx.Response:
  return httpx.post(server.url + "/v1/completions", timeout=60,
                    json={"model": "pt", "prompt": text, "max_tokens": 8})


def test_a_client_that_goes_away_has_its_work_dropped(served):
  batches = served.metric("spot_serve_batch_rows_count", kind="generate")
  url = urllib.parse.urlparse(served.url)
  body = json.dumps({"model": "smop", "prompt": "never again", "max_tokens": 8}).encode()
  with socket.create_connection((url.hostname, url.port)) as sock:
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    time.sleep(0.5)  # queued, waiting for company
  deadline = time.monotonic() + 10
  while served.metric("spot_serve_dropped_total", reason="disconnect") < 1:
    assert time.monotonic() < deadline, "the disconnect was not noticed"
    time.sleep(0.1)
  time.sleep(2.5)  # past the wait the request would have had
  assert served.metric("spot_serve_batch_rows_count", kind="generate") == batches
  assert served.get("/health")["queue_depth"] == 0


def test_a_full_queue_answers_429_then_serves_again(served):
  with concurrent.futures.ThreadPoolExecutor(QUEUE + 4) as pool:
    answers = list(pool.map(lambda i: _ask(served, f"input {i}"), range(QUEUE + 4)))
  codes = sorted(a.status_code for a in answers)
  assert codes == [200] * QUEUE + [429] * 4, codes
  for a in answers:
    if a.status_code == 429:
      assert int(a.headers["Retry-After"]) >= 1
      assert "queue is full" in a.json()["error"]["message"]
    else:
      assert len(a.json()["choices"]) == 1
  assert _ask(served).status_code == 200


def test_sigterm_answers_every_accepted_request_and_exits_0(served):
  with concurrent.futures.ThreadPoolExecutor(QUEUE) as pool:
    flying = [pool.submit(_ask, served, f"input {i}") for i in range(QUEUE)]
    deadline = time.monotonic() + 10
    while served.get("/health")["queue_depth"] < QUEUE:  # all accepted, none run yet
      assert time.monotonic() < deadline
      time.sleep(0.05)
    served.proc.send_signal(signal.SIGTERM)
    answers = [f.result() for f in flying]
  assert [a.status_code for a in answers] == [200] * QUEUE
  for a in answers:
    choice = a.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length") and a.json()["usage"]["total_tokens"]
  assert served.proc.wait(60) == 0
  assert "every accepted request answered" in served.proc.stdout.read()
