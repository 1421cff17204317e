"""`python -m benchmarks.serve_load`: open-loop load on `python -m spot_jax.serve`'s decoder
serving, as an LLM server is measured: tokens/s, time to first token, inter-token latency.

  python -m benchmarks.serve_load --rates=0.5,1,2,4 --out=/tmp/serve_load
  python -m benchmarks.serve_load --models=toy,llama_3_2_1b --rates='toy=4,16;llama_3_2_1b=1' \
      --engines='toy=continuous,batch,peft;llama_3_2_1b=continuous,batch' \
      --requests='toy=64;llama_3_2_1b=16' --out=/tmp/sl

Each of --models (`toy`: `decoder_toy`, Llama-style, width 128; or a decoder config name such
as llama_3_2_1b at --num_layers layers, its full width and vocabulary; random weights unless
--weights=trained, toy only) serves --num_prompts Prompt Tuning prompts (rows of its embedding
table, --prompt_length tokens each). Per arrival rate, --requests requests arrive as a Poisson
process (open loop: a request is sent at its arrival time whatever the server's backlog), each
naming a prompt drawn uniformly, a short input, and max_tokens drawn uniformly from
--min_tokens..--max_tokens. Engines, each its own server process on loopback:
  continuous  `--engine=continuous` (iteration-level scheduling over --slots, --decode_steps
              steps per compiled call when given, else the server's default; streamed: time to
              first token and inter-token gaps are the stream's, between chunks); run when the
              server has it
  batch       the dynamic batcher (one compiled decoding call per batch, --target_length steps;
              the answer comes whole, so time to first token is the request's latency)
  peft        PyTorch + PEFT behind the same HTTP front, one request at a time,
              `generate(use_cache=False)` (its correct path, `benchmarks.peers.peft_http`);
              as it serves one request at a time, at --peft_rates with --peft_requests
--engines, --rates, --requests and --peft_requests take one list for every model, or MODEL=list
groups joined by ';'; --seconds=S sends rate x S requests per run instead. With
--half_saturation, continuous runs once more at half the arrival rate that saturated it.
The goals, per model: continuous's highest tokens/s at a p99 time to first token no higher
than each batch row's, over that row's (>= 2); the half-saturation p99 over a request's alone
(<= 3). Writes OUT/results.json, OUT/serve_load.md (rows and goals) and OUT/serve_load.png
(p99 time to first token against tokens/s). The load generator shares the CPU with the server.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from benchmarks import serve_http
from spot_jax import embedded

ENGINES = ("continuous", "batch", "peft")
WORDS = ("the film was good bad long short plot actor scene story music great dull never again "
         "fine acting funny sad slow fast ending we liked it not at all a very").split()
INPUT = 32


def model_config(name: str, num_layers: int) -> Any:
  """`toy`'s DecoderConfig, or the named decoder config at `num_layers` layers."""
  from spot_jax.embedded import decoder_config  # pylint: disable=g-import-not-at-top
  if name == "toy":
    return decoder_config.toy_config()
  from benchmarks.decoder_train_step import reduced_config  # pylint: disable=g-import-not-at-top
  return reduced_config(name, num_layers)


