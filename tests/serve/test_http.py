"""`python -m spot_jax.serve` over loopback, one real server for the module: five prompts of
different methods answered in one batch exactly as `infer` answers them, the OpenAI client, bad
requests refused one by one while the server keeps serving, and prompts added and removed while
requests are in flight."""
from __future__ import annotations

import concurrent.futures
import json

import httpx
import numpy as np
import pytest

from spot_jax import cli, infer
from tests.helpers import serve_http as util

TEXTS = {"pt": "the cat sat on the mat", "smop": "a good film", "peft": "never again",
         "prefix": "what a dull plot", "dept": "fine acting"}
SETTINGS = ["--input_length=16", "--target_length=8"]
LABELS = ["--label=positive", "--label=negative"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  root = tmp_path_factory.mktemp("serve_http")
  prompts = util.make_prompts(root)
  server = util.start(prompts, [*SETTINGS, *LABELS, "--max_batch_size=8", "--batch_buckets=8",
                                "--length_buckets=16", "--max_wait_ms=300"])
  yield server, prompts, root
  assert server.stop() == 0


def _post(server, path: str, body, timeout: float = 60) -> httpx.Response:
  content = body if isinstance(body, (str, bytes)) else json.dumps(body)
  return httpx.post(server.url + path, content=content, timeout=timeout,
                    headers={"Content-Type": "application/json"})


def _together(calls):
  """Runs the zero-argument `calls` at once; their results in order."""
  with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
    return list(pool.map(lambda call: call(), calls))


def _infer(root, prompts, extra, capsys) -> list[dict]:
  (root / "in.jsonl").write_text("".join(json.dumps({"input": t, "prompt": n}) + "\n"
                                         for n, t in TEXTS.items()))
  out = root / "infer.jsonl"
  argv = [*util.BACKBONE, *SETTINGS, "--batch_size=8", f"--input={root / 'in.jsonl'}",
          f"--output={out}", *(f"--prompt={n}={p}" for n, p in prompts.items()), *extra]
  status = cli.run(infer.main, argv, infer.PROG)
  assert status == 0, capsys.readouterr().err
  return [json.loads(line) for line in out.read_text().splitlines()]


def test_five_methods_in_one_batch_answer_as_infer(served, capsys):
  server, prompts, root = served
  batches = server.metric("spot_serve_batch_rows_count", kind="generate")
  rows = server.metric("spot_serve_batch_rows_sum", kind="generate")
  calls = [lambda n=n, t=t: _post(server, "/v1/completions",
                                  {"model": n, "prompt": t, "max_tokens": 8})
           for n, t in TEXTS.items()]
  answers = _together(calls)
  assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
  # the five requests, of five prompts, ran as one forward pass of five rows
  assert server.metric("spot_serve_batch_rows_count", kind="generate") == batches + 1
  assert server.metric("spot_serve_batch_rows_sum", kind="generate") == rows + 5
  records = _infer(root, prompts, [], capsys)
  texts = [a.json()["choices"][0]["text"] for a in answers]
  assert texts == [r["prediction"] for r in records]
  assert len(set(texts)) >= 3  # the prompts matter
  for a, name in zip(answers, TEXTS):
    body = a.json()
    assert body["model"] == name and body["object"] == "text_completion"
    assert body["usage"]["total_tokens"] == (body["usage"]["prompt_tokens"]
                                             + body["usage"]["completion_tokens"])


def test_classify_scores_equal_infer_labels(served, capsys):
  server, prompts, root = served
  calls = [lambda n=n, t=t: _post(server, "/v1/classify", {"model": n, "input": t})
           for n, t in TEXTS.items()]
  answers = _together(calls)
  assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
  records = _infer(root, prompts, LABELS, capsys)
  for a, record in zip(answers, records):
    got = a.json()["data"][0]
    assert got["label"] == record["prediction"]
    np.testing.assert_allclose([got["scores"][l] for l in ("positive", "negative")],
                               [record["label_scores"][l] for l in ("positive", "negative")],
                               rtol=1e-5, atol=1e-4)


def test_openai_client_gets_completions_by_prompt_name(served):
  import openai  # pylint: disable=g-import-not-at-top
  server, _, _ = served
  client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
  assert {m.id for m in client.models.list()} >= set(TEXTS)
  got = client.completions.create(model="smop", prompt=[TEXTS["smop"], TEXTS["pt"]],
                                  max_tokens=8)
  direct = _post(server, "/v1/completions", {"model": "smop", "max_tokens": 8,
                                             "prompt": [TEXTS["smop"], TEXTS["pt"]]}).json()
  assert [c.text for c in got.choices] == [c["text"] for c in direct["choices"]]
  assert got.usage.prompt_tokens == direct["usage"]["prompt_tokens"]
  with pytest.raises(openai.NotFoundError, match="GET /v1/models lists"):
    client.completions.create(model="nope", prompt="x")
  with pytest.raises(openai.BadRequestError, match="stream=true is not supported"):
    client.completions.create(model="pt", prompt="x", stream=True)
  two = client.completions.create(model="pt", prompt="x", max_tokens=4, n=2, stop=["zzz"])
  assert len(two.choices) == 2 and two.choices[0].text == two.choices[1].text  # greedy


LONG = "word " * 40
BAD = [  # (request path, body, status, field named)
    ("/v1/completions", "{not json", 400, None),
    ("/v1/completions", "[1, 2]", 400, None),
    ("/v1/completions", {"prompt": "x"}, 400, "model"),
    ("/v1/completions", {"model": 3, "prompt": "x"}, 400, "model"),
    ("/v1/completions", {"model": "ptt", "prompt": "x"}, 404, "model"),
    ("/v1/completions", {"model": "pt"}, 400, "prompt"),
    ("/v1/completions", {"model": "pt", "prompt": 7}, 400, "prompt"),
    ("/v1/completions", {"model": "pt", "prompt": []}, 400, "prompt"),
    ("/v1/completions", {"model": "pt", "prompt": ["a", 1]}, 400, "prompt"),
    ("/v1/completions", {"model": "pt", "prompt": LONG}, 400, "prompt"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "max_tokens": 9}, 400, "max_tokens"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "max_tokens": "4"}, 400, "max_tokens"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "temperature": "hot"}, 400,
     "temperature"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "top_k": -2}, 400, "top_k"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "n": 0}, 400, "n"),
    ("/v1/completions", {"model": "pt", "prompt": ["x"] * 3, "n": 3}, 400, "n"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "stop": 5}, 400, "stop"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "stream": True}, 400, "stream"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "logprobs": 2}, 400, "logprobs"),
    ("/v1/classify", {"model": "pt", "input": "x", "labels": []}, 400, "labels"),
    ("/v1/classify", {"model": "pt", "input": "x", "labels": ["a", "a"]}, 400, "labels"),
    ("/v1/classify", {"model": "pt", "input": "x", "labels": ["a " * 20]}, 400, "labels"),
    ("/v1/prompts/extra", {"path": 3}, 400, "path"),
    ("/v1/prompts/extra", {"path": "/no/such/prompt.npy"}, 400, "path"),
    ("/v1/prompts/pt", {"path": "/no/such/prompt.npy"}, 409, "name"),
]


