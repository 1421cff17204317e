"""Continuous batching over slots on a tiny random Gemma 3 (sliding and full layers).

Invariants: every sequence, admitted into a slot while others decode, of any of eight prompt
methods, decodes greedily token for token as `mixed_decoder` decodes its row (the path `infer`
and the batcher take); a seeded sampled sequence gives the same tokens alone and among others;
a prompt's cached KV prefix gives the log-probabilities of prefilling its prompt (1e-5); the
decode step and each prefill bucket compile once; prefills on a second device while the slots
decode give the same tokens.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from spot_jax.backbones.decoder.network import DecoderLM
from spot_jax.serve.scheduler import live_catalog as catalog_lib
from spot_jax.serve.model import prefix_cache, slots
from spot_jax.serve.model.server import DecodeSettings, Server
from spot_jax.serve.catalog.table import PromptTable, ServedPrompt
from spot_jax.serve.scheduler.continuous import Engine
from spot_jax.serve.scheduler.sequence import Sequence
from tests.helpers import hlo as hlo_lib
from tests.serve.test_decoder_serving import (  # noqa: F401  pylint: disable=unused-import
    CONFIG, DECODE, EOS, LENGTHS, _server, build_setup, setup)


def _catalog(backbone, table, placement="prefix"):
  return catalog_lib.Catalog(DecoderLM(CONFIG), backbone, table.entries, emb_dim=CONFIG.emb_dim,
                             target_length=DECODE, load=None, placement=placement)


def _engine(backbone, table, num_slots=3, placement="prefix"):
  return Engine(_catalog(backbone, table, placement), slots=num_slots, length_buckets=[4, 10],
                max_tokens=DECODE, max_queue=64, eos_id=EOS)


def _sequence(name, row, **settings):
  events = []
  ids = np.asarray([t for t in row if t > 0], np.int32)
  seq = Sequence(name, ids, DECODE, lambda *e: events.append(e), **settings)
  return seq, events


def _run(engine, sequences):
  """Drives the engine in this thread until every sequence has ended."""
  engine.submit([s for s, _ in sequences])
  while engine.waiting() or engine.running():
    engine._iterate()  # pylint: disable=protected-access
  assert all(events[-1][0] == "end" for _, events in sequences)
  return [[e[1] for e in events if e[0] == "token"] for _, events in sequences]


def _settings(**columns):
  rows = len(next(iter(columns.values())))
  base = dict(temperature=np.ones(rows, np.float32), top_k=np.zeros(rows, np.int32),
              top_p=np.ones(rows, np.float32), seed=np.arange(rows, dtype=np.uint32),
              choice=np.zeros(rows, np.int32), count=np.zeros(rows, np.int32))
  base.update({k: np.asarray(v, base[k].dtype) for k, v in columns.items()})
  return slots.Sampling(**base)


def _greedy(num: int) -> slots.Sampling:
  """Greedy settings for `num` slots (temperature 0, no top_k, top_p 1, seed 0)."""
  return _settings(temperature=np.zeros(num), seed=np.zeros(num))


def _upto_eos(row):
  row = [int(t) for t in row]
  return row[:row.index(EOS) + 1] if EOS in row else row


def test_slots_decode_every_method_as_the_mixed_batch(setup):  # noqa: F811
  backbone, _, _, table, rows = setup
  names = table.names + table.names[:1]
  want, _ = _server(backbone, table).generate(names, rows)
  engine = _engine(backbone, table)
  got = _run(engine, [_sequence(n, rows[r]) for r, n in enumerate(names)])
  for r, name in enumerate(names):
    assert got[r] == _upto_eos(want[r]), name
  assert engine.prefills == len(names) and engine.steps < len(names) * DECODE
  cacheable = sum(prefix_cache.cacheable(table.entries[table.index(n)]) for n in names)
  assert engine.prefixes.hits == cacheable and engine.prefixes.misses == len(names) - cacheable
  assert 0 < engine.prefixes.misses < len(names)  # SMoP and ATTEMPT prefill their prompt
  compiled = lambda: tuple(f._cache_size() for f in (  # noqa: E731  pylint: disable=protected-access
      slots.decode_steps, slots.prefill, slots.insert))
  before = compiled()
  _run(engine, [_sequence(n, rows[-1 - r]) for r, n in enumerate(names)])
  assert compiled() == before


def beside_run() -> dict:
  """Run in a process with two host devices: the same chained arrivals (each submitted when
  the one before streams its first token, so it arrives while a decode call runs) through an
  engine prefilling on its own device and through one prefilling beside it on the second."""
  backbone, _, _, table, rows = build_setup()
  names = ["pt", "smop", "residual", "prefix", "dept", "ulpt", "attempt", "pt"]
  out = {"want": _server(backbone, table).generate(names, rows[:len(names)])[0].tolist()}
  for mode, device in (("same", None), ("beside", jax.devices()[1])):
    engine = Engine(_catalog(backbone, table), slots=3, length_buckets=[4, 10], max_tokens=DECODE,
                    max_queue=64, eos_id=EOS, prefill_device=device)
    engine.warm()
    chain = []
    for r, name in enumerate(names):
      sampled = {"temperature": 0.8, "top_k": 5, "seed": r} if r % 3 == 2 else {}
      chain.append(_sequence(name, rows[r], **sampled))

    def then(events, after, engine=engine):
      def emit(*event):
        events.append(event)
        if event[0] == "token" and len(events) == 1:
          engine.submit([after])
      return emit

    for (seq, events), (after, _) in zip(chain, chain[1:]):
      seq.emit = then(events, after)
    engine.submit([chain[0][0]])
    while engine.waiting() or engine.running():
      engine._iterate()  # pylint: disable=protected-access
    assert all(events[-1][0] == "end" for _, events in chain)
    out[mode] = [[e[1] for e in events if e[0] == "token"] for _, events in chain]
    out[mode + "_during"] = engine.prefills_during
    out[mode + "_devices"] = [str(engine.device), str(engine.prefill_device)]
  return out


def test_prefills_beside_the_decode_call_give_the_same_tokens():
  """Arrivals prefilled on a second device while the slots decode on the first stream the same
  tokens as prefills on one device (greedy ones: the mixed batch's), and their first tokens
  come out during the call."""
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="2")
  proc = subprocess.run([sys.executable, "-c", "import json; from tests.serve.test_continuous "
                         "import beside_run; print(json.dumps(beside_run()))"],
                        capture_output=True, text=True, env=env, timeout=600,
                        cwd=pathlib.Path(__file__).parents[2], check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["beside_devices"][0] != out["beside_devices"][1]
  assert out["same_devices"][0] == out["same_devices"][1]
  assert out["beside"] == out["same"]
  for r, tokens in enumerate(out["beside"]):
    if r % 3 != 2:
      assert tokens == _upto_eos(out["want"][r]), r
  assert out["beside_during"] >= 2 and out["same_during"] == 0


def test_after_bos_prompts_decode_as_the_mixed_batch(setup):  # noqa: F811
  backbone, _, _, table, rows = setup
  names = ["pt", "smop", "prefix", "dept", "attempt"]
  want, _ = Server(DecoderLM(CONFIG), backbone, table, placement="after_bos",
                   settings=DecodeSettings(DECODE, eos_id=EOS)).generate(names, rows[:5])
  got = _run(_engine(backbone, table, placement="after_bos"),
             [_sequence(n, rows[r]) for r, n in enumerate(names)])
  assert got == [_upto_eos(w) for w in want]


def test_a_seeded_sample_does_not_depend_on_its_neighbours(setup):  # noqa: F811
  backbone, _, _, table, rows = setup
  settings = dict(temperature=0.9, top_k=50, top_p=0.95, seed=1234)
  alone = _run(_engine(backbone, table), [_sequence("pt", rows[0], **settings)])[0]
  crowd = [_sequence(n, rows[r + 1], temperature=1.3, seed=r) for r, n in
           enumerate(table.names[:4])]
  mixed = _run(_engine(backbone, table), [crowd[0], _sequence("pt", rows[0], **settings),
                                          *crowd[1:]])
  assert mixed[1] == alone
  other = _run(_engine(backbone, table), [_sequence("pt", rows[0], **{**settings, "seed": 9})])
  greedy = _run(_engine(backbone, table), [_sequence("pt", rows[0])])[0]
  assert other[0] != alone or greedy != alone  # the seed (or sampling at all) matters


def test_the_cached_prefix_gives_the_logprobs_of_prefilling_the_prompt(setup):  # noqa: F811
  backbone, _, _, table, rows = setup
  engine = _engine(backbone, table, num_slots=2)
  engine._refresh()  # pylint: disable=protected-access
  arrays, model = engine._arrays, DecoderLM(CONFIG)  # pylint: disable=protected-access
  names = [n for n in table.names if prefix_cache.cacheable(table.entries[table.index(n)])]
  assert {"pt", "residual", "ulpt", "prefix", "ptuning_v2", "dept"} <= set(names)
  tokens = np.zeros((1, 10), np.int32)
  tokens[0, :LENGTHS[0]] = rows[0, :LENGTHS[0]]
  valid = tokens > 0
  greedy = _greedy(1)
  for name in names:
    index = np.asarray([table.index(name)], np.int32)
    results = []
    for cached in (True, False):
      head = slots.compute_head(model, backbone, arrays, index, placement="prefix",
                                cached=cached)
      assert int(head.skip[0]) == (table.entries[index[0]].length + 1 if cached else 0)
      state = slots.empty_state(model, 2, engine._state.k_index.shape[1])  # pylint: disable=protected-access
      rows, first = slots.prefill(model, backbone, arrays, index, tokens, valid, head, greedy,
                                  length=state.k_index.shape[1], placement="prefix",
                                  cached=cached)
      state = slots.insert(state, np.ones(1, np.int32), rows)
      sampling = slots.Sampling(*(np.repeat(a, 2) for a in greedy))
      _, second = slots.decode_steps(model, backbone, state, sampling, steps=1)
      second = slots.Chosen(*(a[0] for a in second))
      results.append((first, second))
    (c1, c2), (p1, p2) = results
    np.testing.assert_allclose(c1.top_logprobs, p1.top_logprobs, atol=1e-5, err_msg=name)
    np.testing.assert_array_equal(c1.top_ids, p1.top_ids, err_msg=name)
    np.testing.assert_allclose(c2.top_logprobs[1], p2.top_logprobs[1], atol=1e-5, err_msg=name)


def test_a_decode_call_reads_the_slots_caches_where_they_lie(setup):  # noqa: F811
  """K steps of every slot attend over the heads-major caches in place: the optimized call
  moves no cache-sized array into another layout (before, every layer and step did, twice)."""
  backbone = setup[0]
  model, num_slots, length = DecoderLM(CONFIG), 4, 20
  state = slots.empty_state(model, num_slots, length)
  hlo = slots.decode_steps.lower(model, backbone, state, _greedy(num_slots),
                                 steps=3).compile().as_text()
  assert state.cache[0][0].shape == (num_slots, CONFIG.num_kv_heads, length, CONFIG.head_dim)
  assert not hlo_lib.relayouts(hlo, state.cache[0][0].size)


def test_a_cancelled_waiting_sequence_leaves_the_queue_while_the_slots_are_full(setup):  # noqa: F811
  backbone, _, _, table, rows = setup
  engine = _engine(backbone, table, num_slots=1)
  (first, first_events), (second, second_events) = (_sequence("pt", rows[0]),
                                                    _sequence("smop", rows[1]))
  engine.submit([first, second])
  engine._iterate()  # pylint: disable=protected-access
  engine.cancel(second)
  assert engine.running() == 1  # the slot is taken when the next cycle drops `second`
  engine._iterate()  # pylint: disable=protected-access
  assert engine.waiting() == 0 and second_events == [("end", "cancelled")]
  while engine.running():
    engine._iterate()  # pylint: disable=protected-access
  assert first_events[-1][0] == "end"


def test_a_cancelled_sequence_frees_its_slot_before_the_next_step(setup):  # noqa: F811
  backbone, _, _, table, rows = setup
  engine = _engine(backbone, table, num_slots=1)
  first, first_events = _sequence("pt", rows[0])
  second, second_events = _sequence("smop", rows[1])
  engine.submit([first, second])
  engine._iterate()  # pylint: disable=protected-access
  assert engine.running() == 1 and engine.waiting() == 1
  engine.cancel(first)
  calls = engine.calls
  engine._iterate()  # pylint: disable=protected-access
  assert first_events[-1] == ("end", "cancelled")
  assert engine._active[0] is second and engine.calls == calls + 1  # pylint: disable=protected-access
  with pytest.raises(Exception):
    engine.close()
    engine.submit([_sequence("pt", rows[0])[0]])
  while engine.running():
    engine._iterate()  # pylint: disable=protected-access
  assert second_events[-1][0] == "end"


def test_per_slot_top_k_top_p_and_a_slot_alone_among_truncating_ones():
  logits = np.random.RandomState(0).normal(0, 2, (6, 50)).astype(np.float32)
  choose = jax.jit(slots._choose)  # pylint: disable=protected-access
  best = logits.argmax(-1)
  narrow = choose(logits, _settings(top_k=[1, 0, 1, 0, 1, 0], top_p=[1, 1e-6, 1, 1e-6, 1, 1e-6]))
  np.testing.assert_array_equal(narrow.token, best)
  greedy = choose(logits, _settings(temperature=np.zeros(6)))
  np.testing.assert_array_equal(greedy.token, best)
  np.testing.assert_allclose(greedy.logprob, np.max(greedy.top_logprobs, axis=1), atol=1e-6)
  top2 = np.argsort(-logits, axis=1)[:, :2]
  for count in range(20):
    drawn = choose(logits, _settings(top_k=[2] * 6, count=[count] * 6)).token
    assert all(drawn[r] in top2[r] for r in range(6))
  free = [choose(logits, _settings(count=[c] * 6, seed=[7] * 6)).token[0]
          for c in range(20)]
  among = [choose(logits, _settings(count=[c] * 6, seed=[7] * 6, top_k=[0, 3, 3, 3, 3, 3],
                                    top_p=[1, .5, .5, .5, .5, .5])).token[0] for c in range(20)]
  free, among = [int(t) for t in free], [int(t) for t in among]
  assert free == among and len(set(free)) > 1  # sampled, and untouched by its neighbours


def test_a_prompt_that_grows_the_table_waits_for_the_running_slots(setup):  # noqa: F811
  backbone, _, _, table, rows = setup
  long = ServedPrompt("long", np.random.RandomState(4).normal(
      0, 1, (20, CONFIG.emb_dim)).astype(np.float32), source="long.npy")
  catalog = _catalog(backbone, table)
  catalog.load = lambda name, path: [long]
  engine = Engine(catalog, slots=2, length_buckets=[10], max_tokens=DECODE, max_queue=8,
                  eos_id=EOS, decode_steps=1)  # one step per call: "pt" runs on meanwhile
  first, first_events = _sequence("pt", rows[0])
  engine.submit([first])
  engine._iterate()  # pylint: disable=protected-access
  shape = engine._shape  # pylint: disable=protected-access
  catalog.add("long", "long.npy")  # L grows past the table's room: a new slot state
  second, second_events = _sequence("long", rows[1])
  engine.submit([second])
  engine._iterate()  # pylint: disable=protected-access
  assert engine.running() == 1 and engine.waiting() == 1  # "long" waits for "pt" to finish
  while engine.waiting() or engine.running():
    engine._iterate()  # pylint: disable=protected-access
  assert engine._shape != shape  # pylint: disable=protected-access
  tokens = lambda events: [e[1] for e in events if e[0] == "token"]  # noqa: E731
  alone = _run(_engine(backbone, table), [_sequence("pt", rows[0])])[0]
  grown = PromptTable(list(table.entries) + [long], CONFIG.emb_dim)
  want, _ = _server(backbone, grown).generate(["long"], rows[1:2])
  assert tokens(first_events) == alone and tokens(second_events) == _upto_eos(want[0])


def test_a_batched_prefill_equals_prefills_one_by_one_and_padding_writes_nothing(setup):  # noqa: F811
  backbone, _, _, table, rows = setup
  engine = _engine(backbone, table, num_slots=4)
  engine._refresh()  # pylint: disable=protected-access
  arrays, model = engine._arrays, DecoderLM(CONFIG)  # pylint: disable=protected-access
  names = ["pt", "prefix", "dept"]  # cached prefixes: one kind, one call
  tokens = np.zeros((3, 10), np.int32)
  for r in range(3):
    tokens[r, :LENGTHS[r]] = rows[r, :LENGTHS[r]]
  index = np.asarray([table.index(n) for n in names], np.int32)
  heads = [engine.prefixes.head(table, arrays, n)[0] for n in names]
  greedy = _greedy(4)
  length = engine._state.k_index.shape[1]  # pylint: disable=protected-access
  alone = slots.empty_state(model, 4, length)
  for r in range(3):
    row, _ = slots.prefill(model, backbone, arrays, index[r:r + 1], tokens[r:r + 1],
                           tokens[r:r + 1] > 0, heads[r], slots.Sampling(*(a[:1] for a in greedy)),
                           length=length, placement="prefix", cached=True)
    alone = slots.insert(alone, np.full(1, r, np.int32), row)
  state = slots.empty_state(model, 4, length)
  where = np.asarray([0, 1, 2, 4], np.int32)  # the fourth row pads (slot 4 of 4: nowhere)
  batch, chosen = slots.prefill(model, backbone, arrays, np.concatenate([index, index[:1]]),
                                np.concatenate([tokens, tokens[:1]]),
                                np.concatenate([tokens, tokens[:1]]) > 0, (*heads, heads[0]),
                                greedy, length=length, placement="prefix", cached=True)
  state = slots.insert(state, where, batch)
  for got, want in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(alone)):
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               atol=1e-5)
    assert not np.any(np.asarray(got)[3])  # slot 3 stays empty
  assert np.asarray(chosen.token)[3] == np.asarray(chosen.token)[0]
  got = _run(engine, [_sequence(n, rows[r]) for r, n in enumerate(names)])
  assert engine.prefills == 3 and engine.prefill_calls == 1
  assert got[0] == _run(_engine(backbone, table), [_sequence("pt", rows[0])])[0]


def _events(engine, specs):
  """Runs [(name, row, settings)] through `engine`; each sequence's events."""
  made = []
  for name, row, settings in specs:
    settings = dict(settings)
    limit = settings.pop("max_tokens", DECODE)
    made.append(_sequence(name, row, **settings))
    made[-1][0].max_tokens = limit
  _run(engine, made)
  plain = lambda e: tuple(np.asarray(v).tolist() if isinstance(v, np.ndarray) else v  # noqa: E731
                          for v in e)
  return [[plain(e) for e in events] for _, events in made]


def _k_engine(backbone, table, steps, num_slots=3, **kw):
  return Engine(_catalog(backbone, table), slots=num_slots, length_buckets=[4, 10],
                max_tokens=DECODE, max_queue=64, eos_id=EOS, decode_steps=steps, **kw)


def test_k_decode_steps_per_call_give_the_tokens_of_one_step_per_call(setup):  # noqa: F811
  backbone, _, _, table, rows = setup
  names = table.names + table.names[:1]
  sampled = dict(temperature=0.9, top_k=50, top_p=0.95, seed=77)
  specs = [(n, rows[r % len(rows)], sampled if r % 3 == 1 else {}) for r, n in enumerate(names)]
  one, four = (_events(_k_engine(backbone, table, k), specs) for k in (1, 4))
  assert one == four  # tokens, log-probabilities, top log-probabilities and ends: bit for bit
  want, _ = _server(backbone, table).generate(names, rows[:len(names)])
  for r, events in enumerate(four):
    if r % 3 != 1:
      assert [e[1] for e in events if e[0] == "token"] == _upto_eos(want[r]), names[r]
  assert len({tuple(e[1] for e in events if e[0] == "token") for events in four}) > 1


def test_a_sequence_ending_inside_a_call_ends_as_with_one_step_and_frees_its_slot(setup):  # noqa: F811
  backbone, _, _, table, rows = setup
  text = lambda ids: " ".join(f"<{t}>" for t in ids)  # noqa: E731
  greedy = _events(_k_engine(backbone, table, 1), [("pt", rows[0], {}), ("dept", rows[2], {})])
  tokens = [[e[1] for e in events if e[0] == "token"] for events in greedy]
  assert len(tokens[0]) == DECODE and len(tokens[1]) == DECODE  # neither ends early alone
  specs = [("pt", rows[0], dict(max_tokens=3)),  # 3: the first call's second token
           ("pt", rows[0], dict(stop=(f"<{tokens[0][2]}>",), text=text)),
           ("dept", rows[2], {}),  # ends at its stop id (below): the third token
           ("smop", rows[1], {})]  # waits for a slot that a finished sequence frees
  results = []
  for k in (1, 4):
    engine = _k_engine(backbone, table, k, num_slots=2, stop_ids=(tokens[1][2],))
    results.append(_events(engine, specs))
    assert engine.running() == 0 and engine._active == [None, None]  # pylint: disable=protected-access
  one, four = results
  assert one == four
  ends = [events[-1] for events in four]
  assert ends == [("end", "length"), ("end", "stop"), ("end", "stop"), ("end", "length")]
  got = [[e[1] for e in events if e[0] == "token"] for events in four]
  assert got[0] == tokens[0][:3] and got[1] == tokens[0][:tokens[0].index(tokens[0][2]) + 1]
  assert got[2] == tokens[1][:tokens[1].index(tokens[1][2]) + 1]
  alone = _events(_k_engine(backbone, table, 1), [("smop", rows[1], {})])[0]
  assert four[3] == alone  # its slot held another sequence's dropped tokens: no trace of them
