"""What `python -m spot_jax.serve` builds before it listens: backbone, prompts, batching loop.

The backbone and vocabulary are the ones `infer` serves (the --model given, or the one the run
directories recorded; a run of another backbone is refused), and so are the prompt sources.
Prompts added while serving go through the same checks. Warm-up compiles the greedy decoder at
every padded batch size and input length, so the first requests do not wait for a compilation.
Under several processes every one builds the same service and warms up in step; then process 0
serves and the others follow it (`follow`).
"""
from __future__ import annotations

import os
import pathlib
import sys
import time
from typing import Any, Optional, Sequence

import numpy as np

from spot_jax.cli import flags
from spot_jax.errors import ConfigError
from spot_jax.serve.http import api
from spot_jax.serve.scheduler import batcher as batcher_lib
from spot_jax.serve.catalog import capacity as capacity_lib
from spot_jax.serve.scheduler import live_catalog as catalog_lib
from spot_jax.serve.scheduler import follow
from spot_jax.serve.http import metrics as metrics_lib
from spot_jax.serve.catalog import prompt_loaders, served_backbone
from spot_jax.serve.http.app import Service


class Loader:
  """(name, path) -> served entries, refusing a run or library entry of another backbone.

  Attributes:
    served: the `served_backbone.ServedBackbone`.
    args: the parsed flags (routing, ATTEMPT temperature, --allow_backbone_change).
  """

  def __init__(self, served: served_backbone.ServedBackbone, args: Any):
    self.served, self.args = served, args
    self._fingerprint: Optional[dict] = None

  def fingerprint(self) -> dict:
    if self._fingerprint is None:
      self._fingerprint = self.served.fingerprint()
    return self._fingerprint

  def __call__(self, name: str, path: str) -> list:
    from spot_jax import backbone as backbone_lib  # pylint: disable=g-import-not-at-top
    runs = served_backbone.recorded_runs([path])
    served_backbone.check_kinds(runs, self.served.kind)
    if not self.args.allow_backbone_change:
      for where, record in runs:
        backbone_lib.check_same(record.fingerprint, self.fingerprint(), f"prompt {where}",
                                served_backbone.OVERRIDE_FLAG)
    library = prompt_loaders.library_reference(path) is not None
    return prompt_loaders.load_all(
        name, path, smop_routing=self.args.smop_routing, config=self.served.config,
        fingerprint=self.fingerprint() if library else None,
        attempt_temperature=self.args.attempt_temperature)


def _warm(service: Service, batch_buckets: Sequence[int], length_buckets: Sequence[int]
          ) -> tuple[int, float]:
  """Runs the greedy decoder once at every (batch size, input length): (shapes, seconds)."""
  start, server = time.perf_counter(), service.catalog.server()
  name = service.catalog.table.names[0]
  cap = service.catalog.table.offset_lengths().get(name)
  shapes = 0
  for size in batch_buckets:
    for width in length_buckets:
      if cap and width > cap:
        continue
      rows = np.zeros((size, width), np.int32)
      rows[:, 0] = 1  # EOS alone: every row ends at once
      server.generate([name] * size, rows, valid=rows > 0)  # with a mask, as requests come
      shapes += 1
  return shapes, time.perf_counter() - start


