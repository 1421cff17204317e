"""`python -m benchmarks.peers.peft_http`: PyTorch + PEFT behind spot-jax's HTTP front.

Started by `python -m benchmarks.serve_http` in its own process (torch and JAX never share
one) on a work directory it wrote: hf/ (the model as a Hugging Face directory), adapters/<name>/
(one PEFT prompt-tuning adapter per prompt), <name>.npy (the same prompts, for the listing).
The front is `spot_jax.serve`'s own (Starlette, the checked API, the batching loop, metrics);
only the forward pass differs: a batch of mixed prompts is served one adapter group at a time,
as PEFT can (`set_adapter`, then `generate` on that group's rows, greedy, padded to its
longest input with an attention mask). Prints "listening on http://..." once it serves.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

import numpy as np

from spot_jax import cli
from spot_jax.serve.http import api, app as app_lib
from spot_jax.serve.scheduler import batcher as batcher_lib
from spot_jax.serve.http import metrics as metrics_lib
from spot_jax.serve import service as service_lib
from spot_jax.serve.catalog.capacity import SizedTable
from spot_jax.serve.catalog.table import ServedPrompt
from benchmarks.peers import peft_serve

PROG = "benchmarks.peers.peft_http"


class PeftServer:
  """Decodes a mixed batch with PEFT, one adapter group after another."""

  def __init__(self, model, target_length: int):
    self.model, self.target_length = model, target_length

  def generate(self, names: Sequence[str], rows: np.ndarray, unused_batch_index: int = 0,
               valid: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """`valid` [B, T] marks the tokens of `rows` (None: ids > 0, T5's padding)."""
    import torch  # pylint: disable=import-outside-toplevel
    valid = np.asarray(rows > 0 if valid is None else valid, bool)
    out = np.zeros((len(names), self.target_length), np.int32)
    with torch.inference_mode():
      for name in dict.fromkeys(names):
        group = [i for i, n in enumerate(names) if n == name]
        length = int(valid[group].sum(axis=1).max())
        ids = torch.from_numpy(np.ascontiguousarray(rows[group][:, :length])).long()
        mask = torch.from_numpy(np.ascontiguousarray(valid[group][:, :length])).long()
        self.model.set_adapter(name)
        got = self.model.generate(input_ids=ids, attention_mask=mask,
                                  max_new_tokens=self.target_length, do_sample=False).numpy()
        out[group, :got.shape[1] - 1] = got[:, 1:]  # column 0: the decoder's start token
    return out, np.zeros(len(names), np.float32)


class PeftDecoderServer:
  """Decodes each row alone with PEFT on a decoder-only model: [BOS, input] ->
  `generate(use_cache=False)` (peft 0.21.2's cached generate prepends the prompt again at every
  step, and a padded batch changes a row's positions: see `peft_decoder_serve`)."""

  def __init__(self, model, target_length: int, bos_id: int, eos_id: int):
    self.model, self.target_length = model, target_length
    self.bos_id, self.eos_id = bos_id, eos_id

  def generate(self, names: Sequence[str], rows: np.ndarray, unused_batch_index: int = 0,
               valid: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """`valid` [B, T] marks the tokens of `rows` (every id is a token; None: ids > 0)."""
    import torch  # pylint: disable=import-outside-toplevel
    valid = np.asarray(rows > 0 if valid is None else valid, bool)
    out = np.zeros((len(names), self.target_length), np.int32)
    with torch.inference_mode():
      for i, name in enumerate(names):
        ids = torch.tensor([[self.bos_id] + [int(t) for t in rows[i][valid[i]]]])
        self.model.set_adapter(name)
        got = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                  max_new_tokens=self.target_length, do_sample=False,
                                  use_cache=False, eos_token_id=self.eos_id, pad_token_id=0)
        new = got[0, ids.shape[1]:].numpy()
        out[i, :len(new)] = new
    return out, np.zeros(len(names), np.float32)


class PeftCatalog:
  """The prompts' listing (a `SizedTable` of the same prompts) and the PEFT server."""

  def __init__(self, table: SizedTable, server: PeftServer):
    self.table, self.server = table, server

  @property
  def capacity(self):
    return self.table.capacity

  def snapshot(self, unused_key):
    return self.table, self.server


def main(argv: Sequence[str]) -> int:
  p = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  a = p.add_argument
  a("--work_dir", required=True)
  a("--kind", default="t5", choices=("t5", "decoder"), help="decoder: CAUSAL_LM adapters on a "
    "decoder-only model (work_dir/hf), each request alone")
  a("--vocab", required=True)
  a("--port", type=int, default=0)
  a("--max_batch_size", type=int, default=32)
  a("--max_wait_ms", type=float, default=10.0)
  a("--max_queue", type=int, default=1024)
  a("--input_length", type=int, default=16)
  a("--target_length", type=int, default=8)
  args = p.parse_args(argv)
  import torch  # pylint: disable=import-outside-toplevel
  from spot_jax import vocabulary  # pylint: disable=import-outside-toplevel
  names = sorted((n for n in os.listdir(os.path.join(args.work_dir, "adapters"))),
                 key=lambda n: int(n[1:]))
  if args.kind == "decoder":
    from benchmarks.peers import peft_decoder_serve  # pylint: disable=import-outside-toplevel
    model, _ = peft_decoder_serve.load(args.work_dir, names)
    server = PeftDecoderServer(model, args.target_length, model.config.bos_token_id,
                               model.config.eos_token_id)
  else:
    model, _ = peft_serve.load(args.work_dir, names)
    server = PeftServer(model, args.target_length)
  entries = [ServedPrompt(n, np.load(os.path.join(args.work_dir, f"{n}.npy")), source="peft")
             for n in names]
  table = SizedTable(entries)
  catalog = PeftCatalog(table, server)
  metrics = metrics_lib.Metrics(args.max_batch_size)

  def observe(kind: str, rows: int, unused_padded: int, seconds: float, results) -> None:
    tokens = sum(int(np.count_nonzero(ids)) for ids, _ in results)
    metrics.observe_batch(kind, rows, seconds, tokens)

  loop = batcher_lib.Batcher(catalog, max_batch=args.max_batch_size,
                             max_wait=args.max_wait_ms / 1000, max_queue=args.max_queue,
                             batch_buckets=range(1, args.max_batch_size + 1),  # no padding
                             length_buckets=[args.input_length], observe=observe)
  vocab = vocabulary.get(args.vocab)
  limits = api.Limits(args.input_length, args.target_length, args.max_batch_size,
                      model.config.vocab_size)
  service = app_lib.Service(catalog, loop, metrics, vocab, limits,
                            f"PyTorch {torch.__version__} + PEFT", 60.0)
  sock = service_lib.listen("127.0.0.1", args.port)
  print(f"{PROG}: {len(names)} adapters; listening on http://127.0.0.1:{sock.getsockname()[1]}",
        flush=True)
  return service_lib.serve(service, sock, PROG)


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], PROG, keep_heap=False))