def setup(work: str, num_prompts: int, prompt_length: int, weights: str, config: Any) -> None:
  """work/p<i>/: a run directory per prompt (run.json names the toy decoder's config, its
  weights and vocabulary, so the server needs no --model) and work/adapters/p<i>/: the same
  prompt as a PEFT CAUSAL_LM adapter on work/hf (the same weights). `weights`: "random" (seed
  0: a random model seldom ends early, so answers run to max_tokens) or "trained" (the shipped
  checkpoint, whose answers end at EOS after about ten tokens)."""
  # pylint: disable=g-import-not-at-top
  from spot_jax import backbone as backbone_lib, vocabulary
  from spot_jax.backbones import kinds
  from spot_jax.backbones.decoder.checkpoints import huggingface
  from spot_jax.run_dir import RunDir, RunRecord
  from spot_jax.serve.catalog import served_backbone
  from spot_jax.serve.catalog.served_backbone import ServedBackbone
  from spot_jax.serve.export import peft_causal
  checkpoint = embedded.DECODER_CHECKPOINT_PATH if weights == "trained" else None
  if checkpoint:
    params = kinds.load_checkpoint("decoder", checkpoint, config)
    os.symlink(checkpoint, os.path.join(work, "hf"))
  else:  # the server's own random backbone of seed 0, written for PyTorch
    served = ServedBackbone(config, None, 0, "serve_load")
    params = jax.tree.map(np.asarray, served_backbone.load_params(served)[0])
    huggingface.save_hf_dir(os.path.join(work, "hf"), config, params)
  table = np.asarray(params["token_embedder"]["embedding"], np.float32)
  backbone = backbone_lib.record(config, checkpoint, 0, vocabulary.get(embedded.DECODER_VOCAB_PATH))
  rs = np.random.RandomState(0)
  for i in range(num_prompts):
    prompt = table[rs.randint(3, 170, prompt_length)]
    run = RunDir(os.path.join(work, f"p{i}"))
    os.makedirs(os.path.join(run.path, "prompts"), exist_ok=True)
    np.save(os.path.join(run.path, "prompts", "prompt_best.npy"), prompt)
    run.write_record(RunRecord(task="serve_load", seed=0, method={"class": "PromptTuning"},
                               backbone=backbone, train_steps=1, finished=True))
    peft_causal.export_prompt_adapter(prompt, config, os.path.join(work, "adapters", f"p{i}"),
                                      base_model_name_or_path=os.path.join(work, "hf"))
    np.save(os.path.join(work, f"p{i}.npy"), prompt)  # the PEFT peer's listing


def command(engine: str, work: str, args) -> list[str]:
  most = max(count(args, m, r, peft) for m in args.models for r in for_model(args.rates, m)
             for peft in (False, True))  # the longest run's requests
  common = [f"--input_length={INPUT}", f"--target_length={args.max_tokens}", "--port=0",
            f"--max_queue={4 * most}"]
  if engine == "peft":
    return [sys.executable, "-m", "benchmarks.peers.peft_http", "--kind=decoder",
            f"--work_dir={work}", f"--vocab={embedded.DECODER_VOCAB_PATH}",
            "--max_batch_size=1", "--max_wait_ms=0", *common]
  steps = [] if args.decode_steps is None else [f"--decode_steps={args.decode_steps}"]
  steps += [] if args.prefill_device is None else [f"--prefill_device={args.prefill_device}"]
  extra = (["--engine=continuous", f"--slots={args.slots}", *steps] if engine == "continuous"
           else [f"--max_batch_size={args.max_batch_size}", f"--max_wait_ms={args.max_wait_ms}"])
  return [sys.executable, "-m", "spot_jax.serve", f"--vocab={embedded.DECODER_VOCAB_PATH}",
          *extra, *common, f"--length_buckets={args.length_buckets}",
          f"--table_rows={args.num_prompts}", "--compilation_cache_dir=none",
          *(f"--prompt=p{i}={work}/p{i}" for i in range(args.num_prompts))]


def has_continuous(tree: Optional[str]) -> bool:
  """Whether the server (of `tree`, else this checkout) has the continuous engine."""
  env = dict(os.environ, **({"PYTHONPATH": os.path.abspath(tree)} if tree else {}))
  out = subprocess.run([sys.executable, "-m", "spot_jax.serve", "--help"], capture_output=True,
                       text=True, timeout=300, check=False, env=env,
                       cwd=tree and os.path.abspath(tree)).stdout
  return "--engine" in out


