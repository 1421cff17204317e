"""The benchmark runs and reports what trains (no timing assertions here)."""
import json

from spot_jax import bench, cli


def test_bench_rows(tmp_path):
  out = tmp_path / "bench.json"
  assert bench.main(["--config=t5_1_1_test", "--steps=2", "--input_length=16", "--target_length=4",
                     "--batch_size=2", "--prompt_length=8", "--methods=prompt_tuning,model_tuning",
                     f"--json={out}"]) == 0
  rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
  assert set(rows) == {"prompt_tuning", "model_tuning"}
  assert rows["prompt_tuning"]["trainable_params"] == 8 * 32
  assert rows["model_tuning"]["frozen_params"] == 0
  assert rows["prompt_tuning"]["frozen_params"] == rows["model_tuning"]["trainable_params"]
  for row in rows.values():
    assert row["steps_per_sec"] > 0


def test_bench_rejects_bad_input(capsys):
  assert cli.run(bench.main, ["--methods=lora"], "spot_jax.bench") == 2
  assert "unknown method 'lora'" in capsys.readouterr().err
