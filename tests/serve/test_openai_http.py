"""`python -m spot_jax.serve --engine=continuous` on a tiny random Gemma 3, over loopback, with the
official `openai` client and curl: greedy completions of five prompt methods, arriving while
others decode, streamed and not, equal `infer` on each prompt alone; a seeded sample does not
depend on its neighbours; chat renders as transformers' apply_chat_template; a client that
leaves mid-stream frees its slot within one step; bad fields are 400s naming them."""
from __future__ import annotations

import concurrent.futures
import json
import subprocess
import time

import httpx
import numpy as np
import pytest

from spot_jax import cli, infer, vocabulary
from tests.helpers import serve_http as util
from tests.serve.test_decoder_http import TEXTS, _infer

SLOTS = 4
SERVE = ["--engine=continuous", f"--slots={SLOTS}", "--input_length=256", "--target_length=48",
         "--length_buckets=16,256"]
# Llama 3's chat template (Meta-Llama-3-8B-Instruct's tokenizer_config.json).
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
          "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content"
          " %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_"
          "header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# Gemma 3's (text part) and Qwen 2.5's (without tools).
GEMMA3 = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/"
    "assistant/...\") }}\n    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {{- message['content'] | trim }}\n    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n")
QWEN = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are "
    "a helpful assistant.<|im_end|>\\n' }}\n{%- endif %}\n{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\") %}\n        {{- '<|im_start|>' + message.role + '\\n' + "
    "message.content + '<|im_end|>' + '\\n' }}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n")
TEMPLATES = {"llama3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
             "gemma3": (GEMMA3, "<bos>", "<eos>"), "qwen": (QWEN, None, "<|im_end|>")}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " 2+2? "}]


def _template_dir(root, name):
  source, bos, eos = TEMPLATES[name]
  path = root / f"tokenizer_{name}"
  path.mkdir(exist_ok=True)
  config = {"chat_template": source, "eos_token": eos, **({"bos_token": bos} if bos else {})}
  (path / "tokenizer_config.json").write_text(json.dumps(config))
  return path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  root = tmp_path_factory.mktemp("openai_http")
  prompts = util.make_decoder_prompts(root)
  server = util.start(prompts, [*SERVE, f"--chat_template={_template_dir(root, 'llama3')}"],
                      backbone=util.DECODER_BACKBONE)
  yield server, prompts, root
  assert server.stop() == 0


def _client(server):
  import openai  # pylint: disable=g-import-not-at-top
  return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                       timeout=120)


def _streamed(stream):
  """(text, finish_reason) of an openai-client completion stream."""
  parts, finish = [], None
  for chunk in stream:
    for choice in chunk.choices:
      parts.append(choice.text if hasattr(choice, "text") else choice.delta.content or "")
      finish = choice.finish_reason or finish
  return "".join(parts), finish


def test_greedy_completions_arriving_while_others_decode_equal_infer_alone(served, capsys):
  server, prompts, root = served
  client = _client(server)
  steps = server.metric("spot_serve_decode_steps_total")

  def call(i, name):
    time.sleep(0.15 * i)  # each arrives while the earlier ones decode
    kwargs = dict(model=name, prompt=TEXTS[name], max_tokens=8, temperature=0)
    if i % 2:
      return _streamed(client.completions.create(stream=True, **kwargs))[0], 8
    got = client.completions.create(**kwargs)
    return got.choices[0].text, got.usage.completion_tokens

  long = client.completions.create(model="pt", prompt="a long one", max_tokens=48, stream=True)
  with concurrent.futures.ThreadPoolExecutor(len(TEXTS)) as pool:
    answers = list(pool.map(lambda a: call(*a), enumerate(TEXTS)))
  assert _streamed(long)[1] == "length"  # 48 tokens, during which the others came and went
  alone = _infer(root, prompts, [], capsys, alone=True)
  assert [a[0] for a in answers] == [r["prediction"] for r in alone]
  assert len({a[0] for a in answers}) >= 3  # the prompts matter
  used = server.metric("spot_serve_decode_steps_total") - steps
  assert used < 48 + sum(a[1] for a in answers)  # the sequences shared steps
  assert server.metric("spot_serve_prefills_total", prefix="cached") >= 3  # pt, peft, prefix, dept
  assert server.metric("spot_serve_prefills_total", prefix="prompt") >= 1  # SMoP reads its input
  # on a second host device: arrivals prefill while "long" decodes
  assert server.metric("spot_serve_prefills_during_decode_total") >= 1
  models = {m["id"]: m for m in server.get("/v1/models")["data"]}
  assert not models["smop"]["kv_prefix_cache"] and models["pt"]["kv_prefix_cache"]


