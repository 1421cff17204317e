"""Length-bucketed training batches: same examples, same losses, less padding;
deterministic, resumable.

A local seqio task (byte vocabulary) with a skewed input-length distribution; a tiny T5.1.1.
"""
from __future__ import annotations

import collections
import json
import shutil

import numpy as np
import pytest

from spot_jax import data, models, prompts
from spot_jax.data import bucketing
from spot_jax.train import optimizers
from spot_jax import train as train_lib
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import Transformer, config_by_name
from tests.helpers import bucketing as bucketing_util
from tests.helpers.cli_error_runner import run_cases
from tests.helpers.bucketing_task import BATCH, BUCKETS, LENGTHS, NUM_TRAIN, WINDOW, _cfg
from tests.helpers.cli_errors import STARTUP_NOTE, _env


def _take(it, n):
  return [next(it) for _ in range(n)]


def _rows(batches):
  """Each example as a hashable tuple of its unpadded content (every feature)."""
  out = []
  for b in batches:
    for r in range(len(b["encoder_input_tokens"])):
      enc = b["encoder_input_tokens"][r]
      out.append((tuple(enc[:bucketing.input_lengths(enc[None])[0]]),)
                 + tuple(tuple(np.atleast_1d(b[k][r])) for k in sorted(b)
                         if k != "encoder_input_tokens"))
  return out


