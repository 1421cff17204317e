"""`python -m benchmarks.serve_http`: load test of `python -m spot_jax.serve` over loopback.

  python -m benchmarks.serve_http --shapes=toy,small --markdown=serve_http.md
  python -m benchmarks.serve_http --shapes=toy --soak=600          # RSS growth, failures

64 prompts (rows of the embedding table, 20 tokens each) on one frozen T5 of each shape (`toy`:
the embedded toy T5; `small`: a random T5 of T5-small's shape), short inputs (3 to 8 words),
8 greedy tokens each, the request's prompt drawn uniformly. Three servers in turn, each in its
own process:
  dynamic  spot-jax batching any prompts together (--max_batch_size, --max_wait_ms);
  one      spot-jax one request at a time (max batch 1, no wait);
  peft     PyTorch + PEFT behind the same HTTP front (`benchmarks.peers.peft_http`): the same
           batching loop, each batch served one adapter group at a time.
Loads: `saturated` (--clients clients sending back to back: the highest throughput), Poisson
arrivals at fractions of dynamic's saturated rate (open loop, bounded by --max_in_flight), and
`1 client` (one request at a time: the unloaded latency). Rows: requests/s, p50/p99 latency,
mean rows per forward pass (the server's metrics), the server's peak RSS, failures. The goals,
as ratios of one run: dynamic's saturated throughput >= 2x one's and >= 3x peft's; dynamic's
p99 at half its saturated rate <= 2x one's unloaded p50. The load generator shares the CPU.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

import numpy as np

from spot_jax import embedded

WORDS = ("the film was good bad long short plot actor scene story music great dull never again "
         "fine acting funny sad slow fast ending we liked it not at all a very").split()
SHAPES = {"toy": embedded.CONFIG_NAME, "small": "t5_1_1_small_like"}
PROMPT_LENGTH, TARGET, INPUT = 20, 8, 32


def setup(work: str, shape: str, num_prompts: int) -> list[str]:
  """The model (a checkpoint for spot-jax, a Hugging Face directory for PEFT) and the prompts
  (.npy files and PEFT adapters) in `work`; the spot-jax server's backbone flags."""
  import jax  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.export import peft_io  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from spot_jax.backbones.t5 import checkpoints, config_by_name, hf_export
  config = config_by_name(SHAPES[shape], dropout_rate=0.0)
  if shape == "toy":
    params = checkpoints.load_checkpoint(embedded.CHECKPOINT_PATH, config)
    flags = [f"--checkpoint={embedded.CHECKPOINT_PATH}"]
  else:
    from benchmarks import serve as serve_bench  # pylint: disable=g-import-not-at-top
    params = jax.tree_util.tree_map(np.asarray, serve_bench.random_backbone(config, 0))
    checkpoints.save_checkpoint(params, os.path.join(work, "ckpt"), format="t5x")
    flags = [f"--checkpoint={work}/ckpt"]
  params = jax.tree_util.tree_map(np.asarray, params)
  hf_export.export_hf(params, config, os.path.join(work, "hf"))
  table = np.asarray(params["token_embedder"]["embedding"])
  rs = np.random.RandomState(0)
  for i in range(num_prompts):
    prompt = table[rs.randint(3, 300, PROMPT_LENGTH)].astype(np.float32)
    np.save(os.path.join(work, f"p{i}.npy"), prompt)
    peft_io.export_adapter(prompt, config, os.path.join(work, "adapters", f"p{i}"),
                           base_model_name_or_path=os.path.join(work, "hf"))
  return [f"--model={SHAPES[shape]}", *flags, f"--vocab={embedded.VOCAB_PATH}"]