def test_a_seeded_sample_is_the_same_whatever_shares_its_steps(served):
  server, _, _ = served
  client = _client(server)
  kwargs = dict(model="dept", prompt="roll the dice", max_tokens=12, temperature=1.0,
                top_p=0.9, seed=42, extra_body={"top_k": 40})
  alone = client.completions.create(**kwargs).choices[0].text
  crowd = [lambda n=n: client.completions.create(model=n, prompt="noise " + n, max_tokens=24,
                                                 temperature=1.5, seed=len(n))
           for n in ("pt", "smop", "prefix")]
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    others = [pool.submit(c) for c in crowd]
    time.sleep(0.05)
    mixed = pool.submit(lambda: client.completions.create(**kwargs)).result()
    [o.result() for o in others]  # pylint: disable=expression-not-assigned
  assert mixed.choices[0].text == alone
  two = client.completions.create(**{**kwargs, "n": 2})
  assert two.choices[0].text == alone and two.choices[1].text != alone  # choices sample apart


def test_streaming_with_curl_ends_with_done_and_equals_the_whole_answer(served):
  server, _, _ = served
  body = {"model": "prefix", "prompt": TEXTS["prefix"], "max_tokens": 16, "logprobs": 2}
  whole = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()
  out = subprocess.run(["curl", "-sN", server.url + "/v1/completions", "-H",
                        "Content-Type: application/json", "-d",
                        json.dumps({**body, "stream": True,
                                    "stream_options": {"include_usage": True}})],
                       capture_output=True, text=True, timeout=120, check=True).stdout
  events = [line[len("data: "):] for line in out.splitlines() if line.startswith("data: ")]
  assert events[-1] == "[DONE]"
  chunks = [json.loads(e) for e in events[:-1]]
  assert chunks[-1]["usage"] == whole["usage"] and chunks[-1]["choices"] == []
  choices = [c["choices"][0] for c in chunks[:-1]]
  assert "".join(c["text"] for c in choices) == whole["choices"][0]["text"]
  assert choices[-1]["finish_reason"] == whole["choices"][0]["finish_reason"]
  streamed = [lp for c in choices if c["logprobs"] for lp in c["logprobs"]["token_logprobs"]]
  np.testing.assert_allclose(streamed, whole["choices"][0]["logprobs"]["token_logprobs"],
                             atol=1e-6)
  assert len(streamed) == whole["usage"]["completion_tokens"] > 1


def test_a_client_leaving_mid_stream_frees_its_slot_within_one_step(served):
  server, _, _ = served
  before = server.metric("spot_serve_cancel_lag_steps_count")
  body = {"model": "smop", "prompt": "go on", "max_tokens": 48, "stream": True}
  with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
    lines = r.iter_lines()
    assert next(lines).startswith("data: ")
  deadline = time.monotonic() + 30
  while server.metric("spot_serve_cancel_lag_steps_count") == before:
    assert time.monotonic() < deadline, "the slot was never freed"
    time.sleep(0.05)
  assert server.metric("spot_serve_cancel_lag_steps_bucket", le="1.0") == before + 1
  assert server.metric("spot_serve_running_requests") == 0


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_chat_renders_as_transformers_apply_chat_template(served, name):
  server, _, root = served
  from tokenizers import Tokenizer, models as tok_models  # pylint: disable=g-import-not-at-top
  from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top
  source, bos, eos = TEMPLATES[name]
  tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(tok_models.WordLevel(
      {"[UNK]": 0}, unk_token="[UNK]")), chat_template=source, eos_token=eos, bos_token=bos)
  text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
  ids = vocabulary.get("byte").encode(text)
  target = server
  if name != "llama3":  # another template: a second server holding one prompt
    target = util.start({"pt": str(root / "pt.npy")}, [
        *SERVE[:-1], "--length_buckets=256", "--slots=1", "--no_warmup",
        f"--chat_template={_template_dir(root, name)}"], backbone=util.DECODER_BACKBONE)
  try:
    client = _client(target)
    chat = client.chat.completions.create(model="pt", messages=MESSAGES, max_tokens=8,
                                          temperature=0)
    plain = client.completions.create(model="pt", prompt=ids, max_tokens=8, temperature=0)
    assert chat.usage.prompt_tokens == len(ids) == plain.usage.prompt_tokens
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.choices[0].message.role == "assistant"
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="pt", messages=MESSAGES, max_tokens=8, temperature=0, stream=True) if c.choices]
    assert "".join(parts) == plain.choices[0].text
  finally:
    if target is not server:
      assert target.stop() == 0


