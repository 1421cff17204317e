"""`python -m benchmarks.prefix_cache`: a request's prefill from a prompt's cached KV prefix
against prefilling the prompt too, on a decoder-only shape.

  python -m benchmarks.prefix_cache --model=llama_3_2_1b --num_layers=2 --prompt_length=100 \
      --input_length=60 --json=prefix_cache.json

A random `DecoderLM` of `--model`'s shape at `--num_layers` layers serves one Prompt Tuning
prompt of `--prompt_length` on inputs of `--input_length` ids (the prefill's length bucket:
the next power of two), through the continuous engine's compiled prefill
(`spot_jax.serve.model.slots.prefill`): "cached" starts from the prompt's head
(`compute_head(cached=True)`: its keys and values and BOS'), "prompt" runs prompt, BOS and
input. Both choose the same first token with log-probabilities within 1e-5 (checked before
timing). Reported: XLA's FLOPs of each compiled prefill, the median milliseconds per prefill
over --repeats, and their ratio.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, decoder_train_step
from spot_jax import cli, validate
from spot_jax.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
  p = cli.ArgumentParser(prog="benchmarks.prefix_cache", description=__doc__.splitlines()[0])
  p.add_argument("--model", default="llama_3_2_1b")
  p.add_argument("--num_layers", type=int, default=2)
  p.add_argument("--prompt_length", type=int, default=100)
  p.add_argument("--input_length", type=int, default=60)
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default=None)
  p.add_argument("--markdown", default=None)
  return p


def _setup(args):
  from spot_jax.backbones.decoder.network import DecoderLM  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.catalog.table import PromptTable, ServedPrompt  # pylint: disable=g-import-not-at-top
  config = decoder_train_step.reduced_config(args.model, args.num_layers)
  model = DecoderLM(config)
  init = jax.jit(lambda: model.init(jax.random.PRNGKey(args.seed), jnp.ones((1, 2), jnp.int32)))
  params = jax.tree.map(lambda v: getattr(v, "value", v), init()["params"],
                        is_leaf=lambda v: hasattr(v, "value"))
  rs = np.random.RandomState(args.seed + 1)
  prompt = rs.uniform(-0.5, 0.5, (args.prompt_length, config.emb_dim)).astype(np.float32)
  table = PromptTable([ServedPrompt("pt", prompt)], config.emb_dim)
  return config, model, params, jax.device_put(table.arrays)


def run(args) -> dict:
  """The benchmark's result: {"cached_ms", "prompt_ms", "speedup", ...}."""
  from spot_jax.serve.model import slots  # pylint: disable=g-import-not-at-top
  config, model, params, arrays = _setup(args)
  width = 1 << (args.input_length - 1).bit_length()
  rs = np.random.RandomState(args.seed + 2)
  tokens = np.zeros((1, width), np.int32)
  tokens[0, :args.input_length] = rs.randint(3, min(config.vocab_size, 30000), args.input_length)
  valid = np.arange(width)[None] < args.input_length
  greedy = slots.Sampling(np.zeros(1, np.float32), np.zeros(1, np.int32), np.ones(1, np.float32),
                          np.zeros(1, np.uint32), np.zeros(1, np.int32), np.zeros(1, np.int32))
  index = np.zeros(1, np.int32)
  length = 2 * (args.prompt_length + 1) + width + 8
  times, chosen, flops = {}, {}, {}
  for cached in (True, False):
    head = slots.compute_head(model, params, arrays, index, placement="prefix", cached=cached)
    flops[cached] = common.xla_flops(slots.prefill.lower(
        model, params, arrays, index, tokens, valid, head, greedy, length=length,
        placement="prefix", cached=cached).compile())
    seconds = []
    for i in range(args.repeats + 1):  # the first compiles
      start = time.perf_counter()
      _, out = slots.prefill(model, params, arrays, index, tokens, valid, head, greedy,
                             length=length, placement="prefix", cached=cached)
      out = jax.device_get(out)
      if i:
        seconds.append(time.perf_counter() - start)
    times[cached], chosen[cached] = statistics.median(seconds) * 1e3, out
  if (int(chosen[True].token[0]) != int(chosen[False].token[0]) or not np.allclose(
      chosen[True].top_logprobs, chosen[False].top_logprobs, atol=1e-5)):
    raise ConfigError("the cached prefix's prefill and the prompt's differ; the benchmark "
                      "would compare different computations")
  return {"model": args.model, "num_layers": config.num_layers,
          "prompt_length": args.prompt_length, "input_length": args.input_length,
          "bucket": width, "cached_ms": times[True], "prompt_ms": times[False],
          "speedup": times[False] / times[True], "cached_gflops": (flops[True] or 0) / 1e9,
          "prompt_gflops": (flops[False] or 0) / 1e9, "device": jax.devices()[0].device_kind}


def main(argv: Sequence[str]) -> int:
  args = _parser().parse_args(argv)
  for flag in ("num_layers", "prompt_length", "input_length", "repeats"):
    validate.positive_int(getattr(args, flag), f"--{flag}")
  files = common.output_files(args)
  result = run(args)
  line = (f"| {result['model']} x{result['num_layers']} | {args.prompt_length} | "
          f"{args.input_length} | {result['prompt_gflops']:.2f} / {result['prompt_ms']:.0f} | "
          f"{result['cached_gflops']:.2f} / {result['cached_ms']:.0f} | "
          f"{result['speedup']:.2f}x |")
  markdown = ("| model | prompt | input | with prompt (GFLOP / ms) | from cached prefix (GFLOP / "
              "ms) | speed-up |\n| --- | --- | --- | --- | --- | --- |\n" + line + "\n")
  print(markdown, end="")
  common.write_outputs(files, result, markdown)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "benchmarks.prefix_cache"))
