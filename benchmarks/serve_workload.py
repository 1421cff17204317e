"""The serving benchmark's requests, shared by spot-jax and its PyTorch + PEFT peer (numpy only).

A workload "PxN" is P prompts with N requests each, P * N requests in one queue that arrives at
once, in a shuffled order (so a mixed batch holds several prompts and a one-prompt-at-a-time
server must regroup them). Each request is a row of random token ids of a random length in
[input_length / 2, input_length] ending in EOS (1), right-padded with 0. Class labels are C
random rows of `label_length` ids plus EOS.

Both servers see the same queue: spot-jax builds it here and writes it for the peer
(`write` / `read`); `prompt_groups` is the one-prompt-at-a-time order both follow.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Sequence

import numpy as np

from benchmarks.peers import worker as bench_worker
from spot_jax.errors import ConfigError

EOS_ID = 1
FIRST_ID = 3  # ids 0-2 are padding, EOS and UNK
WORKLOAD_RE = re.compile(r"^(\d+)x(\d+)$")


@dataclasses.dataclass(frozen=True)
class Workload:
  """One queue of requests.

  Attributes:
    name: "PxN".
    prompt_names: the P prompt names.
    request_prompts: [R] the prompt name of each request, in arrival order.
    tokens: [R, T] int32 encoder ids (EOS included, 0 = padding).
    labels: [C, S] int32 class-label target ids (EOS included, 0 = padding).
  """
  name: str
  prompt_names: tuple[str, ...]
  request_prompts: tuple[str, ...]
  tokens: np.ndarray
  labels: np.ndarray

  @property
  def num_requests(self) -> int:
    return len(self.request_prompts)


def parse_workload(text: str) -> tuple[int, int]:
  """"64x2" -> (64 prompts, 2 requests each).

  Raises:
    ConfigError: anything else.
  """
  m = WORKLOAD_RE.match(text.strip())
  if not m or min(int(m.group(1)), int(m.group(2))) < 1:
    raise ConfigError(f"workload {text!r} is not PxN; give prompts x requests per "
                      "prompt, e.g. 64x2")
  return int(m.group(1)), int(m.group(2))


def make_workload(text: str, prompt_names: Sequence[str], vocab_size: int, input_length: int,
                  num_labels: int, label_length: int, seed: int) -> Workload:
  """The queue of workload `text` over the first P of `prompt_names` (see the module docstring)."""
  num_prompts, per_prompt = parse_workload(text)
  if num_prompts > len(prompt_names):
    raise ConfigError(f"workload {text} needs {num_prompts} prompts, {len(prompt_names)} built")
  rs = np.random.RandomState(seed)
  names = tuple(prompt_names[:num_prompts])
  order = rs.permutation(num_prompts * per_prompt)
  request_prompts = tuple(names[i // per_prompt] for i in order)
  tokens = np.zeros((len(order), input_length), np.int32)
  for row in tokens:
    n = rs.randint(max(1, input_length // 2), input_length + 1)
    row[:n - 1] = rs.randint(FIRST_ID, vocab_size, n - 1)
    row[n - 1] = EOS_ID
  labels = np.zeros((num_labels, label_length + 1), np.int32)
  labels[:, :label_length] = rs.randint(FIRST_ID, vocab_size, (num_labels, label_length))
  labels[:, label_length] = EOS_ID
  return Workload(text, names, request_prompts, tokens, labels)


def prompt_groups(workload: Workload) -> list[tuple[str, list[int]]]:
  """[(prompt name, its request indices in arrival order)] in order of first arrival."""
  groups: dict[str, list[int]] = {}
  for i, name in enumerate(workload.request_prompts):
    groups.setdefault(name, []).append(i)
  return list(groups.items())


def chunks(indices: Sequence[int], size: int) -> list[list[int]]:
  """`indices` in consecutive batches of at most `size`."""
  return [list(indices[i:i + size]) for i in range(0, len(indices), size)]


def percentile(values: Sequence[float], q: float) -> float:
  return float(np.percentile(np.asarray(values, np.float64), q))


def write(workload: Workload, path: str) -> None:
  """The queue as JSON for the peer process."""
  with open(path, "w", encoding="utf-8") as f:
    json.dump({"name": workload.name, "prompt_names": list(workload.prompt_names),
               "request_prompts": list(workload.request_prompts),
               "tokens": workload.tokens.tolist(), "labels": workload.labels.tolist()}, f)


def read(path: str) -> Workload:
  if not os.path.isfile(path):
    raise ConfigError(f"workload file {path} does not exist; benchmarks.serve writes it")
  with open(path, encoding="utf-8") as f:
    d = json.load(f)
  return Workload(d["name"], tuple(d["prompt_names"]), tuple(d["request_prompts"]),
                  np.asarray(d["tokens"], np.int32), np.asarray(d["labels"], np.int32))


def until_eos(row: Sequence[int]) -> list[int]:
  """What a request gets: a decoded row up to and including its first EOS (all of it if none)."""
  row = [int(t) for t in row]
  return row[:row.index(EOS_ID) + 1] if EOS_ID in row else row


def summarize(passes: Sequence[dict], first: dict, task: str) -> dict:
  """A row's timing fields from its timed passes (median pass) and its untimed first pass."""
  totals = [p["total"] for p in passes]
  median = passes[int(np.argsort(totals)[len(totals) // 2])]
  requests = len(median["done"])
  tokens = None if task == "score" else sum(len(o) for o in median["outputs"])
  total = float(np.median(totals))
  return {"pass_sec_all": totals, "pass_sec_median": total, "examples_per_sec": requests / total,
          "generated_tokens_per_sec": tokens / total if tokens is not None else None,
          "generated_tokens": tokens, "latency_p50_sec": percentile(median["done"], 50),
          "latency_p95_sec": percentile(median["done"], 95),
          "compile_sec": max(0.0, first["total"] - total), "first_pass_sec": first["total"],
          "calls_per_pass": median["calls"],
          "peak_host_memory_bytes": bench_worker.peak_host_memory_bytes(),
          "load_average_1min": os.getloadavg()[0]}