def build(args: Any, prog: str, specs: Sequence[tuple[str, str]], batch_buckets: Sequence[int],
          length_buckets: Sequence[int]) -> tuple[Service, tuple[int, float]]:
  """(the service of the parsed flags, (shapes compiled, seconds) of its warm-up)."""
  import jax  # pylint: disable=g-import-not-at-top
  from spot_jax import runtime  # pylint: disable=g-import-not-at-top
  runtime.enable_serving_cache(args.compilation_cache_dir, prog)
  metrics = metrics_lib.Metrics(args.max_batch_size)
  metrics.watch_compiles()
  served = served_backbone.resolve(
      [p for _, p in specs], checkpoint=args.checkpoint, seed=args.seed,
      config=flags.model_config(args.model, args.model_binding, dropout_rate=0.0)
      if args.model else None, allow_backbone_change=args.allow_backbone_change)
  config = served.config
  if args.engine == "continuous" and served.kind != "decoder":  # before any weights load
    raise ConfigError("--engine=continuous serves decoder-only backbones (Llama, Gemma, Qwen); "
                      "serve this T5 backbone with --engine=batch")
  loader = Loader(served, args)
  entries = [e for name, path in specs for e in loader(name, path)]
  vocab = served.vocabulary(args.vocab)
  served.check_vocabulary(vocab)
  limits = api.Limits(args.input_length, args.target_length, args.max_batch_size,
                      config.vocab_size, args.truncate, tuple(args.label))
  from spot_jax.serve.model import inputs  # pylint: disable=g-import-not-at-top
  if args.label:
    inputs.label_rows(vocab, args.label, args.target_length)  # checked now, not per request
  params, mesh = served_backbone.load_params(served)
  several = jax.process_count() > 1  # the others repeat process 0's calls (`follow`)
  mirror = follow.Mirror(several)
  capacity = capacity_lib.Capacity(capacity_lib.next_power_of_two(args.table_rows), 0, 0, 0, 0)
  catalog = catalog_lib.Catalog(served.network(), params, entries, emb_dim=config.emb_dim,
                                target_length=args.target_length, load=loader,
                                placement=args.placement, seed=args.seed, capacity=capacity,
                                mesh=mesh if several else None, mirror=mirror,
                                eos_id=inputs.eos_of(vocab))

  def observe(kind: str, rows: int, unused_padded: int, seconds: float, results: list) -> None:
    tokens, eos_id = 0, inputs.eos_of(vocab)
    if kind == "generate":  # a row's tokens run to its first EOS, or fill it
      for ids, _ in results:
        ids = [int(t) for t in ids]
        tokens += ids.index(eos_id) + 1 if eos_id in ids else len(ids)
    metrics.observe_batch(kind, rows, seconds, tokens)

  loop = batcher_lib.Batcher(catalog, max_batch=args.max_batch_size,
                             max_wait=args.max_wait_ms / 1000, max_queue=args.max_queue,
                             batch_buckets=batch_buckets, length_buckets=length_buckets,
                             observe=observe, mirror=mirror)
  from spot_jax import backbone as backbone_lib  # pylint: disable=g-import-not-at-top
  described = backbone_lib.describe(loader.fingerprint())
  engine = _engine(args, catalog, length_buckets, metrics, several, vocab)
  service = Service(catalog, loop, metrics, vocab, limits, described, args.request_timeout,
                    engine=engine, chat_template=_chat_template(args, served),
                    bos_id=getattr(config, "bos_id", 0))
  if args.no_warmup:
    return service, (0, 0.0)
  if engine is not None:
    start = time.perf_counter()
    return service, (engine.warm(), time.perf_counter() - start)
  return service, _warm(service, batch_buckets, length_buckets)


def _engine(args: Any, catalog: Any, length_buckets: Sequence[int], metrics: Any,
            several: bool, vocab: Any) -> Any:
  """The continuous-batching engine of --engine=continuous, or None."""
  if args.engine != "continuous":
    return None
  if several:
    raise ConfigError("--engine=continuous runs on one process; serve a pod with --engine=batch")
  from spot_jax.serve.scheduler import continuous  # pylint: disable=g-import-not-at-top
  metrics.slots.set(args.slots)
  from spot_jax.serve.model import inputs  # pylint: disable=g-import-not-at-top
  return continuous.Engine(catalog, slots=args.slots, length_buckets=length_buckets,
                           max_tokens=args.target_length, max_queue=args.max_queue,
                           eos_id=inputs.eos_of(vocab),
                           stop_ids=tuple(getattr(vocab, "eos_ids", ()) or ()),
                           observe=metrics, decode_steps=args.decode_steps,
                           prefill_device=_prefill_device(args.prefill_device, catalog.params))


def _prefill_device(flag: str, params: Any) -> Any:
  """--prefill_device's device (None: where the slots are). `auto` on CPU stays on one device
  when a second copy of the weights would take over half the host's available memory."""
  import jax  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.model import slots  # pylint: disable=g-import-not-at-top
  if flag == "same":
    return None
  if flag == "auto":
    device = slots.second_device(params)
    if device is None or device.platform != "cpu":
      return device
    size = sum(x.nbytes for x in jax.tree_util.tree_leaves(params) if hasattr(x, "nbytes"))
    if 2 * size > host_available():
      print(f"note: --prefill_device=auto prefills on the serving device: a second copy of the "
            f"weights ({size / 2**30:.1f} GiB) would take over half the free host memory",
            file=sys.stderr)
      return None
    return device
  devices = jax.local_devices()
  if int(flag) >= len(devices):
    raise ConfigError(f"--prefill_device={flag}: this process has {len(devices)} local "
                      f"device(s); give an index below {len(devices)}, 'auto' or 'same'")
  return devices[int(flag)]


def host_available() -> int:
  """Bytes of host memory available (MemAvailable; else free pages)."""
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _chat_template(args: Any, served: Any) -> Any:
  """--chat_template's (a model directory or a .jinja file), else the checkpoint directory's."""
  from spot_jax.backbones.decoder import chat_template  # pylint: disable=g-import-not-at-top
  path = args.chat_template
  if path is None:
    checkpoint = getattr(served, "checkpoint", None)
    if served.kind != "decoder" or not checkpoint or "://" in checkpoint:
      return None
    root = pathlib.Path(checkpoint)
    return chat_template.load_chat_template(root) if root.is_dir() else None
  root = pathlib.Path(path)
  if root.is_file() and root.suffix == ".jinja":
    return chat_template.ChatTemplate(root.read_text(encoding="utf-8"), origin=str(root))
  if root.is_file():
    root = root.parent
  found = chat_template.load_chat_template(root) if root.is_dir() else None
  if found is None:
    raise ConfigError(f"--chat_template={path} holds no chat template; give a model directory "
                      f"whose tokenizer_config.json has one, or a .jinja file")
  return found
