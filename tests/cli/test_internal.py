"""Every program through the one runner: a bug is exit 1 and "internal error", a bad input from a
fresh process is exactly one stderr line (no TensorFlow/absl start-up lines), and no parser
declares --debug itself.

`PROGRAMS` lists each entry point once with
  (module, its main, a function that main calls (patched to raise a TypeError), arguments
   reaching that call, a bad input, a fragment of its error line).
Placeholders in arguments: {tmp} an empty scratch directory.
"""
from __future__ import annotations

import importlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

from spot_jax import cli
from tests.helpers import REPO

SMOKE = ["--gin_file=gin/test/smoke.gin", "--gin.MODEL_DIR='{tmp}/run'",
         "--gin.train.train.eval_cfg=None"]
EVAL = ["--gin_file=gin/models/t5_1_1_byte_tiny.gin", "--gin_file=gin/test/smoke_prompt.gin",
        "--gin_file=gin/runs/eval.gin",
        "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentiment_v100'",
        "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}"]
SPOT = ["--model=t5_1_1_byte_tiny", "--task_module=tests.helpers.spot_tasks", "--train_steps=4",
        "--embedding_step=2"]

PROGRAMS = [
    ("spot_jax.train", "spot_jax.train.__main__:main", "spot_jax.data:validate", SMOKE,
     [*SMOKE, "--gin.TRAIN_STEPS=-5"], "TRAIN_STEPS=-5 must be a positive integer"),
    ("spot_jax.eval", "spot_jax.eval:main", "spot_jax.fileio:creatable_dir",
     [*EVAL, "--gin.MODEL_DIR='{tmp}'"], EVAL, "give exactly one of MODEL_DIR"),
    ("spot_jax.infer", "spot_jax.infer:main", "spot_jax.backbones.t5.config:config_by_name",
     ["--model=t5_1_1_byte_tiny", "--prompt={tmp}/p.npy"],
     ["--model=t5_1_1_byte_tiny", "--vocab=byte", "--prompt={tmp}/missing.npy",
      "--input={tmp}/in.txt", "--output={tmp}/out.jsonl"], "missing.npy"),
    ("spot_jax.convert", "spot_jax.convert:main", "spot_jax.fileio:writable_dir",
     ["--hf_dir={tmp}", "--output_dir={tmp}/out"],
     ["--hf_dir={tmp}/absent", "--output_dir={tmp}/out"],
     "absent' does not exist; give a Hugging Face T5 directory"),
    ("spot_jax.library", "spot_jax.library:main", "spot_jax.spot.library:Library.load",
     ["list", "--library={tmp}"], ["list", "--library={tmp}/nolib"], "does not exist"),
    ("spot_jax.retrieve", "spot_jax.retrieve:main", "spot_jax.spot.settings:from_flags",
     ["--library={tmp}", "--target_task=spot_test_bits_v1", "--output_dir={tmp}/w", *SPOT],
     ["--library={tmp}/nolib", "--target_task=spot_test_bits_v1", "--output_dir={tmp}/w", *SPOT],
     "is empty or missing"),
    ("spot_jax.study", "spot_jax.study:main", "spot_jax.spot.study:run",
     ["--study_dir={tmp}/s", "--sources=spot_test_parity_v1", "--targets=spot_test_bits_v1",
      "--seeds=0", *SPOT],
     ["--study_dir={tmp}/s", "--sources=spot_test_parity_v1", "--targets=spot_test_bitz_v1",
      "--seeds=0", *SPOT],
     "did you mean 'spot_test_bits_v1'"),
    ("spot_jax.report", "spot_jax.report:main", "spot_jax.report:check_study_dir",
     ["--study_dir={tmp}"], ["--study_dir={tmp}"],
     "is empty; give the folder of a `python -m spot_jax.study` run"),
    ("spot_jax.demo", "spot_jax.demo.__main__:main", "spot_jax.fileio:writable_dir",
     ["--output_dir={tmp}/demo"], ["--methods=lora", "--output_dir={tmp}/demo"],
     "unknown method 'lora'"),
    ("benchmarks", "benchmarks.train_step:main", "benchmarks.train_step:config_by_name",
     ["--methods=pt100"], ["--methods=lora"], "entry 0 ('lora') is unknown"),
    ("benchmarks.jobs", "benchmarks.jobs:main", "benchmarks.jobs:measure",
     ["--runs=1", "--repeats=1"], ["--runs=0,2"], "--runs='0,2': entry 0 (0) must be >= 1"),
    ("benchmarks.lengths", "benchmarks.lengths:main", "benchmarks.lengths:config_by_name",
     [], ["--method=pt1000"], "--method='pt1000' is unknown"),
    ("benchmarks.peers.peft_train", "benchmarks.peers.peft_train:main",
     "benchmarks.peers.worker:parse", ["--shape={{}}", "--method=pt"], ["--shape=x", "--method=pt"],
     "--shape is not JSON"),
    ("benchmarks.peers.t5x_train", "benchmarks.peers.t5x_train:main",
     "benchmarks.peers.worker:parse", ["--shape={{}}"], ["--shape={{}}"], "--shape lacks"),
    ("spot_jax.embedded.pretrain", "spot_jax.embedded.pretrain:main",
     "spot_jax.embedded.pretrain:pretrain", ["--output_dir={tmp}/toy", "--steps=1"],
     ["--steps=0", "--output_dir={tmp}/toy"], "--steps=0 must be a positive integer"),
    ("tasks", "tasks.__main__:main", "tasks.__main__:list_lines", ["list"], ["lst"],
     "invalid choice: 'lst'"),
    ("spot_jax.demo.replication", "spot_jax.demo.replication:main",
     "spot_jax.demo.replication:load", ["{tmp}"], ["{tmp}"], "has no results.json"),
    ("spot_jax.demo.noise", "spot_jax.demo.noise:main", "spot_jax.fileio:writable_dir",
     ["--output_dir={tmp}/noise"], ["--num_seeds=1", "--output_dir={tmp}/noise"],
     "--num_seeds=1 must be an integer >= 2"),
]
GIN_PROGRAMS = {"spot_jax.train": "spot_jax.train.__main__", "spot_jax.eval": "spot_jax.eval"}


