"""`python -m benchmarks.peers.peft_decoder_serve`: the PyTorch + PEFT peer of
`benchmarks.decoder_serve`.

Started by `python -m benchmarks.decoder_serve --vs=peft` in its own process with a work
directory the parent wrote: `hf/` (the random decoder, `save_hf_dir`), `adapters/<name>/` (one
CAUSAL_LM prompt-tuning adapter per prompt, `peft_causal.export_prompt_adapter`) and
`workloads/<PxN>.json`. It loads the model and every adapter once, then serves each queue
prompt by prompt (`set_adapter`, in order of first arrival):

  score     one forward pass per batch of min(--batch_size, the prompt's requests) inputs x C
            labels: rows [BOS, input, label[:-1]] right-padded with an attention mask, the sum of
            the label tokens' log-probabilities read from the logits after the prompt's;
  generate  `generate(max_new_tokens=N, do_sample=False, use_cache=False)` on one request per
            call: peft 0.21.2 under transformers 5 prepends the prompt again at every cached
            step (use_cache=True is wrong), and drops the positions of a left-padded row, so
            batching rows of different lengths would change their answers.

One untimed pass, then `--repeats` timed ones; one JSON row per (workload, task), outputs
included. Needs the `bench` extra (torch, transformers, peft).
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings
from typing import Any, Sequence

import numpy as np

from benchmarks import serve_workload
from benchmarks.peers import worker as bench_worker
from spot_jax import cli, runtime


def load(work_dir: str, names: Sequence[str]):
  """The transformers model with every adapter of `names` loaded once; (model, seconds)."""
  import peft  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  base = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(work_dir, "hf"))
  adapter = lambda n: os.path.join(work_dir, "adapters", n)  # noqa: E731
  model = peft.PeftModel.from_pretrained(base, adapter(names[0]), adapter_name=names[0])
  for name in names[1:]:
    model.load_adapter(adapter(name), adapter_name=name)
  model.eval()
  return model, time.perf_counter() - t0


def score_rows(tokens: np.ndarray, labels: np.ndarray, bos_id: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(ids [B*C, W], label targets [B*C, W], weights [B*C, W]): per input and label the row
  [BOS, input, label[:-1]] right-padded, targets [input, label] (the trainer's layout)."""
  rows = []
  for row in tokens:
    real = [int(t) for t in row if t > 0]
    for label in labels:
      lab = [int(t) for t in label if t > 0]
      rows.append((real, lab))
  width = max(len(r) + len(lab) for r, lab in rows)
  ids, targets, weights = (np.zeros((len(rows), width), np.int64) for _ in range(3))
  for i, (real, lab) in enumerate(rows):
    sequence = real + lab
    ids[i, :len(sequence)] = [bos_id] + sequence[:-1]
    targets[i, :len(sequence)] = sequence
    weights[i, len(real):len(sequence)] = 1
  return ids, targets, weights


def _serve_batch(model, tokens: np.ndarray, labels: np.ndarray, task: str, target_length: int,
                 prompt_length: int, bos_id: int) -> list[Any]:
  import torch  # pylint: disable=import-outside-toplevel
  if task == "score":
    ids, targets, weights = score_rows(tokens, labels, bos_id)
    ids_t = torch.from_numpy(ids)
    logits = model(input_ids=ids_t, attention_mask=(torch.from_numpy(targets) > 0).long()
                   ).logits[:, prompt_length:]
    lp = torch.log_softmax(logits.float(), dim=-1).gather(
        -1, torch.from_numpy(targets)[..., None])[..., 0]
    scores = (lp * torch.from_numpy(weights)).sum(-1).reshape(tokens.shape[0], labels.shape[0])
    return [row.astype(np.float64) for row in scores.numpy()]
  out = []
  for row in tokens:
    ids = torch.tensor([[bos_id] + [int(t) for t in row if t > 0]])
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      seq = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                           max_new_tokens=target_length, do_sample=False, use_cache=False,
                           eos_token_id=serve_workload.EOS_ID, pad_token_id=0)
    new = seq[0, ids.shape[1]:].numpy() if seq.shape[1] > ids.shape[1] else seq[0].numpy()
    out.append(serve_workload.until_eos(new))
  return out


def serve_pass(model, workload, task: str, batch_size: int, target_length: int,
               prompt_length: int, bos_id: int) -> dict:
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
        results = _serve_batch(model, workload.tokens[batch], workload.labels, task,
                               target_length, prompt_length, bos_id)
        calls += 1 if task == "score" else len(batch)
        now = time.perf_counter() - t0
        for i, result in zip(batch, results):
          outputs[i], done[i] = result, now
  rows = 1 if task == "generate" else min(batch_size,
                                          len(serve_workload.prompt_groups(workload)[0][1]))
  return {"outputs": outputs, "done": done, "total": time.perf_counter() - t0, "calls": calls,
          "batch_rows": rows}


def main(argv: Sequence[str]) -> int:
  p = cli.ArgumentParser(prog="benchmarks.peers.peft_decoder_serve",
                         description=__doc__.splitlines()[0])
  p.add_argument("--output_dir", required=True)
  p.add_argument("--workloads", required=True, help="comma-separated PxN names")
  p.add_argument("--tasks", required=True, help="comma-separated: score, generate")
  p.add_argument("--method", default="pt100", help="the spot-jax method the adapters hold")
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--target_length", type=int, default=8)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--bos_id", type=int, default=2)
  p.add_argument("--threads", type=int, default=os.cpu_count())
  args = p.parse_args(argv)
  import peft  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(args.threads)
  workloads = [serve_workload.read(os.path.join(args.output_dir, "workloads", f"{w}.json"))
               for w in args.workloads.split(",")]
  names = sorted({n for w in workloads for n in w.prompt_names}, key=lambda n: int(n[1:]))
  model, load_sec = load(args.output_dir, names)
  prompt_length = int(model.peft_config[names[0]].num_virtual_tokens)
  for workload in workloads:
    for task in args.tasks.split(","):
      run = lambda: serve_pass(model, workload, task, args.batch_size,  # noqa: E731
                               args.target_length, prompt_length, args.bos_id)
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
  sys.exit(bench_worker.run(main, "benchmarks.peers.peft_decoder_serve"))
