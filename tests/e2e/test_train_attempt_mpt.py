"""ATTEMPT and MPT as users run them: training from the gin files on a mixture (each example with
its task index), exact resume after SIGKILL, an MPT target from the distilled source, and
serving every task of the runs in one mixed batch with `spot_jax.infer`."""
from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from spot_jax import backbone as backbone_lib
from spot_jax import prompts
from spot_jax.serve import peft_mpt, prompt_loaders
from spot_jax.run_dir import RunDir
from spot_jax.serve.table import PromptTable
from spot_jax.spot import library as prompt_library
from spot_jax.t5 import config_by_name
from tests.helpers import REPO  # noqa: E402
from tests.helpers.kill import kill_at_checkpoint  # noqa: E402
from tests.helpers.train_cli import _env, _losses

PARITY, SENTIMENT = "spot_synthetic_parity_v100", "spot_synthetic_sentiment_v100"
TASKS = [PARITY, SENTIMENT]
LENGTH = 6
CONFIG = config_by_name("t5_1_1_byte_tiny")
COMMON = ["--gin_file=gin/models/t5_1_1_byte_tiny.gin",
          "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}", "--gin.BATCH_SIZE=16",
          "--gin.DROPOUT_RATE=0.0", "--gin.train.train.eval_cfg=None", "--gin.LEARNING_RATE=0.3"]


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> pathlib.Path:
  """A SPoT library of the random byte-tiny backbone: one entry per synthetic task (random
  prompts stand in for trained ones: the methods only read them), and one more source."""
  root = tmp_path_factory.mktemp("lib")
  fp = backbone_lib.fingerprint(CONFIG, None, 0)
  rs = np.random.RandomState(0)
  lib = prompt_library.Library(root)
  for entry_id, task in (("parity.p0", PARITY), ("sentiment.p0", SENTIMENT),
                         ("extra.p0", SENTIMENT)):
    prompt = rs.normal(0, 1, (LENGTH, CONFIG.emb_dim)).astype(np.float32)
    lib.add(entry_id=entry_id, task=task, run_id=entry_id, seed=0, fingerprint=fp, prompt=prompt,
            embedding=prompt[:2], score=50.0 if entry_id != "extra.p0" else 10.0, metric="accuracy")
  return root


def _train(args, timeout=900) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "spot_jax.train", *COMMON, *args], cwd=REPO,
                        env=_env(), capture_output=True, text=True, timeout=timeout)


def _reference_and_killed_run(args, ref_dir: pathlib.Path, run_dir: pathlib.Path, steps: int,
                              period: int) -> subprocess.CompletedProcess:
  """Runs the command twice at once: to the end in `ref_dir` (returned), and in `run_dir`
  SIGKILLed once checkpoint `period` exists, then rerun there to the end."""
  def start(model_dir, out):
    return subprocess.Popen([sys.executable, "-m", "spot_jax.train", *COMMON, *args,
                             f"--gin.MODEL_DIR='{model_dir}'"], cwd=REPO, env=_env(), stdout=out,
                            stderr=subprocess.STDOUT if out is not subprocess.DEVNULL
                            else out, text=True)
  ref = start(ref_dir, subprocess.PIPE)
  proc = start(run_dir, subprocess.DEVNULL)
  kill_at_checkpoint(proc, run_dir, period, steps, timeout=600)
  out, _ = ref.communicate(timeout=900)
  assert ref.returncode == 0, out[-3000:]
  resumed = _train([*args, f"--gin.MODEL_DIR='{run_dir}'"])
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from" in resumed.stdout
  first = int(re.search(rf"^step (\d+)/{steps}", resumed.stdout, re.M).group(1))
  assert first > period
  _same_final_state(ref_dir, run_dir, steps)
  return subprocess.CompletedProcess(ref.args, ref.returncode, out, "")


