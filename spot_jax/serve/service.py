"""`python -m spot_jax.serve`: serve soft prompts over HTTP, batching requests across prompts.

  # The runs' recorded backbone and vocabulary; every prompt by its name
  python -m spot_jax.serve --prompt=rte=/runs/rte_pt --prompt=boolq=/runs/boolq_smop --port=8000
  # Every entry of a SPoT prompt library, by its id, on the library's backbone
  python -m spot_jax.serve --library=/libs/t5_base --model=t5_1_1_lm100k_base \
    --checkpoint=/ckpts/checkpoint_1100000
  curl localhost:8000/v1/completions -d '{"model": "rte", "prompt": "premise: ..."}'

Prompts use `infer`'s vocabulary (--prompt NAME=PATH: run directories, .npy files, PEFT
adapters, LIBRARY_DIR#ID), as do --model/--checkpoint (default: the backbone the runs recorded;
prompts of another backbone are refused) and the lengths. One thread batches every queued
request (see `spot_jax.serve.scheduler.batcher`); the API is in `spot_jax.serve.http.app`. See
docs/serving.md, "Serving over HTTP".
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
import socket
import sys
import time
from typing import MutableMapping, Sequence

from spot_jax import cli, validate
from spot_jax.cli import distributed, flags
from spot_jax.errors import ConfigError

PROG = "spot_jax.serve"


def _parser() -> cli.ArgumentParser:
  p = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  a = p.add_argument
  from spot_jax.serve.catalog import served_backbone  # pylint: disable=g-import-not-at-top
  served_backbone.add_served_flags(p)
  a("--library", action="append", default=[], metavar="DIR", help="serve every entry of this "
    "SPoT prompt library, by its id (repeatable)")
  a("--smop_routing", default="linear", help="routing of SMoP runs: linear, top2, gumbel, "
    "stochastic or single")
  a("--attempt_temperature", type=float, default=None, help="softmax temperature of ATTEMPT "
    "runs trained with a non-default one (default: E * e)")
  a("--placement", default="prefix", choices=("prefix", "after_bos", "suffix"))
  a("--vocab", default=None, help="'byte' or a SentencePiece model (default: the runs' recorded "
    "vocabulary, else T5's)")
  flags.add_lengths(p, 128, 32, input_help="longest input in tokens, EOS included (longer ones "
                    "are refused, or cut with --truncate)", target_help="the largest max_tokens: "
                    "decoded tokens per row, EOS included")
  a("--truncate", action="store_true", help="cut inputs longer than --input_length")
  a("--label", action="append", default=[], help="class label of /v1/classify requests that "
    "give none (repeatable)")
  a("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
  a("--port", type=int, default=8000, help="port to listen on (0: a free one, printed)")
  a("--max_batch_size", type=int, default=32, help="rows per forward pass")
  a("--max_wait_ms", type=float, default=10.0, help="how long the oldest request waits for "
    "others to join its batch")
  a("--max_queue", type=int, default=256, help="requests waiting at most; more get 429")
  a("--request_timeout", type=float, default=60.0, help="seconds a request may wait for its "
    "answer (then 504)")
  a("--batch_buckets", default=None, help="padded batch sizes, comma-separated (default: powers "
    "of 2 below --max_batch_size, and it)")
  a("--length_buckets", default=None, help="padded input lengths, comma-separated (default: "
    "powers of 2 from 16 below --input_length, and it)")
  a("--table_rows", type=int, default=8, help="prompts the table has room for at start "
    "(it grows in powers of two)")
  a("--engine", default="batch", choices=("batch", "continuous"), help="how completions run: "
    "'batch' (requests batched, each generation one compiled call) or 'continuous' (decoder-only "
    "backbones: iteration-level scheduling over --slots, streaming, chat, a KV prefix cache)")
  a("--slots", type=int, default=8, help="sequences decoding at once (--engine=continuous)")
  a("--decode_steps", type=int, default=4, help="decode steps per compiled call "
    "(--engine=continuous): tokens stream K at a time; 1 returns to the host every token")
  a("--prefill_device", default="auto", help="where --engine=continuous prefills: 'auto' (a "
    "second device of the serving kind when there is one, so arrivals prefill while the slots "
    "decode: on CPU the program makes two host devices, unless JAX_NUM_CPU_DEVICES is set; "
    "it holds a second copy of the weights, if they take under half the free memory), 'same', "
    "or a local device index")
  a("--chat_template", default=None, help="a model directory (tokenizer_config.json or "
    "chat_template.jinja) or a .jinja file for /v1/chat/completions (default: the checkpoint "
    "directory's)")
  a("--no_warmup", action="store_true", help="compile on first use instead of at start-up")
  distributed.add_arguments(p)
  a("--compilation_cache_dir", default=None, help="JAX's persistent compilation cache (default: "
    "$SPOT_JAX_COMPILATION_CACHE, else ~/.cache/spot_jax/jax; 'none' turns it off)")
  return p


def _buckets(flag: str, value, top: int, first: int, factor: int) -> list[int]:
  if value:
    out = sorted(set(flags.int_list(flag, value, minimum=1)))
    if out[-1] > top:
      raise ConfigError(f"{flag}={value} holds {out[-1]}, above {top}; give sizes up to {top}")
    return sorted(set(out) | {top})
  out, b = [], first
  while b < top:
    out.append(b)
    b *= factor
  return out + [top]


def _specs(args) -> list[tuple[str, str]]:
  """(name, path) of every --prompt and every --library entry."""
  from spot_jax.serve.catalog import served_backbone  # pylint: disable=g-import-not-at-top
  specs = served_backbone.prompt_specs(args.prompt)
  for root in args.library:
    from spot_jax.spot import library as prompt_library  # pylint: disable=g-import-not-at-top
    ids = prompt_library.Library(root).ids()
    if not ids:
      raise ConfigError(f"--library {root} holds no entries; give a library with prompts")
    specs += [(i, f"{root}#{i}") for i in ids]
  names = [n for n, _ in specs]
  dupes = sorted({n for n in names if names.count(n) > 1})
  if dupes:
    raise ConfigError(f"prompt names must be unique; {', '.join(dupes)} given twice")
  if not specs:
    raise ConfigError("no prompts to serve; give --prompt NAME=PATH or --library DIR")
  return specs


def _check(args) -> None:
  for flag in ("input_length", "target_length", "max_batch_size", "max_queue", "table_rows",
               "slots", "decode_steps"):
    validate.positive_int(getattr(args, flag), f"--{flag}", optional=True)
  validate.positive_int(args.port, "--port", minimum=0, optional=True)
  for flag in ("max_wait_ms", "request_timeout"):
    validate.non_negative(getattr(args, flag), f"--{flag}", finite=False)
  if args.prefill_device not in ("auto", "same") and not args.prefill_device.isdigit():
    raise ConfigError(f"--prefill_device={args.prefill_device!r} is not a device; give 'auto', "
                      f"'same' or a local device index (0, 1, ...)")


def host_devices(argv: Sequence[str], environ: MutableMapping[str, str] = os.environ) -> None:
  """Before any device is used (the command line only): two host devices when the continuous
  engine may prefill beside its decode calls (--prefill_device=auto), unless JAX_NUM_CPU_DEVICES
  or XLA_FLAGS' device count say how many. Other backends ignore it."""
  p = argparse.ArgumentParser(add_help=False)  # the full parser imports jax
  p.add_argument("--engine")
  p.add_argument("--prefill_device", default="auto")
  args, _ = p.parse_known_args(argv)
  if (args.engine == "continuous" and args.prefill_device == "auto"
      and "JAX_NUM_CPU_DEVICES" not in environ
      and "xla_force_host_platform_device_count" not in environ.get("XLA_FLAGS", "")):
    # Not by importing jax here: the engine needs JAX's asynchronous dispatch, which
    # `runtime.keep_heap` turns off when it finds jax imported.
    environ["JAX_NUM_CPU_DEVICES"] = "2"


