"""`python -m spot_jax.serve` on a decoder-only backbone (a random tiny Gemma 3), over loopback:
five prompts of different methods answered in one batch exactly as `infer` answers each, label
scores as `infer --label`'s, and a decoder prompt added and removed while serving."""
from __future__ import annotations

import concurrent.futures
import json

import httpx
import numpy as np
import pytest

from spot_jax import cli, infer
from tests.helpers import serve_http as util

TEXTS = {"pt": "the cat sat", "smop": "a good film", "peft": "never again",
         "prefix": "a dull plot", "dept": "fine acting"}
SETTINGS = ["--input_length=16", "--target_length=8"]
LABELS = ["--label=yes", "--label=no"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  root = tmp_path_factory.mktemp("decoder_http")
  prompts = util.make_decoder_prompts(root)
  server = util.start(prompts, [*SETTINGS, *LABELS, "--max_batch_size=8", "--batch_buckets=8",
                                "--length_buckets=16", "--max_wait_ms=300"],
                      backbone=util.DECODER_BACKBONE)
  yield server, prompts, root
  assert server.stop() == 0


def _post(server, path: str, body, timeout: float = 120) -> httpx.Response:
  return httpx.post(server.url + path, content=json.dumps(body), timeout=timeout,
                    headers={"Content-Type": "application/json"})


def _together(calls):
  with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
    return list(pool.map(lambda call: call(), calls))


def _infer(root, prompts, extra, capsys, alone: bool = False) -> list[dict]:
  """`infer`'s records of TEXTS, each with its prompt: all in one batch, or each prompt alone."""
  groups = [[n] for n in TEXTS] if alone else [list(TEXTS)]
  records = []
  for names in groups:
    (root / "in.jsonl").write_text("".join(json.dumps({"input": TEXTS[n], "prompt": n}) + "\n"
                                           for n in names))
    out = root / "infer.jsonl"
    argv = [*util.DECODER_BACKBONE, *SETTINGS, "--batch_size=8", f"--input={root / 'in.jsonl'}",
            f"--output={out}", *(f"--prompt={n}={prompts[n]}" for n in names), *extra]
    status = cli.run(infer.main, argv, infer.PROG)
    assert status == 0, capsys.readouterr().err
    records += [json.loads(line) for line in out.read_text().splitlines()]
  return records


def test_five_decoder_methods_in_one_batch_answer_as_infer_alone(served, capsys):
  server, prompts, root = served
  batches = server.metric("spot_serve_batch_rows_count", kind="generate")
  calls = [lambda n=n, t=t: _post(server, "/v1/completions",
                                  {"model": n, "prompt": t, "max_tokens": 8})
           for n, t in TEXTS.items()]
  answers = _together(calls)
  assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
  assert server.metric("spot_serve_batch_rows_count", kind="generate") == batches + 1
  texts = [a.json()["choices"][0]["text"] for a in answers]
  alone = _infer(root, prompts, [], capsys, alone=True)
  assert texts == [r["prediction"] for r in alone]
  assert len(set(texts)) >= 3  # the prompts matter


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
    np.testing.assert_allclose([got["scores"][label] for label in ("yes", "no")],
                               [record["label_scores"][label] for label in ("yes", "no")],
                               rtol=1e-5, atol=1e-5)


def test_a_decoder_prompt_added_and_removed_while_serving(served):
  server, _, root = served
  np.save(root / "new.npy", np.random.RandomState(5).normal(0, 1, (6, 32)).astype(np.float32))
  added = _post(server, "/v1/prompts/new", {"path": str(root / "new.npy")})
  assert added.status_code == 200 and added.json()["added"] == ["new"]
  new = _post(server, "/v1/completions", {"model": "new", "prompt": "abc", "max_tokens": 8})
  assert new.status_code == 200
  np.save(root / "wide.npy", np.zeros((2, 64), np.float32))  # a T5-width prompt
  wide = _post(server, "/v1/prompts/wide", {"path": str(root / "wide.npy")})
  assert wide.status_code == 400 and "width 64" in wide.json()["error"]["message"]
  assert httpx.delete(server.url + "/v1/prompts/new", timeout=60).status_code == 200
  gone = _post(server, "/v1/completions", {"model": "new", "prompt": "abc"})
  assert gone.status_code == 404
  assert {m["id"] for m in server.get("/v1/models")["data"]} == set(TEXTS)
