"""A decoder-only soft prompt served by vLLM: each request as vLLM's `prompt_embeds`.

vLLM (`vllm serve MODEL --enable-prompt-embeds`) takes, in a Completions request, a
`prompt_embeds` field: a torch tensor [T, E] written by `torch.save` and base64-encoded, which
it feeds to the model in place of the embedded tokens (no BOS or template added). A request's
tensor here is what our own `DecoderLM.inputs` gives a Prompt Tuning module on [BOS, inputs]:

  rows 0..P-1      the folded prompt [P, E] (Prompt Tuning, folded Residual / MPT / ULPT), as is
  rows P..P+T      the frozen table's rows of [BOS, input ids] (times sqrt(E) for Gemma, as
                   transformers' `inputs_embeds` are)

So `torch.load` of a payload gives exactly the rows our decoder reads (float32); bfloat16 halves
the transfer. Deep prompts, per-input mixtures (SMoP, ATTEMPT) and DePT offsets have no such
form and are refused in one line.
"""
from __future__ import annotations

import base64
import io
import json
from typing import Any, Optional, Sequence

import numpy as np

from spot_jax.errors import ConfigError

DTYPES = ("float32", "bfloat16")


def check_entry(entry: Any) -> np.ndarray:
  """The [P, E] prompt of a served entry vLLM can take, or a one-line ConfigError naming why."""
  why = ("a deep prompt (per-layer prefixes)" if entry.deep else
         f"a per-input mixture of {entry.num_prompts} prompts ({entry.routing} routing)"
         if entry.num_prompts != 1 else
         "a DePT prompt with an offset of the input embeddings" if entry.offset is not None
         else None)
  if why:
    raise ConfigError(f"prompt {entry.name!r} is {why}; vLLM's prompt_embeds hold one [L, E] "
                      f"input prompt (Prompt Tuning, folded Residual, MPT or ULPT)")
  return np.asarray(entry.prompts[0], np.float32)


def request_rows(network: Any, params: Any, prompt: np.ndarray,
                 tokens: Sequence[int]) -> np.ndarray:
  """[P + 1 + T, E] float32: the prompt, then the embedded [BOS, tokens].

  Args:
    network: the frozen `DecoderLM` (no prompt module).
    params: its parameters.
    prompt: [P, E] the folded prompt.
    tokens: the input's ids, without padding (every id is a token, 0 too).
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.decoder.network import DecoderLM  # pylint: disable=g-import-not-at-top
  ids = [network.config.bos_id] + [int(t) for t in tokens]
  embedded = network.apply({"params": params}, jnp.asarray([ids], jnp.int32),
                           method=DecoderLM.embed)[0]
  prompt = jnp.asarray(prompt).astype(network.config.activation_dtype)
  return np.asarray(jnp.concatenate([prompt, embedded]).astype(jnp.float32))


def encode(rows: np.ndarray, dtype: str = "float32") -> str:
  """rows [T, E] -> base64 of `torch.save(tensor)`, vLLM's `prompt_embeds` encoding."""
  import torch  # pylint: disable=g-import-not-at-top
  if dtype not in DTYPES:
    raise ConfigError(f"--vllm_dtype={dtype!r} is not one of {', '.join(DTYPES)}")
  tensor = torch.from_numpy(np.array(rows, np.float32)).to(getattr(torch, dtype))
  buffer = io.BytesIO()
  torch.save(tensor, buffer)
  return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode(payload: str) -> Any:
  """The torch tensor a `prompt_embeds` string holds, read as vLLM reads it (weights only)."""
  import torch  # pylint: disable=g-import-not-at-top
  return torch.load(io.BytesIO(base64.b64decode(payload, validate=True)), weights_only=True)


def completion_body(model: str, payload: str, *, max_tokens: int, temperature: float = 0.0,
                    top_k: Optional[int] = None, seed: Optional[int] = None) -> dict:
  """A vLLM Completions request (POST /v1/completions) of one `prompt_embeds` payload; no
  `prompt` (vLLM would run it as a request of its own)."""
  body = {"model": model, "prompt_embeds": payload, "max_tokens": int(max_tokens),
          "temperature": float(temperature)}
  if top_k:
    body["top_k"] = int(top_k)
  if seed is not None:
    body["seed"] = int(seed)
  return body


def post(url: str, body: dict, timeout: float = 600.0) -> dict:
  """Sends one request body to a vLLM server (`http://HOST:PORT/v1/completions`); its answer."""
  import urllib.request  # pylint: disable=g-import-not-at-top
  request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                   headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(request, timeout=timeout) as response:
    return json.loads(response.read())



def requests_path(folder: str, overwrite: bool) -> str:
  """FOLDER/requests.jsonl, checked before any work (creating nothing): a folder that can be
  made and written, and no earlier requests.jsonl unless `overwrite`."""
  from spot_jax import fileio  # pylint: disable=g-import-not-at-top
  path = fileio.creatable_dir(folder, "--export_vllm") / "requests.jsonl"
  if path.exists() and not overwrite:
    raise ConfigError(f"{path} exists; pass --overwrite to replace it")
  return str(path)


def write_requests(path: str, bodies: Sequence[dict]) -> None:
  """Writes the request bodies to `path` (`requests_path`'s), one JSON body a line, atomically."""
  import os  # pylint: disable=g-import-not-at-top
  from spot_jax import fileio  # pylint: disable=g-import-not-at-top
  fileio.writable_dir(os.path.dirname(path), "--export_vllm")
  fileio.atomic_write_bytes(path, "".join(json.dumps(b) + "\n" for b in bodies).encode())
