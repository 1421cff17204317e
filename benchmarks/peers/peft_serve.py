"""`python -m benchmarks.peers.peft_serve`: the PyTorch + PEFT peer of `benchmarks.serve`.

Started by `python -m benchmarks.serve --vs=peft` in its own process (torch and JAX never
share one) with a work directory the parent wrote:

  hf/                   the parent's random T5 as a Hugging Face model (`backbones.t5.hf_export`)
  adapters/<name>/      one PEFT prompt-tuning adapter per prompt (`spot_jax.serve.export.peft_io`)
  workloads/<PxN>.json  the request queues (`serve_workload.write`)

It loads the model and every adapter once (`PeftModel.from_pretrained`, then `load_adapter`),
then serves each queue the way PEFT can: prompt by prompt (`set_adapter`, in order of first
arrival), in batches of min(--batch_size, the prompt's requests), each batch padded to its
longest input with an attention mask. `generate`: `model.generate(max_new_tokens=...,
do_sample=False)` (greedy; `beam`: num_beams); `score`: one forward pass of B * C rows with the
label rows as decoder targets, summing their log-probabilities. One untimed pass, then
`--repeats` timed ones; prints one JSON row per (workload, task), with the outputs.
Needs the `bench` extra (torch, transformers, peft).
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Sequence

import numpy as np

from spot_jax import cli, runtime
from benchmarks import serve_workload
from benchmarks.peers import worker as bench_worker


def load(work_dir: str, names: Sequence[str]):
  """The Hugging Face model with every adapter of `names` loaded once; (model, seconds)."""
  import peft  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  base = transformers.T5ForConditionalGeneration.from_pretrained(os.path.join(work_dir, "hf"))
  adapter = lambda n: os.path.join(work_dir, "adapters", n)
  model = peft.PeftModel.from_pretrained(base, adapter(names[0]), adapter_name=names[0])
  for name in names[1:]:
    model.load_adapter(adapter(name), adapter_name=name)
  model.eval()
  return model, time.perf_counter() - t0


def _serve_batch(model, tokens: np.ndarray, labels: np.ndarray, task: str, target_length: int,
                 num_beams: int) -> list[Any]:
  import torch  # pylint: disable=import-outside-toplevel
  length = int((tokens > 0).sum(axis=1).max())  # right padding: the longest input in the batch
  ids = torch.from_numpy(np.ascontiguousarray(tokens[:, :length])).long()
  if task == "score":
    c = labels.shape[0]
    ids = ids.repeat_interleave(c, dim=0)
    targets = torch.from_numpy(np.tile(labels, (tokens.shape[0], 1))).long()
    decoder_input = torch.cat([torch.zeros_like(targets[:, :1]), targets[:, :-1]], dim=1)
    logits = model(input_ids=ids, attention_mask=(ids > 0).long(),
                   decoder_input_ids=decoder_input).logits
    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None])[..., 0]
    scores = (lp * (targets > 0)).sum(-1).reshape(tokens.shape[0], c)
    return [row.astype(np.float64) for row in scores.numpy()]
  out = model.generate(input_ids=ids, attention_mask=(ids > 0).long(), max_new_tokens=target_length,
                       do_sample=False, num_beams=num_beams if task == "beam" else 1)
  return [serve_workload.until_eos(row[1:]) for row in out.numpy()]  # row[0]: decoder start


def serve_pass(model, workload, task: str, batch_size: int, target_length: int,
               num_beams: int) -> dict:
  """Serves the queue once, prompt by prompt."""
  import torch  # pylint: disable=import-outside-toplevel
  outputs: list[Any] = [None] * workload.num_requests
  done = np.zeros(workload.num_requests)
  calls = 0
  t0 = time.perf_counter()
  with torch.inference_mode():
    for name, idx in serve_workload.prompt_groups(workload):
      model.set_adapter(name)
      for batch in serve_workload.chunks(idx, min(batch_size, len(idx))):
        results = _serve_batch(model, workload.tokens[batch], workload.labels, task, target_length,
                               num_beams)
        calls += 1
        now = time.perf_counter() - t0
        for i, result in zip(batch, results):
          outputs[i], done[i] = result, now
  return {"outputs": outputs, "done": done, "total": time.perf_counter() - t0, "calls": calls,
          "batch_rows": min(batch_size, len(serve_workload.prompt_groups(workload)[0][1]))}


def main(argv: Sequence[str]) -> int:
  p = cli.ArgumentParser(prog="benchmarks.peers.peft_serve", description=__doc__.splitlines()[0])
  p.add_argument("--output_dir", required=True)
  p.add_argument("--workloads", required=True, help="comma-separated PxN names")
  p.add_argument("--tasks", required=True, help="comma-separated: generate, score, beam")
  p.add_argument("--method", default="pt100", help="the spot-jax method the adapters hold")
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--target_length", type=int, default=16)
  p.add_argument("--num_beams", type=int, default=4)
  p.add_argument("--repeats", type=int, default=3)
  args = p.parse_args(argv)
  import peft  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  workloads = [serve_workload.read(os.path.join(args.output_dir, "workloads", f"{w}.json"))
               for w in args.workloads.split(",")]
  names = sorted({n for w in workloads for n in w.prompt_names}, key=lambda n: int(n[1:]))
  model, load_sec = load(args.output_dir, names)
  for workload in workloads:
    for task in args.tasks.split(","):
      run = lambda: serve_pass(model, workload, task, args.batch_size, args.target_length,
                               args.num_beams)
      first = run()
      passes = [run() for _ in range(args.repeats)]
      row = {"framework": "PyTorch + PEFT", "way": "peft", "method": args.method,
             "workload": workload.name, "task": task, "requests": workload.num_requests,
             "batch_rows": first["batch_rows"], "adapters_loaded": len(names),
             "load_sec": load_sec, **serve_workload.summarize(passes, first, task),
             "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
             "peft": peft.__version__, "malloc": runtime.applied(),
             "outputs": [o.tolist() if isinstance(o, np.ndarray) else o for o in first["outputs"]]}
      print(json.dumps(row), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(bench_worker.run(main, "benchmarks.peers.peft_serve"))
