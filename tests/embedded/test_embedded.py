"""The embedded default: the synthetic suite, the committed toy T5 and its reproducibility, and
that a prompt really learns on it (and cannot on a random backbone)."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import seqio

from spot_jax import data as data_lib
from spot_jax import embedded
from spot_jax.train import evaluator as evaluator_lib
from spot_jax import models
from spot_jax.train import optimizers
from spot_jax import prompts
from spot_jax.backbones import t5
from spot_jax import train as train_lib
from spot_jax.errors import ConfigError
from tasks import embedded as suite
from tests.helpers import REPO

COMMITTED = pathlib.Path(embedded.TOY_DIR)
needs_model = pytest.mark.skipif(not (COMMITTED / "checkpoint").is_dir(),
                                 reason=f"no toy model at {COMMITTED}; run python -m "
                                        "spot_jax.embedded.pretrain")


# --- the suite ---------------------------------------------------------------------------------


def test_suite_shape_and_relations():
  assert len(suite.SOURCES) >= 8 and len(suite.TARGETS) >= 4
  assert set(suite.SOURCES) | set(suite.TARGETS) | set(suite.HARD_TARGETS) == set(suite.TASKS)
  assert len(suite.SOURCES + suite.TARGETS + suite.HARD_TARGETS) == len(suite.TASKS)
  assert set(suite.PRETRAIN_SOURCES) < set(suite.SOURCES)
  for target in suite.TARGETS + suite.HARD_TARGETS:
    assert suite.RELATED[target] and set(suite.RELATED[target]) <= set(suite.SOURCES)
    assert all(suite.TASKS[s].skill == suite.TASKS[target].skill for s in suite.RELATED[target])
    assert all(suite.TASKS[s].skill != suite.TASKS[target].skill for s in suite.UNRELATED[target])


def test_examples_are_deterministic_labelled_and_splits_disjoint():
  for key, task in suite.TASKS.items():
    suite.examples.cache_clear()
    first = suite.examples(key, "train")
    suite.examples.cache_clear()
    assert suite.examples(key, "train") == first
    inputs, targets = first
    assert (len(inputs) == suite.SPLIT_SIZES["train"]
            and all(i.startswith(key + " ") for i in inputs))
    if task.labels:
      assert set(targets) <= set(task.labels), key
    if task.skill in ("sentiment", "nli", "paraphrase"):  # several labels, none dominant
      assert task.chance < 100.0 / len(task.labels) + 5, key
  # Validation inputs mostly unseen in train (short arithmetic inputs repeat by nature).
  train = set(suite.examples("sentiment_travel", "train")[0])
  val = suite.examples("sentiment_travel", "validation")[0]
  assert sum(v in train for v in val) < len(val) // 4


def test_sentiment_label_is_the_majority_polarity():
  for text, label in zip(*suite.examples("sentiment_food", "validation")):
    words = text.split()
    pos = sum(w in suite.POSITIVE for w in words)
    neg = sum(w in suite.NEGATIVE for w in words)
    assert pos + neg == 3 and label == ("positive" if pos > neg else "negative")


def test_category_label_is_the_domain_of_both_sentences_nouns():
  owner = {noun: domain for domain, nouns in suite.DOMAINS.items() for noun in nouns}
  for text, label in zip(*suite.examples("category", "validation")):
    words = text.split()
    assert words[:2] == ["category", "sentence1:"] and "sentence2:" in words
    nouns = [owner[w] for w in words if w in owner]
    assert len(nouns) == 2 and set(nouns) == {label}


@needs_model
def test_vocabulary_text_is_pinned_and_later_tasks_tokenise_without_unknowns():
  from spot_jax.embedded import toy_data  # pylint: disable=g-import-not-at-top
  # The committed vocabulary was trained on the first 12 tasks; tasks added later stay out of it.
  assert len(suite.VOCABULARY_TASKS) == 12 and set(suite.VOCABULARY_TASKS) < set(suite.TASKS)
  assert not {"sentiment_sports", "category"} & set(suite.VOCABULARY_TASKS)
  lines = toy_data.vocabulary_text(num_corpus_sentences=0)
  assert len(lines) == 12 * 2 * 500 and lines[0].startswith("addition ")
  vocab = suite.get_vocabulary()
  unk = vocab.tokenizer.unk_id()
  for key in set(suite.TASKS) - set(suite.VOCABULARY_TASKS):
    inputs, targets = suite.examples(key, "train")
    for text in inputs[:500] + targets[:500]:
      assert unk not in vocab.encode(text), (key, text)
    # the demo's input length
    assert max(len(vocab.encode(i[len(key) + 1:])) for i in inputs) < 48, key


def test_tasks_registered_idempotently_with_taskless_variants():
  before = set(seqio.TaskRegistry.names())
  suite.register_all()
  assert set(seqio.TaskRegistry.names()) == before
  for key in suite.TASKS:
    assert suite.task_name(key) in before and suite.task_name(key, taskless=True) in before


def test_a_low_resource_variant_trains_on_the_first_examples_and_keeps_the_other_splits():
  name = suite.task_name("category", taskless=True, train_examples=24)
  assert name == "spot_toy_category_taskless_n24_v100"
  assert suite.task_name("category", taskless=True, train_examples=24) == name  # idempotent
  task, full = seqio.get_mixture_or_task(name), seqio.get_mixture_or_task(
      suite.task_name("category", taskless=True))
  read = lambda t, split: [ex["targets_pretokenized"] for ex in t.get_dataset(
      {"inputs": 48, "targets": 8}, split=split, shuffle=False, num_epochs=1).as_numpy_iterator()]
  assert read(task, "train") == read(full, "train")[:24]
  assert read(task, "validation") == read(full, "validation")
  from spot_jax.demo import methods as demo_methods  # pylint: disable=g-import-not-at-top
  # The demo's default regime is registered with the suite, for programs that name tasks.
  assert demo_methods.Settings().train_examples == demo_methods.LOW_RESOURCE == suite.LOW_RESOURCE
  assert suite.task_name("sum", True, suite.LOW_RESOURCE) in seqio.TaskRegistry.names()
  for bad, fragment in ((0, "train_examples=0 must be a positive integer"),
                        (4001, "train_examples=4001: the suite's train splits hold 4000")):
    with pytest.raises(ConfigError, match=fragment):
      suite.task_name("category", taskless=True, train_examples=bad)


@needs_model
def test_taskless_task_tokens_postprocessor_and_metric():
  for key in ("category", "nli_sports"):
    task = seqio.get_mixture_or_task(suite.task_name(key, taskless=True))
    ex = next(task.get_dataset({"inputs": 64, "targets": 8}, split="validation",
                               shuffle=False).as_numpy_iterator())
    vocab = task.output_features["inputs"].vocabulary
    text, label = suite.examples(key, "validation")[0][0], suite.examples(key, "validation")[1][0]
    assert vocab.decode(ex["inputs"].tolist()) == text[len(key) + 1:]
    assert vocab.decode(ex["targets"].tolist()) == label
    post = task.postprocess_fn
    assert post(label) == suite.TASKS[key].labels.index(label) and post("banana") == -1
  assert task.metric_fns[0]([0, 1, 2, 2], [0, 1, 2, -1]) == {"accuracy": 75.0}


# --- the committed model -------------------------------------------------------------------------


@needs_model
def test_committed_checkpoint_loads_strictly_with_its_registered_config():
  assert embedded.CONFIG_NAME in t5.CONFIGS
  config = t5.config_by_name(embedded.CONFIG_NAME)
  params = t5.load_checkpoint(embedded.CHECKPOINT_PATH, config)  # strict: raises on any mismatch
  log = json.loads((COMMITTED / "losses.json").read_text())
  assert (sum(int(np.prod(x.shape)) for x in __import__("jax").tree.leaves(params))
          == log["num_parameters"])
  assert len(log["loss"]) == log["steps"] and log["loss"][-1] < log["loss"][0] / 3
  vocab = suite.get_vocabulary()
  assert vocab.vocab_size <= config.vocab_size
  size = sum(f.stat().st_size for f in COMMITTED.rglob("*") if f.is_file())
  assert size <= 20 * 2 ** 20, f"the embedded folder holds {size} bytes"
  assert (COMMITTED / "README.md").is_file()
  gin_file = (COMMITTED / f"{embedded.CONFIG_NAME}.gin").read_text()
  repo = REPO
  assert (repo / "gin" / "models" / f"{embedded.CONFIG_NAME}.gin").read_text() == gin_file


@needs_model
def test_pretrain_toy_reproduces_the_committed_vocabulary_and_first_losses(tmp_path):
  from spot_jax.embedded import pretrain as pretrain_toy  # pylint: disable=g-import-not-at-top
  log = json.loads((COMMITTED / "losses.json").read_text())
  steps = 6
  short = pretrain_toy.pretrain(str(tmp_path), steps=log.get("schedule_steps", log["steps"]),
                                seed=log["seed"], batch_size=log["batch_size"], stop_after=steps,
                                evaluate=False)
  assert (tmp_path / "spm.model").read_bytes() == (COMMITTED / "spm.model").read_bytes()
  # To float32 rounding: XLA may order a reduction differently after a layer's layout changes
  # (the committed log predates the heads-major attention), so not bit for bit.
  np.testing.assert_allclose(short["loss"], log["loss"][:steps], rtol=1e-5)
  t5.load_checkpoint(str(tmp_path / "checkpoint"), t5.config_by_name(embedded.CONFIG_NAME))


# --- a prompt learns on the toy model, not on a random backbone ----------------------------------

TARGET = "sentiment_travel"
# The demo's target budget (batch 16 here, a constant rate): at 40 steps the toy model is 40
# points above chance, and the random backbone still only answers one label.
STEPS = 40


def _prompt_accuracy(tmp_path: pathlib.Path, checkpoint) -> float:
  task = suite.task_name(TARGET, taskless=True)
  lengths = {"inputs": 48, "targets": 8}
  config = t5.config_by_name(embedded.CONFIG_NAME, dropout_rate=0.0)
  rows = suite.get_vocabulary().vocab_size - suite.EXTRA_IDS
  model = models.EncoderDecoderModel(module=t5.Transformer(
      config, prompt=prompts.PromptTuning(length=20, prompt_init=prompts.sampled_vocab(rows))))
  result = train_lib.train(
      model=model, train_dataset_cfg=data_lib.DatasetConfig(task, lengths, batch_size=16,
                                                            module="tasks.embedded"),
      total_steps=STEPS, model_dir=str(tmp_path / ("toy" if checkpoint else "random")),
      optimizer=optimizers.adafactor(learning_rate=0.3),
      eval_cfg=evaluator_lib.EvalConfig(task, lengths, batch_size=100, num_examples=200,
                                        module="tasks.embedded"),
      eval_period=STEPS, initial_checkpoint_path=checkpoint, seed=0, verbose=False)
  return result.eval_history[-1][1][task]["accuracy"]


@needs_model
def test_a_short_prompt_run_learns_on_the_toy_model_but_not_on_a_random_one(tmp_path):
  chance = suite.TASKS[TARGET].chance
  pretrained = _prompt_accuracy(tmp_path, embedded.CHECKPOINT_PATH)
  random_backbone = _prompt_accuracy(tmp_path, None)
  print(f"{TARGET}: chance {chance:.1f}, toy T5 {pretrained:.1f}, random backbone "
        f"{random_backbone:.1f}")
  assert pretrained >= chance + 25, (pretrained, chance)
  assert random_backbone < chance + 10, (random_backbone, chance)


# --- command lines: bad input is one line, exit 2 ----------------------------------------------


def _one_line_error(capsys, main, argv, prog):
  from spot_jax import cli  # pylint: disable=g-import-not-at-top
  assert cli.run(main, argv, prog) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"{prog}: error: ") and "Traceback" not in err[0], err
  return err[0]


@needs_model
@pytest.mark.parametrize("argv, expected", [
    (["--methods=pt,sopt"], "unknown method 'sopt' in --methods (entry 1; did you mean 'spot'?)"),
    (["--targets=sentiment_hotel"], "unknown target task 'sentiment_hotel'"),
    (["--target_steps=0"], "--target_steps=0 must be a positive integer"),
    (["--prompt_length=0"], "--prompt_length=0 must be a positive integer"),
    (["--input_length=-3"], "--input_length=-3 must be a positive integer"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--seeds="], "--seeds is empty; give at least one seed"),
    (["--seeds=0,1,0"], "--seeds: entry 2 (0) repeats entry 0; seeds must be distinct"),
    (["--seeds=0,-1"], "--seeds: entry 1 (-1) must be a non-negative integer"),
    (["--seeds=0,x"], "--seeds: entry 1 ('x') must be a non-negative integer"),
    (["--seeds=0,1", "--seed_offset=5"], "give --seeds or --seed_offset, not both"),
    (["--seed_offset=-5"], "--seed_offset=-5 must be an integer >= 0"),
    (["--num_seeds=0"], "--num_seeds=0 must be a positive integer"),
    (["--methods=pt,all"], "--methods=all stands alone; give 'all' or a comma list of methods"),
    (["--train_examples=0"], "--train_examples=0 must be 'all' or an integer from 1 to 4000"),
    (["--train_examples=4001"], "--train_examples=4001 must be 'all' or an integer from 1 to 4000"),
    (["--train_examples=few"], "--train_examples=few must be 'all' or an integer from 1 to 4000"),
    (["--margin=0"], "--margin=0.0 must be a number of points > 0"),
    (["--margin=-3", "--claims"], "--margin=-3.0 must be a number of points > 0"),
    (["--power=1"], "--power=1.0 must be"),
    (["--power=0", "--claims"], "--power=0.0 must be"),
    (["--learning_rate=0"], "--learning_rate=0.0 must be a number > 0, e.g. --learning_rate=0.3"),
])
def test_demo_bad_input_is_one_line(capsys, tmp_path, argv, expected):
  from spot_jax.demo.__main__ import main  # pylint: disable=g-import-not-at-top
  out = tmp_path / "out"
  line = _one_line_error(capsys, main, argv + [f"--output_dir={out}"], "spot_jax.demo")
  assert expected in line
  assert not out.exists() and not any(tmp_path.iterdir())  # nothing was written before the error


@needs_model
def test_demo_unwritable_output_dir_is_one_line(capsys, tmp_path):
  from spot_jax.demo.__main__ import main  # pylint: disable=g-import-not-at-top
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  line = _one_line_error(capsys, main, [f"--output_dir={blocker / 'out'}"], "spot_jax.demo")
  assert "is not writable" in line and blocker.read_text() == "not a directory"


def test_pretrain_toy_bad_input_is_one_line(capsys, tmp_path):
  from spot_jax.embedded.pretrain import main  # pylint: disable=g-import-not-at-top
  line = _one_line_error(capsys, main, ["--steps=0", f"--output_dir={tmp_path}"],
                         "spot_jax.embedded.pretrain")
  assert "--steps=0 must be a positive integer" in line


RANK_EXAMPLES = 100  # validation examples the demo runs below score per target (the demo's: 500)


def _demo_in_a_fresh_process(argv, tf_log_level, timeout):
  """`python -m spot_jax.demo *argv` on the CPU; TF_CPP_MIN_LOG_LEVEL=tf_log_level,
  or unset if None."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  if tf_log_level is not None:
    env["TF_CPP_MIN_LOG_LEVEL"] = tf_log_level
  return subprocess.run([sys.executable, "-m", "spot_jax.demo", *argv],
                        capture_output=True, text=True, env=env, timeout=timeout)


