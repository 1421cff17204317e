"""`python -m benchmarks.peers.peft_decoder_train`: the PyTorch + PEFT peer of
`benchmarks.decoder_train_step`.

Run by `python -m benchmarks.decoder_train_step --vs=peft` in its own process (torch and JAX
never share one), with a work directory holding `hf_config.json` (`hf.config_to_hf` of the
parent's reduced `DecoderConfig`). It builds that transformers model with random weights
(torch seed `--seed`; `--weight_std` > 0 redraws every weight from N(0, std^2), for a parity
check whose logits are not near-uniform), wraps it with PEFT prompt tuning
(`PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=L)`, PEFT's own random init) and
writes both to the work directory before timing anything:

  weights.safetensors   the model's state dict (a tied `lm_head.weight` left out)
  prompt.npy            PEFT's initial prompt [L, E]

so the parent's spot-jax step starts from the same weights and prompt. Then it times AdamW
steps on `token_batch`'s tokens: the model reads [BOS, sequence[:-1]] after the prompt; the loss
is the mean cross-entropy of the target tokens (the last `--target_length` of each row), read
from the logits after the prompt's positions, as spot-jax's `DecoderOnlyModel` counts it.
torch runs on `--threads` threads (default: every core, as XLA). Prints one JSON row.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Sequence

import numpy as np

from benchmarks.peers import worker as bench_worker
from spot_jax import cli, runtime

FIRST_ID = 3  # ids 0-2: padding, BOS/EOS of the tiny models


def token_batch(vocab_size: int, batch_size: int, input_length: int, target_length: int,
                seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(sequence [B, T + S] int32 of random ids >= 3, loss weights [B, T + S] int32: 1 on the
  last S positions); both sides of the benchmark read this batch."""
  rs = np.random.RandomState(seed)
  sequence = rs.randint(FIRST_ID, vocab_size, (batch_size, input_length + target_length))
  weights = np.zeros_like(sequence)
  weights[:, input_length:] = 1
  return sequence.astype(np.int32), weights.astype(np.int32)


def build(work_dir: str, prompt_length: int, seed: int, weight_std: float):
  """The PEFT model on a random transformers model of `hf_config.json`; writes its weights and
  initial prompt to `work_dir`."""
  import peft  # pylint: disable=import-outside-toplevel
  import safetensors.torch  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  with open(os.path.join(work_dir, "hf_config.json"), encoding="utf-8") as f:
    fields = json.load(f)
  torch.manual_seed(seed)
  config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
  base = transformers.AutoModelForCausalLM.from_config(config)
  if weight_std > 0:
    with torch.no_grad():
      for param in base.parameters():
        param.normal_(0.0, weight_std)
  state = {k: v.contiguous() for k, v in base.state_dict().items()
           if not (k == "lm_head.weight" and config.tie_word_embeddings)}
  safetensors.torch.save_file(state, os.path.join(work_dir, "weights.safetensors"))
  model = peft.get_peft_model(base, peft.PromptTuningConfig(task_type="CAUSAL_LM",
                                                            num_virtual_tokens=prompt_length))
  prompt = model.prompt_encoder["default"].embedding.weight.detach().numpy()
  np.save(os.path.join(work_dir, "prompt.npy"), prompt.astype(np.float32))
  return model, config


def bench(work_dir: str, *, batch_size: int, input_length: int, target_length: int,
          prompt_length: int, steps: int, warmup: int, learning_rate: float,
          weight_decay: float, seed: int, weight_std: float, threads: int) -> dict:
  """Times `steps` AdamW steps of PEFT prompt tuning (after the first and `warmup` more)."""
  import peft  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(threads)
  model, config = build(work_dir, prompt_length, seed, weight_std)
  model.train()
  trainable = [p for p in model.parameters() if p.requires_grad]
  opt = torch.optim.AdamW(trainable, lr=learning_rate, weight_decay=weight_decay, eps=1e-8)
  sequence, weights = token_batch(config.vocab_size, batch_size, input_length, target_length,
                                  seed)
  bos = np.full((batch_size, 1), config.bos_token_id, np.int64)
  ids = torch.from_numpy(np.concatenate([bos, sequence[:, :-1]], axis=1).astype(np.int64))
  mask = torch.ones_like(ids)
  picked = torch.from_numpy(weights.astype(bool))
  targets = torch.from_numpy(sequence.astype(np.int64))[picked]

  def step() -> float:
    opt.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, prompt_length:]
    loss = torch.nn.functional.cross_entropy(logits[picked].float(), targets)
    loss.backward()
    opt.step()
    return float(loss)

  t0 = time.perf_counter()
  first_loss = step()
  first = time.perf_counter() - t0
  for _ in range(warmup):
    step()
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    loss = step()
    times.append(time.perf_counter() - t0)
  median = statistics.median(times)
  return {"framework": "PyTorch + PEFT", "model_type": config.model_type,
          "attn_implementation": config._attn_implementation,  # pylint: disable=protected-access
          "step_sec_all": times, "step_sec_median": median, "steps_per_sec": 1.0 / median,
          "step_sec_min": min(times), "step_sec_max": max(times),
          "first_step_sec": first, "first_loss": first_loss, "final_loss": loss,
          "trainable_params": int(sum(p.numel() for p in trainable)),
          "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
          "transformers": transformers.__version__, "peft": peft.__version__,
          "peak_host_memory_bytes": bench_worker.peak_host_memory_bytes(),
          "load_average_1min": os.getloadavg()[0], "malloc": runtime.applied()}


def main(argv: Sequence[str]) -> int:
  p = cli.ArgumentParser(prog="benchmarks.peers.peft_decoder_train",
                         description=__doc__.splitlines()[0])
  p.add_argument("--work_dir", required=True, help="holds hf_config.json; weights go here")
  p.add_argument("--batch_size", type=int, default=8)
  p.add_argument("--input_length", type=int, default=112)
  p.add_argument("--target_length", type=int, default=16)
  p.add_argument("--prompt_length", type=int, default=100)
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--warmup", type=int, default=1)
  p.add_argument("--learning_rate", type=float, default=0.01)
  p.add_argument("--weight_decay", type=float, default=0.01)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--weight_std", type=float, default=0.0)
  p.add_argument("--threads", type=int, default=os.cpu_count())
  args = p.parse_args(argv)
  row = bench(args.work_dir, batch_size=args.batch_size, input_length=args.input_length,
              target_length=args.target_length, prompt_length=args.prompt_length,
              steps=args.steps, warmup=args.warmup, learning_rate=args.learning_rate,
              weight_decay=args.weight_decay, seed=args.seed, weight_std=args.weight_std,
              threads=args.threads)
  print(json.dumps(row), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(bench_worker.run(main, "benchmarks.peers.peft_decoder_train"))
