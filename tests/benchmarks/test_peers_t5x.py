"""`benchmarks --vs=t5x`: t5x's step of prompt-tuning's model and of spot-jax's contrib model
on the same shape (no timing assertions)."""
import json
import os
import subprocess
import sys

import pytest

from spot_jax import cli
from benchmarks import train_step as bench
from benchmarks import common
from benchmarks.peers import t5x_train as bench_t5x
from spot_jax.backbones.t5 import CONFIGS
from tests.helpers import REPO as ROOT

TINY = ["--model=t5_1_1_test", "--steps=1", "--input_length=8", "--target_length=4",
        "--batch_size=2", "--prompt_length=4", "--warmup=0", "--inference_steps=1"]
needs_t5x = pytest.mark.skipif(not common.t5x_importable(),
                               reason="t5x, flaxformer and prompt_tuning are not importable "
                                      "(put their checkouts on PYTHONPATH; see docs/t5x.md)")


def test_the_issue_shape_is_t5_1_1_small_with_6_layers_of_8_heads():
  config = CONFIGS["t5_1_1_small_like"]
  assert bench.bench_config("t5_1_1_small", {"num_layers": 6, "num_heads": 8}) == config
  assert (config.emb_dim, config.num_heads, config.head_dim, config.mlp_dim) == (512, 8, 64, 1024)
  assert (config.num_encoder_layers, config.num_decoder_layers, config.vocab_size) == (6, 6, 32128)
  assert config.mlp_activations == ("gelu", "linear") and not config.logits_via_embedding
  assert common.t5x_shape(config)["num_heads"] == 8


@needs_t5x
def test_vs_t5x_runs_prompt_tunings_model_on_the_same_shape(tmp_path):
  out, md = tmp_path / "bench.json", tmp_path / "bench.md"
  assert bench.main(TINY + ["--methods=prompt_tuning,smop4x5", "--vs=t5x", "--dropout_rate=0",
                            f"--json={out}", f"--markdown={md}"]) == 0
  rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
  assert "t5x" not in rows["smop4x5"]
  ours, t5x = rows["prompt_tuning"], rows["prompt_tuning"]["t5x"]
  assert t5x["shape"] == {k: ours["shape"][k] for k in common.SHAPE_KEYS}
  assert ((t5x["batch_size"], t5x["input_length"], t5x["target_length"],
           t5x["prompt_length"]) == (2, 8, 4, 4))
  # Same architecture: flaxformer's T5.1.1 has exactly spot-jax's frozen parameters, and only the
  # [prompt_length, emb_dim] prompt is trained on both sides.
  assert t5x["trainable_params"] == ours["trainable_params"] == 4 * 32
  assert t5x["frozen_params"] == ours["frozen_params"]
  assert (t5x["speedup_of_spot_jax"]
          == pytest.approx(t5x["step_sec_median"] / ours["step_sec_median"]))
  # spot-jax's contrib model under t5x's Trainer: the same parameters, and XLA's FLOPs of the step
  # within 1% of spot-jax's own step (t5x's metrics and z-loss; no frozen-weight gradient).
  contrib = ours["t5x_contrib"]
  assert (contrib["model"], contrib["framework"]) == ("contrib", "t5x + spot-jax contrib")
  assert contrib["shape"] == t5x["shape"] and contrib["batch_size"] == t5x["batch_size"] == 2
  assert ((contrib["trainable_params"], contrib["frozen_params"]) == (ours["trainable_params"],
                                                                      ours["frozen_params"]))
  assert ours["flops_per_step"] <= contrib["flops_per_step"] <= 1.01 * ours["flops_per_step"]
  # not interleaved
  assert "t5x_process_spot_jax" not in ours and "paired_step_ratio" not in contrib
  for row in (ours, t5x, contrib):
    assert row["lower_sec"] < row["compile_sec"] < row["compile_plus_first_step_sec"]
    assert row["hlo_ops"]["stablehlo"] > 0 and row["hlo_ops"]["optimized_hlo"] > 0
    assert row["flops_per_step"] > 0 and row["peak_host_memory_bytes"] > 0
  text = md.read_text()
  assert ("| prompt_tuning | t5x + prompt-tuning |" in text
          and "| prompt_tuning | spot-jax |" in text)
  assert "| prompt_tuning | t5x + spot-jax contrib |" in text
  assert ours["dropout_rng"] == "threefry" and not t5x["use_hardware_rng"]
  assert "threefry" in t5x["prng_impl"]