BAD = [  # (path, body, field named)
    ("/v1/completions", {"model": "pt", "prompt": "x", "n": SLOTS + 1}, "n"),
    ("/v1/completions", {"model": "pt", "prompt": ["x", "y"], "n": 3}, "n"),
    ("/v1/completions", {"model": "pt", "prompt": "word " * 60}, "prompt"),
    ("/v1/completions", {"model": "pt", "prompt": list(range(3, 300))}, "prompt"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "top_p": 0}, "top_p"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "top_p": 1.5}, "top_p"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "logprobs": 6}, "logprobs"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "seed": "s"}, "seed"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "suffix": "!"}, "suffix"),
    ("/v1/completions", {"model": "pt", "prompt": "x", "max_tokens": 49}, "max_tokens"),
    ("/v1/chat/completions", {"model": "pt", "messages": [{"content": "hi"}]}, "messages"),
    ("/v1/chat/completions", {"model": "pt", "messages": []}, "messages"),
    ("/v1/chat/completions", {"model": "pt", "messages": [{"role": "user", "content": "x"}],
                              "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"model": "pt", "messages": [{"role": "user", "content": "x"}],
                              "tools": []}, "tools"),
]


@pytest.mark.parametrize("path, body, field", BAD)
def test_a_bad_request_is_a_400_naming_its_field(served, path, body, field):
  server, _, _ = served
  r = httpx.post(server.url + path, json=body, timeout=60)
  assert r.status_code == 400, r.text
  error = r.json()["error"]
  assert error["param"] == field and "\n" not in error["message"]


def _infer_one(root, path, text, capsys):
  """`infer`'s greedy prediction of `text` with the prompt at `path` alone."""
  (root / "one.jsonl").write_text(json.dumps({"input": text}) + "\n")
  argv = [*util.DECODER_BACKBONE, "--input_length=16", "--target_length=8", "--batch_size=1",
          f"--input={root / 'one.jsonl'}", f"--output={root / 'one_out.jsonl'}",
          f"--prompt=one={path}"]
  assert cli.run(infer.main, argv, infer.PROG) == 0, capsys.readouterr().err
  return json.loads((root / "one_out.jsonl").read_text())["prediction"]


def test_a_replaced_prompt_gets_a_new_prefix_and_classify_still_answers(served, capsys):
  server, _, root = served
  client = _client(server)
  rs = np.random.RandomState(11)
  answers = []
  for version in ("a", "b"):
    path = root / f"fresh_{version}.npy"
    np.save(path, rs.normal(0, 1, (3 + len(answers), 32)).astype(np.float32))
    added = httpx.post(server.url + "/v1/prompts/fresh", json={"path": str(path)}, timeout=120)
    assert added.status_code == 200, added.text
    got = client.completions.create(model="fresh", prompt="the cat sat", max_tokens=8,
                                    temperature=0).choices[0].text
    assert got == _infer_one(root, path, "the cat sat", capsys)
    answers.append(got)
    assert httpx.delete(server.url + "/v1/prompts/fresh", timeout=60).status_code == 200
  assert answers[0] != answers[1]
  scores = httpx.post(server.url + "/v1/classify", json={"model": "pt", "input": "the cat sat",
                                                         "labels": ["yes", "no"]}, timeout=120)
  assert scores.status_code == 200 and set(scores.json()["data"][0]["scores"]) == {"yes", "no"}


def test_a_stop_string_cuts_the_text_streamed_or_not(served):
  server, _, _ = served
  client = _client(server)
  for name, text in TEXTS.items():  # a prompt whose greedy text is long enough to cut
    kwargs = dict(model=name, prompt=text, max_tokens=24, temperature=0)
    full = client.completions.create(**kwargs).choices[0].text
    if len(full) >= 4:
      break
  assert len(full) >= 4, full
  stop = full[2:4]
  cut = client.completions.create(stop=[stop], **kwargs).choices[0]
  assert cut.text == full[:full.find(stop)] and cut.finish_reason == "stop"
  streamed, finish = _streamed(client.completions.create(stop=[stop], stream=True, **kwargs))
  assert (streamed, finish) == (cut.text, "stop")


def test_echo_and_logprobs_of_greedy_choices(served):
  server, _, _ = served
  client = _client(server)
  plain = client.completions.create(model="smop", prompt="abc", max_tokens=6, temperature=0)
  echoed = client.completions.create(model="smop", prompt="abc", max_tokens=6, temperature=0,
                                     echo=True, logprobs=3)
  assert echoed.choices[0].text == "abc" + plain.choices[0].text
  lps = echoed.choices[0].logprobs
  assert len(lps.token_logprobs) == echoed.usage.completion_tokens == 6
  assert all(len(top) <= 3 for top in lps.top_logprobs)  # byte tokens may share a text
  chat = client.chat.completions.create(model="pt", messages=[{"role": "user", "content": "x"}],
                                        max_tokens=5, temperature=0, logprobs=True,
                                        top_logprobs=4, n=2)
  assert chat.choices[0].message.content == chat.choices[1].message.content  # greedy
  for entry in chat.choices[0].logprobs.content:
    assert len(entry.top_logprobs) == 4
    assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-6)  # argmax
    assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
  assert chat.usage.completion_tokens == 2 * len(chat.choices[0].logprobs.content)