def command(system: str, work: str, backbone: Sequence[str], num_prompts: int, args) -> list[str]:
  common = [f"--input_length={INPUT}", f"--target_length={TARGET}", "--port=0",
            f"--max_queue={args.max_in_flight}"]
  if system == "peft":
    return [sys.executable, "-m", "benchmarks.peers.peft_http", f"--work_dir={work}",
            f"--vocab={embedded.VOCAB_PATH}", f"--max_batch_size={args.max_batch_size}",
            f"--max_wait_ms={args.max_wait_ms}", *common]
  batching = ([f"--max_batch_size={args.max_batch_size}", f"--max_wait_ms={args.max_wait_ms}"]
              if system == "dynamic" else ["--max_batch_size=1", "--max_wait_ms=0"])
  return [sys.executable, "-m", "spot_jax.serve", *backbone, *batching, *common,
          f"--length_buckets={INPUT}", f"--table_rows={num_prompts}",
          "--compilation_cache_dir=none",
          *(f"--prompt=p{i}={work}/p{i}.npy" for i in range(num_prompts))]


def start(cmd: Sequence[str], log: str, **popen) -> tuple[subprocess.Popen, str]:
  """Starts a server writing to the file `log` (never a pipe nobody reads); its URL. `popen`:
  further `subprocess.Popen` arguments (env, cwd)."""
  with open(log, "w", encoding="utf-8") as f:
    proc = subprocess.Popen(list(cmd), stdout=f, stderr=subprocess.STDOUT, text=True, **popen)
  while proc.poll() is None:
    with open(log, encoding="utf-8") as f:
      found = re.search(r"listening on (http://\S+)", f.read())
    if found:
      return proc, found.group(1)
    time.sleep(0.2)
  with open(log, encoding="utf-8") as f:
    raise RuntimeError("the server did not start:\n" + f.read()[-3000:])


def status_kib(pid: int, field: str) -> int:
  """VmHWM (peak) or VmRSS of process `pid`, KiB."""
  with open(f"/proc/{pid}/status", encoding="ascii") as f:
    return int(next(l.split()[1] for l in f if l.startswith(field + ":")))


def texts(rs, count: int = 2000) -> list[str]:
  """Inputs of 3 to 8 words that fit the servers' input length in the toy vocabulary's tokens
  (EOS included): a longer one would be refused (400), as it should be."""
  from spot_jax import vocabulary  # pylint: disable=g-import-not-at-top
  vocab = vocabulary.get(embedded.VOCAB_PATH)
  out = [" ".join(rs.choice(WORDS, rs.randint(3, 9))) for _ in range(count)]
  return [t for t in out if len(vocab.encode(t)) < INPUT]


async def _one(session, url: str, name: str, text: str, out: list) -> None:
  t0 = time.perf_counter()
  try:
    async with session.post(url + "/v1/completions", json={"model": name, "prompt": text,
                                                           "max_tokens": TARGET}) as r:
      body = await r.read()
      why = "" if r.status == 200 else f"HTTP {r.status}: {body[:120].decode(errors='replace')}"
  except Exception as e:  # pylint: disable=broad-except  (counted as a failure, by kind)
    why = type(e).__name__
  out.append((time.perf_counter() - t0, why))


async def drive(url: str, seconds: float, rate: Optional[float], clients: int, names, rs,
                max_in_flight: int) -> dict:
  """Requests for `seconds`: Poisson arrivals at `rate`/s, or `clients` back to back (rate
  None). Returns requests/s, latencies, failures. aiohttp's client: httpx's async pool, at 64
  concurrent requests, was the bottleneck (48 requests/s where aiohttp drives 300)."""
  import aiohttp  # pylint: disable=g-import-not-at-top
  pool = texts(rs)
  text = lambda: pool[rs.randint(len(pool))]
  out: list = []
  # Idle connections are dropped after 1 s, before the server's 5 s keep-alive closes them: a
  # request sent on a connection the server is closing would fail as the client's doing.
  connector = aiohttp.TCPConnector(limit=max_in_flight, keepalive_timeout=1)
  timeout = aiohttp.ClientTimeout(total=120)
  async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
    t0 = time.perf_counter()
    if rate is None:
      async def worker():
        while time.perf_counter() - t0 < seconds:
          await _one(session, url, rs.choice(names), text(), out)
      await asyncio.gather(*(worker() for _ in range(clients)))
    else:
      tasks, at = set(), 0.0
      while True:
        at += rs.exponential(1 / rate)
        if at >= seconds:
          break
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
        if len(tasks) < max_in_flight:
          task = asyncio.create_task(_one(session, url, rs.choice(names), text(), out))
          tasks.add(task)
          task.add_done_callback(tasks.discard)
        else:
          out.append((0.0, "client in-flight limit"))
      await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
  good = np.array([t for t, why in out if not why]) * 1000
  failed = collections.Counter(why for _, why in out if why)
  return {"requests_per_s": len(good) / wall, "p50_ms": float(np.percentile(good, 50)),
          "p99_ms": float(np.percentile(good, 99)), "failures": sum(failed.values()),
          "failure_kinds": dict(failed), "requests": len(out)}