def _resolve(spec: str):
  """(owner object, attribute name) of "module:attr" or "module:Class.attr"."""
  module, _, path = spec.partition(":")
  owner = importlib.import_module(module)
  *parents, name = path.split(".")
  for parent in parents:
    owner = getattr(owner, parent)
  return owner, name


def _fill(args, tmp: pathlib.Path) -> list[str]:
  return [a.replace("{tmp}", str(tmp)).replace("{{}}", "{}") for a in args]


def _run_in_process(prog: str, main_spec: str, argv: list[str]) -> int:
  owner, name = _resolve(main_spec)
  main = getattr(owner, name)
  if prog in GIN_PROGRAMS:
    from spot_jax.cli import gin_flags  # pylint: disable=g-import-not-at-top
    module = importlib.import_module(GIN_PROGRAMS[prog])
    return gin_flags.run(main, argv, prog, "", module.GIN_ROOTS)
  return cli.run(main, argv, prog)


def test_every_program_is_listed_once():
  assert len({p[0] for p in PROGRAMS}) == len(PROGRAMS) == 18


def _plant_bug(monkeypatch, spec: str) -> list:
  """Replaces the function `spec` names with one raising TypeError; returns its call log."""
  calls = []

  def deliberate_bug(*unused_args, **unused_kwargs):
    calls.append(1)
    raise TypeError("deliberate bug")

  owner, name = _resolve(spec)
  monkeypatch.setattr(owner, name, deliberate_bug)
  return calls


@pytest.fixture
def clean_gin():
  import gin  # pylint: disable=g-import-not-at-top
  gin.clear_config(clear_constants=True)
  yield
  gin.clear_config(clear_constants=True)


@pytest.mark.parametrize("prog, main_spec, patched, args, _bad, _fragment", PROGRAMS,
                         ids=[p[0] for p in PROGRAMS])
