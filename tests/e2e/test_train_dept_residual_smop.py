"""DePT and Residual SMoP as a user runs them: `python -m spot_jax.train` from their gin files on a
tiny model, SIGKILL and restart (the same final prompt as an uninterrupted run), then
`python -m spot_jax.infer` on the run directory (the same predictions as the unfolded module)."""
from __future__ import annotations

import json
import pathlib
import re
import subprocess

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import seqio

from spot_jax import models, partitioning, prompts
from spot_jax import backbone as backbone_lib
from spot_jax.backbones.t5 import Transformer, config_by_name, generate
from tests.helpers import REPO
from tests.helpers.kill import kill_at_checkpoint  # noqa: E402
from tests.helpers.train_cli import _cmd, _env, _losses, run_in_one_process

STEPS = 120
MODEL = ["--gin_file=gin/models/t5_1_1_byte_tiny.gin"]
RUN = ["--gin_file=gin/runs/prompt_tune.gin"]
COMMON = ["--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentiment_v100'",
          "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}", "--gin.BATCH_SIZE=16",
          "--gin.prompts.sampled_vocab.num_most_frequent=256", "--gin.train.train.eval_cfg=None",
          f"--gin.TRAIN_STEPS={STEPS}", "--gin.CHECKPOINT_PERIOD=20",
          f"--gin.train.train.log_period={STEPS // 6}"]
# DePT's file comes after the run file (it sets OPTIMIZER); Residual SMoP's before it.
METHODS = {
    "dept": (MODEL + RUN + ["--gin_file=gin/prompts/dept.gin", "--gin.PROMPT_LENGTH=6",
                            "--gin.DEPT_RANK=4", "--gin.MAX_INPUT_LENGTH=48",
                            "--gin.OFFSET_LEARNING_RATE=0.05", "--gin.LENGTH_BUCKETS=(24,)"],
             prompts.DePT(6, max_length=48, rank=4)),
    "residual_smop": (MODEL + ["--gin_file=gin/prompts/residual_smop.gin"] + RUN
                      + ["--gin.NUM_PROMPTS=3", "--gin.PROMPT_LENGTH=2", "--gin.BOTTLENECK=16",
                         "--gin.SHARED_MLP=False"],
                      prompts.ResidualSMoP(3, 2, bottleneck=16, shared_mlp=False)),
}
CONFIG = config_by_name("t5_1_1_byte_tiny", dropout_rate=0.0)


TEXTS = ["a good film", "dull and slow", "never again", "great acting and a good plot"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[pathlib.Path, dict]:
  """Per method an uninterrupted run (<method>/ref) and one SIGKILLed once checkpoint 20 exists,
  then restarted (<method>/killed); then `python -m spot_jax.infer` on each reference run with
  TEXTS. The killed runs have processes of their own; the rest run in one process, each as
  `python -m` would. -> (root, {case: result})."""
  root = tmp_path_factory.mktemp("methods")
  for method, (args, _) in METHODS.items():
    run_dir = root / method / "killed"
    proc = subprocess.Popen(_cmd(*args, *COMMON, f"--gin.MODEL_DIR='{run_dir}'"), cwd=REPO,
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_at_checkpoint(proc, run_dir, 20, STEPS)
  (root / "in.jsonl").write_text("\n".join(json.dumps({"input": t}) for t in TEXTS) + "\n")
  cases = {f"{run} {m}": ("spot_jax.train", [*args, *COMMON, f"--gin.MODEL_DIR='{root / m / run}'"])
           for run in ("ref", "killed") for m, (args, _) in METHODS.items()}
  cases.update({f"infer {m}": ("spot_jax.infer", [
      "--model=t5_1_1_byte_tiny", "--vocab=byte", f"--prompt=m={root / m / 'ref'}",
      f"--input={root / 'in.jsonl'}", f"--output={root / m / 'out.jsonl'}", "--input_length=48",
      "--target_length=6"]) for m in METHODS})
  return root, dict(zip(cases, run_in_one_process(list(cases.values()))))


def _reference_predictions(module, run_dir: pathlib.Path, texts: list[str]) -> list[str]:
  """The unfolded module with the run's final state, each input alone, t5.generate."""
  state = ocp.StandardCheckpointer().restore(run_dir / "checkpoints" / str(STEPS) / "default")
  model = models.EncoderDecoderModel(Transformer(CONFIG))
  backbone, _ = backbone_lib.load_backbone(model, model.dummy_batch(4, 4), None, 0,
                                           partitioning.create_mesh(1),
                                           partitioning.logical_rules(), info=lambda _: None)
  vocab = seqio.ByteVocabulary()
  out = []
  for text in texts:
    ids = list(vocab.encode(text))[:47] + [1]
    tokens = np.zeros((1, 48), np.int32)
    tokens[0, :len(ids)] = ids
    decoded, _ = generate(Transformer(CONFIG, prompt=module),
                          {**backbone, "prompt": state["params"]["prompt"]}, jnp.asarray(tokens),
                          max_decode_length=6)
    row = [int(t) for t in np.asarray(decoded[0])]
    out.append(vocab.decode([t for t in row[:row.index(1) if 1 in row else None] if t > 0]))
  return out


@pytest.mark.parametrize("method", sorted(METHODS))
def test_trains_from_gin_resumes_after_sigkill_and_serves(runs, method):
  root, results = runs
  ref_dir, run_dir = root / method / "ref", root / method / "killed"
  reference = results[f"ref {method}"]
  assert reference.returncode == 0, reference.stderr[-3000:]
  losses = _losses(reference.stdout)
  assert len(losses) == 6 and min(losses[1:]) < losses[0], reference.stdout[-2000:]
  exported = sorted(p.name for p in (ref_dir / "prompts").glob("*.npy"))
  if method == "dept":
    assert f"offset_step_{STEPS}.npy" in exported and "lr 0.3" in reference.stdout
  else:
    assert not [n for n in exported if not n.startswith("prompt_")]

  resumed = results[f"killed {method}"]  # restarted after the SIGKILL
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from" in resumed.stdout
  assert int(re.search(rf"^step (\d+)/{STEPS}", resumed.stdout, re.M).group(1)) > 20
  for name in exported:
    if name.endswith(f"_{STEPS}.npy"):
      np.testing.assert_allclose(np.load(run_dir / "prompts" / name),
                                 np.load(ref_dir / "prompts" / name), rtol=0, atol=1e-6)

  served = results[f"infer {method}"]
  assert served.returncode == 0, served.stderr[-2000:]
  predictions = [json.loads(l)["prediction"]
                 for l in (root / method / "out.jsonl").read_text().splitlines()]
  assert predictions == _reference_predictions(METHODS[method][1], ref_dir, TEXTS)