def requests(rs, count: int, rate: float, num_prompts: int, low: int, high: int) -> list[dict]:
  """`count` requests: Poisson arrival times at `rate`/s (exponential gaps, the first at its
  gap), a prompt drawn uniformly, an input of 3 to 8 words, max_tokens uniform in [low, high]."""
  gaps = rs.exponential(1.0 / rate, count)
  return [{"at": float(t), "model": f"p{rs.randint(num_prompts)}",
           "prompt": " ".join(rs.choice(WORDS, rs.randint(3, 9))),
           "max_tokens": int(rs.randint(low, high + 1))} for t in np.cumsum(gaps)]


def send(url: str, req: dict, stream: bool, start: float) -> dict:
  """One request at its arrival time; (ttft, token gaps, tokens, latency, error) seconds."""
  delay = start + req["at"] - time.perf_counter()
  if delay > 0:
    time.sleep(delay)
  part = urllib.parse.urlsplit(url)
  body = {k: req[k] for k in ("model", "prompt", "max_tokens")} | {"temperature": 0.0}
  if stream:  # a chunk may carry several tokens: the usage counts them
    body |= {"stream": True, "stream_options": {"include_usage": True}}
  t0 = time.perf_counter()
  out = {"ttft": None, "gaps": [], "tokens": 0, "latency": None, "error": ""}
  try:
    conn = http.client.HTTPConnection(part.hostname, part.port, timeout=900)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
      out["error"] = f"HTTP {resp.status}: {resp.read()[:120]!r}"
      return out
    if not stream:
      answer = json.loads(resp.read())
      out["ttft"] = out["latency"] = time.perf_counter() - t0
      out["tokens"] = int(answer["usage"]["completion_tokens"])
      return out
    last = None
    for line in resp:
      line = line.strip()
      if not line.startswith(b"data:") or line == b"data: [DONE]":
        continue
      chunk, now = json.loads(line[5:]), time.perf_counter()
      if chunk.get("usage"):
        out["tokens"] = int(chunk["usage"]["completion_tokens"])
      if not chunk.get("choices"):
        continue
      if last is None:
        out["ttft"] = now - t0
      else:
        out["gaps"].append(now - last)
      last = now
    out["latency"] = time.perf_counter() - t0
    out["tokens"] = out["tokens"] or len(out["gaps"]) + (last is not None)
  except Exception as e:  # pylint: disable=broad-except  (counted as a failure, by kind)
    out["error"] = type(e).__name__
  return out


def drive(url: str, reqs: Sequence[dict], stream: bool) -> dict:
  """Each request on a thread of its own, started at its arrival time (live threads are the
  requests in flight: the client's own start-up does not delay the first ones); the figures."""
  results: list = [None] * len(reqs)
  threads = []
  start = time.perf_counter() + 0.05
  for i, req in enumerate(reqs):
    delay = start + req["at"] - time.perf_counter()
    if delay > 0:
      time.sleep(delay)
    threads.append(threading.Thread(target=lambda i=i: results.__setitem__(
        i, send(url, reqs[i], stream, start))))
    threads[-1].start()
  for t in threads:
    t.join()
  return summarize(results, time.perf_counter() - start)


def summarize(results: Sequence[dict], seconds: float) -> dict:
  """tokens/s over the run, p50/p99 time to first token and inter-token gap (ms), failures."""
  good = [r for r in results if not r["error"]]
  pct = lambda xs, q: round(1000 * float(np.percentile(xs, q)), 1) if len(xs) else None
  ttft = [r["ttft"] for r in good]
  gaps = [g for r in good for g in r["gaps"]]
  return {"requests": len(results), "failures": len(results) - len(good),
          "errors": sorted({r["error"] for r in results if r["error"]})[:3],
          "seconds": round(seconds, 2),
          "tokens_per_s": round(sum(r["tokens"] for r in good) / seconds, 1),
          "tokens_per_request": round(sum(r["tokens"] for r in good) / max(len(good), 1), 1),
          "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
          "itl_p50_ms": pct(gaps, 50), "itl_p99_ms": pct(gaps, 99)}


