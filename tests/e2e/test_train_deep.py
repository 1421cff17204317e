"""Deep prompts through the command lines: `python -m spot_jax.train` from their gin files on the
tiny byte model (loss falls), exact resume after SIGKILL, and `python -m spot_jax.infer` serving
both runs' exported prefixes in one mixed batch as each alone."""
from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest

from spot_jax import cli, infer
from spot_jax.prompts import deep
from tests.helpers import REPO
from tests.helpers.kill import kill_at_checkpoint  # noqa: E402
from tests.helpers.train_cli import _cmd, _env, _losses, _run

STEPS = 100
METHODS = {
    "prefix_tuning": ["--gin_file=gin/prompts/prefix_tuning.gin", "--gin.PROMPT_LENGTH=4",
                      "--gin.PREFIX_PROJECTION=True", "--gin.PROJECTION_DIM=16"],
    "ptuning_v2": ["--gin_file=gin/prompts/ptuning_v2.gin", "--gin.PROMPT_LENGTH=3",
                   "--gin.DEEP_STACKS=('encoder', 'decoder')"],
}


def _args(method: str, model_dir) -> list[str]:
  # smoke.gin's task and tiny model; the method's gin file replaces its PROMPT
  return ["--gin_file=gin/test/smoke.gin", *METHODS[method], "--gin.train.train.eval_cfg=None",
          f"--gin.TRAIN_STEPS={STEPS}", "--gin.CHECKPOINT_PERIOD=10",
          "--gin.train.train.log_period=10", f"--gin.MODEL_DIR='{model_dir}'"]


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory):
  """{method: (run directory, stdout)} of uninterrupted runs."""
  out = {}
  for method in METHODS:
    run_dir = tmp_path_factory.mktemp(method) / "ref"
    proc = _run(_args(method, run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out[method] = (run_dir, proc.stdout)
  return out


@pytest.mark.parametrize("method", sorted(METHODS))
def test_trains_from_its_gin_file_and_resumes_exactly_after_sigkill(reference_runs,
                                                                    method, tmp_path):
  ref_dir, stdout = reference_runs[method]
  losses = _losses(stdout)
  assert len(losses) == STEPS // 10 and np.mean(losses[-2:]) < losses[0] - 0.5, losses
  record = np.load(ref_dir / "prompts" / f"prompt_step_{STEPS}.npy")
  parts = deep.from_record(record, method)  # the export is a deep prompt record
  assert set(parts) == ({"encoder", "decoder", "cross"} if method == "prefix_tuning"
                        else {"encoder_tokens", "decoder_tokens"})

  run_dir = tmp_path / "killed"
  proc = subprocess.Popen(_cmd(*_args(method, run_dir)), cwd=REPO, env=_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  kill_at_checkpoint(proc, run_dir, 10, STEPS)
  resumed = _run(_args(method, run_dir))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from" in resumed.stdout
  assert int(re.search(rf"^step (\d+)/{STEPS}", resumed.stdout, re.M).group(1)) > 10
  got = deep.from_record(np.load(run_dir / "prompts" / f"prompt_step_{STEPS}.npy"))
  for k, v in parts.items():
    np.testing.assert_allclose(got[k], v, rtol=0, atol=1e-6, err_msg=k)


def test_infer_serves_both_runs_in_one_batch(reference_runs, tmp_path):
  inputs = tmp_path / "in.jsonl"
  rows = [("this movie was great", "prefix"), ("awful", "ptv2"), ("a fine film", "ptv2"),
          ("not good at all", "prefix")]
  inputs.write_text("".join(json.dumps({"input": t, "prompt": p}) + "\n" for t, p in rows))
  common = ["--model=t5_1_1_byte_tiny", "--vocab=byte", "--input_length=48",
            "--target_length=12", "--label=positive", "--label=negative"]
  runs = {"prefix": reference_runs["prefix_tuning"][0], "ptv2": reference_runs["ptuning_v2"][0]}
  assert cli.run(infer.main, [*common, *(f"--prompt={n}={d}" for n, d in runs.items()),
                              f"--input={inputs}", f"--output={tmp_path / 'mixed.jsonl'}"],
                 infer.PROG) == 0
  mixed = [json.loads(l) for l in (tmp_path / "mixed.jsonl").read_text().splitlines()]
  assert [m["prompt"] for m in mixed] == [p for _, p in rows]
  for name, run_dir in runs.items():  # each run alone, on its own rows
    alone = tmp_path / f"{name}.jsonl"
    mine = tmp_path / f"{name}_in.txt"
    mine.write_text("".join(t + "\n" for t, p in rows if p == name))
    assert cli.run(infer.main, [*common, f"--prompt={name}={run_dir}", f"--input={mine}",
                                f"--output={alone}"], infer.PROG) == 0
    want = [json.loads(l) for l in alone.read_text().splitlines()]
    got = [m for m in mixed if m["prompt"] == name]
    assert [g["prediction"] for g in got] == [w["prediction"] for w in want]
    np.testing.assert_allclose([list(g["label_scores"].values()) for g in got],
                               [list(w["label_scores"].values()) for w in want], atol=1e-4)