def listen(host: str, port: int) -> socket.socket:
  try:
    sock = socket.create_server((host, port), reuse_port=False)
  except OSError as e:
    raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror}); give a free --port (0: "
                      f"any)") from None
  return sock


def main(argv: Sequence[str]) -> int:
  args = _parser().parse_args(argv)
  distributed.setup(args)  # on a pod: process 0 serves HTTP, the others follow its calls
  _check(args)
  try:
    # pylint: disable-next=g-import-not-at-top,multiple-imports,unused-import
    import starlette, uvicorn, prometheus_client
  except ImportError as e:
    raise ConfigError(f"serving over HTTP needs {e.name}; pip install starlette uvicorn "
                      f"prometheus-client") from None
  batch_buckets = _buckets("--batch_buckets", args.batch_buckets, args.max_batch_size, 1, 2)
  length_buckets = _buckets("--length_buckets", args.length_buckets, args.input_length,
                            min(16, args.input_length), 2)
  import jax  # pylint: disable=g-import-not-at-top
  sock = listen(args.host, args.port) if jax.process_index() == 0 else None
  from spot_jax.serve import assemble  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.scheduler import follow  # pylint: disable=g-import-not-at-top
  service, warm = assemble.build(args, PROG, _specs(args), batch_buckets, length_buckets)
  if sock is None:
    return follow.follow(service.catalog)
  host, port = sock.getsockname()[:2]
  print(f"{PROG}: {len(service.catalog.table)} prompts on {service.backbone}: "
        f"{', '.join(service.catalog.table.names)}", flush=True)
  engine = service.engine
  sizes = (f"{args.slots} slots, prefills on {engine.prefill_device}" if engine is not None
           else f"batch sizes {','.join(map(str, batch_buckets))}")
  print(f"{PROG}: compiled {warm[0]} shapes in {warm[1]:.1f} s ({sizes}; input lengths "
        f"{','.join(map(str, length_buckets))})", flush=True)
  print(f"{PROG}: listening on http://{host}:{port}", flush=True)
  return serve(service, sock)