def serve(engine: str, work: str, args, log: str):
  """Starts a server (its log in a file, never a pipe nobody reads); (process, URL). The
  continuous engine runs from --continuous_tree when given (another checkout's spot_jax: run
  there, since `python -m` puts the working directory first on the path)."""
  tree = args.continuous_tree if engine == "continuous" else None
  env = dict(os.environ, **({"PYTHONPATH": os.path.abspath(tree)} if tree else {}))
  return serve_http.start(command(engine, work, args), log, env=env,
                          cwd=tree and os.path.abspath(tree))


def alone(url: str, stream: bool, args, rs, count: int = 3) -> float:
  """TTFT (ms) of one request alone (median of `count`, after a warm-up), at --max_tokens/2."""
  reqs = requests(rs, count + 1, 1000.0, args.num_prompts, args.max_tokens // 2,
                  args.max_tokens // 2)
  got = [send(url, dict(r, at=0.0), stream, time.perf_counter()) for r in reqs]
  return round(1000 * float(np.median([g["ttft"] for g in got[1:] if g["ttft"]] or [np.nan])), 1)


def count(args, model: str, rate: float, peft: bool) -> int:
  """Requests of one run: --requests (--peft_requests), or rate x --seconds when given."""
  if peft:
    return for_model(args.peft_requests, model)[0]
  if args.seconds:
    return max(16, int(round(rate * args.seconds)))
  return for_model(args.requests, model)[0]


def run_engine(engine: str, work: str, model: str, args) -> list[dict]:
  """One server: its rows at each rate, then (continuous, --half_saturation) one at half the
  arrival rate that saturated it (its highest tokens/s over the tokens a request got)."""
  proc, url = serve(engine, work, args, os.path.join(args.out, f"{model}.{engine}.log"))
  rows = []
  peft = engine == "peft"
  try:
    stream = engine == "continuous"
    rs = np.random.RandomState(args.seed)
    single = alone(url, stream, args, rs, 9 if stream else 3)  # whole answers take long

    def run(rate: float, load: str = "") -> None:
      reqs = requests(np.random.RandomState(args.seed + 1), count(args, model, rate, peft), rate,
                      args.num_prompts, args.min_tokens, args.max_tokens)
      rows.append({"engine": engine, "rate": rate, "load": load, "model": model,
                   "ttft_alone_ms": single, **drive(url, reqs, stream)})
      print(json.dumps(rows[-1]), flush=True)

    rates = for_model(args.rates, model)
    for rate in (args.peft_rates or [min(rates)]) if peft else rates:
      run(rate)
    if stream and args.half_saturation:
      top = max(rows, key=lambda r: r["tokens_per_s"])
      run(round(top["tokens_per_s"] / top["tokens_per_request"] / 2, 1), "half")
  finally:
    proc.terminate()
    proc.wait(timeout=60)
  return rows


def goals(rows: Sequence[dict]) -> list[dict]:
  """Per model, continuous against batch: for each batch row, continuous's highest tokens/s at
  a p99 time to first token no higher than the batch row's (its ratio: goal >= 2), and the p99
  time to first token of continuous's half-saturation row over a request's alone (goal <= 3)."""
  out = []
  for model in dict.fromkeys(r["model"] for r in rows):
    mine = [r for r in rows if r["model"] == model and not r["failures"]]
    cont = [r for r in mine if r["engine"] == "continuous"]
    for b in (r for r in mine if r["engine"] == "batch"):
      fit = [c["tokens_per_s"] for c in cont if c["ttft_p99_ms"] <= b["ttft_p99_ms"]]
      if fit:
        out.append({"model": model, "goal": "throughput at equal p99 TTFT", "batch_rate": b["rate"],
                    "ttft_p99_ms": b["ttft_p99_ms"], "batch": b["tokens_per_s"],
                    "continuous": max(fit), "ratio": round(max(fit) / b["tokens_per_s"], 2)})
    for h in (r for r in cont if r["load"] == "half"):
      out.append({"model": model, "goal": "p99 TTFT at half saturation / alone", "rate": h["rate"],
                  "ttft_p99_ms": h["ttft_p99_ms"], "alone_ms": h["ttft_alone_ms"],
                  "ratio": round(h["ttft_p99_ms"] / h["ttft_alone_ms"], 2)})
  return out


def markdown(rows: Sequence[dict], met: Sequence[dict] = ()) -> str:
  cols = ("engine", "rate", "model", "tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
          "itl_p99_ms", "ttft_alone_ms", "failures")
  head = ("| engine | arrivals/s | model | tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms "
          "| ITL p99 ms | TTFT alone ms | failures |")
  lines = [head, "|" + " --- |" * len(cols)]
  for r in rows:
    cells = ["—" if r[c] is None else str(r[c]) for c in cols]
    cells[1] += " (half saturation)" if r.get("load") == "half" else ""
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", "| model | goal | at | continuous | batch or alone | ratio |",
            "| --- | --- | --- | --- | --- | --- |"] if met else []
  for g in met:
    if "batch" in g:
      lines.append(f"| {g['model']} | tokens/s at p99 TTFT <= batch's (>= 2x) | "
                   f"{g['ttft_p99_ms']} ms | {g['continuous']} | {g['batch']} | {g['ratio']} |")
    else:
      lines.append(f"| {g['model']} | p99 TTFT at half saturation / alone (<= 3x) | "
                   f"{g['rate']}/s | {g['ttft_p99_ms']} ms | {g['alone_ms']} ms | {g['ratio']} |")
  return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
  for arm in dict.fromkeys((r["model"], r["engine"]) for r in rows):
    got = sorted((r for r in rows if (r["model"], r["engine"]) == arm
                  and r["ttft_p99_ms"] is not None), key=lambda r: r["rate"])  # half load too
    ax.plot([r["tokens_per_s"] for r in got], [r["ttft_p99_ms"] for r in got], "o-",
            label=" ".join(arm))
  ax.set_xscale("log")
  ax.set_xlabel("tokens/s")
  ax.set_ylabel("p99 time to first token (ms)")
  ax.set_yscale("log")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def per_model(text: str, cast: Callable) -> dict:
  """"1,2" -> {None: [1, 2]} (every model); "toy=1,2;llama_3_2_1b=3" -> by model."""
  if "=" not in text:
    return {None: [cast(x) for x in text.split(",")]}
  groups = (g.split("=", 1) for g in text.split(";") if g)
  return {m.strip(): [cast(x) for x in v.split(",")] for m, v in groups}