def _assert_same_batches(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_every_window_is_regrouped_without_loss_or_duplication(task_name):
  n = 2 * NUM_TRAIN // BATCH  # two epochs
  fixed = _take(data.train_batches(_cfg(task_name, length_buckets=None)), n)
  bucketed = _take(data.train_batches(_cfg(task_name)), n)
  assert all(b["encoder_input_tokens"].shape == (BATCH, 64) for b in fixed)
  for w in range(0, n, WINDOW):
    assert (collections.Counter(_rows(fixed[w:w + WINDOW]))
            == collections.Counter(_rows(bucketed[w:w + WINDOW])))
  # seqio's shuffle buffer mixes neighbouring epochs; unshuffled, each epoch is exactly the task's
  # examples
  unshuffled = _take(data.train_batches(_cfg(task_name, shuffle=False)), n)
  for epoch in (unshuffled[:n // 2], unshuffled[n // 2:]):
    ids = sorted(int(bytes((np.array(r[0][:-1]) - 3).astype(np.uint8)).split()[1])
                 for r in _rows(epoch))
    assert ids == list(range(NUM_TRAIN))
  shapes = set()
  for b in bucketed:
    width = b["encoder_input_tokens"].shape[1]
    longest = bucketing.input_lengths(b["encoder_input_tokens"]).max()
    assert width == min(x for x in (*BUCKETS, 64) if x >= longest)
    assert b["decoder_target_tokens"].shape == (BATCH, 4)
    shapes.add(width)
  assert shapes == {20, 32, 64}, shapes
  padded = sum(b["encoder_input_tokens"].size for b in bucketed)
  assert padded < 0.7 * sum(b["encoder_input_tokens"].size for b in fixed)
  truncated = sum(int(b["inputs_truncated"].sum()) for b in bucketed)
  assert truncated == sum(int(b["inputs_truncated"].sum()) for b in fixed) > 0


def test_deterministic_resumable_and_sliced_across_hosts(task_name):
  n = 3 * WINDOW
  full = _take(data.train_batches(_cfg(task_name)), n)
  _assert_same_batches(full, _take(data.train_batches(_cfg(task_name)), n))
  for start in (1, WINDOW, WINDOW + 3, 2 * WINDOW):
    _assert_same_batches(full[start:], _take(data.train_batches(_cfg(task_name),
                                                                start_position=start), n - start))
  halves = [_take(data.train_batches(_cfg(task_name), start_position=2, shard_id=s,
                                     num_shards=2), 5)
            for s in (0, 1)]
  for a, b, g in zip(*halves, full[2:7]):
    _assert_same_batches([{k: np.concatenate([a[k], b[k]]) for k in g}], [g])
  other_seed = _take(data.train_batches(data.DatasetConfig(task_name, LENGTHS, seed=4,
                                                           batch_size=BATCH, bucket_window=WINDOW,
                                                           length_buckets=BUCKETS)), n)
  assert _rows(other_seed) != _rows(full)


def test_bucket_batches_keeps_every_row_and_orders_batches_by_seed():
  tokens = np.zeros((8, 10), np.int32)
  for i, n in enumerate((9, 1, 3, 10, 2, 4, 7, 5)):
    tokens[i, :n] = np.arange(1, n + 1)
  window = {"encoder_input_tokens": tokens, "idx": np.arange(8)}
  out = bucketing.bucket_batches(window, 2, (4, 8, 10), np.random.RandomState(0))
  assert sorted(np.concatenate([b["idx"] for b in out]).tolist()) == list(range(8))
  by_rows = {tuple(b["idx"]): b["encoder_input_tokens"].shape[1] for b in out}
  assert by_rows == {(1, 2): 4, (4, 5): 4, (6, 7): 8, (0, 3): 10}  # stable within a bucket
  for b in out:
    np.testing.assert_array_equal(b["encoder_input_tokens"],
                                  tokens[b["idx"], :b["encoder_input_tokens"].shape[1]])


@pytest.mark.parametrize("buckets, message", [
    ((32, 16), "not strictly increasing"),
    ((16, 128), "goes beyond TASK_FEATURE_LENGTHS['inputs']=64"),
    ((0, 16), "entry 0 (0) is a bucket of 0 tokens"),
    ((16, 16), "entry 1 (16) is not above entry 0 (16)"),
    ((), "LENGTH_BUCKETS=()"),
    ("big", "LENGTH_BUCKETS='big'"),
    ((16.5,), "LENGTH_BUCKETS=(16.5,)"),
])
def test_bad_buckets_are_one_line_errors(task_name, buckets, message):
  with pytest.raises(ConfigError) as e:
    data.validate(_cfg(task_name, length_buckets=buckets))
  assert message in str(e.value) and "\n" not in str(e.value)


def test_auto_buckets_and_default_off(task_name):
  assert data.bucket_boundaries(_cfg(task_name, length_buckets="auto")) == (16, 32, 64)
  assert data.bucket_boundaries(_cfg(task_name, length_buckets=(16, 64))) == (16, 64)
  assert data.bucket_boundaries(_cfg(task_name, length_buckets=None)) is None


def _prompt(kind):
  if kind == "prompt_tuning":
    return prompts.PromptTuning(length=5)
  if kind == "smop":
    return prompts.SMoP(num_prompts=3, length=2)
  if kind == "prefix_tuning":  # deep prompts: per-layer prefixes placed before the sequence
    return prompts.PrefixTuning(length=4, projection=True, projection_dim=8)
  if kind == "ptuning_v2":
    return prompts.PTuningV2(length=4, stacks=("encoder", "decoder"))
  if kind == "attempt":  # three random "library" sources of the byte-tiny model's width
    return prompts.Attempt(np.random.RandomState(0).normal(0, 1, (3, 5, 64)), bottleneck=8)
  if kind == "mpt":
    return prompts.MultitaskPrompt(length=5, num_tasks=2, rows_init=prompts.mpt.normal(0.5))
  return prompts.ResidualPrompt(length=5, bottleneck=8)


@pytest.mark.parametrize("kind", ["prompt_tuning", "smop", "residual", "prefix_tuning",
                                  "ptuning_v2", "attempt", "mpt"])
def test_per_example_losses_equal_fixed_and_bucketed(task_name, kind):
  """The trainer's loss of each example is the same padded to 64 or to its bucket."""
  got, want = bucketing_util.losses_fixed_and_bucketed(_cfg(task_name), _prompt(kind),
                                                       WINDOW, BUCKETS)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_trainer_compiles_once_per_bucket_and_resumes_exactly(tmp_path, task_name):
  """6 steps straight vs a restart from the same run's step-3 checkpoint
  (mid-window): same losses, prompt."""
  model = models.EncoderDecoderModel(Transformer(config_by_name("t5_1_1_byte_tiny"),
                                                 prompt=_prompt("prompt_tuning")))
  cfg = _cfg(task_name, length_buckets=(32,))

  def run(folder):
    return train_lib.train(model=model, train_dataset_cfg=cfg, total_steps=6,
                         model_dir=str(tmp_path / folder), optimizer=optimizers.adafactor(),
                         eval_period=1000, verbose=False,
                         checkpoint_cfg=train_lib.CheckpointConfig(period=3, keep=3))

  straight = run("straight")
  widths = {b["encoder_input_tokens"].shape[1] for b in _take(data.train_batches(cfg), 6)}
  assert straight.compilations == len(widths) > 1
  shutil.copytree(tmp_path / "straight" / "checkpoints", tmp_path / "resumed" / "checkpoints")
  shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "6")
  resumed = run("resumed")
  assert len(resumed.history) == 3
  np.testing.assert_allclose([h["loss"] for h in resumed.history],
                             [h["loss"] for h in straight.history[3:]], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(resumed.state.params["prompt"]["prompt"]),
                             np.asarray(straight.state.params["prompt"]["prompt"]),
                             rtol=1e-6, atol=1e-7)


TRAIN = ["--gin_file=gin/models/t5_1_1_toy.gin",
         "--gin_file=gin/prompts/prompt_tuning_sampled_vocab.gin",
         "--gin_file=gin/runs/prompt_tune.gin",
         "--gin.MIXTURE_OR_TASK_NAME='spot_toy_reverse_taskless_v100'",
         "--gin.MIXTURE_OR_TASK_MODULE='tasks.embedded'",
         "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 24}",
         "--gin.PROMPT_LENGTH=10", "--gin.BATCH_SIZE=8", "--gin.train.train.eval_cfg=None"]


def test_command_lines(tmp_path):
  """Bad LENGTH_BUCKETS / bench flags: exit 2, one line; a bucketed embedded run;
  a tiny bench_lengths run."""
  run, cache = tmp_path / "run", tmp_path / "cache"
  lengths = tmp_path / "lengths.txt"
  lengths.write_text("# a comment\n"
                     + "\n".join(map(str, [3, 5, 12, 7, 4, 16, 2, 9, 6, 3, 4, 5])) + "\n")
  (tmp_path / "bad_lengths.txt").write_text("12\nseven\n")
  bench_args = [f"--lengths=file:{lengths}", "--model=t5_1_1_byte_tiny", "--method=prompt_tuning",
                "--prompt_length=3", "--batch_size=2", "--buckets=8", "--bucket_window=3",
                "--target_length=4", "--steps=1", "--warmup=0"]
  bench = "benchmarks.lengths"
  cases = [
      ([*bench_args, f"--lengths=file:{tmp_path}/missing.txt"],
       "missing.txt: cannot read it", bench),
      ([*bench_args, f"--lengths=file:{tmp_path}/bad_lengths.txt"], "line 2 is 'seven'", bench),
      ([*bench_args, "--lengths=rte"], "valid: file:<path>", bench),
      ([*bench_args, "--lengths=task:spot_toy_revrse_v100"],
       "did you mean 'spot_toy_reverse_v100'", bench),
      ([*bench_args, "--buckets=8,4"], "not strictly increasing", bench),
      ([*bench_args, "--method=pt1000"], "--method='pt1000' is unknown", bench),
      ([*bench_args, f"--markdown={tmp_path}/no_dir/bench.md"], "no_dir' does not exist", bench),
      ([*bench_args, f"--json={tmp_path}/bench.json"], None, bench),
      ([*TRAIN, f"--gin.MODEL_DIR='{tmp_path}/bad'", "--gin.LENGTH_BUCKETS=(32, 16)"],
       "not strictly increasing"),
      ([*TRAIN, f"--gin.MODEL_DIR='{tmp_path}/bad'", "--gin.LENGTH_BUCKETS=(16, 96)"],
       "goes beyond TASK_FEATURE_LENGTHS['inputs']=48"),
      ([*TRAIN, f"--gin.MODEL_DIR='{tmp_path}/bad'", "--gin.LENGTH_BUCKETS='sometimes'"],
       "LENGTH_BUCKETS='sometimes'"),
      ([*TRAIN, f"--gin.MODEL_DIR='{run}'", "--gin.LENGTH_BUCKETS=(8, 16, 32)",
        "--gin.TRAIN_STEPS=6",
        "--gin.INITIAL_CHECKPOINT_PATH='spot_jax/embedded/toy_t5/checkpoint'",
        f"--gin.COMPILATION_CACHE_DIR='{cache}'"], None),
  ]
  cases = [c if len(c) == 3 else (*c, "spot_jax.train") for c in cases]
  results = run_cases([{"module": m, "args": a, "model_dir": None} for a, _, m in cases], _env(),
                      timeout=600)
  for (_, fragment, module), res in zip(cases, results):
    assert "Traceback" not in res["stderr"] + res["stdout"]
    if fragment is None:
      assert res["code"] == 0, res["stderr"][-2000:]
      continue
    lines = [l for l in res["stderr"].splitlines() if l.strip() and not STARTUP_NOTE.match(l)]
    assert res["code"] == 2 and len(lines) == 1, res["stderr"]
    assert lines[0].startswith(f"{module}: error: ") and fragment in lines[0], lines[0]
    assert res["stderr"].rstrip().splitlines()[-1] == lines[0]
  assert (run / "prompts" / "prompt_step_6.npy").is_file()
  # the step at two or more lengths, at least
  assert len([p for p in cache.rglob("*") if p.is_file()]) >= 2
  _check_bench(json.loads((tmp_path / "bench.json").read_text()))


def _check_bench(result):
  """The tiny bench: 12 lengths (<= 16) in 6 batches of 2; fixed 64 (16 rounded up) vs buckets
  (8, 64)."""
  (dist,) = result["distributions"]
  assert dist["fixed_input_length"] == 64 and dist["buckets"] == [8, 64]
  assert dist["examples"] == 12 and dist["batches"] == 6 and dist["bucket_window"] == 3
  # window 1: 3 5 12 7 4 16 in some order -> pairs by bucket; the stream is a permutation, so only
  # totals:
  assert sum(dist["bucketed_batches_per_width"].values()) == 6
  assert result["num_compiles"] == len(result["widths"]) == 2
  step = {w["width"]: w["step_sec_median"] for w in result["widths"]}
  np.testing.assert_allclose(dist["fixed_sec"], 6 * step[64])
  np.testing.assert_allclose(dist["bucketed_sec"], sum(
      n * step[int(w)] for w, n in dist["bucketed_batches_per_width"].items()))
  np.testing.assert_allclose(dist["bucketed_examples_per_sec"], 12 / dist["bucketed_sec"])
  # one round
  np.testing.assert_allclose(dist["speedup_per_round"], [dist["fixed_sec"] / dist["bucketed_sec"]])
  flops = {w["width"]: w["flops_per_step"] for w in result["widths"]}
  bucketed_flops = sum(n * flops[int(w)] for w, n in dist["bucketed_batches_per_width"].items())
  np.testing.assert_allclose(dist["flops_ratio"], 6 * flops[64] / bucketed_flops)
  assert flops[8] < flops[64]
  assert dist["fixed_real_token_fraction"] == pytest.approx(76 / (12 * 64))
