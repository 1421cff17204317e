"""Deep prompts through the command lines: `python -m spot_jax.train` from their gin files on the
tiny byte model (loss falls), exact resume after SIGKILL, and `python -m spot_jax.infer` serving
both runs' exported prefixes in one mixed batch as each alone."""
from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest

from spot_jax.prompts import deep
from tests.helpers import REPO
from tests.helpers.kill import kill_at_checkpoint  # noqa: E402
from tests.helpers.train_cli import _cmd, _env, _losses, run_in_one_process

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


ROWS = [("this movie was great", "prefix"), ("awful", "ptv2"), ("a fine film", "ptv2"),
        ("not good at all", "prefix")]
SERVED = {"prefix": "prefix_tuning", "ptv2": "ptuning_v2"}
INFER = ["--model=t5_1_1_byte_tiny", "--vocab=byte", "--input_length=48", "--target_length=12",
         "--label=positive", "--label=negative"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict, dict]:
  """Per method an uninterrupted run and one SIGKILLed once checkpoint 10 exists, then
  restarted; then `python -m spot_jax.infer` on both runs in one mixed batch ("mixed", ROWS) and
  on each alone on its own rows ("prefix", "ptv2"). The killed runs have processes of their own;
  the rest run in one process, each as `python -m` would.
  -> ({method: (reference dir, killed dir)}, {case: result})."""
  root = tmp_path_factory.mktemp("deep")
  dirs = {m: (root / m / "ref", root / m / "killed") for m in METHODS}
  for method, (_, killed) in dirs.items():
    proc = subprocess.Popen(_cmd(*_args(method, killed)), cwd=REPO, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_at_checkpoint(proc, killed, 10, STEPS)
  (root / "in.jsonl").write_text("".join(json.dumps({"input": t, "prompt": p}) + "\n"
                                         for t, p in ROWS))
  cases = {f"ref {m}": ("spot_jax.train", _args(m, ref)) for m, (ref, _) in dirs.items()}
  cases.update({f"resumed {m}": ("spot_jax.train", _args(m, killed))
                for m, (_, killed) in dirs.items()})
  cases["mixed"] = ("spot_jax.infer", [*INFER, *(f"--prompt={n}={dirs[m][0]}"
                                                 for n, m in SERVED.items()),
                                       f"--input={root / 'in.jsonl'}",
                                       f"--output={root / 'mixed.jsonl'}"])
  for name, method in SERVED.items():  # each run alone, on its own rows
    (root / f"{name}_in.txt").write_text("".join(t + "\n" for t, p in ROWS if p == name))
    cases[name] = ("spot_jax.infer", [*INFER, f"--prompt={name}={dirs[method][0]}",
                                      f"--input={root / f'{name}_in.txt'}",
                                      f"--output={root / f'{name}.jsonl'}"])
  return dirs, dict(zip(cases, run_in_one_process(list(cases.values()))))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_trains_from_its_gin_file_and_resumes_exactly_after_sigkill(runs, method):
  (ref_dir, run_dir), results = runs[0][method], runs[1]
  reference, resumed = results[f"ref {method}"], results[f"resumed {method}"]
  assert reference.returncode == 0, reference.stderr[-3000:]
  losses = _losses(reference.stdout)
  assert len(losses) == STEPS // 10 and np.mean(losses[-2:]) < losses[0] - 0.5, losses
  record = np.load(ref_dir / "prompts" / f"prompt_step_{STEPS}.npy")
  parts = deep.from_record(record, method)  # the export is a deep prompt record
  assert set(parts) == ({"encoder", "decoder", "cross"} if method == "prefix_tuning"
                        else {"encoder_tokens", "decoder_tokens"})

  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from" in resumed.stdout
  assert int(re.search(rf"^step (\d+)/{STEPS}", resumed.stdout, re.M).group(1)) > 10
  got = deep.from_record(np.load(run_dir / "prompts" / f"prompt_step_{STEPS}.npy"))
  for k, v in parts.items():
    np.testing.assert_allclose(got[k], v, rtol=0, atol=1e-6, err_msg=k)


def test_infer_serves_both_runs_in_one_batch(runs):
  dirs, results = runs
  for name in ("mixed", *SERVED):
    assert results[name].returncode == 0, results[name].stderr[-3000:]
  root = dirs["prefix_tuning"][0].parents[1]
  mixed = [json.loads(l) for l in (root / "mixed.jsonl").read_text().splitlines()]
  assert [m["prompt"] for m in mixed] == [p for _, p in ROWS]
  for name in SERVED:
    want = [json.loads(l) for l in (root / f"{name}.jsonl").read_text().splitlines()]
    got = [m for m in mixed if m["prompt"] == name]
    assert [g["prediction"] for g in got] == [w["prediction"] for w in want]
    np.testing.assert_allclose([list(g["label_scores"].values()) for g in got],
                               [list(w["label_scores"].values()) for w in want], atol=1e-4)
