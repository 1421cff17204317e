"""`python -m benchmarks.peers.peft_serve_file`: a file of requests served by PyTorch + PEFT.

The PyTorch counterpart of `python -m spot_jax.infer --input=FILE --output=FILE`, run by
`benchmarks.serve_e2e` as a whole process (what a user of PEFT would write):

  python -m benchmarks.peers.peft_serve_file --model=HF_DIR --adapters=DIR --vocab=spm.model \
      --input=requests.jsonl --output=predictions.jsonl [--max_new_tokens=8 --input_length=64 \
      --batch_size=32]

Each JSONL request names its prompt ("prompt"), a PEFT prompt-tuning adapter DIR/<prompt>.
The model and every adapter named are loaded once; then prompt by prompt (in order of first
appearance) `set_adapter` and greedy `generate` in batches of --batch_size, padded to the
batch's longest input with an attention mask. Inputs are tokenized and predictions decoded
with spot-jax's SentencePiece vocabulary (seqio's ids; see `spot_jax.vocabulary`), inputs cut
to --input_length tokens with EOS as `infer` does, so both sides see the same ids. Predictions
are written in input order; stderr gets one timing line (load, serving loop, first prediction
after process start). Needs the `bench` extra (torch, transformers, peft).
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Sequence

import numpy as np

from spot_jax import cli, runtime, vocabulary
from benchmarks.peers import worker as bench_worker

PROG = "benchmarks.peers.peft_serve_file"


def main(argv: Sequence[str]) -> int:
  p = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  p.add_argument("--model", required=True, help="Hugging Face T5 directory")
  p.add_argument("--adapters", required=True, help="folder of PEFT adapters, one per prompt name")
  p.add_argument("--vocab", required=True, help="SentencePiece model, or 'byte'")
  p.add_argument("--input", required=True)
  p.add_argument("--output", required=True)
  p.add_argument("--max_new_tokens", type=int, default=8)
  p.add_argument("--input_length", type=int, default=64)
  p.add_argument("--batch_size", type=int, default=32)
  args = p.parse_args(argv)
  t_main = time.perf_counter()
  import peft  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  with open(args.input, encoding="utf-8") as f:
    requests = [json.loads(line) for line in f if line.strip()]
  vocab = vocabulary.get(args.vocab)
  tokens = np.zeros((len(requests), args.input_length), np.int64)
  for i, r in enumerate(requests):
    ids = list(vocab.encode(r["input"]))[:args.input_length - 1] + [vocab.eos_id]
    tokens[i, :len(ids)] = ids
  t_import = time.perf_counter()
  groups: dict[str, list[int]] = {}
  for i, r in enumerate(requests):
    groups.setdefault(r["prompt"], []).append(i)
  base = transformers.T5ForConditionalGeneration.from_pretrained(args.model)
  names = list(groups)
  model = peft.PeftModel.from_pretrained(base, os.path.join(args.adapters, names[0]),
                                         adapter_name=names[0])
  for name in names[1:]:
    model.load_adapter(os.path.join(args.adapters, name), adapter_name=name)
  model.eval()
  t_load = time.perf_counter()
  predictions: list[str] = [""] * len(requests)
  first = None
  with torch.inference_mode():
    for name, idx in groups.items():
      model.set_adapter(name)
      for lo in range(0, len(idx), args.batch_size):
        batch = idx[lo:lo + args.batch_size]
        rows = tokens[batch]
        ids = torch.from_numpy(rows[:, :int((rows > 0).sum(1).max())])
        out = model.generate(input_ids=ids, attention_mask=(ids > 0).long(),
                             max_new_tokens=args.max_new_tokens, do_sample=False, num_beams=1)
        for i, row in zip(batch, out.numpy()):
          row = [int(t) for t in row[1:]]  # row[0] is the decoder start
          row = row[:row.index(vocab.eos_id)] if vocab.eos_id in row else row
          predictions[i] = vocab.decode([t for t in row if t > 0])
        if first is None:
          first = runtime.seconds_since_start()
  t_loop = time.perf_counter()
  tmp = args.output + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for r, pred in zip(requests, predictions):
      f.write(json.dumps({"id": r.get("id"), "input": r["input"], "prompt": r["prompt"],
                          "prediction": pred}, ensure_ascii=False) + "\n")
  os.replace(tmp, args.output)
  print(f"wrote {len(requests)} predictions to {args.output}")
  start = runtime.seconds_since_start()
  to_main = (start or 0.0) - (time.perf_counter() - t_main)
  print(f"{PROG}: timing: process start to main {to_main:.2f} s, imports and inputs "
        f"{t_import - t_main:.2f} s, model and {len(names)} adapters {t_load - t_import:.2f} s, "
        f"serving loop {t_loop - t_load:.2f} s; first prediction {first or 0.0:.2f} s after "
        f"process start", file=sys.stderr, flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(bench_worker.run(main, PROG))