def batch_rows(url: str) -> tuple[float, float]:
  import urllib.request  # pylint: disable=g-import-not-at-top
  with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
    text = r.read().decode()
  value = lambda name: sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                           if l.startswith(name + "{"))
  return value("spot_serve_batch_rows_sum"), value("spot_serve_batch_rows_count")


def measure(url: str, label: str, seconds: float, rate, clients: int, names, rs, args) -> dict:
  before = batch_rows(url)
  row = asyncio.run(drive(url, seconds, rate, clients, names, rs, args.max_in_flight))
  after = batch_rows(url)
  row["mean_batch"] = (after[0] - before[0]) / max(after[1] - before[1], 1)
  row["load"] = label
  return row


def run_system(system: str, work: str, backbone, names, args, saturated: Optional[float]
               ) -> list[dict]:
  proc, url = start(command(system, work, backbone, len(names), args),
                    os.path.join(work, f"{system}.log"))
  rs = np.random.RandomState(1)
  rows = []
  try:
    measure(url, "warm-up", 3, None, args.clients, names, rs, args)
    rows.append(measure(url, f"saturated ({args.clients} clients)", args.seconds, None,
                        args.clients, names, rs, args))
    if system == "dynamic":
      saturated = rows[0]["requests_per_s"]
      for frac in args.fractions:
        rows.append(measure(url, f"Poisson {frac:g}x = {frac * saturated:.1f}/s", args.seconds,
                            frac * saturated, 0, names, rs, args))
    if system == "one":
      rows.append(measure(url, "1 client", args.seconds, None, 1, names, rs, args))
  finally:
    peak = status_kib(proc.pid, "VmHWM") / 1024
    proc.terminate()
    proc.wait(120)
  return [{"system": system, **r, "peak_rss_mb": peak} for r in rows]


def goals(rows: Sequence[dict]) -> dict:
  get = lambda system, prefix, key: next(r[key] for r in rows if r["system"] == system
                                         and r["load"].startswith(prefix))
  sat = get("dynamic", "saturated", "requests_per_s")
  half = next((r for r in rows if r["system"] == "dynamic" and r["load"].startswith(
      "Poisson 0.5x")), None)
  out = {"dynamic / one, saturated": sat / get("one", "saturated", "requests_per_s"),
         "dynamic / peft, saturated": sat / get("peft", "saturated", "requests_per_s")}
  if half:
    out["dynamic p99 at 0.5x / one-at-a-time p50"] = half["p99_ms"] / get("one", "1 client",
                                                                          "p50_ms")
  return out


def markdown(shape: str, rows: Sequence[dict], ratios: dict) -> str:
  lines = [f"**{shape}** ({SHAPES[shape]}, 64 prompts x 20 tokens, {TARGET} greedy tokens)", "",
           "| server | load | requests/s | p50 ms | p99 ms | rows/pass | peak RSS MB | failed |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['system']} | {r['load']} | {r['requests_per_s']:.1f} | "
                 f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['mean_batch']:.1f} | "
                 f"{r['peak_rss_mb']:.0f} | {r['failures']} |")
  lines += ["", "; ".join(f"{k}: {v:.2f}" for k, v in ratios.items()), ""]
  return "\n".join(lines)


