"""The SPoT layer end to end on a tiny random T5 and tiny local tasks (tests/helpers/spot_tasks.py):
the seeded study on a 3 x 2 x 3-seed grid (each job's runs in one jitted step, generic SPoT and
the top-2 retrieval runs), SIGKILL mid-job and restart, the seeded aggregates against the run
records, the reports, then a library built from the study's source runs and every retrieval
strategy.

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
from spot_jax.cli import model_flag
from spot_jax import experiment
from spot_jax.spot import similarity
from spot_jax.spot import library as prompt_library
from spot_jax.spot import study as grid_lib
from spot_jax.spot import study_tables
from tests.helpers import REPO

SOURCES = ["spot_test_sentiment_v1", "spot_test_parity_v1", "spot_test_length_v1"]
TARGETS = ["spot_test_review_v1", "spot_test_bits_v1"]
RUN_FLAGS = ["--model=t5_1_1_byte_tiny", "--task_module=tests.helpers.spot_tasks",
             "--input_length=24",
             "--target_length=6", "--batch_size=8", "--train_steps=4", "--embedding_step=2",
             "--eval_period=4", "--checkpoint_period=2", "--eval_batch_size=16",
             "--eval_num_examples=16", "--prompt_length=4", "--metric=char_match"]
SEEDS = (0, 1, 2)
STUDY_FLAGS = [f"--sources={','.join(SOURCES)}", f"--targets={','.join(TARGETS)}", "--seeds=0,1,2",
               "--generic", "--retrieval_k=2", *RUN_FLAGS]
GRID = grid_lib.Grid(tuple(SOURCES), tuple(TARGETS), SEEDS, generic=True, retrieval_k=2)


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


def _settings(**change):
  from spot_jax.spot import settings as settings_lib  # pylint: disable=g-import-not-at-top
  model, name = model_flag.load_model("t5_1_1_byte_tiny")
  base = dict(model=model, model_name=name, initial_checkpoint_path=None,
              task_module="tests.helpers.spot_tasks",
              lengths={"inputs": 24, "targets": 6}, train_steps=4, embedding_step=2, eval_period=4,
              prompt_length=4, metric="char_match",
              fingerprint=settings_lib.model_fingerprint(model, None, 0))
  return settings_lib.RunSettings(**{**base, **change})


LAYOUT = grid_lib.Layout(_settings())
ALL_CELLS = {LAYOUT.path(c) for c in GRID.cells()}  # 3 + 6 + 1, then 18 + 6 + 6 + 6, then 6


def _finished(study_dir: pathlib.Path) -> set[str]:
  return {c for c in ALL_CELLS if experiment.read_outcome(study_dir / c) is not None}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, env) -> pathlib.Path:
  study_dir = tmp_path_factory.mktemp("study_full") / "study"
  proc = _run(env, "study", f"--study_dir={study_dir}", *STUDY_FLAGS)
  # per target and seed: baseline, 3 sources, generic, weighted average, mixture
  assert ("52 runs in 10 jobs run, 0 already finished, 0 waiting; 42 rows"
          in proc.stdout), proc.stdout[-2000:]
  return study_dir


def _cell_path(row: dict) -> str:
  kind = {"baseline": "baseline", "generic": "generic", "weighted_average": "weighted_average",
          "mixture": "mixture"}.get(row["init"], "transfer")
  source = row["init"] if kind == "transfer" else None
  return LAYOUT.path(grid_lib.Cell(kind, row["target"], row["seed"], source))


def test_study_writes_the_table(uninterrupted):
  doc = json.loads((uninterrupted / "results.json").read_text())
  rows = doc["rows"]
  assert len(rows) == 2 * 3 * (1 + 3 + 3)
  header = (uninterrupted / "results.csv").read_text().splitlines()[0]
  assert header.split(",") == list(study_tables.COLUMNS)
  for row in rows:
    base = experiment.read_outcome(uninterrupted / f"baselines/{row['target']}.seed_{row['seed']}")
    rec = experiment.read_outcome(uninterrupted / _cell_path(row))
    assert rec.seed == row["seed"] and rec.task == row["target"]
    best = json.loads((pathlib.Path(rec.run_dir) / "best" / "metric.json").read_text())
    assert row["score"] == best["value"] and best["metric"] == "char_match"
    assert row["baseline_score"] == base.score
    assert row["relative_error_reduction"] == pytest.approx(
        ((100 - base.score) - (100 - row["score"])) / (100 - base.score), abs=1e-12)
    if row["init"] == "generic":  # from the prompt tuned on the mixture of all sources
      assert rec.init == "best prompt of generic/source"
      generic = experiment.read_outcome(uninterrupted / "generic" / "source")
      assert generic.task.startswith("spot_generic_") and generic.score is None
    elif row["init"] in ("weighted_average", "mixture"):
      sims = {s: similarity.similarities(
          base.embedding(), [experiment.read_outcome(uninterrupted / f"sources/{s}").embedding()],
          "average")[0] for s in SOURCES}
      top = sorted(SOURCES, key=lambda s: -sims[s])[:2]
      assert row["retrieved"] == ";".join(top)
      if row["init"] == "mixture":
        mix = experiment.read_outcome(
            uninterrupted / f"retrieval/mixture_sources/{row['target']}.seed_{row['seed']}")
        assert (rec.init == "best prompt of "
                            f"retrieval/mixture_sources/{row['target']}.seed_{row['seed']}")
        assert mix.task.startswith("spot_mixture_") and mix.score is None
      else:  # started from SPoT's weighted average of the top-2 best prompts
        prompts_ = [experiment.read_outcome(uninterrupted / f"sources/{s}").prompt() for s in top]
        want = similarity.weighted_average(prompts_, [sims[s] for s in top])
        request = grid_lib._request(uninterrupted, LAYOUT, GRID,  # pylint: disable=protected-access
                                    grid_lib.Cell("weighted_average", row["target"], row["seed"]))
        np.testing.assert_allclose(request.init, want, rtol=0, atol=1e-6)
        assert rec.init == f"weighted average of {', '.join(top)}"
    elif row["init"] != "baseline":
      source = experiment.read_outcome(uninterrupted / f"sources/{row['init']}")
      want = similarity.similarities(base.embedding(), [source.embedding()], "per_token")[0]
      assert row["similarity_per_token"] == pytest.approx(want, abs=1e-12)
      # the transfer run started from the source's best prompt
      assert rec.init == f"best prompt of sources/{row['init']}"
  assert len({r["score"] for r in rows}) > 1, rows  # graded metric: distinct scores
  # each job trained its runs in one step: one job record per job directory
  job = json.loads((uninterrupted / "transfers" / SOURCES[0] / "job.json").read_text())
  assert [r["name"] for r in job["runs"]] == [f"{t}.seed_{s}" for t in TARGETS for s in SEEDS]
  timing = [json.loads(l) for l in (uninterrupted / grid_lib.TIMING).read_text().splitlines()]
  assert sum(t["runs"] for t in timing) == 52 and not any(t["one_at_a_time"] for t in timing)


def test_sigkill_mid_job_then_restart_completes_only_the_missing_runs(tmp_path, env, uninterrupted):
  study_dir = tmp_path / "study"
  proc = subprocess.Popen(_cmd("study", f"--study_dir={study_dir}", *STUDY_FLAGS), cwd=REPO,
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  half = None
  deadline = time.time() + 600
  while time.time() < deadline and proc.poll() is None:
    done = _finished(study_dir)
    if len(done) >= 3:  # a later job whose runs all saved step 2 but did not finish: kill now
      # (Not earlier: a kill between the K runs' first saves leaves no common step, which the
      # trainer refuses to resume; see the integrator's note.)
      jobs = {}
      for c in ALL_CELLS - done:
        jobs.setdefault(c.rsplit("/", 1)[0], []).append(c)
      half = next((cells[0] for _, cells in sorted(jobs.items())
                   if all((study_dir / c / "checkpoints" / "2" / "_CHECKPOINT_METADATA").is_file()
                          for c in cells) and not any(c in done for c in cells)), None)
      if half is not None:
        proc.send_signal(signal.SIGKILL)
        break
    time.sleep(0.05)
  proc.wait(timeout=60)
  assert (half is not None
          and proc.returncode == -signal.SIGKILL), "did not catch a half-finished job"
  before = _finished(study_dir)
  assert half not in before and 3 <= len(before) < len(ALL_CELLS)
  records = {c: (study_dir / c / "run.json").read_bytes() for c in before}
  half_job = half.rsplit("/", 1)[0]

  restart = _run(env, "study", f"--study_dir={study_dir}", *STUDY_FLAGS, "--verbose")
  ran = set(re.findall(r"^job (\S+): running \d+ runs in one step$", restart.stdout, re.M))
  skipped = set(re.findall(r"^job (\S+): \d+ runs finished, skipped$", restart.stdout, re.M))
  assert {c.rsplit("/", 1)[0] for c in ALL_CELLS - before} == ran and half_job in ran
  assert {c.rsplit("/", 1)[0] for c in before} == skipped
  # the half-finished job resumed from the step all its runs saved, not from scratch
  resumed = restart.stdout.split(f"job {half_job}: running")[1].split("\njob ")[0]
  assert re.search(r"resumed (\d+ runs in \S+ from step 2|from \S+checkpoints/2)",
                   resumed), resumed[-1500:]
  assert {c: (study_dir / c / "run.json").read_bytes() for c in before} == records
  assert (study_dir / "results.csv").read_text() == (uninterrupted / "results.csv").read_text()


def test_seeded_aggregates_against_the_run_records(uninterrupted):
  """Transfer gains, correlations and retrieval's share, recomputed from run.json
  and the prompts."""
  from scipy import stats as scipy_stats  # pylint: disable=g-import-not-at-top
  rows = json.loads((uninterrupted / "results.json").read_text())["rows"]
  score = lambda path: experiment.read_outcome(uninterrupted / path).score
  base = {(t, s): score(f"baselines/{t}.seed_{s}") for t in TARGETS for s in SEEDS}
  transfer = {(t, src, s): score(f"transfers/{src}/{t}.seed_{s}") for t in TARGETS
              for src in SOURCES for s in SEEDS}
  gains = study_tables.transfer_gains(rows, TARGETS, SOURCES)
  for t in TARGETS:
    for src in SOURCES:
      rer = [(transfer[(t, src, s)] - base[(t, s)]) / (100 - base[(t, s)]) for s in SEEDS]
      diff = [transfer[(t, src, s)] - base[(t, s)] for s in SEEDS]
      got = gains[(t, src)]
      half = scipy_stats.t.ppf(0.975, 2) * np.std(rer, ddof=1) / np.sqrt(3)
      assert got["rer"].n == 3 and got["rer"].mean == pytest.approx(np.mean(rer), abs=1e-12)
      assert got["rer"].half_width == pytest.approx(half, abs=1e-12)
      assert got["points"].mean == pytest.approx(np.mean(diff), abs=1e-12)
  # correlations over the seed-averaged points: 3 per target (no interval), 6 pooled
  emb = lambda path: experiment.read_outcome(uninterrupted / path).embedding()
  sim = {(t, src): np.mean([similarity.similarities(emb(f"baselines/{t}.seed_{s}"),
                                                    [emb(f"sources/{src}")],
                                                    "average")[0] for s in SEEDS])
         for t in TARGETS for src in SOURCES}
  corr = study_tables.correlations(rows, TARGETS, SOURCES, "average")
  for name, members in [(t, [t]) for t in TARGETS] + [("all", TARGETS)]:
    x = [sim[(t, src)] for t in members for src in SOURCES]
    y = [gains[(t, src)]["rer"].mean for t in members for src in SOURCES]
    if np.ptp(y) > 0:
      assert corr[name]["pearson"].mean == pytest.approx(scipy_stats.pearsonr(x, y)[0], abs=1e-9)
      assert corr[name]["spearman"].mean == pytest.approx(scipy_stats.spearmanr(x, y)[0], abs=1e-9)
    assert corr[name]["n"] == len(x)
    assert corr[name]["pearson"].resolved == (len(x) >= 5)
  assert "too few" in corr[TARGETS[0]]["pearson"].why
  # retrieval: each method's share of the oracle's gain over the 6 (target, seed) cases
  table = {r["method"]: r
           for r in study_tables.retrieval_table(rows, SOURCES, "average", ks=(1,), retrieval_k=2)}
  cases = [(t, s) for t in TARGETS for s in SEEDS]
  oracle = [max(transfer[(t, src, s)] for src in SOURCES) for t, s in cases]
  top1 = [transfer[(t, max(SOURCES, key=lambda src: similarity.similarities(
      emb(f"baselines/{t}.seed_{s}"), [emb(f"sources/{src}")], "average")[0]), s)]
          for t, s in cases]
  methods = {"best_of_top_1": top1,
             "weighted_average": [score(f"retrieval/weighted_average/{t}.seed_{s}")
                                  for t, s in cases],
             "mixture": [score(f"retrieval/mixture/{t}.seed_{s}") for t, s in cases],
             "generic": [score(f"generic_transfers/{t}.seed_{s}") for t, s in cases]}
  b = np.mean([base[c] for c in cases])
  for method, values in methods.items():
    got = table[method]
    assert got["cases"] == 6
    if np.mean(oracle) > b:
      assert (got["oracle_gain_kept"].mean
              == pytest.approx((np.mean(values) - b) / (np.mean(oracle) - b), abs=1e-12))
    per_seed = [np.mean([v for (t, s), v in zip(cases, values) if s == seed]) for seed in SEEDS]
    assert got["mean_score"].mean == pytest.approx(np.mean(per_seed), abs=1e-12)
    assert got["mean_score"].n == 3


def test_report_writes_readable_figures_with_intervals(uninterrupted, env):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  _run(env, "report", f"--study_dir={uninterrupted}", "--similarity=per_token")
  out = uninterrupted / "report"
  for name in ("transfer_heatmap.png", "similarity_heatmap.png", "similarity_vs_transfer.png",
               "retrieval.png"):
    with Image.open(out / name) as image:
      width, height = image.size
    assert width >= 500 and height >= 300, (name, image.size)  # sized to the grid, not a strip
  md = (out / "report.md").read_text()
  rows = json.loads((uninterrupted / "results.json").read_text())["rows"]
  gains = study_tables.transfer_gains(rows, TARGETS, SOURCES)
  short = {"spot_test_review_v1": "review", "spot_test_bits_v1": "bits",
           "spot_test_sentiment_v1": "sentiment", "spot_test_parity_v1": "parity",
           "spot_test_length_v1": "length"}
  for (t, s), g in gains.items():  # the transfer table: mean ± t half-width over the 3 seeds
    assert (f"| {short[t]} | {short[s]} | 3 | {g['rer'].format(3)} | {g['points'].format(3)} | "
            f"{g['verdict']} |" in md)
  # three points per target: no interval, said so
  assert "| review | 3 | " in md and "too few" in md
  assert " p " not in md and "(p " not in md  # no p-values
  for fragment in ("Pearson r", "Spearman r", "share of oracle gain kept", "best_of_top_1",
                   "oracle", "| generic |", "| weighted_average | 2 |", "| mixture | 2 |",
                   "Sources ranked by similarity", "prefix 'spot_test_'"):
    assert fragment in md


@pytest.fixture(scope="module")
def library_dir(uninterrupted, tmp_path_factory) -> pathlib.Path:
  lib = tmp_path_factory.mktemp("lib") / "library"
  # in-process (the library CLI's own subprocess test is in test_spot_library)
  for source in SOURCES:
    code = cli.run(library_cli.main, ["add", f"--library={lib}",
                                      f"--run_dir={uninterrupted / 'sources' / source}",
                                      "--task_module=tests.helpers.spot_tasks"], library_cli.PROG)
    assert code == 0
  entries, problems = prompt_library.Library(lib).load()
  assert [e.id for e in entries] == sorted(SOURCES) and not problems
  for e in entries:
    rec = experiment.read_outcome(uninterrupted / "sources" / e.task)
    np.testing.assert_array_equal(e.embedding, rec.embedding())
    np.testing.assert_array_equal(e.prompt, rec.prompt())
    assert e.score == rec.score and e.embedding_step == 2
  return lib


def test_retrieval_runs_every_strategy_and_reports(library_dir, uninterrupted, tmp_path, capsys):
  strategies = ["best_of_top_k", "weighted_average", "mixture", "smop_experts", "smop",
                "generic", "baseline"]
  work = tmp_path / "retrieve"
  # in-process (faster: one Python, warm caches); the command line's own checks are below
  code = cli.run(retrieve_cli.main,
                 [f"--library={library_dir}", "--target_task=spot_test_review_v1",
                  f"--strategy={','.join(strategies)}", "--k=2", "--expert_length=2",
                  f"--output_dir={work}", *RUN_FLAGS], retrieve_cli.PROG)
  proc = capsys.readouterr()
  assert code == 0, proc.err[-3000:]
  written = re.findall(r"^wrote (.+)$", proc.out, re.M)
  assert len(written) == 1, proc.out[-2000:]
  report = json.loads(pathlib.Path(written[0]).read_text())
  assert written[0] == str(work / f"retrieval-{report['key']}.json")
  # the ranking is the similarity of the target's early prompt to each library embedding
  assert (report["embedding_file"]
          == str(pathlib.Path(report["embedding_run_dir"]) / "prompts" / "prompt_step_2.npy"))
  target_emb = np.load(report["embedding_file"])
  sims = {s: similarity.similarities(
      target_emb, [experiment.read_outcome(uninterrupted / "sources" / s).embedding()],
      "average")[0] for s in SOURCES}
  ranked = [r["id"] for r in report["ranking"]]
  assert ranked == sorted(SOURCES, key=lambda s: -sims[s])
  for r in report["ranking"]:
    assert r["similarity"] == pytest.approx(sims[r["id"]], abs=1e-12)
    assert f"{r['id']} ({r['task']}) similarity {r['similarity']:.4f}" in proc.out
  results = {r["strategy"]: r for r in report["results"]}
  assert list(results) == strategies
  for name, res in results.items():
    rec = experiment.read_outcome(res["run_dir"])
    assert rec is not None and rec.score == res["score"] and rec.task == "spot_test_review_v1", name
    assert f"{name}: score {res['score']:.4g}" in proc.out
  best = results["best_of_top_k"]
  assert set(best["tried"]) == set(ranked[:2]) and best["score"] == max(best["tried"].values())
  assert best["chosen"] == [max(best["tried"], key=best["tried"].get)]
  alphas = results["weighted_average"]["alphas"]
  assert (alphas
          == pytest.approx({i: sims[i] / (sims[ranked[0]] + sims[ranked[1]]) for i in ranked[:2]}))
  assert results["mixture"]["mixture_tasks"] == sorted(ranked[:2] + ["spot_test_review_v1"])
  assert results["generic"]["mixture_tasks"] == sorted(SOURCES)
  experts = np.load(pathlib.Path(results["smop_experts"]["run_dir"]) / "prompts"
                    / "prompt_best.npy")
  assert experts.shape == (2, 2, 64)  # k experts of expert_length tokens


def test_study_and_retrieve_bad_inputs_exit_2_with_one_line(tmp_path, env, capsys, library_dir,
                                                            uninterrupted):
  (tmp_path / "a_file").write_text("not a directory")
  cases = [("study", [f"--study_dir={tmp_path / 's'}", "--sources=spot_test_parity_v1",
                      "--targets=spot_test_bitz_v1", "--seeds=0",
                      *RUN_FLAGS], "did you mean 'spot_test_bits_v1'"),
           ("study", [f"--study_dir={tmp_path / 's'}", "--seeds=0,x", *RUN_FLAGS],
            "--seeds='0,x': entry 1 ('x') is not an integer"),
           ("study", [f"--study_dir={tmp_path / 's'}", "--seeds=", *RUN_FLAGS], "--seeds is empty"),
           ("study", [f"--study_dir={tmp_path / 's'}", "--seeds=0,1,0", *RUN_FLAGS],
            "--seeds: entry 2 (0) repeats entry 0"),
           ("study", [f"--study_dir={tmp_path / 's'}", "--seeds=1,-2", *RUN_FLAGS],
            "--seeds='1,-2': entry 1 (-2) must be >= 0"),
           ("study", [f"--study_dir={tmp_path / 's'}", "--sources=spot_test_parity_v1",
                      "--targets=spot_test_bits_v1", "--retrieval_k=2",
                      *RUN_FLAGS], "--retrieval_k=2; give 0"),
           ("study", [f"--study_dir={tmp_path / 's'}", "--sources=spot_test_parity_v1",
                      "--targets=spot_test_bits_v1", "--one_at_a_time",
                      *RUN_FLAGS], "--one_at_a_time needs --checkpoint"),
           ("study", [f"--study_dir={tmp_path / 's'}", "--sources=spot_test_parity_v1",
                      "--targets=spot_test_bits_v1", "--num_shards=2", "--shard_index=2",
                      *RUN_FLAGS], "--shard_index=2 --num_shards=2"),
           ("retrieve", [f"--library={tmp_path / 'nolib'}", "--target_task=spot_test_bits_v1",
                         "--strategy=oracle", f"--output_dir={tmp_path / 'w'}",
                         *RUN_FLAGS], "--strategy='oracle': entry 0 ('oracle') is unknown"),
           ("retrieve", [f"--library={tmp_path / 'nolib'}", "--target_task=spot_test_bits_v1",
                         f"--output_dir={tmp_path / 'w'}", *RUN_FLAGS], "is empty or missing"),
           ("study", [f"--study_dir={tmp_path / 'a_file' / 's'}", "--sources=spot_test_parity_v1",
                      "--targets=spot_test_bits_v1", "--seeds=0", *RUN_FLAGS],
            f"--study_dir '{tmp_path / 'a_file' / 's'}' is not writable (Not a directory)"),
           ("retrieve", [f"--library={library_dir}", "--target_task=spot_test_bits_v1",
                         "--strategy=,", f"--output_dir={tmp_path / 'w'}",
                         *RUN_FLAGS], "--strategy=',': entry 0 is empty"),
           ("retrieve", [f"--library={library_dir}", "--target_task=spot_test_bits_v1",
                         f"--output_dir={tmp_path / 'a_file' / 'w'}", *RUN_FLAGS],
            f"--output_dir '{tmp_path / 'a_file' / 'w'}' is not writable (Not a directory)"),
           ("report", [f"--study_dir={tmp_path / 'nothing'}"],
            "does not exist; give the folder of a"),
           ("report", [f"--study_dir={uninterrupted}", f"--output_dir={tmp_path / 'a_file' / 'r'}"],
            f"--output_dir '{tmp_path / 'a_file' / 'r'}' is not writable (Not a directory)")]
  mains = {"study": study_cli.main, "retrieve": retrieve_cli.main, "report": report_cli.main}
  for i, (prog, args, fragment) in enumerate(cases):
    if i == 0:  # as a user runs it
      proc = subprocess.run(_cmd(prog, *args), cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
      code, stderr = proc.returncode, proc.stderr
    else:  # the same error boundary, in-process (faster)
      code = cli.run(mains[prog], args, f"spot_jax.{prog}")
      stderr = capsys.readouterr().err
    assert code == 2, (prog, args, stderr[-2000:])
    assert "Traceback" not in stderr
    lines = [l for l in stderr.splitlines() if l.startswith(f"spot_jax.{prog}:")]
    assert len(lines) == 1 and lines[0].startswith(f"spot_jax.{prog}: error:"), stderr[-2000:]
    assert fragment in lines[0], lines[0]
  assert not (tmp_path / "s").exists()  # nothing written


def test_shards_partition_every_stage_by_job():
  for stage in GRID.stages():
    jobs = LAYOUT.jobs(stage)
    parts = [grid_lib.shard_jobs(jobs, i, 3) for i in range(3)]
    assert sorted(j for p in parts for j, _ in p) == sorted(j for j, _ in jobs)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_runs_of_another_metric_get_a_job_of_their_own():
  layout = grid_lib.Layout(_settings(task_metrics={TARGETS[1]: "accuracy"}))
  jobs = dict(layout.jobs(GRID.stages()[0]))
  assert [c.task for c in jobs["baselines"]] == [TARGETS[0]] * 3
  assert [c.task for c in jobs["baselines.accuracy"]] == [TARGETS[1]] * 3
  # every (task, seed) pair once per job: the trainer refuses a repeated one
  for stage in GRID.stages():
    for _, cells in LAYOUT.jobs(stage):
      assert len({(c.task, c.seed) for c in cells}) == len(cells)


def test_restart_with_other_settings_is_refused(tmp_path):
  grid_lib.check_config(tmp_path, _settings(), GRID)
  before = (tmp_path / grid_lib.CONFIG).read_bytes()
  grid_lib.check_config(tmp_path, _settings(), GRID)  # same settings: fine
  with pytest.raises(grid_lib.ConfigError, match="learning_rate differ"):
    grid_lib.check_config(tmp_path, _settings(learning_rate=0.1), GRID)
  assert (tmp_path / grid_lib.CONFIG).read_bytes() == before


def test_model_from_gin_file_has_the_config_names_fingerprint(tmp_path):
  from spot_jax.spot import settings as settings_lib  # pylint: disable=g-import-not-at-top
  by_name, _ = model_flag.load_model("t5_1_1_byte_tiny")
  by_file, _ = model_flag.load_model("gin/models/t5_1_1_byte_tiny.gin", ["DROPOUT_RATE=0.3"])
  assert by_file.config.dropout_rate == 0.3 and not by_file.has_prompt
  assert (settings_lib.model_fingerprint(by_file, None, 0)
          == settings_lib.model_fingerprint(by_name, None, 0))
  assert (settings_lib.model_fingerprint(by_file, None, 1)
          != settings_lib.model_fingerprint(by_name, None, 0))
  ckpt = tmp_path / "ckpt"
  ckpt.mkdir()
  (ckpt / "a.bin").write_bytes(b"weights")
  first = settings_lib.model_fingerprint(by_name, str(ckpt), 0)
  assert (first["checkpoint"].startswith("files:")
          and first != settings_lib.model_fingerprint(by_name, None, 0))
  (ckpt / "a.bin").write_bytes(b"weightz")
  assert settings_lib.model_fingerprint(by_name, str(ckpt), 0) != first


def test_stage2_cell_waits_for_a_source_of_another_shard(tmp_path):
  for cell in GRID.stages()[1] + GRID.stages()[2]:
    assert grid_lib._request(tmp_path, LAYOUT, GRID, cell) is None  # pylint: disable=protected-access
  assert not any(tmp_path.iterdir())  # nothing trained, nothing written
