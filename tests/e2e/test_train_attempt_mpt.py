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
from spot_jax.serve.export import peft_mpt
from spot_jax.serve.catalog import prompt_loaders
from spot_jax.run_dir import RunDir
from spot_jax.serve.catalog.table import PromptTable
from spot_jax.spot import library as prompt_library
from spot_jax.backbones.t5 import config_by_name
from tests.helpers import REPO  # noqa: E402
from tests.helpers.kill import kill_at_checkpoint  # noqa: E402
from tests.helpers.train_cli import _env, _losses, run_in_one_process

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


def _resumed_exactly(resumed: subprocess.CompletedProcess, ref_dir: pathlib.Path,
                     run_dir: pathlib.Path) -> None:
  """`resumed` restarted `run_dir` after its SIGKILL at checkpoint PERIOD and ended where the
  uninterrupted run in `ref_dir` did."""
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from" in resumed.stdout
  first = int(re.search(rf"^step (\d+)/{STEPS}", resumed.stdout, re.M).group(1))
  assert first > PERIOD
  _same_final_state(ref_dir, run_dir, STEPS)


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
ROOT_ARGS = ["--gin_file=gin/runs/prompt_tune.gin",
             "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_mix_v100'", f"--gin.TRAIN_STEPS={STEPS}",
             f"--gin.CHECKPOINT_PERIOD={PERIOD}", f"--gin.TASK_NAMES={TASKS}",
             "--gin.train.train.log_period=20"]
INFERRED = {"attempt": ["att/0", "att/1"], "mpt": ["src/0", "src/1", "tgt", "ad/1"]}


def _method_args(library: pathlib.Path) -> dict[str, list[str]]:
  return {
      "attempt": ["--gin_file=gin/prompts/attempt_multitask.gin", *ROOT_ARGS,
                  "--gin.ATTENTION_BOTTLENECK=16",
                  f"--gin.SOURCE_PROMPTS=['{library}#parity.p0', '{library}#sentiment.p0', "
                  f"'{library}#extra.p0']"],
      "mpt": ["--gin_file=gin/prompts/mpt_distill.gin", *ROOT_ARGS,
              f"--gin.TEACHER_LIBRARY='{library}'", f"--gin.PROMPT_LENGTH={LENGTH}",
              "--gin.LEARNING_RATE=0.05"],
  }


@pytest.fixture(scope="module")
def runs(tmp_path_factory, library) -> tuple[pathlib.Path, dict]:
  """Per method (ATTEMPT, MPT distillation) an uninterrupted run (<method>/ref) and one
  SIGKILLed once checkpoint PERIOD exists, then restarted (<method>/killed); an MPT target from
  the distilled source (mpt/target), the source exported as a PEFT adapter (mpt/adapter), and a
  mixed batch through `spot_jax.infer` per method. The killed runs have processes of their own;
  the rest run in one process, each as `python -m` would. -> (root, {case: result})."""
  root = tmp_path_factory.mktemp("runs")
  methods = _method_args(library)
  for method, args in methods.items():
    run_dir = root / method / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "spot_jax.train", *COMMON, *args,
                             f"--gin.MODEL_DIR='{run_dir}'"], cwd=REPO, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_at_checkpoint(proc, run_dir, PERIOD, STEPS, timeout=600)
  train = lambda *args: ("spot_jax.train", [*COMMON, *args])
  cases = {f"{run} {m}": train(*args, f"--gin.MODEL_DIR='{root / m / run}'")
           for run in ("ref", "killed") for m, args in methods.items()}
  mpt = root / "mpt"
  cases["target"] = train("--gin_file=gin/prompts/mpt_target.gin",
                          "--gin_file=gin/runs/prompt_tune.gin",
                          f"--gin.MIXTURE_OR_TASK_NAME='{SENTIMENT}'", "--gin.TRAIN_STEPS=10",
                          f"--gin.MPT_SOURCE='{mpt / 'ref'}'", f"--gin.PROMPT_LENGTH={LENGTH}",
                          f"--gin.MODEL_DIR='{mpt / 'target'}'")
  cases["export"] = ("spot_jax.infer", ["--model=t5_1_1_byte_tiny", f"--prompt=src={mpt / 'ref'}",
                                        f"--export_peft_mpt={mpt / 'adapter'}"])
  cases["infer attempt"] = _infer(root / "attempt", [f"--prompt=att={root / 'attempt' / 'ref'}"],
                                  INFERRED["attempt"])
  cases["infer mpt"] = _infer(mpt, [f"--prompt=src={mpt / 'ref'}",
                                    f"--prompt=tgt={mpt / 'target'}",
                                    f"--prompt=ad={mpt / 'adapter'}"], INFERRED["mpt"])
  return root, dict(zip(cases, run_in_one_process(list(cases.values()))))


