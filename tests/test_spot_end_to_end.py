"""The SPoT layer end to end on a tiny random T5 and tiny local tasks (tests/spot_tasks.py):
the study on a 3 x 2 x 1 grid, SIGKILL mid-grid and restart, the reports, then a library built
from the study's source runs and every retrieval strategy.

Every command runs as a user runs it (`python -m spot_jax.<prog>`), sharing a persistent XLA
compilation cache so the ~30 identical tiny runs compile once.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from spot_jax import cli
from spot_jax import library as library_cli
from spot_jax import report as report_cli
from spot_jax import retrieve as retrieve_cli
from spot_jax import study as study_cli
from spot_jax.cli import model_file
from spot_jax.spot import runs, similarity
from spot_jax.spot import prompt_library
from spot_jax.spot import grid as grid_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ["spot_test_sentiment_v1", "spot_test_parity_v1", "spot_test_length_v1"]
TARGETS = ["spot_test_review_v1", "spot_test_bits_v1"]
RUN_FLAGS = ["--model=t5_1_1_byte_tiny", "--task_module=tests.spot_tasks", "--input_length=24",
             "--target_length=6", "--batch_size=8", "--train_steps=4", "--embedding_step=2",
             "--eval_period=4", "--checkpoint_period=2", "--eval_batch_size=16", "--eval_num_examples=16", "--prompt_length=4",
             "--metric=char_match"]
STUDY_FLAGS = [f"--sources={','.join(SOURCES)}", f"--targets={','.join(TARGETS)}", "--seeds=0", "--generic",
               *RUN_FLAGS]
GRID = grid_lib.Grid(tuple(SOURCES), tuple(TARGETS), (0,), generic=True)
ALL_CELLS = {c.path for c in GRID.stage1() + GRID.stage2()}  # 3 + 2 + 1, then 6 + 2


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
  cache = tmp_path_factory.mktemp("xla_cache")
  return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO),
              JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def _cmd(prog: str, *args: str) -> list[str]:
  return [sys.executable, "-m", f"spot_jax.{prog}", *args]


def _run(env, prog, *args, timeout=900) -> subprocess.CompletedProcess:
  proc = subprocess.run(_cmd(prog, *args), cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=timeout)
  assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
  return proc


def _finished(study_dir: pathlib.Path) -> set[str]:
  return {c for c in ALL_CELLS if runs.read_record(study_dir / c) is not None}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, env) -> pathlib.Path:
  study_dir = tmp_path_factory.mktemp("study_full") / "study"
  proc = _run(env, "study", f"--study_dir={study_dir}", *STUDY_FLAGS)
  assert "14 cells run, 0 already finished, 0 waiting; 10 rows" in proc.stdout, proc.stdout[-2000:]
  return study_dir


def test_study_writes_the_table(uninterrupted):
  doc = json.loads((uninterrupted / "results.json").read_text())
  rows = doc["rows"]
  assert len(rows) == 2 * (1 + 3 + 1)  # per target: baseline, 3 sources, generic SPoT
  header = (uninterrupted / "results.csv").read_text().splitlines()[0]
  assert header.split(",") == list(grid_lib.COLUMNS)
  for row in rows:
    base = runs.read_record(uninterrupted / f"targets/{row['target']}/seed0/baseline")
    cell = row["init"] if row["init"] in ("baseline", "generic") else f"from/{row['init']}"
    rec = runs.read_record(uninterrupted / f"targets/{row['target']}/seed0/{cell}")
    best = json.loads((pathlib.Path(rec.run_dir) / "best" / "metric.json").read_text())
    assert row["score"] == best["value"] and best["metric"] == "char_match"
    assert row["baseline_score"] == base.score
    assert row["relative_error_reduction"] == pytest.approx(
        ((100 - base.score) - (100 - row["score"])) / (100 - base.score), abs=1e-12)
    if row["init"] == "generic":  # from the prompt tuned on the mixture of all sources
      assert rec.init == "best prompt of generic/source"
      generic = runs.read_record(uninterrupted / "generic" / "source")
      assert generic.task.startswith("spot_generic_") and generic.score is None
    elif row["init"] != "baseline":
      source = runs.read_record(uninterrupted / f"sources/{row['init']}")
      want = similarity.similarities(base.embedding(), [source.embedding()], "per_token")[0]
      assert row["similarity_per_token"] == pytest.approx(want, abs=1e-12)
      # the transfer run started from the source's best prompt
      assert rec.init == f"best prompt of sources/{row['init']}"
  assert len({r["score"] for r in rows}) > 1, rows  # graded metric: distinct scores


def test_sigkill_mid_grid_then_restart_completes_only_the_missing_cells(tmp_path, env, uninterrupted):
  study_dir = tmp_path / "study"
  proc = subprocess.Popen(_cmd("study", f"--study_dir={study_dir}", *STUDY_FLAGS), cwd=REPO, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  half = None
  deadline = time.time() + 600
  while time.time() < deadline and proc.poll() is None:
    done = _finished(study_dir)
    if len(done) >= 3:  # a later cell with its step-2 checkpoint but not finished: kill now
      half = next((c for c in ALL_CELLS - done if (study_dir / c / "checkpoints" / "2").is_dir()), None)
      if half is not None:
        proc.send_signal(signal.SIGKILL)
        break
    time.sleep(0.05)
  proc.wait(timeout=60)
  assert half is not None and proc.returncode == -signal.SIGKILL, "did not catch a half-finished cell"
  before = _finished(study_dir)
  assert half not in before and 3 <= len(before) < len(ALL_CELLS)
  records = {c: (study_dir / c / "run.json").read_bytes() for c in before}

  restart = _run(env, "study", f"--study_dir={study_dir}", *STUDY_FLAGS, "--verbose")
  ran = set(re.findall(r"^cell (\S+): running$", restart.stdout, re.M))
  skipped = set(re.findall(r"^cell (\S+): finished, skipped$", restart.stdout, re.M))
  assert ran == ALL_CELLS - before and skipped == before
  # the half-finished cell resumed from its own checkpoint, not from scratch
  resumed = restart.stdout.split(f"cell {half}: running")[1].split("cell ")[0]
  assert "resumed from" in resumed and "checkpoints/2" in resumed, resumed[-1500:]
  assert {c: (study_dir / c / "run.json").read_bytes() for c in before} == records
  assert (study_dir / "results.csv").read_text() == (uninterrupted / "results.csv").read_text()


def test_report_writes_figures_and_tables(uninterrupted, env):
  _run(env, "report", f"--study_dir={uninterrupted}", "--similarity=per_token")
  out = uninterrupted / "report"
  for name in ("transfer_heatmap.png", "similarity_heatmap.png", "similarity_vs_transfer.png"):
    data = (out / name).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
  md = (out / "report.md").read_text()
  rows = json.loads((uninterrupted / "results.json").read_text())["rows"]
  for target in TARGETS:  # the transfer table holds each RER (one seed: the mean is the value)
    line = next(l for l in md.splitlines() if l.startswith(f"| {target} |"))
    values = [float(v) for v in line.strip("| ").split(" | ")[1:4]]
    want = [next(r["relative_error_reduction"] for r in rows if r["target"] == target and r["init"] == s)
            for s in SOURCES]
    np.testing.assert_allclose(values, want, rtol=1e-3, atol=1e-4)
  for fragment in ("Pearson r", "Spearman r", "share of oracle gain kept", "best_of_top_1", "oracle", "| generic |",
                   "Sources ranked by similarity"):
    assert fragment in md


@pytest.fixture(scope="module")
def library_dir(uninterrupted, tmp_path_factory) -> pathlib.Path:
  lib = tmp_path_factory.mktemp("lib") / "library"
  for source in SOURCES:  # in-process (the library CLI's own subprocess test is in test_spot_library)
    code = cli.run(library_cli.main, ["add", f"--library={lib}", f"--run_dir={uninterrupted / 'sources' / source}",
                                      "--task_module=tests.spot_tasks"], library_cli.PROG)
    assert code == 0
  entries, problems = prompt_library.Library(lib).load()
  assert [e.id for e in entries] == sorted(SOURCES) and not problems
  for e in entries:
    rec = runs.read_record(uninterrupted / "sources" / e.task)
    np.testing.assert_array_equal(e.embedding, rec.embedding())
    np.testing.assert_array_equal(e.prompt, rec.prompt())
    assert e.score == rec.score and e.embedding_step == 2
  return lib


def test_retrieval_runs_every_strategy_and_reports(library_dir, uninterrupted, tmp_path, capsys):
  strategies = ["best_of_top_k", "weighted_average", "mixture", "smop_experts", "smop", "generic", "baseline"]
  work = tmp_path / "retrieve"
  # in-process (faster: one Python, warm caches); the command line's own checks are below
  code = cli.run(retrieve_cli.main, [f"--library={library_dir}", "--target_task=spot_test_review_v1",
                                     f"--strategy={','.join(strategies)}", "--k=2", "--expert_length=2",
                                     f"--output_dir={work}", *RUN_FLAGS], retrieve_cli.PROG)
  proc = capsys.readouterr()
  assert code == 0, proc.err[-3000:]
  written = re.findall(r"^wrote (.+)$", proc.out, re.M)
  assert len(written) == 1, proc.out[-2000:]
  report = json.loads(pathlib.Path(written[0]).read_text())
  assert written[0] == str(work / f"retrieval-{report['key']}.json")
  # the ranking is the similarity of the target's early prompt to each library embedding
  assert report["embedding_file"] == str(pathlib.Path(report["embedding_run_dir"]) / "prompts" / "prompt_step_2.npy")
  target_emb = np.load(report["embedding_file"])
  sims = {s: similarity.similarities(target_emb, [runs.read_record(uninterrupted / "sources" / s).embedding()],
                                     "average")[0] for s in SOURCES}
  ranked = [r["id"] for r in report["ranking"]]
  assert ranked == sorted(SOURCES, key=lambda s: -sims[s])
  for r in report["ranking"]:
    assert r["similarity"] == pytest.approx(sims[r["id"]], abs=1e-12)
    assert f"{r['id']} ({r['task']}) similarity {r['similarity']:.4f}" in proc.out
  results = {r["strategy"]: r for r in report["results"]}
  assert list(results) == strategies
  for name, res in results.items():
    rec = runs.read_record(res["run_dir"])
    assert rec is not None and rec.score == res["score"] and rec.task == "spot_test_review_v1", name
    assert f"{name}: score {res['score']:.4g}" in proc.out
  best = results["best_of_top_k"]
  assert set(best["tried"]) == set(ranked[:2]) and best["score"] == max(best["tried"].values())
  assert best["chosen"] == [max(best["tried"], key=best["tried"].get)]
  alphas = results["weighted_average"]["alphas"]
  assert alphas == pytest.approx({i: sims[i] / (sims[ranked[0]] + sims[ranked[1]]) for i in ranked[:2]})
  assert results["mixture"]["mixture_tasks"] == sorted(ranked[:2] + ["spot_test_review_v1"])
  assert results["generic"]["mixture_tasks"] == sorted(SOURCES)
  experts = np.load(pathlib.Path(results["smop_experts"]["run_dir"]) / "prompts" / "prompt_best.npy")
  assert experts.shape == (2, 2, 64)  # k experts of expert_length tokens


def test_study_and_retrieve_bad_inputs_exit_2_with_one_line(tmp_path, env, capsys, library_dir, uninterrupted):
  (tmp_path / "a_file").write_text("not a directory")
  cases = [("study", [f"--study_dir={tmp_path / 's'}", "--sources=spot_test_parity_v1", "--targets=spot_test_bitz_v1",
                      "--seeds=0", *RUN_FLAGS], "did you mean 'spot_test_bits_v1'"),
           ("study", [f"--study_dir={tmp_path / 's'}", "--seeds=0,x", *RUN_FLAGS], "--seeds='0,x': entry 1 ('x') is not an integer"),
           ("study", [f"--study_dir={tmp_path / 's'}", "--sources=spot_test_parity_v1", "--targets=spot_test_bits_v1",
                      "--num_shards=2", "--shard_index=2", *RUN_FLAGS], "--shard_index=2 --num_shards=2"),
           ("retrieve", [f"--library={tmp_path / 'nolib'}", "--target_task=spot_test_bits_v1", "--strategy=oracle",
                         f"--output_dir={tmp_path / 'w'}", *RUN_FLAGS], "--strategy='oracle': entry 0 ('oracle') is unknown"),
           ("retrieve", [f"--library={tmp_path / 'nolib'}", "--target_task=spot_test_bits_v1",
                         f"--output_dir={tmp_path / 'w'}", *RUN_FLAGS], "is empty or missing"),
           ("study", [f"--study_dir={tmp_path / 'a_file' / 's'}", "--sources=spot_test_parity_v1",
                      "--targets=spot_test_bits_v1", "--seeds=0", *RUN_FLAGS],
            f"--study_dir '{tmp_path / 'a_file' / 's'}' is not writable (Not a directory)"),
           ("retrieve", [f"--library={library_dir}", "--target_task=spot_test_bits_v1", "--strategy=,",
                         f"--output_dir={tmp_path / 'w'}", *RUN_FLAGS], "--strategy=',': entry 0 is empty"),
           ("retrieve", [f"--library={library_dir}", "--target_task=spot_test_bits_v1",
                         f"--output_dir={tmp_path / 'a_file' / 'w'}", *RUN_FLAGS],
            f"--output_dir '{tmp_path / 'a_file' / 'w'}' is not writable (Not a directory)"),
           ("report", [f"--study_dir={tmp_path / 'nothing'}"], "does not exist; give the folder of a"),
           ("report", [f"--study_dir={uninterrupted}", f"--output_dir={tmp_path / 'a_file' / 'r'}"],
            f"--output_dir '{tmp_path / 'a_file' / 'r'}' is not writable (Not a directory)")]
  mains = {"study": study_cli.main, "retrieve": retrieve_cli.main, "report": report_cli.main}
  for i, (prog, args, fragment) in enumerate(cases):
    if i == 0:  # as a user runs it
      proc = subprocess.run(_cmd(prog, *args), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
      code, stderr = proc.returncode, proc.stderr
    else:  # the same error boundary, in-process (faster)
      code = cli.run(mains[prog], args, f"spot_jax.{prog}")
      stderr = capsys.readouterr().err
    assert code == 2, (prog, args, stderr[-2000:])
    assert "Traceback" not in stderr
    lines = [l for l in stderr.splitlines() if l.startswith(f"spot_jax.{prog}:")]
    assert len(lines) == 1 and lines[0].startswith(f"spot_jax.{prog}: error:"), stderr[-2000:]
    assert fragment in lines[0], lines[0]
  assert not (tmp_path / "s" / "results.csv").exists()


def test_shards_partition_every_stage():
  grid = grid_lib.Grid(tuple(SOURCES), tuple(TARGETS), (0, 1), generic=True)
  for stage in (grid.stage1(), grid.stage2()):
    parts = [grid_lib.shard_cells(stage, i, 3) for i in range(3)]
    assert sorted(c.path for p in parts for c in p) == sorted(c.path for c in stage)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def _settings(**change):
  from spot_jax.spot import settings as settings_lib  # pylint: disable=g-import-not-at-top
  model, name = model_file.load_model("t5_1_1_byte_tiny")
  base = dict(model=model, model_name=name, initial_checkpoint_path=None, task_module="tests.spot_tasks",
              lengths={"inputs": 24, "targets": 6}, train_steps=4, embedding_step=2, eval_period=4,
              prompt_length=4, fingerprint=settings_lib.model_fingerprint(model, None, 0))
  return settings_lib.RunSettings(**{**base, **change})


def test_restart_with_other_settings_is_refused(tmp_path):
  grid_lib.check_config(tmp_path, _settings(), GRID)
  before = (tmp_path / grid_lib.CONFIG).read_bytes()
  grid_lib.check_config(tmp_path, _settings(), GRID)  # same settings: fine
  with pytest.raises(grid_lib.ConfigError, match="learning_rate differ"):
    grid_lib.check_config(tmp_path, _settings(learning_rate=0.1), GRID)
  assert (tmp_path / grid_lib.CONFIG).read_bytes() == before


def test_model_from_gin_file_has_the_config_names_fingerprint(tmp_path):
  from spot_jax.spot import settings as settings_lib  # pylint: disable=g-import-not-at-top
  by_name, _ = model_file.load_model("t5_1_1_byte_tiny")
  by_file, _ = model_file.load_model("gin/models/t5_1_1_byte_tiny.gin", ["DROPOUT_RATE=0.3"])
  assert by_file.config.dropout_rate == 0.3 and not by_file.has_prompt
  assert settings_lib.model_fingerprint(by_file, None, 0) == settings_lib.model_fingerprint(by_name, None, 0)
  assert settings_lib.model_fingerprint(by_file, None, 1) != settings_lib.model_fingerprint(by_name, None, 0)
  ckpt = tmp_path / "ckpt"
  ckpt.mkdir()
  (ckpt / "a.bin").write_bytes(b"weights")
  first = settings_lib.model_fingerprint(by_name, str(ckpt), 0)
  assert first["checkpoint"].startswith("files:") and first != settings_lib.model_fingerprint(by_name, None, 0)
  (ckpt / "a.bin").write_bytes(b"weightz")
  assert settings_lib.model_fingerprint(by_name, str(ckpt), 0) != first


def test_stage2_cell_waits_for_a_source_of_another_shard(tmp_path):
  for cell in (grid_lib.Cell("transfer", TARGETS[0], 0, SOURCES[0]), grid_lib.Cell("generic", TARGETS[0], 0)):
    assert grid_lib.run_cell(_settings(), tmp_path, cell, GRID) is None
    assert not (tmp_path / cell.path).exists()  # nothing trained, nothing written