def _same_final_state(a: pathlib.Path, b: pathlib.Path, steps: int) -> None:
  name = f"prompt_step_{steps}.npy"
  np.testing.assert_allclose(np.load(b / "prompts" / name), np.load(a / "prompts" / name),
                             rtol=0, atol=1e-6)
  pa, pb = RunDir(a).prompt_params(), RunDir(b).prompt_params()
  for path_value in zip(*(sorted(_flat(p).items()) for p in (pa, pb))):
    (ka, va), (kb, vb) = path_value
    assert ka == kb
    np.testing.assert_allclose(vb, va, rtol=0, atol=1e-6, err_msg=ka)


def _flat(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    out.update(_flat(v, f"{prefix}{k}/") if isinstance(v, dict)
               else {f"{prefix}{k}": np.asarray(v)})
  return out


STEPS, PERIOD = 120, 20


def test_attempt_multitask_trains_resumes_and_serves(tmp_path, library):
  args = ["--gin_file=gin/prompts/attempt_multitask.gin", "--gin_file=gin/runs/prompt_tune.gin",
          "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_mix_v100'", f"--gin.TRAIN_STEPS={STEPS}",
          f"--gin.CHECKPOINT_PERIOD={PERIOD}", f"--gin.TASK_NAMES={TASKS}",
          "--gin.ATTENTION_BOTTLENECK=16",
          f"--gin.SOURCE_PROMPTS=['{library}#parity.p0', '{library}#sentiment.p0', "
          f"'{library}#extra.p0']",
          "--gin.train.train.log_period=20"]
  ref = _reference_and_killed_run(args, tmp_path / "ref", tmp_path / "killed", STEPS, PERIOD)
  assert len(_losses(ref.stdout)) == STEPS // 20 and np.all(np.isfinite(_losses(ref.stdout)))
  export = np.load(tmp_path / "ref" / "prompts" / f"prompt_step_{STEPS}.npy")
  assert export.shape == (3 + 2, LENGTH, CONFIG.emb_dim)
  # The sources stayed as given; both targets trained away from their start (the first source).
  lib = prompt_library.Library(library)
  np.testing.assert_array_equal(export[:3], [lib.get(i).prompt
                                             for i in ("parity.p0", "sentiment.p0", "extra.p0")])
  assert np.abs(export[3:] - export[0]).max(axis=(1, 2)).min() > 0.1

  # Served from the run directory: the same entries as from the module and its trained params.
  sources = np.stack([prompt_library.Library(library).get(i).prompt
                      for i in ("parity.p0", "sentiment.p0", "extra.p0")])
  module = prompts.Attempt(sources, num_targets=2, bottleneck=16)
  params = RunDir(tmp_path / "ref").prompt_params()
  served = PromptTable(prompt_loaders.load_all("att", str(tmp_path / "ref")), CONFIG.emb_dim)
  want = PromptTable([prompt_loaders.from_module(f"att/{k}", module, params, task=k)
                      for k in (0, 1)],
                     CONFIG.emb_dim)
  assert served.names == want.names == ["att/0", "att/1"]
  for field, a, b in zip(want.arrays._fields, want.arrays, served.arrays):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=field)
  _infer(tmp_path, [f"--prompt=att={tmp_path / 'ref'}"], ["att/0", "att/1"])