def test_attempt_multitask_trains_resumes_and_serves(runs, library):
  root, results = runs
  ref_dir = root / "attempt" / "ref"
  ref = results["ref attempt"]
  assert ref.returncode == 0, ref.stderr[-3000:]
  _resumed_exactly(results["killed attempt"], ref_dir, root / "attempt" / "killed")
  assert len(_losses(ref.stdout)) == STEPS // 20 and np.all(np.isfinite(_losses(ref.stdout)))
  export = np.load(ref_dir / "prompts" / f"prompt_step_{STEPS}.npy")
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
  params = RunDir(ref_dir).prompt_params()
  served = PromptTable(prompt_loaders.load_all("att", str(ref_dir)), CONFIG.emb_dim)
  want = PromptTable([prompt_loaders.from_module(f"att/{k}", module, params, task=k)
                      for k in (0, 1)],
                     CONFIG.emb_dim)
  assert served.names == want.names == ["att/0", "att/1"]
  for field, a, b in zip(want.arrays._fields, want.arrays, served.arrays):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=field)
  _check_inferred(root / "attempt", results["infer attempt"], INFERRED["attempt"])


def test_mpt_distills_resumes_then_adapts_a_target_and_serves(runs):
  root, results = runs
  mpt = root / "mpt"
  ref = results["ref mpt"]
  assert ref.returncode == 0, ref.stderr[-3000:]
  _resumed_exactly(results["killed mpt"], mpt / "ref", mpt / "killed")
  assert len(_losses(ref.stdout)) == STEPS // 20 and np.all(np.isfinite(_losses(ref.stdout)))
  # The run trained the distillation model: its terms were logged (with random teachers and
  # the task loss ~20x larger they need not fall here; tests/prompts/test_mpt.py checks that).
  kl, hidden = (_scalars(mpt / "ref", tag) for tag in ("distill_kl", "distill_hidden"))
  assert len(kl) == len(hidden) == STEPS // 20
  assert min(kl) > 0 and min(hidden) > 0 and np.all(np.isfinite(kl + hidden)), (kl, hidden)
  assert (np.load(mpt / "ref" / "prompts" / f"prompt_step_{STEPS}.npy").shape
          == (2, LENGTH, CONFIG.emb_dim))

  # A target on one task, from the distilled source (mean factors), trained a few steps.
  target = results["target"]
  assert target.returncode == 0, target.stderr[-3000:]
  source = peft_mpt.source_arrays(str(mpt / "ref"))
  state = RunDir(mpt / "target").prompt_params()
  assert (sorted(state) == ["shared", "task_cols", "task_rows"]
          and state["task_cols"].shape == (1, LENGTH, 1))
  assert not np.array_equal(state["shared"], source["shared"])  # it trained from there
  assert np.abs(state["shared"] - source["shared"]).max() < 5.0
  folded = np.load(mpt / "target" / "prompts" / "prompt_step_10.npy")
  np.testing.assert_allclose(folded,
                             state["shared"] * (state["task_cols"][0] @ state["task_rows"][0]),
                             rtol=1e-6, atol=1e-6)
  # The source's unfolded export round-trips through a PEFT adapter.
  assert results["export"].returncode == 0, results["export"].stderr[-3000:]
  back = peft_mpt.read_adapter(str(mpt / "adapter"), CONFIG)
  assert all(np.array_equal(back[k], source[k]) for k in source)
  _check_inferred(mpt, results["infer mpt"], INFERRED["mpt"])


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


def _infer(folder: pathlib.Path, prompt_flags, names) -> tuple[str, list[str]]:
  """`spot_jax.infer` on one mixed batch (folder/in.jsonl), each row naming one of `names`."""
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(names)))
  return ("spot_jax.infer", ["--model=t5_1_1_byte_tiny", *prompt_flags,
                             f"--input={folder / 'in.jsonl'}", "--vocab=byte",
                             f"--output={folder / 'out.jsonl'}", "--input_length=48",
                             "--target_length=6", "--batch_size=8"])


def _rows(names) -> list[dict]:
  texts = ["parity: 0110", "sentiment: good bad nice sad fine", "parity: 1", "sentiment: ugly dull"]
  return [{"input": texts[i % len(texts)], "prompt": names[i % len(names)]} for i in range(6)]


def _check_inferred(folder: pathlib.Path, proc: subprocess.CompletedProcess, names) -> None:
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = [json.loads(l) for l in (folder / "out.jsonl").read_text().splitlines()]
  assert [o["prompt"] for o in out] == [r["prompt"] for r in _rows(names)]
