"""The decoder-only benchmarks at tiny shapes: both sides compute the same thing on the same
inputs (no timing asserted).

`benchmarks.decoder_train_step --vs=peft`: step 1's loss of spot-jax's trainer step equals
PEFT's on the weights and prompt PEFT wrote (weights ~ N(0, 1), so the loss is not the
uniform ln V that any two models would share). `benchmarks.decoder_serve --vs=peft`: mixed
batches equal one prompt at a time, and PEFT's scores and greedy tokens equal spot-jax's.
"""
from __future__ import annotations

import json
import math
import pathlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from benchmarks import decoder_serve, decoder_train_step, serve  # noqa: E402

TINY_TRAIN = ["--batch_size=2", "--input_length=6", "--target_length=4", "--prompt_length=3",
              "--steps=1", "--warmup=0", "--weight_std=1.0", "--peer_threads=1"]
TINY_SERVE = ["--num_layers=2", "--emb_dim=32", "--num_heads=4", "--num_kv_heads=2",
              "--head_dim=8", "--mlp_dim=64", "--vocab_size=128", "--prompt_length=3",
              "--workloads=4x2", "--input_length=8", "--target_length=4", "--batch_size=4",
              "--repeats=1", "--peer_threads=1"]


def _rows(path: pathlib.Path) -> list[dict]:
  return json.loads(path.read_text())["rows"]


def test_reduced_gemma_keeps_a_full_layer_last():
  config = decoder_train_step.reduced_config("gemma_3_1b", 2)
  assert config.num_layers == 2 and config.layer_types == ("sliding", "full")
  assert config.vocab_size == 262144 and config.emb_dim == 1152
  assert decoder_train_step.reduced_config("llama_3_2_1b", 2).layer_types == ()


def test_train_step_loss_equals_peft(tmp_path):
  out = tmp_path / "train.json"
  assert decoder_train_step.main(
      TINY_TRAIN + ["--models=decoder_tiny_llama,decoder_tiny_gemma3", "--num_layers=2",
                    f"--json={out}"]) == 0
  rows = _rows(out)
  assert [r["model"] for r in rows] == ["decoder_tiny_llama", "decoder_tiny_gemma3"]
  for r in rows:
    ours, theirs = r["spot_jax"], r["peft"]
    assert abs(ours["first_loss"] - theirs["first_loss"]) <= 1e-4 * theirs["first_loss"], r
    assert abs(ours["first_loss"] - math.log(r["vocab_size"])) > 0.1  # not uniform logits
    assert ours["trainable_params"] == theirs["trainable_params"] == 3 * r["emb_dim"]
    assert r["speedup"] == pytest.approx(ours["steps_per_sec"] / theirs["steps_per_sec"])


def test_remat_and_int8_rows_price_against_none(tmp_path):
  """Each remat x quantization pair is a row; remat computes the same step 1 loss as none."""
  out = tmp_path / "remat.json"
  assert decoder_train_step.main(
      TINY_TRAIN + ["--models=decoder_tiny_llama", "--num_layers=2", "--vs=none",
                    "--remat=none,full", "--quantization=none,int8", f"--json={out}"]) == 0
  rows = {r["model"]: r for r in _rows(out)}
  assert list(rows) == ["decoder_tiny_llama", "decoder_tiny_llama int8",
                        "decoder_tiny_llama remat full", "decoder_tiny_llama int8 remat full"]
  base = rows["decoder_tiny_llama"]["spot_jax"]
  full, int8 = rows["decoder_tiny_llama remat full"], rows["decoder_tiny_llama int8"]
  assert abs(full["spot_jax"]["first_loss"] - base["first_loss"]) <= 1e-6 * base["first_loss"]
  assert abs(rows["decoder_tiny_llama int8 remat full"]["spot_jax"]["first_loss"]
             - int8["spot_jax"]["first_loss"]) <= 1e-6 * base["first_loss"]
  for r in (full, int8):
    assert r["step_time_vs_float32"] == pytest.approx(
        r["spot_jax"]["step_sec_median"] / base["step_sec_median"])


def test_serving_predictions_equal_peft(tmp_path):
  out = tmp_path / "serve.json"
  assert decoder_serve.main(TINY_SERVE + [f"--json={out}"]) == 0
  rows = _rows(out)
  assert {(r["way"], r["task"]) for r in rows} == {
      (w, t) for w in ("mixed", "one-prompt", "peft") for t in ("score", "generate")}
  for r in rows:
    if r["way"] == "mixed":
      assert r["checked_against_one_prompt"]["identical"], r
      assert r["distinct_predictions"] > 2  # real answers, not one repeated
    if r["way"] == "peft":
      check = r["agreement_with_mixed"]
      assert check["identical"] and check["agree"] == check["of"] == 8, r
      if r["task"] == "score":
        assert check["max_score_diff"] <= serve.SCORE_TOLERANCE