def serve(service, sock: socket.socket, prog: str = PROG) -> int:
  """Runs uvicorn on `sock` until SIGTERM/SIGINT, then answers every accepted request."""
  import uvicorn  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.http import app as app_lib  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.scheduler import follow  # pylint: disable=g-import-not-at-top

  @contextlib.asynccontextmanager
  async def lifespan(unused_app):
    # What start-up made lives as long as the process (jax, the weights, compiled calls):
    # frozen, a full garbage collection no longer walks it (about 130 ms on the toy decoder,
    # with the GIL held: a stall of every stream), but only what requests allocate.
    gc.collect()
    gc.freeze()
    service.batcher.start()
    if service.engine is not None:
      service.engine.start()
    yield
    service.batcher.stop()  # every request still queued runs before the process ends
    if service.engine is not None:
      service.engine.stop()
    with service.batcher.mirror.turn():
      service.batcher.mirror.send(follow.STOP, {})  # the other processes end too

  application = app_lib.create(service)
  application.router.lifespan_context = lifespan

  class Server(uvicorn.Server):
    """uvicorn's server; a signal stops it gracefully and the process then exits 0."""

    @contextlib.contextmanager
    def capture_signals(self):
      old = {s: signal.signal(s, self._stop) for s in (signal.SIGTERM, signal.SIGINT)}
      try:
        yield
      finally:
        for s, handler in old.items():
          signal.signal(s, handler)

    def _stop(self, sig, unused_frame) -> None:
      service.batcher.flush()  # no more waiting for company: run what is queued
      if service.engine is not None:
        service.engine.close()  # accepted sequences (streams included) finish; no new ones
      if self.should_exit and sig == signal.SIGINT:
        self.force_exit = True
      self.should_exit = True

  config = uvicorn.Config(application, log_level="warning", access_log=False,
                          timeout_graceful_shutdown=None, lifespan="on")
  started = time.monotonic()
  Server(config).run(sockets=[sock])
  print(f"{prog}: stopped after {time.monotonic() - started:.0f} s, {service.batcher.batches} "
        f"batches; every accepted request answered", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], PROG))
