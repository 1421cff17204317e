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

from spot_jax import cli, infer, models, partitioning, prompts
from spot_jax import backbone as backbone_lib
from spot_jax.t5 import Transformer, config_by_name, generate
from tests.helpers import REPO
from tests.helpers.kill import kill_at_checkpoint  # noqa: E402
from tests.helpers.train_cli import _cmd, _env, _losses, _run

MODEL = ["--gin_file=gin/models/t5_1_1_byte_tiny.gin"]
RUN = ["--gin_file=gin/runs/prompt_tune.gin"]
COMMON = ["--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentiment_v100'",
          "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}", "--gin.BATCH_SIZE=16",
          "--gin.prompts.sampled_vocab.num_most_frequent=256", "--gin.train.train.eval_cfg=None",
          "--gin.TRAIN_STEPS=300", "--gin.CHECKPOINT_PERIOD=20", "--gin.train.train.log_period=50"]
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


def _train_killed_then_resumed(args: list[str],
                               run_dir: pathlib.Path) -> subprocess.CompletedProcess:
  proc = subprocess.Popen(_cmd(*args, f"--gin.MODEL_DIR='{run_dir}'"), cwd=REPO, env=_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  kill_at_checkpoint(proc, run_dir, 20, 300)
  return _run([*args, f"--gin.MODEL_DIR='{run_dir}'"])


def _reference_predictions(module, run_dir: pathlib.Path, texts: list[str]) -> list[str]:
  """The unfolded module with the run's final state, each input alone, t5.generate."""
  state = ocp.StandardCheckpointer().restore(run_dir / "checkpoints" / "300" / "default")
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
def test_trains_from_gin_resumes_after_sigkill_and_serves(tmp_path, capsys, method):
  args, module = METHODS[method]
  args = [*args, *COMMON]
  reference = _run([*args, f"--gin.MODEL_DIR='{tmp_path / 'ref'}'"])
  assert reference.returncode == 0, reference.stderr[-3000:]
  losses = _losses(reference.stdout)
  assert len(losses) == 6 and min(losses[1:]) < losses[0], reference.stdout[-2000:]
  exported = sorted(p.name for p in (tmp_path / "ref" / "prompts").glob("*.npy"))
  if method == "dept":
    assert "offset_step_300.npy" in exported and "lr 0.3" in reference.stdout
  else:
    assert not [n for n in exported if not n.startswith("prompt_")]

  resumed = _train_killed_then_resumed(args, tmp_path / "killed")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from" in resumed.stdout
  assert int(re.search(r"^step (\d+)/300", resumed.stdout, re.M).group(1)) > 20
  for name in exported:
    if name.endswith("_300.npy"):
      np.testing.assert_allclose(np.load(tmp_path / "killed" / "prompts" / name),
                                 np.load(tmp_path / "ref" / "prompts" / name), rtol=0, atol=1e-6)

  texts = ["a good film", "dull and slow", "never again", "great acting and a good plot"]
  (tmp_path / "in.jsonl").write_text("\n".join(json.dumps({"input": t}) for t in texts) + "\n")
  status = cli.run(infer.main, ["--model=t5_1_1_byte_tiny", "--vocab=byte",
                                f"--prompt=m={tmp_path / 'ref'}",
                                f"--input={tmp_path / 'in.jsonl'}",
                                f"--output={tmp_path / 'out.jsonl'}", "--input_length=48",
                                "--target_length=6"], infer.PROG)
  assert status == 0, capsys.readouterr().err[-2000:]
  served = [json.loads(l)["prediction"] for l in (tmp_path / "out.jsonl").read_text().splitlines()]
  want = _reference_predictions(module, tmp_path / "ref", texts)
  assert served == want
