"""`python -m benchmarks.peers.peft_train`: the PyTorch + Hugging Face PEFT counterpart
of `benchmarks`.

Run by `python -m benchmarks --vs=peft` in its own process (torch and JAX never share one).
It builds a randomly initialised transformers T5 of the same shape as a spot_jax config, wraps
it with PEFT and times AdamW train steps (median after warm-up):

  pt     PEFT prompt tuning (`PromptTuningConfig`, num_transformer_submodules=1): the soft prompt
         is prepended to the encoder input only, as in spot-jax's Prompt Tuning (PEFT's seq2seq
         default would also prompt the decoder).
  ptune  PEFT P-tuning (`PromptEncoderConfig`, MLP reparameterisation): the nearest PEFT
         counterpart of Residual Prompt Tuning's reparameterised prompt.

FLOPs per step are counted by `torch.utils.flop_counter.FlopCounterMode` over one extra, untimed
step (matmuls, attention and convolutions, forward and backward: torch's own count, which leaves
out elementwise work that XLA's cost analysis includes); with `--peak_flops` (the matmul peak
`benchmarks` measured in the same run) the row carries an MFU.

Prints one JSON object per method on stdout. Needs the `bench` extra (torch, transformers, peft).
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Optional, Sequence

from benchmarks.peers import worker as bench_worker
from spot_jax import runtime
from spot_jax.errors import ConfigError

PEFT_METHODS = ("pt", "ptune")


def hf_shape(config) -> dict:
  """transformers.T5Config keyword arguments of a spot_jax `T5Config`'s shape (called by bench)."""
  act = tuple(config.mlp_activations)
  ff = "relu" if act == ("relu",) else ("gated-gelu" if act == ("gelu", "linear") else None)
  if ff is None:
    raise ConfigError(f"no transformers T5 counterpart for mlp_activations {act}; valid: relu, "
                      "gelu+linear")
  return dict(vocab_size=config.vocab_size, d_model=config.emb_dim, d_kv=config.head_dim,
              d_ff=config.mlp_dim, num_layers=config.num_encoder_layers,
              num_decoder_layers=config.num_decoder_layers, num_heads=config.num_heads,
              feed_forward_proj=ff, tie_word_embeddings=bool(config.logits_via_embedding))


def _hf_config(shape: dict, dropout_rate: float):
  import transformers  # pylint: disable=import-outside-toplevel
  cfg = transformers.T5Config(**shape, dropout_rate=dropout_rate, decoder_start_token_id=0,
                              pad_token_id=0)
  cfg.tie_word_embeddings = shape["tie_word_embeddings"]  # transformers 5 forces True otherwise
  return cfg


def bench_peft(method: str, shape: dict, batch_size: int, input_length: int, target_length: int,
               prompt_length: int, dropout_rate: float, steps: int, warmup: int, seed: int = 0,
               peak_flops: Optional[float] = None) -> dict:
  """Times `steps` AdamW steps of PEFT `method` on a random T5; returns one result row."""
  import peft  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import torch.utils.flop_counter  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.manual_seed(seed)
  base = transformers.T5ForConditionalGeneration(_hf_config(shape, dropout_rate))
  if method == "pt":
    pcfg = peft.PromptTuningConfig(task_type="SEQ_2_SEQ_LM", num_virtual_tokens=prompt_length,
                                   num_transformer_submodules=1)
  else:
    pcfg = peft.PromptEncoderConfig(task_type="SEQ_2_SEQ_LM", num_virtual_tokens=prompt_length,
                                    num_transformer_submodules=1,
                                    encoder_reparameterization_type="MLP", encoder_hidden_size=128)
  model = peft.get_peft_model(base, pcfg)
  model.train()
  trainable = [p for p in model.parameters() if p.requires_grad]
  opt = torch.optim.AdamW(trainable, lr=0.3)
  gen = torch.Generator().manual_seed(seed)
  vocab = base.config.vocab_size
  inputs = torch.randint(2, vocab, (batch_size, input_length), generator=gen)
  labels = torch.randint(2, vocab, (batch_size, target_length), generator=gen)
  mask = torch.ones_like(inputs)

  def step():
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=inputs, attention_mask=mask, labels=labels).loss
    loss.backward()
    opt.step()
    return float(loss)

  t0 = time.perf_counter()
  step()
  first = time.perf_counter() - t0
  with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
    step()  # counted, not timed
  flops = float(counter.get_total_flops())
  for _ in range(warmup):
    step()
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    loss = step()
    times.append(time.perf_counter() - t0)
  median = statistics.median(times)
  return {"method": method, "shape": shape, "batch_size": batch_size,
          "input_length": input_length, "target_length": target_length,
          "prompt_length": prompt_length, "dropout_rate": dropout_rate,
          "step_sec_median": median, "examples_per_sec": batch_size / median,
          "first_step_sec": first, "flops_per_step": flops,
          "achieved_flops_per_sec": flops / median,
          "mfu": flops / median / peak_flops if peak_flops else None,
          "trainable_params": int(sum(p.numel() for p in trainable)),
          "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
          "peft": peft.__version__, "final_loss": loss,
          "peak_host_memory_bytes": bench_worker.peak_host_memory_bytes(),
          "malloc": runtime.applied()}


def main(argv: Sequence[str]) -> int:
  parser = bench_worker.parser("benchmarks.peers.peft_train", __doc__.splitlines()[0],
                               "JSON of transformers.T5Config shape fields")
  parser.add_argument("--method", choices=PEFT_METHODS, required=True)
  parser.add_argument("--peak_flops", type=float, default=None,
                      help="FLOP/s of the matmul peak measured by benchmarks (for the MFU)")
  args, shape = bench_worker.parse(parser, argv, "benchmarks.peers.peft_train.hf_shape")
  row = bench_peft(args.method, shape, args.batch_size, args.input_length, args.target_length,
                   args.prompt_length, args.dropout_rate, args.steps, args.warmup,
                   peak_flops=args.peak_flops)
  print(json.dumps(row), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(bench_worker.run(main, "benchmarks.peers.peft_train"))
