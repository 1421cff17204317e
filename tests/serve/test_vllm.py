"""vLLM's `prompt_embeds` of a served decoder-only prompt, checked without vLLM.

Invariants: a payload is base64 of `torch.save` of a [P + 1 + T, E] tensor that equals, f32 bit
for bit, the rows our `DecoderLM.inputs` gives the same Prompt Tuning prompt on [BOS, inputs]
(Gemma's sqrt(E) scaling on the token rows only); `infer --export_vllm` writes one Completions
request per input whose body is valid under vLLM's documented request fields; prompts without
a single [L, E] form are refused in one line.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from typing import Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import pydantic
import pytest

torch = pytest.importorskip("torch")

from spot_jax import models, prompts, vocabulary  # noqa: E402
from spot_jax.backbones.decoder.config import config_by_name  # noqa: E402
from spot_jax.backbones.decoder.network import DecoderLM  # noqa: E402
from spot_jax.errors import ConfigError  # noqa: E402
from spot_jax.prompts import initializers  # noqa: E402
from spot_jax.serve.catalog import prompt_loaders  # noqa: E402
from spot_jax.serve.catalog import served_backbone  # noqa: E402
from spot_jax.serve.catalog.served_backbone import ServedBackbone  # noqa: E402
from spot_jax.serve.catalog.table import ServedPrompt  # noqa: E402
from spot_jax.serve.export import vllm  # noqa: E402
from spot_jax.serve.model import inputs  # noqa: E402
from tests.helpers import REPO  # noqa: E402

ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
TOKENS = [72, 105, 33, 7, 1]  # byte ids of an input, seqio's EOS (1) last, as our server reads


class CompletionRequest(pydantic.BaseModel):
  """The fields of vLLM's Completions request (`CompletionRequest`, docs "Completions API",
  its sampling and extra parameters) that a prompt_embeds request uses, typed as vLLM types
  them; any other field is refused here so that a typo cannot pass."""
  model_config = pydantic.ConfigDict(extra="forbid", strict=True)
  model: Optional[str] = None
  prompt: Optional[Union[list[int], list[list[int]], str, list[str]]] = None
  prompt_embeds: Optional[Union[str, list[str]]] = None
  max_tokens: Optional[int] = 16
  temperature: Optional[float] = None
  top_k: Optional[int] = None
  seed: Optional[int] = None


def _prompted(name: str, length: int = 4):
  config = config_by_name(name)
  module = prompts.PromptTuning(length, prompt_init=initializers.uniform(1.0))
  model = models.DecoderOnlyModel(DecoderLM(config, prompt=module), eos_id=1)
  dummy = model.dummy_batch(4, 2)
  backbone = jax.device_get(models.unbox(model.init_backbone(jax.random.PRNGKey(0), dummy)))
  prompt = models.unbox(model.init_prompt(jax.random.PRNGKey(1), backbone, dummy))["prompt"]
  return config, module, backbone, jax.device_get(prompt)


@pytest.mark.parametrize("name", ["decoder_tiny_gemma3", "decoder_tiny_llama"])
def test_the_payload_is_exactly_the_rows_decoder_lm_reads(name):
  config, module, backbone, prompt = _prompted(name)
  table = vllm.check_entry(prompt_loaders.from_module("pt", module, prompt))  # served as [L, E]
  rows = vllm.request_rows(DecoderLM(config), backbone, np.asarray(table), TOKENS)
  x, valid = DecoderLM(config, prompt=module).apply(
      {"params": {**backbone, "prompt": prompt}}, jnp.asarray([[config.bos_id] + TOKENS]),
      method=DecoderLM.inputs)
  assert rows.shape == (4 + 1 + len(TOKENS), config.emb_dim) and bool(np.all(valid))
  np.testing.assert_array_equal(rows, np.asarray(x[0], np.float32))
  np.testing.assert_array_equal(rows[:4], table)  # the prompt is not scaled, the tokens are
  raw = np.asarray(backbone["token_embedder"]["embedding"])[[config.bos_id] + TOKENS]
  scale = config.emb_dim ** 0.5 if config.scale_embeddings else 1.0
  np.testing.assert_allclose(rows[4:], raw * scale, rtol=1e-6)

  tensor = vllm.decode(vllm.encode(rows))
  assert tensor.dtype == torch.float32 and tuple(tensor.shape) == rows.shape
  np.testing.assert_array_equal(tensor.numpy(), rows)
  half = vllm.encode(rows, "bfloat16")
  small = vllm.decode(half)
  saved = len(base64.b64decode(vllm.encode(rows))) - len(base64.b64decode(half))
  assert small.dtype == torch.bfloat16 and saved >= 2 * rows.size - 64  # 2 bytes a value
  np.testing.assert_allclose(small.float().numpy(), rows, rtol=2 ** -8, atol=0)


def test_prompts_without_one_input_prompt_are_refused_in_one_line():
  base = np.ones((2, 3, 8), np.float32)
  smop = ServedPrompt("smop", base, router=np.ones((8, 2), np.float32), routing="linear")
  dept = ServedPrompt("dept", base[:1], offset=np.ones((4, 8), np.float32))
  for entry, why in ((smop, "mixture of 2 prompts"), (dept, "DePT")):
    with pytest.raises(ConfigError, match=why) as e:
      vllm.check_entry(entry)
    assert "\n" not in str(e.value)
  np.testing.assert_array_equal(vllm.check_entry(ServedPrompt("pt", base[0])), base[0])
  with pytest.raises(ConfigError, match="--vllm_dtype"):
    vllm.encode(base[0], "float16")


def test_infer_export_vllm_writes_valid_completion_requests(tmp_path):
  config = config_by_name("decoder_tiny_llama")
  prompt = np.random.RandomState(0).uniform(-1, 1, (3, config.emb_dim)).astype(np.float32)
  np.save(tmp_path / "p.npy", prompt)
  texts = ["Hi!", "a longer input line"]
  (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
  out = tmp_path / "vllm"
  run = subprocess.run(
      [sys.executable, "-m", "spot_jax.infer", f"--prompt=qa={tmp_path / 'p.npy'}",
       "--model=decoder_tiny_llama", "--vocab=byte", f"--input={tmp_path / 'in.txt'}",
       f"--export_vllm={out}", "--vllm_model=meta-llama/Llama-3.2-1B", "--target_length=7",
       "--temperature=0"], cwd=REPO, env=ENV, capture_output=True, text=True,
      timeout=300)
  assert run.returncode == 0, run.stderr
  lines = (out / "requests.jsonl").read_text().splitlines()
  assert len(lines) == len(texts)
  params, _ = served_backbone.load_params(ServedBackbone(config, None, 0, "--model"))
  tokens, valid, _ = inputs.tokenize(vocabulary.get("byte"), texts, 128)
  for line, row in zip(lines, (t[v] for t, v in zip(tokens, valid))):
    body = CompletionRequest.model_validate(json.loads(line))
    assert body.model == "meta-llama/Llama-3.2-1B" and body.prompt is None
    assert body.max_tokens == 7 and body.temperature == 0.0
    tensor = vllm.decode(body.prompt_embeds)
    expected = vllm.request_rows(DecoderLM(config), params, prompt, row)
    np.testing.assert_array_equal(tensor.numpy(), expected)
  assert "2 vLLM Completions requests" in run.stdout


def test_schema_refuses_what_vllm_would_not_take():
  with pytest.raises(pydantic.ValidationError):
    CompletionRequest.model_validate({"model": "m", "prompt_embeds": 3})
  with pytest.raises(pydantic.ValidationError):
    CompletionRequest.model_validate({"model": "m", "prompt_embed": "x"})