def test_a_bug_is_exit_1_and_internal_error(prog, main_spec, patched, args, _bad, _fragment,
                                            tmp_path, monkeypatch, capsys, clean_gin):
  calls = _plant_bug(monkeypatch, patched)
  code = _run_in_process(prog, main_spec, _fill(args, tmp_path))
  err = capsys.readouterr().err.strip().splitlines()
  assert calls, f"{patched} was not reached: {err}"
  assert code == 1, err
  assert err == [f"{prog}: error: internal error: TypeError: deliberate bug (rerun with --debug "
                 "for the traceback)"], err


@pytest.mark.parametrize("prog, main_spec, patched, args", [p[:4] for p in PROGRAMS],
                         ids=[p[0] for p in PROGRAMS])
def test_debug_shows_the_traceback_instead(prog, main_spec, patched, args, tmp_path,
                                           monkeypatch, clean_gin):
  """Every parser knows --debug (the runner's ArgumentParser declares it), and with it the error
  propagates instead of becoming one line."""
  _plant_bug(monkeypatch, patched)
  with pytest.raises(TypeError, match="deliberate bug"):
    _run_in_process(prog, main_spec, [*_fill(args, tmp_path), "--debug"])


def _misspelled(flag: str) -> str:
  """--gin_file -> --gin_flie: the last two letters swapped."""
  return flag[:-2] + flag[-1] + flag[-2]


@pytest.mark.parametrize("prog, main_spec, args", [(p[0], p[1], p[3]) for p in PROGRAMS],
                         ids=[p[0] for p in PROGRAMS])
def test_a_misspelled_flag_is_one_line_naming_the_flag_meant(prog, main_spec, args, tmp_path,
                                                             capsys, clean_gin):
  """Each program's own first flag, misspelled (required or not, subcommand or not), and the
  --debug every parser takes: exit 2, one line suggesting the flag meant; nothing runs."""
  args = _fill(args, tmp_path)
  own = next((i for i, a in enumerate(args) if a.startswith("--")), None)
  cases = [[*args, "--debgu"]]
  if own is not None:
    flag, sep, value = args[own].partition("=")
    cases.append([*args[:own], f"{_misspelled(flag)}{sep}{value}", *args[own + 1:]])
  for case, meant in zip(cases, ["--debug", flag if own is not None else None]):
    code = _run_in_process(prog, main_spec, case)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"{prog}: error: "), (case, err)
    assert f"did you mean {meant}?" in err[0], (case, err)
  assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_no_parser_declares_debug_itself():
  declared = [str(p.relative_to(REPO)) for p in (REPO / "spot_jax").rglob("*.py")
              if re.search(r"""add_argument\(\s*["']--debug["']""", p.read_text())]
  assert declared == ["spot_jax/cli/runner.py"], declared


def _env_without_log_settings() -> dict:
  env = {k: v for k, v in os.environ.items()
         if k not in ("TF_CPP_MIN_LOG_LEVEL", "SPOT_JAX_VERBOSE", "SPOT_JAX_TF_LOG_DEFAULTED")}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  return env


@pytest.mark.parametrize("prog, bad, fragment", [(p[0], p[4], p[5]) for p in PROGRAMS],
                         ids=[p[0] for p in PROGRAMS])
def test_bad_input_from_a_fresh_process_is_exactly_one_stderr_line(prog, bad, fragment, tmp_path):
  """No TF_CPP_MIN_LOG_LEVEL in the environment: TensorFlow's and absl's start-up lines must not
  reach the terminal, so the error line is all there is."""
  proc = subprocess.run([sys.executable, "-m", prog, *_fill(bad, tmp_path)], cwd=REPO,
                        env=_env_without_log_settings(), capture_output=True, text=True,
                        timeout=600)
  lines = proc.stderr.splitlines()
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert (len(lines) == 1 and lines[0].startswith(f"{prog}: error: ")
          and fragment in lines[0]), proc.stderr[-3000:]


ABSL_LINE = re.compile(r"^[IWEF]\d{4} [\d:. ]+\d+ [\w.]+:\d+\] ")