def test_bad_requests_each_get_a_json_error_naming_the_field(served):
  server, _, _ = served
  for path, body, status, field in BAD:
    got = _post(server, path, body)
    assert got.status_code == status, (body, got.text)
    error = got.json()["error"]
    assert error["param"] == field, (body, error)
    assert error["message"] and "\n" not in error["message"]
    if field:
      assert field in error["message"] or field in ("name", "path"), error["message"]
  long = _post(server, "/v1/completions", {"model": "pt", "prompt": LONG}).json()["error"]
  assert "longer than the server's input length 16" in long["message"]
  assert httpx.delete(server.url + "/v1/prompts/nope").status_code == 404
  assert httpx.get(server.url + "/v1/nothing").json()["error"]["code"] == 404
  # the server kept serving
  ok = _post(server, "/v1/completions", {"model": "pt", "prompt": TEXTS["pt"], "max_tokens": 8})
  assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_prompts_added_and_removed_while_requests_are_in_flight(served):
  server, prompts, root = served
  np.save(root / "new.npy", np.random.RandomState(5).normal(0, 0.5, (6, util.CONFIG.emb_dim))
          .astype(np.float32))
  ask = lambda: _post(server, "/v1/completions", {"model": "pt", "prompt": TEXTS["pt"],
                                                  "max_tokens": 8})
  want = ask().json()["choices"][0]["text"]
  compiles = server.get("/health")["compiles"]
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    flying = [pool.submit(ask) for _ in range(6)]
    added = _post(server, "/v1/prompts/new", {"path": str(root / "new.npy")})
    removed = httpx.delete(server.url + "/v1/prompts/peft", timeout=60)
    answers = [f.result() for f in flying]
  assert added.status_code == 200 and added.json() == {"added": ["new"], "prompts": 6,
                                                       "table_grew": False}
  assert removed.status_code == 200 and removed.json()["removed"] == ["peft"]
  assert [a.json()["choices"][0]["text"] for a in answers] == [want] * 6
  new = _post(server, "/v1/completions", {"model": "new", "prompt": "x", "max_tokens": 8})
  assert new.status_code == 200
  gone = _post(server, "/v1/completions", {"model": "peft", "prompt": "x"})
  assert gone.status_code == 404 and "GET /v1/models" in gone.json()["error"]["message"]
  assert {m["id"] for m in server.get("/v1/models")["data"]} == set(TEXTS) - {"peft"} | {"new"}
  assert server.get("/health")["compiles"] == compiles  # the table had room: nothing compiled
  # a prompt longer than the table's room grows it; the next batch compiles, later ones do not
  np.save(root / "long.npy", np.ones((12, util.CONFIG.emb_dim), np.float32) * 0.1)
  grown = _post(server, "/v1/prompts/long", {"path": str(root / "long.npy")})
  assert grown.json()["table_grew"] is True
  assert _post(server, "/v1/completions", {"model": "long", "prompt": "x"}).status_code == 200
  after = server.get("/health")["compiles"]
  assert after > compiles
  for name in ("long", "pt"):
    assert _post(server, "/v1/completions", {"model": name, "prompt": "y"}).status_code == 200
  assert server.get("/health")["compiles"] == after
  assert _post(server, "/v1/prompts/peft", {"path": prompts["peft"]}).status_code == 200