def soak(work: str, backbone, names, args) -> dict:
  """Half the saturated rate for --soak seconds: RSS after warm-up and at the end, failures."""
  log = os.path.join(work, "soak.log")
  proc, url = start(command("dynamic", work, backbone, len(names), args), log)
  rs = np.random.RandomState(2)
  try:
    sat = measure(url, "saturated", args.seconds, None, args.clients, names, rs, args)
    rate, samples, results = sat["requests_per_s"] / 2, [], []
    start_at = time.perf_counter()
    while time.perf_counter() - start_at < args.soak:
      results.append(asyncio.run(drive(url, 30, rate, 0, names, rs, args.max_in_flight)))
      samples.append((time.perf_counter() - start_at, status_kib(proc.pid, "VmRSS") / 1024))
  finally:
    proc.terminate()
    proc.wait(120)
  with open(log, encoding="utf-8") as f:
    server_lines = f.read().splitlines()[3:]  # after its three start-up lines
  warm = next((m for t, m in samples if t >= args.soak_warmup), samples[0][1])
  return {"seconds": args.soak, "rate_per_s": rate, "rss_after_warmup_mb": warm,
          "rss_end_mb": samples[-1][1], "rss_max_mb": max(m for _, m in samples),
          "growth_percent": 100 * (samples[-1][1] / warm - 1),
          "requests": sum(r["requests"] for r in results),
          "failures": sum(r["failures"] for r in results),
          "failure_kinds": dict(sum((collections.Counter(r["failure_kinds"]) for r in results),
                                    collections.Counter())),
          "p99_ms_worst_window": max(r["p99_ms"] for r in results),
          "rss_mb_every_30s": [round(m, 1) for _, m in samples],
          "server_log": server_lines[-20:]}


def main(argv: Sequence[str]) -> int:
  p = argparse.ArgumentParser(prog="benchmarks.serve_http", description=__doc__.splitlines()[0])
  p.add_argument("--shapes", default="toy,small")
  p.add_argument("--num_prompts", type=int, default=64)
  p.add_argument("--seconds", type=float, default=8.0, help="per measured load")
  p.add_argument("--clients", type=int, default=64)
  p.add_argument("--fractions", default="0.25,0.5", help="Poisson rates, x saturated")
  p.add_argument("--max_batch_size", type=int, default=32)
  p.add_argument("--max_wait_ms", type=float, default=10.0)
  p.add_argument("--max_in_flight", type=int, default=256)
  p.add_argument("--soak", type=float, default=0, help="seconds of the soak (0: none)")
  p.add_argument("--soak_warmup", type=float, default=60)
  p.add_argument("--json", default=None)
  p.add_argument("--markdown", default=None)
  args = p.parse_args(argv)
  args.fractions = [float(f) for f in args.fractions.split(",")]
  report, text = {}, []
  for shape in args.shapes.split(","):
    with tempfile.TemporaryDirectory(prefix="spot_jax_serve_http_") as work:
      backbone = setup(work, shape, args.num_prompts)
      names = [f"p{i}" for i in range(args.num_prompts)]
      if args.soak:
        report[shape] = soak(work, backbone, names, args)
        print(json.dumps({shape: report[shape]}), flush=True)
        continue
      rows = []
      for system in ("dynamic", "one", "peft"):
        rows += run_system(system, work, backbone, names, args, None)
        print(json.dumps(rows[-1]), flush=True)
      report[shape] = {"rows": rows, "goals": goals(rows)}
      text.append(markdown(shape, rows, report[shape]["goals"]))
      print(text[-1], flush=True)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(report, f, indent=1)
  if args.markdown:
    with open(args.markdown, "w", encoding="utf-8") as f:
      f.write("\n".join(text))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