def for_model(values: dict, model: str) -> list:
  """`per_model`'s values of `model` (else those for every model; KeyError: none)."""
  return values[model] if model in values else values[None]


def parse(argv: Sequence[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="benchmarks.serve_load", description=__doc__.splitlines()[0])
  a = p.add_argument
  a("--engines", default=",".join(ENGINES), help="of " + ", ".join(ENGINES) + "; per model as "
    "--rates")
  a("--models", default="toy", help="toy, or decoder config names (e.g. llama_3_2_1b) run at "
    "--num_layers layers")
  a("--num_layers", type=int, default=2, help="the depth of the named (non-toy) models")
  a("--rates", default="0.5,1,2,4", help="arrivals per second, one run each; per model: "
    "'toy=4,16;llama_3_2_1b=1,2'")
  a("--requests", default="64", help="requests per run; per model as --rates")
  a("--seconds", type=float, default=None, help="instead of --requests: rate x SECONDS requests "
    "per run (at least 16), so that every rate runs about as long")
  a("--half_saturation", action="store_true", help="after its rates, run continuous once more "
    "at half the arrival rate that saturated it (the TTFT goal's load)")
  a("--peft_rates", default=None, help="the peft engine's rates (default: the lowest of --rates)")
  a("--peft_requests", default="16", help="requests per peft run (one at a time); per model "
    "as --rates")
  a("--num_prompts", type=int, default=64)
  a("--prompt_length", type=int, default=20)
  a("--min_tokens", type=int, default=8)
  a("--max_tokens", type=int, default=128)
  a("--max_batch_size", type=int, default=8)
  a("--length_buckets", default=f"16,{INPUT}", help="both servers' padded input lengths")
  a("--max_wait_ms", type=float, default=10.0)
  a("--slots", type=int, default=8)
  a("--decode_steps", type=int, default=None, help="the continuous engine's decode steps per "
    "compiled call (default: the server's)")
  a("--prefill_device", default=None, help="the continuous server's --prefill_device (default: "
    "the server's, auto: prefills beside the decode calls on a second host device)")
  a("--seed", type=int, default=0)
  a("--weights", default="random", choices=("random", "trained"), help="the toy decoder's "
    "random weights (answers run to max_tokens) or its shipped checkpoint (they end at EOS)")
  a("--continuous_tree", default=None, help="a checkout whose spot_jax.serve has --engine "
    "(default: this one)")
  a("--out", required=True, help="folder of results.json, serve_load.md, serve_load.png")
  args = p.parse_args(argv)
  try:
    args.rates = per_model(args.rates, float)
    args.requests = per_model(args.requests, int)
    args.peft_requests = per_model(args.peft_requests, int)
  except ValueError:
    p.error("--rates and --*requests: numbers, or MODEL=numbers groups joined by ';'")
  args.peft_rates = [float(r) for r in args.peft_rates.split(",")] if args.peft_rates else None
  args.models = [m for m in args.models.split(",") if m]
  args.engines = per_model(args.engines, str)
  unknown = [e for v in args.engines.values() for e in v if e not in ENGINES]
  missing = [m for m in args.models
             for v in (args.rates, args.requests, args.peft_requests, args.engines)
             if m not in v and None not in v]
  if missing:
    p.error(f"--engines, --rates and --*requests need values for "
            f"{', '.join(sorted(set(missing)))}")
  lowest = min(min(r) for r in args.rates.values())
  if args.decode_steps is not None and args.decode_steps < 1:
    p.error(f"--decode_steps={args.decode_steps}: give a positive integer")
  if unknown or not 1 <= args.min_tokens <= args.max_tokens or lowest <= 0:
    p.error(f"--engines of {', '.join(ENGINES)}; 1 <= --min_tokens <= --max_tokens; rates > 0")
  if args.weights == "trained" and args.models != ["toy"]:
    p.error("--weights=trained: only the toy model has a shipped checkpoint; give --models=toy")
  return args


def main(argv: Sequence[str], work: Optional[str] = None) -> int:
  args = parse(argv)
  os.makedirs(args.out, exist_ok=True)
  wanted = {e for v in args.engines.values() for e in v}
  skipped = (["continuous"] if "continuous" in wanted and not has_continuous(args.continuous_tree)
             else [])
  if skipped:
    print(f"skipped (not in this tree): {', '.join(skipped)}", flush=True)
  rows = []
  for model in args.models:
    config = model_config(model, args.num_layers)
    with tempfile.TemporaryDirectory() as tmp:
      where = os.path.join(work, model) if work else tmp
      os.makedirs(where, exist_ok=True)
      setup(where, args.num_prompts, args.prompt_length, args.weights, config)
      engines = [e for e in for_model(args.engines, model) if e not in skipped]
      rows += [row for engine in engines for row in run_engine(engine, where, model, args)]
  met = goals(rows)
  with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
    json.dump({"argv": list(argv), "skipped": skipped, "rows": rows, "goals": met}, f, indent=1)
  with open(os.path.join(args.out, "serve_load.md"), "w", encoding="utf-8") as f:
    f.write(markdown(rows, met))
  plot(rows, os.path.join(args.out, "serve_load.png"))
  print(markdown(rows, met))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
