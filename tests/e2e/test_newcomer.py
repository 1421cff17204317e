"""A newcomer's first day, from a fresh install: docs/tasks.md's worked example run as written.

In a virtual environment holding only `pip install -e <repo>` (conftest.py), from a folder
outside the repository, the bash blocks of the worked example (read from the doc, so the doc
cannot drift from what works) train the user's TSV task, evaluate it, serve it from its run
directory alone, add it to a prompt library, retrieve it for another task and transfer it by
SPoT. Only the step counts are made smaller (each replaced text must be in the doc). Then
`spot_jax.infer` starts twice on a cold compilation cache: no warning on stderr, and the second
start loads every executable from what the first wrote (JAX's compile log shows only cache hits).
"""
from __future__ import annotations

import json
import pathlib
import re
import subprocess
import time

from tests.e2e.conftest import clean_env
from tests.helpers import REPO

DOC = REPO / "docs" / "tasks.md"
SECTION = "**Worked example"
# Fewer steps than the doc's, for CI; the folder the doc makes, in the test's own.
SMALLER = {"--gin.TRAIN_STEPS=200": "--gin.TRAIN_STEPS=20",
           "--gin.EVAL_PERIOD=100": "--gin.EVAL_PERIOD=10",
           "--train_steps=200": "--train_steps=20", "--embedding_step=100": "--embedding_step=10",
           "--eval_period=100": "--eval_period=10"}


def worked_example(folder: pathlib.Path) -> str:
  """The worked example's bash blocks, as one script, with `SMALLER` steps and `folder`."""
  text = DOC.read_text()
  start = text.index(SECTION)
  end = text.find("\n#", start)
  blocks = re.findall(r"```bash\n(.*?)```", text[start:end if end >= 0 else None], re.S)
  assert len(blocks) >= 2, f"{DOC}: the worked example has {len(blocks)} bash blocks"
  script = "\n".join(blocks)
  for old, new in {**SMALLER, "/tmp/my_task": str(folder)}.items():
    assert old in script, f"{DOC}'s worked example no longer holds {old!r}; update SMALLER"
    script = script.replace(old, new)
  return script


def _noise(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.strip()]


def _infer(script: str, folder: pathlib.Path, env: dict
           ) -> tuple[float, subprocess.CompletedProcess]:
  """The worked example's `spot_jax.infer` command again, timed (its output elsewhere)."""
  (command,) = re.findall(r"python -m spot_jax\.infer(?:[^\n]*\\\n)*[^\n]*", script)
  command = command.replace("--output=predictions.jsonl", "--output=again.jsonl")
  start = time.monotonic()
  proc = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True,
                        text=True, timeout=600)
  return time.monotonic() - start, proc


def test_the_worked_example_from_a_fresh_install(base_venv, tmp_path):
  folder = tmp_path / "my_task"
  assert REPO not in folder.parents
  env = clean_env(base_venv, tmp_path / "cache")
  script = worked_example(folder)
  proc = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=1500)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]

  # train, eval: the run records the shipped checkpoint, whatever the working folder
  record = json.loads((folder / "run" / "run.json").read_text())
  assert record["backbone"]["checkpoint"] == "embedded:toy_t5/checkpoint", record["backbone"]
  assert record["finished"] and (folder / "run" / "config.gin").is_file()
  assert (folder / "run" / "eval_validation" / "metrics.json").is_file()
  # infer --prompt=run, no other backbone flag
  predictions = [json.loads(l) for l in (folder / "predictions.jsonl").read_text().splitlines()]
  assert predictions and all(p["prediction"] in ("positive", "negative") for p in predictions)
  # library add, then retrieval for another task picks the user's prompt
  (entry,) = (folder / "library" / "entries").glob("*.json")
  assert json.loads(entry.read_text())["task"] == "my_rating_v1"
  (report,) = (folder / "retrieval").glob("retrieval-*.json")
  assert entry.stem in report.read_text()
  # the SPoT transfer names its source run and step
  transfer = json.loads((folder / "travel" / "run.json").read_text())
  assert transfer["init"].startswith(f"run {folder / 'run'}, best, step "), transfer["init"]

  # a cold compilation cache: infer twice, quietly; the second start reads what the first wrote
  cache_env = dict(env, XDG_CACHE_HOME=str(tmp_path / "cold"))
  first_seconds, first = _infer(script, folder, cache_env)
  assert first.returncode == 0 and _noise(first.stderr) == [], first.stderr
  cache = tmp_path / "cold" / "spot_jax" / "jax"
  written = sorted(p.name for p in cache.iterdir())
  assert any(name.endswith("-cache") for name in written), written
  # The second start, with JAX's compile log on: every executable comes from the cache.
  second_seconds, second = _infer(script, folder, dict(cache_env, JAX_LOG_COMPILES="1"))
  assert second.returncode == 0, second.stderr
  log = second.stderr.splitlines()
  assert any("Persistent compilation cache hit for" in line for line in log), second.stderr
  assert not [line for line in log if "Persistent compilation cache miss" in line], second.stderr
  assert sorted(p.name for p in cache.iterdir()) == written  # nothing compiled anew
  print(f"infer on a cold cache {first_seconds:.1f} s, on the warm cache {second_seconds:.1f} s")