@needs_t5x
def test_vs_t5x_pairs_unsafe_rbg_with_t5xs_hardware_rng_and_interleaves(tmp_path):
  out = tmp_path / "bench.json"
  assert bench.main(TINY + ["--methods=prompt_tuning", "--vs=t5x", "--dropout_rate=0.1",
                            "--steps=2", "--dropout_rng=unsafe_rbg", "--interleave",
                            f"--json={out}"]) == 0
  row = json.loads(out.read_text())["rows"][0]
  assert row["dropout_rng"] == "unsafe_rbg"
  for key in ("t5x", "t5x_contrib"):
    assert row[key]["use_hardware_rng"] and "unsafe_rbg" in row[key]["prng_impl"]
    assert row[key]["final_loss"] > 0
  # --interleave: the t5x process also ran spot-jax's own step; each row's paired ratio is the
  # median over rounds of its step time over that step's in the same round.
  own = row["t5x_process_spot_jax"]
  assert own["dropout_rng"] == "unsafe_rbg" and own["paired_step_ratio"] == 1.0
  # The parent's step, but under t5x's USE_HARDWARE_RNG every key of the process is unsafe_rbg
  # (the parent's state keys stay threefry): a few key-handling ops differ.
  assert own["flops_per_step"] == pytest.approx(row["flops_per_step"], rel=1e-2)
  assert (own["trainable_params"] == row["trainable_params"]
          and own["frozen_params"] == row["frozen_params"])
  for key in ("t5x", "t5x_contrib"):
    peer = row[key]
    assert peer["timing"] == "interleaved" and len(peer["step_sec_all"]) == 2
    ratios = [t / f for t, f in zip(peer["step_sec_all"], own["step_sec_all"])]
    assert peer["paired_step_ratio"] == pytest.approx(sum(ratios) / 2)


def _without_t5x_env():
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  probe = subprocess.run([sys.executable, "-c", "from benchmarks import common as b; "
                          "print(b.t5x_importable())"], capture_output=True, text=True,
                         env=env, cwd=ROOT)
  if probe.stdout.strip() != "False":
    pytest.skip("t5x is importable without PYTHONPATH (installed in site-packages)")
  return env


@pytest.mark.parametrize("module,args", [
    ("benchmarks", ["--vs=t5x"] + TINY),
    ("benchmarks.peers.t5x_train", ["--shape=" + json.dumps({k: 8 for k in common.SHAPE_KEYS})]),
])
def test_without_t5x_one_line_error_naming_pythonpath(module, args):
  proc = subprocess.run([sys.executable, "-m", module] + args, capture_output=True, text=True,
                        env=_without_t5x_env(), cwd=ROOT, timeout=300)
  err = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
  assert len(err) == 1 and err[0].startswith(f"{module}: error: ")
  assert "not importable" in err[0] and "PYTHONPATH" in err[0] and "prompt-tuning" in err[0]


@pytest.mark.parametrize("args,message", [
    (["--num_heads=0"], "--num_heads=0 must be a positive integer"),
    (["--vs=t5x", "--methods=smop4x5"], "--vs=t5x compares Prompt Tuning"),
    (["--vs=t5x", "--model=t5_small"], "--vs=t5x needs a T5.1.1 config"),
    (["--vs=t5y"], "invalid choice"),
    (["--vs=t5x", "--dropout_rng=rbg"],
     "--vs=t5x with --dropout_rng=rbg: t5x has no such setting; valid: threefry (t5x's default) or "
     "unsafe_rbg (t5x's USE_HARDWARE_RNG)"),
])
def test_bench_rejects_bad_shape_and_vs_input(capsys, args, message):
  assert cli.run(bench.main, args, "benchmarks") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("benchmarks: error: ") and message in err[0]


@pytest.mark.parametrize("args,message", [
    (["--shape={"], "--shape is not JSON"), (['--shape={"emb_dim": 8}'], "--shape lacks"),
    (["--shape=" + json.dumps({k: 8 for k in common.SHAPE_KEYS}), "--models=pt,contrib"],
     "--models='pt,contrib': unknown or no model; valid: prompt_tuning, contrib"),
])
def test_bench_t5x_rejects_bad_input(capsys, args, message):
  assert cli.run(bench_t5x.main, args, "benchmarks.peers.t5x_train") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert (len(err) == 1 and err[0].startswith("benchmarks.peers.t5x_train: error: ")
          and message in err[0])


def test_bench_compiles_the_train_step_once(caplog, tmp_path):
  """No retrace or second compile of the timed step (jax_log_compiles names every XLA compile)."""
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_log_compiles", True)
  try:
    with caplog.at_level("WARNING"):
      assert bench.main(TINY + ["--methods=prompt_tuning", "--steps=2", "--warmup=1"]) == 0
  finally:
    jax.config.update("jax_log_compiles", False)
  compiles = [r.getMessage() for r in caplog.records if "XLA compilation of" in r.getMessage()]
  assert sum("jit(train_step)" in m for m in compiles) == 1, compiles
  assert sum("jit(score_batch)" in m for m in compiles) == 1, compiles