def _library(root, name: str, fingerprint: dict):
  from spot_jax.spot import library as prompt_library  # pylint: disable=g-import-not-at-top
  prompt = np.random.RandomState(3).normal(0, 0.5, (4, util.CONFIG.emb_dim)).astype(np.float32)
  library = prompt_library.Library(root / name)
  for entry_id in ("src.a", "src.b"):
    library.add(entry_id=entry_id, task="spot_synthetic_sentiment_v100", run_id=entry_id, seed=0,
                fingerprint=fingerprint, prompt=prompt, embedding=prompt, score=1.0,
                metric="accuracy", embed_dim=util.CONFIG.emb_dim)
  return root / name


def test_library_entries_by_id_and_another_backbones_refused(served):
  from spot_jax import backbone as backbone_lib  # pylint: disable=g-import-not-at-top
  from spot_jax.serve import service  # pylint: disable=g-import-not-at-top
  server, _, root = served
  ours = _library(root, "ours", backbone_lib.fingerprint(util.CONFIG, util.CHECKPOINT, 0))
  other = _library(root, "other", backbone_lib.fingerprint(util.CONFIG, None, 1))
  args = service._parser().parse_args([f"--library={ours}"])  # pylint: disable=protected-access
  assert service._specs(args) == [("src.a", f"{ours}#src.a"),  # pylint: disable=protected-access
                                  ("src.b", f"{ours}#src.b")]
  added = _post(server, "/v1/prompts/src.a", {"path": f"{ours}#src.a"})
  assert added.status_code == 200, added.text
  ok = _post(server, "/v1/completions", {"model": "src.a", "prompt": "x", "max_tokens": 8})
  assert ok.status_code == 200
  refused = _post(server, "/v1/prompts/foreign", {"path": f"{other}#src.a"})
  assert refused.status_code == 400 and refused.json()["error"]["param"] == "path"
  assert "was trained against frozen model" in refused.json()["error"]["message"]
  assert httpx.delete(server.url + "/v1/prompts/src.a").status_code == 200