@pytest.fixture(scope="module")
def tensorflow_start_up_lines() -> None:
  """Skips unless a plain `import tensorflow` prints start-up lines here (one probe per module)."""
  plain = subprocess.run([sys.executable, "-c", "import tensorflow"],
                         env=_env_without_log_settings(), capture_output=True, text=True,
                         timeout=600)
  if not any(ABSL_LINE.match(l) for l in plain.stderr.splitlines()):
    pytest.skip("TensorFlow prints no start-up lines on this machine")


@pytest.mark.usefixtures("tensorflow_start_up_lines")
def test_asking_for_the_start_up_lines_shows_them():
  """SPOT_JAX_VERBOSE=1 leaves TensorFlow's loading notes alone (where TensorFlow prints any)."""
  env = _env_without_log_settings()
  verbose = subprocess.run([sys.executable, "-m", "tasks", "lst"], cwd=REPO,
                           env=dict(env, SPOT_JAX_VERBOSE="1"), capture_output=True, text=True,
                           timeout=600)
  lines = verbose.stderr.splitlines()
  assert verbose.returncode == 2 and lines[-1].startswith("tasks: error: "), verbose.stderr
  assert any(ABSL_LINE.match(l) for l in lines[:-1]), verbose.stderr


@pytest.mark.usefixtures("tensorflow_start_up_lines")
def test_a_probe_for_tensorflow_does_not_use_up_the_quiet_import():
  """etils asks `importlib.util.find_spec("tensorflow")` when orbax reads a checkpoint (eval and
  infer read one before seqio imports TensorFlow); the real import after it is still quiet."""
  env = _env_without_log_settings()
  code = ("from spot_jax import quiet_logs; quiet_logs.quiet(); import importlib.util; "
          "assert importlib.util.find_spec('tensorflow') is not None; import tensorflow")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]


def test_a_repeated_library_warning_is_shown_once():
  """seqio repeats its advice for every training stream; a program shows each absl warning once
  (errors every time), and SPOT_JAX_VERBOSE=1 shows every repeat."""
  code = ("from spot_jax import quiet_logs; quiet_logs.quiet(); from absl import logging; "
          "[logging.warning('advice %d', i % 2) for i in range(5)]; logging.error('failed'); "
          "logging.error('failed')")
  errors = ["ERROR:absl:failed"] * 2
  expected = {"": ["WARNING:absl:advice 0", "WARNING:absl:advice 1", *errors],
              "1": [f"WARNING:absl:advice {i % 2}" for i in range(5)] + errors}
  for verbose, lines in expected.items():
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                          env=dict(_env_without_log_settings(), SPOT_JAX_VERBOSE=verbose),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stderr.splitlines() == lines, proc.stderr[-3000:]


def test_advice_that_cannot_apply_is_dropped_and_other_warnings_kept():
  """seqio's advice to cache a function dataset before training (the toy and in-memory tasks):
  the trainer resumes each stream at its position, so a program drops it; SPOT_JAX_VERBOSE=1
  shows it."""
  code = ("from spot_jax import quiet_logs; quiet_logs.quiet(); import seqio, tasks.synthetic; "
          "seqio.get_mixture_or_task('spot_synthetic_sentiment_v100').source.get_dataset("
          "'train', shuffle=True, seed=0); from absl import logging; logging.warning('advice')")
  for verbose in ("", "1"):
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                          env=dict(_env_without_log_settings(), SPOT_JAX_VERBOSE=verbose),
                          capture_output=True, text=True, timeout=600)
    seqio_advice = [l for l in proc.stderr.splitlines() if "highly recommended that you cache" in l]
    assert proc.returncode == 0 and len(seqio_advice) == (1 if verbose else 0), proc.stderr[-3000:]
    assert "WARNING:absl:advice" in proc.stderr.splitlines(), proc.stderr[-3000:]


def test_a_reader_that_stops_early_ends_the_program_quietly():
  # `python -m tasks list | head -1`: the reader goes away before the listing is written. The
  # program ends with the status a shell reports for SIGPIPE, and says nothing on stderr (no
  # "internal error", no "Exception ignored ... BrokenPipeError" at exit).
  proc = subprocess.Popen([sys.executable, "-m", "tasks", "list"], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  proc.stdout.close()
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == cli.EXIT_BROKEN_PIPE == 141, err.decode()
  assert err.decode() == ""