def test_mpt_distills_resumes_then_adapts_a_target_and_serves(tmp_path, library):
  args = ["--gin_file=gin/prompts/mpt_distill.gin", "--gin_file=gin/runs/prompt_tune.gin",
          "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_mix_v100'", f"--gin.TRAIN_STEPS={STEPS}",
          f"--gin.CHECKPOINT_PERIOD={PERIOD}", f"--gin.TASK_NAMES={TASKS}",
          f"--gin.TEACHER_LIBRARY='{library}'", f"--gin.PROMPT_LENGTH={LENGTH}",
          "--gin.train.train.log_period=20", "--gin.LEARNING_RATE=0.05"]
  ref = _reference_and_killed_run(args, tmp_path / "source", tmp_path / "killed", STEPS, PERIOD)
  assert len(_losses(ref.stdout)) == STEPS // 20 and np.all(np.isfinite(_losses(ref.stdout)))
  # The run trained the distillation model: its terms were logged (with random teachers and
  # the task loss ~20x larger they need not fall here; tests/prompts/test_mpt.py checks that).
  kl, hidden = (_scalars(tmp_path / "source", tag) for tag in ("distill_kl", "distill_hidden"))
  assert len(kl) == len(hidden) == STEPS // 20
  assert min(kl) > 0 and min(hidden) > 0 and np.all(np.isfinite(kl + hidden)), (kl, hidden)
  assert (np.load(tmp_path / "source" / "prompts" / f"prompt_step_{STEPS}.npy").shape
          == (2, LENGTH, CONFIG.emb_dim))

  # A target on one task, from the distilled source (mean factors), trained a few steps.
  target = _train(["--gin_file=gin/prompts/mpt_target.gin", "--gin_file=gin/runs/prompt_tune.gin",
                   f"--gin.MIXTURE_OR_TASK_NAME='{SENTIMENT}'", "--gin.TRAIN_STEPS=10",
                   f"--gin.MPT_SOURCE='{tmp_path / 'source'}'", f"--gin.PROMPT_LENGTH={LENGTH}",
                   f"--gin.MODEL_DIR='{tmp_path / 'target'}'"])
  assert target.returncode == 0, target.stderr[-3000:]
  source = peft_mpt.source_arrays(str(tmp_path / "source"))
  state = RunDir(tmp_path / "target").prompt_params()
  assert (sorted(state) == ["shared", "task_cols", "task_rows"]
          and state["task_cols"].shape == (1, LENGTH, 1))
  assert not np.array_equal(state["shared"], source["shared"])  # it trained from there
  assert np.abs(state["shared"] - source["shared"]).max() < 5.0
  folded = np.load(tmp_path / "target" / "prompts" / "prompt_step_10.npy")
  np.testing.assert_allclose(folded,
                             state["shared"] * (state["task_cols"][0] @ state["task_rows"][0]),
                             rtol=1e-6, atol=1e-6)
  # The source's unfolded export round-trips through a PEFT adapter.
  assert subprocess.run([sys.executable, "-m", "spot_jax.infer", "--model=t5_1_1_byte_tiny",
                         f"--prompt=src={tmp_path / 'source'}",
                         f"--export_peft_mpt={tmp_path / 'adapter'}"],
                        cwd=REPO, env=_env(), capture_output=True, text=True).returncode == 0
  back = peft_mpt.read_adapter(str(tmp_path / "adapter"), CONFIG)
  assert all(np.array_equal(back[k], source[k]) for k in source)
  _infer(tmp_path, [f"--prompt=src={tmp_path / 'source'}", f"--prompt=tgt={tmp_path / 'target'}",
                    f"--prompt=ad={tmp_path / 'adapter'}"], ["src/0", "src/1", "tgt", "ad/1"])


def _scalars(model_dir: pathlib.Path, tag: str) -> list[float]:
  """The logged values of a training scalar, in step order (TensorBoard events)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  values = {}
  for path in sorted((model_dir / "tensorboard" / "train").glob("events.*")):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        if value.tag == tag:
          values[int(event.step)] = float(tf.make_ndarray(value.tensor))
  return [values[k] for k in sorted(values)]


def _infer(tmp_path: pathlib.Path, prompt_flags, names) -> None:
  """One mixed batch through `spot_jax.infer`, each row naming one of `names`."""
  texts = ["parity: 0110", "sentiment: good bad nice sad fine", "parity: 1", "sentiment: ugly dull"]
  rows = [{"input": texts[i % len(texts)], "prompt": names[i % len(names)]} for i in range(6)]
  (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  proc = subprocess.run([sys.executable, "-m", "spot_jax.infer", "--model=t5_1_1_byte_tiny",
                         *prompt_flags, f"--input={tmp_path / 'in.jsonl'}", "--vocab=byte",
                         f"--output={tmp_path / 'out.jsonl'}", "--input_length=48",
                         "--target_length=6", "--batch_size=8"],
                        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = [json.loads(l) for l in (tmp_path / "out.jsonl").read_text().splitlines()]
  assert [o["prompt"] for o in out] == [r["prompt"] for r in rows]