@needs_model
def test_demo_command_line_error_from_a_fresh_process(tmp_path):
  proc = _demo_in_a_fresh_process(["--methods=lora", f"--output_dir={tmp_path}"], "3", timeout=300)
  lines = [l for l in proc.stderr.splitlines() if l.startswith("spot_jax.demo")]
  assert proc.returncode == 2 and lines == [
      "spot_jax.demo: error: unknown method 'lora' in --methods (entry 0); valid: pt, spot, smop, "
      "residual, spot_unrelated, prefix, ptuning_v2, dept, residual_smop, "
      "attempt, mpt, ulpt, pt_int8, all"], proc.stderr
  assert "Traceback" not in proc.stderr


@needs_model
def test_demo_run_from_a_fresh_process_takes_its_lengths_and_prints_no_tf_log_lines(tmp_path):
  # Without the demo's TF_CPP_MIN_LOG_LEVEL default, a run shorter than an epoch ends with
  # TensorFlow's "did not fully read the dataset being cached" warning, and a machine without a
  # CUDA driver gets a cuInit error, both in the middle of the progress lines.
  from spot_jax.run_dir import RunDir  # pylint: disable=g-import-not-at-top
  proc = _demo_in_a_fresh_process(["--methods=pt,smop", "--targets=category", "--target_steps=2",
                                   "--seeds=0", "--claims", "--train_examples=16",
                                   "--prompt_length=6", "--input_length=37",
                                   f"--rank_examples={RANK_EXAMPLES}", "--compilation_cache=none",
                                   f"--output_dir={tmp_path}"],
                                  None, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  results = json.loads((tmp_path / "results.json").read_text())
  assert list(results["cells"]) == ["category/pt", "category/smop"] and results["seeds"] == [0]
  assert "validation accuracy %" in proc.stdout
  # --claims with fewer seeds than the power analysis asks for (SMoP's non-inferiority) runs,
  # with one warning line.
  warnings = [l for l in proc.stderr.splitlines() if l.startswith("spot_jax.demo: warning:")]
  assert len(warnings) == 1 and "1 seeds where the power analysis asks for" in warnings[0] \
      and "the power is 0%, not 90%" in warnings[0], proc.stderr[-2000:]
  assert "power analysis" in proc.stdout
  log = proc.stdout + proc.stderr
  assert "cache_dataset_ops" not in log and "cuInit" not in log, log[-2000:]
  assert not [l for l in log.splitlines() if l[:5] in ("W0000", "E0000")], log[-2000:]
  # The prompt and input lengths (and the examples scored) reach the recipe and the runs.
  recipe = results["recipe"]
  assert (recipe["prompt_length"], recipe["input_length"], recipe["rank_examples"]) == (
      6, 37, RANK_EXAMPLES)
  job, = (tmp_path / "runs").glob("pt-*")
  run = RunDir(job / "category.seed_0")
  assert np.load(run.exported_prompt()[0]).shape[0] == 6 and run.read_record().method["length"] == 6
  assert run.read_record().task == suite.task_name("category", taskless=True, train_examples=16)
  assert json.loads(run.rank_path.read_text())["examples"] == RANK_EXAMPLES


def test_demo_report_tables_verdicts_claims_and_chart(tmp_path):
  from scipy import stats as scipy_stats  # pylint: disable=g-import-not-at-top
  from spot_jax.demo import results  # pylint: disable=g-import-not-at-top
  pt, spot, smop = [80.0, 82.0, 84.0], [85.0, 88.0, 90.0], [70.0, 90.0, 84.0]
  choices = {("sum", s): {"target": "sum", "seed": s, "source": src, "similarity": 0.5,
                          "related": src == "addition", "ranking": [[src, 0.5]] * 8}
             for s, src in ((0, "addition"), (1, "addition"), (2, "length"))}
  summary = results.Summary(["sum"], ["pt", "spot", "smop"], [0, 1, 2], {"sum": 10.2},
                            {("sum", "pt"): pt, ("sum", "spot"): spot, ("sum", "smop"): smop},
                            [("addition", 61.0)], choices, {"pt": 9.5, "spot": None, "smop": 8.0},
                            prompt_length=20)
  t = scipy_stats.t.ppf(0.975, 2)
  half = lambda xs: t * np.std(xs, ddof=1) / np.sqrt(len(xs))
  rows = results.accuracy_rows(summary)
  assert rows[0] == ["target", "chance", "Prompt Tuning", "SPoT", "SMoP 4x5"]
  assert rows[1] == ["sum", "10.2", f"82.0 ± {half(pt):.1f}", f"87.7 ± {half(spot):.1f}",
                     f"81.3 ± {half(smop):.1f}"]
  # The table's verdicts are one family: 2 comparisons (SPoT and SMoP against PT on 1 target),
  # simultaneous at 95%, so each interval is a 97.5% one.
  assert summary.level == pytest.approx(0.975) and len(summary.pairs()) == 2
  t_family = scipy_stats.t.ppf(1 - 0.025 / 2, 2)
  family_half = lambda xs: t_family * np.std(xs, ddof=1) / np.sqrt(len(xs))
  diff = np.subtract(spot, pt)  # [5, 6, 6]: its interval lies above 0
  assert results.verdict_rows(summary)[1] == [
      "sum", f"+{diff.mean():.1f} ± {family_half(diff):.1f} better",
      f"-{-np.mean(np.subtract(smop, pt)):.1f} ± {family_half(np.subtract(smop, pt)):.1f} "
      "not resolved"]
  assert len(results.verdict_rows(summary)) == 2  # one target: no targets' mean row
  assert results.source_rows(summary)[1] == ["sum", "addition*", "addition*", "length", "2/3"]
  claims = {(r[0][:10], r[1]): r[4] for r in results.claim_rows(summary)[1:]}
  assert (claims[("SPoT beats", "sum")] == "holds"
          and claims[("SMoP 4x5 (", "sum")] == "not resolved")
  assert claims[("task embed", "all")] == "not resolved"  # 2 of 3 related: n too small
  texts = [r[0] for r in results.claim_rows(summary)[1:]]
  assert "SMoP 4x5 (5 prompt tokens per input) matches or beats 20-token Prompt Tuning" in texts
  shorter = dataclasses.replace(summary, prompt_length=10)
  assert "SMoP 4x5 (5 prompt tokens per input) matches or beats 10-token Prompt Tuning" in [
      r[0] for r in results.claim_rows(shorter)[1:]]
  # A claim against a method that did not run is not made: without SPoT, ATTEMPT and MPT are
  # compared with Prompt Tuning only.
  scores = {("sum", m): pt for m in ("pt", "attempt", "mpt")}
  no_spot = results.Summary(["sum"], ["pt", "attempt", "mpt"], [0, 1, 2], {"sum": 10.2}, scores,
                            [], {}, {})
  texts = [r[0] for r in results.claim_rows(no_spot)[1:]]
  assert "ATTEMPT beats Prompt Tuning" in texts and "MPT beats Prompt Tuning" in texts
  assert not any(t.startswith(("ATTEMPT (an attentional", "MPT (a prompt distilled"))
                 for t in texts)
  # A Summary without a prompt length has the demo recipe's.
  from spot_jax.demo import methods  # pylint: disable=g-import-not-at-top
  assert (results.Summary([], [], [], {}, {}, [], {}, {}).prompt_length
          == methods.Settings.prompt_length)
  paths = results.write(tmp_path, summary, {"target_steps": 100})
  saved = json.loads(paths[0].read_text())
  assert (saved["cells"]["sum/spot"]["scores"] == spot
          and saved["cells"]["sum/spot"]["verdict_vs_pt"] == "better")
  assert saved["cells"]["sum/pt"]["interval"]["mean"] == pytest.approx(82.0)
  md = paths[1].read_text()
  assert (f"| sum | 10.2 | 82.0 ± {half(pt):.1f} |" in md
          and "| sum | addition* | addition* | length | 2/3 |" in md)
  assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_targets_mean_row_and_families(tmp_path):
  from spot_jax import stats  # pylint: disable=g-import-not-at-top
  from spot_jax.demo import results  # pylint: disable=g-import-not-at-top
  scores = {("a", "pt"): [80.0, 82.0, 84.0, 81.0], ("a", "residual"): [83.0, 85.0, 88.0, 84.0],
            ("b", "pt"): [30.0, 20.0, 40.0, 35.0], ("b", "residual"): [34.0, 26.0, 41.0, 40.0]}
  summary = results.Summary(["a", "b"], ["pt", "residual"], [0, 1, 2, 3], {"a": 50.0, "b": 10.0},
                            scores, [], {}, {})
  # One pair (Residual against PT) on 2 targets: per-target intervals simultaneous over 2, the
  # targets' mean over 1.
  assert summary.pairs() == [("residual", "pt")]
  assert summary.level == pytest.approx(0.975) and summary.pooled_level == pytest.approx(0.95)
  per_seed = np.mean([np.subtract(scores[(t, "residual")], scores[(t, "pt")])
                      for t in "ab"], axis=0)
  mean = stats.interval(per_seed, 0.95)
  rows = results.verdict_rows(summary)
  assert rows[-1] == [results.MEAN_ROW, f"+{mean.format()} {stats.verdict(mean)}"]
  claims = [r for r in results.claim_rows(summary)[1:] if r[0].startswith("Residual PT")]
  assert [r[1] for r in claims] == ["a", "b", results.MEAN_ROW]
  assert claims[-1][2] == f"+{mean.format()} points"
  saved = summary.to_json()
  assert saved["targets_mean"]["residual-pt"]["difference"]["mean"] == pytest.approx(mean.mean)
  assert saved["levels"] == {"per_target": pytest.approx(0.975),
                             "targets_mean": pytest.approx(0.95), "comparisons": 2}
  assert ("simultaneous 95% interval over the 2 per-target comparisons"
          in results.verdict_heading(summary))


# One very short real demo for the tests below: the 8 sources, then Prompt Tuning, SPoT and every
# successor on one target with 2 seeds, each class-label run scored on RANK_EXAMPLES examples.
SUCCESSORS = ["prefix", "ptuning_v2", "dept", "residual_smop", "attempt", "mpt", "ulpt"]
DEMO_ARGV = ["--targets=category", f"--methods={','.join(['pt', 'spot'] + SUCCESSORS)}",
             "--seeds=3,4", "--source_steps=4", "--target_steps=4",
             f"--rank_examples={RANK_EXAMPLES}", "--compilation_cache=none"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
  """(--output_dir, what the demo printed, its results.json) of DEMO_ARGV's one run."""
  from spot_jax.demo.__main__ import main  # pylint: disable=g-import-not-at-top
  out = tmp_path_factory.mktemp("demo")
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    assert main(DEMO_ARGV + [f"--output_dir={out}"]) == 0
  return out, printed.getvalue(), json.loads((out / "results.json").read_text())


def _jobs(out: pathlib.Path) -> dict[str, pathlib.Path]:
  return {p.name.split("-")[0]: p for p in (out / "runs").iterdir()}


@needs_model
def test_seeded_demo_from_real_runs_retrieves_spot_sources_and_reuses_them(demo, capsys):
  """SPoT's source per seed is retrieval's, the tables are the runs' own scores, and a rerun
  trains nothing."""
  from spot_jax import stats  # pylint: disable=g-import-not-at-top
  from spot_jax.demo.__main__ import main  # pylint: disable=g-import-not-at-top
  from spot_jax.run_dir import RunDir  # pylint: disable=g-import-not-at-top
  from spot_jax.spot import library as prompt_library, similarity  # pylint: disable=g-import-not-at-top
  out_dir, out, saved = demo
  assert saved["seeds"] == [3, 4] and "category/spot" in saved["cells"]
  jobs = _jobs(out_dir)
  # the table's numbers are the runs' own rank-classification accuracies, and the verdict is
  # the paired one
  for method in ("pt", "spot"):
    scores = [json.loads(RunDir(jobs[method] / f"category.seed_{s}").rank_path.read_text())[
        "accuracy"] for s in (3, 4)]
    assert saved["cells"][f"category/{method}"]["scores"] == pytest.approx(scores, abs=0.01)
  assert saved["cells"]["category/spot"]["verdict_vs_pt"] == stats.paired_verdict(
      saved["cells"]["category/pt"]["scores"], saved["cells"]["category/spot"]["scores"])
  # SPoT's source is retrieval's: the library entry most similar to the seed's early PT prompt
  # among the sources 10 points above their task's chance (every source stays in the library)
  library, = (out_dir / "libraries").iterdir()
  entries, problems = prompt_library.Library(library).load()
  assert not problems and sorted(e.id for e in entries) == sorted(suite.SOURCES)
  left_out = {x["task"] for x in saved["left_out"]}
  assert left_out == {x["task"] for x in saved["sources"]
                      if x["accuracy"] < suite.TASKS[x["task"]].chance + 10}
  ranked = [e for e in entries if e.id not in left_out] or entries
  assert all(f"source {t} left out of retrieval: " in out for t in left_out)
  for choice in saved["retrieval"]:
    seed = choice["seed"]
    embedding = np.load(RunDir(jobs["pt"] / f"category.seed_{seed}").embedding_prompt()[0])
    sims = similarity.similarities(embedding, [e.embedding for e in ranked], "average")
    assert choice["source"] == ranked[int(np.argmax(sims))].id
    assert choice["related"] == (choice["source"] in suite.RELATED["category"])
    record = RunDir(jobs["spot"] / f"category.seed_{seed}").read_record()
    assert (record.finished
            and record.init.startswith(f"retrieved library entry {choice['source']} "))
  assert "SPoT's source per seed" in out and "paired by seed" in out
  # a rerun trains nothing and prints the same tables
  assert main(DEMO_ARGV + [f"--output_dir={out_dir}"]) == 0
  assert "finished earlier, reused" in capsys.readouterr().out
  again = json.loads((out_dir / "results.json").read_text())
  assert again["cells"] == saved["cells"] and again["retrieval"] == saved["retrieval"]


@needs_model
def test_demo_successors_run_from_the_library_and_enter_the_tables(demo):
  """The successors on request: every one trains (ATTEMPT and MPT from the demo's library), each
  run is an ordinary run directory, and the tables, claims and job times name them."""
  from spot_jax import prompts  # pylint: disable=g-import-not-at-top
  from spot_jax.demo import methods as demo_methods  # pylint: disable=g-import-not-at-top
  from spot_jax.run_dir import RunDir  # pylint: disable=g-import-not-at-top
  from spot_jax.spot import library as prompt_library  # pylint: disable=g-import-not-at-top
  out_dir, out, saved = demo
  methods = ["pt", "spot"] + SUCCESSORS
  assert saved["methods"] == methods
  assert sorted(saved["cells"]) == sorted(f"category/{m}" for m in methods)
  jobs = _jobs(out_dir)
  assert sorted(jobs) == sorted(methods + ["source", "mpt_source"])
  for method in methods:
    for seed in (3, 4):
      run = RunDir(jobs[method] / f"category.seed_{seed}")  # every method scored by rank
      assert run.read_record().finished and run.rank_path.is_file(), (method, seed)
  # ATTEMPT's frozen sources are the library's best source prompts, in the suite's order
  library, = (out_dir / "libraries").iterdir()
  entries, _ = prompt_library.Library(library).load()
  by_id = {e.id: e.prompt for e in entries}
  run = RunDir(jobs["attempt"] / "category.seed_3")
  module = prompts.Attempt(np.stack([by_id[k] for k in suite.SOURCES]), bottleneck=100)
  candidates = prompts.effective_prompt(module, run.prompt_params())
  np.testing.assert_array_equal(candidates[:len(suite.SOURCES)],
                                np.stack([by_id[k] for k in suite.SOURCES]))
  # MPT's distillation trained the shared prompt of all 8 sources; each target started from it
  distilled = RunDir(jobs["mpt_source"] / "sources.seed_5").prompt_params()
  assert distilled["task_cols"].shape[0] == len(suite.SOURCES)
  # DePT's offset trains at its own rate: both parameter groups moved
  dept = RunDir(jobs["dept"] / "category.seed_3").prompt_params()
  assert np.any(np.asarray(dept["offset"]["b"]) != 0)
  claims = [c["claim"] for c in saved["claims"]]
  assert (any(c.startswith("Prefix tuning") for c in claims)
          and any(c.startswith("MPT") for c in claims))
  # SPoT ran: ATTEMPT and MPT are also compared with it (without SPoT they are not:
  # test_demo_report_tables_verdicts_claims_and_chart)
  assert (any(c.startswith("ATTEMPT (an attentional mixture") for c in claims)
          and any(c.startswith("MPT (a prompt distilled") for c in claims))
  assert "MPT distillation" in out and "job wall times" in out
  for name in (demo_methods.METHOD_NAMES[m] for m in methods):
    assert name in out


def test_successor_job_keys_hold_their_own_settings_only():
  """Changing one successor's setting changes that method's job key and no other's (so a rerun
  retrains it alone); every successor has settings, and an unknown one is refused."""
  from spot_jax.demo import methods as demo_methods  # pylint: disable=g-import-not-at-top
  from spot_jax.demo import successor_methods  # pylint: disable=g-import-not-at-top
  settings = demo_methods.Settings()
  own = successor_methods.OWN_SETTINGS
  assert sorted(own) == sorted(demo_methods.SUCCESSORS)
  changed = {**own, "dept": {**own["dept"], "rank": 4}}
  for method in ("prefix", "ptuning_v2", "dept", "residual_smop", "ulpt"):
    before = successor_methods.recipe(method, settings, 100).key
    after = successor_methods.recipe(method, settings, 100, own_settings=changed).key
    assert (before != after) == (method == "dept"), method
  changed_dept = successor_methods.recipe("dept", settings, 100, own_settings=changed)
  assert changed_dept.model.module.prompt.rank == 4 and changed_dept.name == "dept"
  with pytest.raises(ValueError, match="unknown successor 'lora'; valid: prefix, ptuning_v2"):
    successor_methods.recipe("lora", settings, 100)
