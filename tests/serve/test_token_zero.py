"""Id 0 is a token when serving: a Hugging Face directory (a tiny random Llama saved with
`save_pretrained` beside a Llama-3-style tokenizer.json whose "!" is id 0) served with a soft
prompt by `python -m spot_jax.infer` and by `python -m spot_jax.serve` (batch and continuous
engines, over loopback). Inputs and answers full of "!" give transformers' greedy tokens,
label log-likelihoods and token log-probabilities (float32, 1e-5). Nothing is downloaded."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spot_jax import cli, infer  # noqa: E402
from tests.helpers import bang_token as bang  # noqa: E402
from tests.helpers import serve_http  # noqa: E402

TOL = 1e-5
TEXTS = ["wow! great!!", "!!!", "no way!"]
LABELS = ["yes!", "!no"]
STEPS = 6
LENGTHS = ["--input_length=16", f"--target_length={STEPS}"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """(HF directory, gin model file, tokenizer, torch model, [P, E] prompt, prompt file)."""
  folder = bang.write_tokenizer(tmp_path_factory.mktemp("bang") / "hf")
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
  model, cfg, _ = bang.tiny_llama(tokenizer, likely_bang=True)
  gin_file = bang.write_checkpoint(folder, model, cfg)
  prompt = np.random.RandomState(1).normal(0, 0.5, (3, cfg.emb_dim)).astype(np.float32)
  np.save(folder.parent / "pt.npy", prompt)
  return folder, gin_file, tokenizer, model, prompt, folder.parent / "pt.npy"


def _ids(tokenizer, text: str) -> list[int]:
  """The ids spot-jax feeds after BOS: the text's, then EOS."""
  return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def _greedy(checkpoint, text: str) -> tuple[list[int], list[float]]:
  _, _, tokenizer, model, prompt, _ = checkpoint
  return bang.greedy(model, [tokenizer.bos_token_id] + _ids(tokenizer, text), STEPS,
                     tokenizer.eos_token_id, prompt)


def _answer(tokenizer, tokens: list[int]) -> str:
  eos = tokenizer.eos_token_id
  return tokenizer.decode(tokens[:tokens.index(eos)] if eos in tokens else tokens)


def _label_scores(checkpoint, text: str) -> list[float]:
  _, _, tokenizer, model, prompt, _ = checkpoint
  inputs = [tokenizer.bos_token_id] + _ids(tokenizer, text)
  return [float(bang.row_log_probs(model, inputs + _ids(tokenizer, label), len(inputs),
                                   prompt).sum()) for label in LABELS]


def test_the_inputs_and_answers_hold_id_zero(checkpoint):
  tokenizer = checkpoint[2]
  assert all(0 in _ids(tokenizer, t) for t in TEXTS + LABELS)
  assert any(0 in _greedy(checkpoint, t)[0] for t in TEXTS)  # "!" generated as well


def _infer(checkpoint, tmp_path, capsys, extra=()) -> list[dict]:
  folder, gin_file, *_, prompt_file = checkpoint
  (tmp_path / "in.txt").write_text("".join(t + "\n" for t in TEXTS))
  out = tmp_path / "out.jsonl"
  argv = [f"--model={gin_file}", f"--checkpoint={folder}", f"--prompt=pt={prompt_file}",
          f"--input={tmp_path / 'in.txt'}", f"--output={out}", *LENGTHS, "--batch_size=4",
          "--compilation_cache_dir=none", *extra]
  assert cli.run(infer.main, argv, infer.PROG) == 0, capsys.readouterr().err
  return [json.loads(line) for line in out.read_text().splitlines()]


def test_infer_generates_as_transformers(checkpoint, tmp_path, capsys):
  tokenizer = checkpoint[2]
  records = _infer(checkpoint, tmp_path, capsys)
  for text, record in zip(TEXTS, records):
    tokens, logps = _greedy(checkpoint, text)
    assert record["input"] == text and record["prediction"] == _answer(tokenizer, tokens)
    np.testing.assert_allclose(record["score"], sum(logps), rtol=0, atol=TOL)


def test_infer_ranks_labels_as_transformers(checkpoint, tmp_path, capsys):
  records = _infer(checkpoint, tmp_path, capsys, [f"--label={label}" for label in LABELS])
  for text, record in zip(TEXTS, records):
    want = _label_scores(checkpoint, text)
    np.testing.assert_allclose([record["label_scores"][label] for label in LABELS], want,
                               rtol=0, atol=TOL)
    assert record["prediction"] == LABELS[int(np.argmax(want))]


def _serve(checkpoint, extra):
  folder, gin_file, *_, prompt_file = checkpoint
  return serve_http.start({"pt": str(prompt_file)}, [*LENGTHS, *extra],
                          backbone=[f"--model={gin_file}", f"--checkpoint={folder}"])


def _post(server, path: str, body: dict) -> dict:
  reply = httpx.post(server.url + path, json=body, timeout=300)
  assert reply.status_code == 200, reply.text
  return reply.json()


def test_batch_server_generates_and_classifies_as_transformers(checkpoint):
  tokenizer = checkpoint[2]
  server = _serve(checkpoint, ["--length_buckets=16", "--batch_buckets=4",
                               "--max_batch_size=4"] + [f"--label={label}" for label in LABELS])
  try:
    body = _post(server, "/v1/completions", {"model": "pt", "prompt": TEXTS,
                                             "max_tokens": STEPS})
    for text, choice in zip(TEXTS, body["choices"]):
      tokens, _ = _greedy(checkpoint, text)
      assert choice["text"] == _answer(tokenizer, tokens)
      assert choice["finish_reason"] == ("stop" if tokenizer.eos_token_id in tokens else "length")
    body = _post(server, "/v1/classify", {"model": "pt", "input": TEXTS})
    for text, row in zip(TEXTS, body["data"]):
      np.testing.assert_allclose([row["scores"][label] for label in LABELS],
                                 _label_scores(checkpoint, text), rtol=0, atol=TOL)
  finally:
    assert server.stop() == 0


def test_continuous_engine_answers_openai_as_transformers(checkpoint):
  import openai  # pylint: disable=g-import-not-at-top
  tokenizer = checkpoint[2]
  server = _serve(checkpoint, ["--engine=continuous", "--slots=2", "--length_buckets=16"])
  try:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                           timeout=300)
    for text in TEXTS:
      tokens, logps = _greedy(checkpoint, text)
      reply = client.completions.create(model="pt", prompt=text, max_tokens=STEPS,
                                        temperature=0, echo=True, logprobs=1)
      choice = reply.choices[0]
      assert choice.text == text + _answer(tokenizer, tokens)
      np.testing.assert_allclose(choice.logprobs.token_logprobs, logps, rtol=0, atol=TOL)
      assert reply.usage.completion_tokens == len(tokens)
  finally:
    assert server.stop() == 0


def test_decoding_cuts_at_eos_not_at_id_zero():
  from spot_jax.serve.model import inputs  # pylint: disable=g-import-not-at-top
  rows = np.array([[5, 0, 9, 0, 0], [0, 0, 0, 0, 0], [4, 9, 0, 9, 9]])
  np.testing.assert_array_equal(inputs.valid_to_eos(rows, 9), [[1, 1, 1, 0, 0], [1] * 5,
                                                                [1, 1, 0, 0, 0]])
