"""The service's Prometheus metrics (prometheus-client writes the exposition format).

  spot_serve_requests_total{endpoint, status}    answered requests
  spot_serve_request_seconds{endpoint}           latency histogram, arrival to answer
  spot_serve_queue_depth                         requests waiting for a batch
  spot_serve_batch_rows{kind}                    rows per forward pass (before padding)
  spot_serve_batch_seconds{kind}                 forward pass time
  spot_serve_generated_tokens_total              decoded tokens (EOS included) of answered rows
  spot_serve_tokens_per_second                   decoded tokens per second of the last batch
  spot_serve_dropped_total{reason}               requests dropped before their batch ran
  spot_serve_compiles_total                      XLA compilations (or cache loads) so far
  spot_serve_prompts, spot_serve_table_rows      prompts served, rows the table has room for

With continuous batching (`--engine=continuous`):
  spot_serve_time_to_first_token_seconds         arrival to first token, per sequence
  spot_serve_inter_token_latency_seconds         between a sequence's tokens
  spot_serve_running_requests                    sequences holding a slot
  spot_serve_waiting_requests                    sequences waiting for one
  spot_serve_slots, spot_serve_slot_use          slots, and the share of them in use
  spot_serve_decode_steps_total                  compiled decode steps run
  spot_serve_prefills_total{prefix}              prefills, "cached" (from the prompt's KV
                                                 prefix: a prefix-cache hit) or "prompt"
  spot_serve_prefills_during_decode_total        of them, prefilled on --prefill_device while
                                                 a decode call ran
  spot_serve_cancel_lag_steps                    decode calls (of --decode_steps steps) a cancelled
                                                 sequence still held its slot (0 or 1)
"""
from __future__ import annotations

import threading
from typing import Callable

import prometheus_client as prom

prom.disable_created_metrics()  # no *_created series beside every counter and histogram
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class Metrics:
  """One registry of the service's metrics (see the module docstring).

  Attributes:
    registry: the `prometheus_client.CollectorRegistry`.
    compiles: XLA compilations since `watch_compiles`.
  """

  def __init__(self, max_batch: int):
    self.registry = r = prom.CollectorRegistry()
    self.requests = prom.Counter("spot_serve_requests", "Answered requests",
                                 ["endpoint", "status"], registry=r)
    self.latency = prom.Histogram("spot_serve_request_seconds", "Arrival to answer",
                                  ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
    self.queue_depth = prom.Gauge("spot_serve_queue_depth", "Requests waiting", registry=r)
    rows = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, max_batch})
    self.batch_rows = prom.Histogram("spot_serve_batch_rows", "Rows per forward pass", ["kind"],
                                     buckets=[b for b in rows if b <= max_batch], registry=r)
    self.batch_seconds = prom.Histogram("spot_serve_batch_seconds", "Forward pass time", ["kind"],
                                        buckets=LATENCY_BUCKETS, registry=r)
    self.tokens = prom.Counter("spot_serve_generated_tokens", "Decoded tokens", registry=r)
    self.tokens_per_second = prom.Gauge("spot_serve_tokens_per_second",
                                        "Decoded tokens per second of the last batch", registry=r)
    self.dropped = prom.Counter("spot_serve_dropped", "Requests dropped before their batch",
                                ["reason"], registry=r)
    self._compiles = prom.Counter("spot_serve_compiles", "XLA compilations so far", registry=r)
    self.prompts = prom.Gauge("spot_serve_prompts", "Prompts served", registry=r)
    self.table_rows = prom.Gauge("spot_serve_table_rows", "Rows the prompt table has room for",
                                 registry=r)
    self.ttft = prom.Histogram("spot_serve_time_to_first_token_seconds", "Arrival to first token",
                               buckets=LATENCY_BUCKETS, registry=r)
    self.inter_token = prom.Histogram("spot_serve_inter_token_latency_seconds",
                                      "Time between a sequence's tokens", buckets=ITL_BUCKETS,
                                      registry=r)
    self.running = prom.Gauge("spot_serve_running_requests", "Sequences holding a slot",
                              registry=r)
    self.waiting = prom.Gauge("spot_serve_waiting_requests", "Sequences waiting for a slot",
                              registry=r)
    self.slots = prom.Gauge("spot_serve_slots", "Slots", registry=r)
    self.slot_use = prom.Gauge("spot_serve_slot_use", "Share of the slots in use", registry=r)
    self.steps = prom.Counter("spot_serve_decode_steps", "Compiled decode steps", registry=r)
    self.prefills = prom.Counter("spot_serve_prefills", "Prefills by prefix", ["prefix"],
                                 registry=r)
    self.prefills_during = prom.Counter("spot_serve_prefills_during_decode", "Prefills run "
                                        "while a decode call ran", registry=r)
    self.cancel_lag = prom.Histogram("spot_serve_cancel_lag_steps", "Decode calls a cancelled "
                                     "sequence still held its slot", buckets=(0, 1, 2, 4, 8),
                                     registry=r)
    self.compiles = 0
    self._lock = threading.Lock()

  def watch_compiles(self) -> None:
    """Counts every XLA compilation of this process from now on (jax.monitoring's event)."""
    import jax  # pylint: disable=g-import-not-at-top

    def on_event(event: str, unused_seconds: float, **unused_kwargs) -> None:
      if event == _COMPILE_EVENT:
        with self._lock:
          self.compiles += 1
        self._compiles.inc()

    jax.monitoring.register_event_duration_secs_listener(on_event)

  def observe_batch(self, kind: str, rows: int, seconds: float, tokens: int) -> None:
    self.batch_rows.labels(kind).observe(rows)
    self.batch_seconds.labels(kind).observe(seconds)
    if tokens:
      self.tokens.inc(tokens)
      self.tokens_per_second.set(tokens / max(seconds, 1e-9))

  def ttft_observed(self, seconds: float) -> None:
    self.ttft.observe(seconds)

  def itl(self, seconds: float) -> None:
    self.inter_token.observe(seconds)

  def cancelled(self, lag_steps: int) -> None:
    self.cancel_lag.observe(lag_steps)

  def step(self, count: int = 1) -> None:
    self.steps.inc(count)

  def prefill(self, cached: bool, during: bool = False) -> None:
    self.prefills.labels("cached" if cached else "prompt").inc()
    if during:
      self.prefills_during.inc()

  def exposition(self, refresh: Callable[[], None]) -> tuple[bytes, str]:
    """(the text format, its content type), after `refresh` sets the gauges."""
    refresh()
    return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
