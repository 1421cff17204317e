"""The prompt library: entries, refusals that leave it byte-identical, corrupt/foreign entries
skipped, concurrent writers, and its command line's one-line errors."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from spot_jax import cli
from spot_jax import library as library_cli
from spot_jax.run_dir import RunDir, RunRecord
from spot_jax import backbone as backbone_lib
from spot_jax.spot import library as prompt_library
from spot_jax.backbones.t5 import config_by_name
from tests.helpers import REPO

MODEL = ["--model=t5_1_1_byte_tiny", "--task_module=tests.helpers.spot_tasks"]
E = config_by_name("t5_1_1_byte_tiny").emb_dim  # 64
FP0 = backbone_lib.fingerprint(config_by_name("t5_1_1_byte_tiny"), None, 0)


def _run(argv, capsys) -> tuple[int, str, str]:
  code = cli.run(library_cli.main, argv, library_cli.PROG)
  out = capsys.readouterr()
  return code, out.out, out.err


def _snapshot(root: pathlib.Path) -> dict:
  return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _npy(path: pathlib.Path, shape, seed=0) -> str:
  np.save(path, np.random.RandomState(seed).normal(size=shape).astype(np.float32))
  return str(path)


@pytest.fixture
def lib(tmp_path, capsys):
  """A library with two entries added through the command line."""
  root = tmp_path / "lib"
  for i, task in enumerate(("spot_test_sentiment_v1", "spot_test_parity_v1")):
    code, out, err = _run(["add", f"--library={root}",
                           f"--prompt={_npy(tmp_path / f'p{i}.npy', (4, E), i)}",
                           f"--embedding={_npy(tmp_path / f'e{i}.npy', (4, E), 10 + i)}",
                           f"--task={task}", "--score=50", *MODEL], capsys)
    assert code == 0, err
  return root


def test_entries_round_trip(lib, tmp_path, capsys):
  entries, problems = prompt_library.Library(lib).load()
  assert problems == []
  assert [e.task for e in entries] == ["spot_test_parity_v1", "spot_test_sentiment_v1"]
  np.testing.assert_array_equal(entries[1].prompt, np.load(tmp_path / "p0.npy"))
  np.testing.assert_array_equal(entries[1].embedding, np.load(tmp_path / "e0.npy"))
  assert entries[0].fingerprint == FP0 and entries[0].score == 50.0
  code, out, _ = _run(["list", f"--library={lib}"], capsys)
  assert code == 0 and "2 entries" in out and "spot_test_parity_v1.p1" in out
  code, out, _ = _run(["show", f"--library={lib}", "--id=spot_test_parity_v1.p1"], capsys)
  assert json.loads(out)["prompt_shape"] == [4, E]
  code, out, _ = _run(["remove", f"--library={lib}", "--id=spot_test_parity_v1.p1"], capsys)
  assert code == 0 and prompt_library.Library(lib).ids() == ["spot_test_sentiment_v1.p0"]
  assert not list((lib / "arrays").glob("spot_test_parity_v1.p1.*"))


def test_scores_print_rounded_and_list_columns_line_up(tmp_path, capsys):
  root = tmp_path / "lib"
  adds = [("spot_test_sentiment_v1", "a_run_with_a_long_name_0123456789", 0.57 * 50, "28.5"),
          ("spot_test_parity_v1", "r", 100.0, "100")]  # 0.57 * 50 = 28.499999999999996
  for i, (task, run, score, printed) in enumerate(adds):
    prompt = _npy(tmp_path / f"p{i}.npy", (4, E), i)
    embedding = _npy(tmp_path / f"e{i}.npy", (3 + 9 * i, E), i)
    code, out, err = _run(["add", f"--library={root}", f"--prompt={prompt}",
                           f"--embedding={embedding}", f"--task={task}", f"--run_id={run}",
                           f"--score={score!r}", *MODEL], capsys)
    assert code == 0, err
    assert out.rstrip().endswith(f"score {printed}"), out
  code, out, _ = _run(["list", f"--library={root}"], capsys)
  lines = out.splitlines()
  assert code == 0 and lines[-1] == "2 entries"
  table = lines[:-1]
  # Every column starts at the same place on each line: the header's words mark them.
  starts = [table[0].index(word) for word in ("task", "prompt", "embedding")]
  for line in table[1:]:
    assert [line[s - 1] for s in starts] == [" "] * 3 and all(line[s] != " " for s in starts), table
  assert table[1].split()[3] == "100" and table[2].split()[3] == "28.5"
  score_end = table[0].index("score") + len("score")
  assert {line[score_end - 1] for line in table} <= set("e0123456789"), table  # right-aligned


def test_add_from_a_run_directory_record(tmp_path, capsys):
  run_dir = tmp_path / "run"
  (run_dir / "prompts").mkdir(parents=True)
  _npy(run_dir / "prompts" / "prompt_best.npy", (4, E), 1)
  _npy(run_dir / "prompts" / "prompt_step_2.npy", (4, E), 2)
  RunDir(run_dir).write_record(RunRecord(
      task="spot_test_bits_v1", seed=0, method={"class": "PromptTuning", "length": 4},
      backbone={"fingerprint": FP0}, task_module="tests.helpers.spot_tasks", train_steps=4,
      embedding_step=2, metric="char_match", score=71.5, finished=True, init="x"))
  code, out, err = _run(["add", f"--library={tmp_path / 'lib'}", f"--run_dir={run_dir}"], capsys)
  assert code == 0, err
  (entry,), _ = prompt_library.Library(tmp_path / "lib").load()
  assert ((entry.task, entry.score, entry.metric, entry.embedding_step) == ("spot_test_bits_v1",
                                                                            71.5, "char_match", 2))
  np.testing.assert_array_equal(entry.embedding, np.load(run_dir / "prompts" / "prompt_step_2.npy"))
  # the same run against --model with another backbone (seed 1 = another random backbone)
  code, _, err = _run(["add", f"--library={tmp_path / 'lib2'}", f"--run_dir={run_dir}", "--seed=1",
                       "--model=t5_1_1_test", "--task_module=tests.helpers.spot_tasks"], capsys)
  assert (code == 2 and "was trained against frozen model" in err
          and "--allow_backbone_change" in err)


def _refusals(tmp_path: pathlib.Path):
  good_e = _npy(tmp_path / "good_e.npy", (4, E), 5)
  truncated = tmp_path / "truncated.npy"
  data = pathlib.Path(_npy(tmp_path / "full.npy", (4, E), 6)).read_bytes()
  truncated.write_bytes(data[:len(data) // 2])
  narrow = _npy(tmp_path / "narrow.npy", (4, 32), 7)
  narrow_e = _npy(tmp_path / "narrow_e.npy", (4, 32), 8)
  other_ckpt = tmp_path / "ckpt"
  other_ckpt.mkdir()
  (other_ckpt / "weights.bin").write_bytes(b"another model")
  base = ["add", f"--embedding={good_e}", "--score=1"]
  (tmp_path / "dept" / "prompts").mkdir(parents=True)  # a DePT run: its offset beside its prompt
  dept_prompt = _npy(tmp_path / "dept" / "prompts" / "prompt_best.npy", (4, E), 9)
  _npy(tmp_path / "dept" / "prompts" / "offset_best.npy", (16, E), 9)
  return {
      "DePT prompt": ([*base, f"--prompt={dept_prompt}", "--task=spot_test_parity_v1", *MODEL],
                      "is a DePT prompt: it needs the input offset exported beside it"),
      "wrong embedding size": (["add", f"--embedding={narrow_e}", f"--prompt={narrow}",
                                "--task=spot_test_parity_v1", *MODEL],
                               "embedding size is 32 but the frozen model's is 64"),
      "another frozen model": ([*base, f"--prompt={good_e}", "--task=spot_test_parity_v1", *MODEL,
                                f"--checkpoint={other_ckpt}"], "another frozen model"),
      "another random backbone": ([*base, f"--prompt={good_e}", "--task=spot_test_parity_v1",
                                   *MODEL, "--seed=3"], "another frozen model"),
      "truncated npy": ([*base, f"--prompt={truncated}", "--task=spot_test_parity_v1", *MODEL],
                        "is truncated or not a .npy array"),
      "duplicate id": ([*base, f"--prompt={good_e}", "--task=spot_test_parity_v1",
                        "--id=spot_test_parity_v1.p1", *MODEL], "already exists"),
      "unknown task": ([*base, f"--prompt={good_e}", "--task=spot_test_parity_v2", *MODEL],
                       "did you mean 'spot_test_parity_v1'"),
      "no model": ([*base, f"--prompt={good_e}", "--task=spot_test_parity_v1",
                    "--task_module=tests.helpers.spot_tasks"],
                   "the frozen model is unknown"),
  }


def test_refusals_are_one_line_and_leave_the_library_byte_identical(lib, tmp_path, capsys):
  before = _snapshot(lib)
  for name, (argv, fragment) in _refusals(tmp_path).items():
    code, out, err = _run([argv[0], f"--library={lib}", *argv[1:]], capsys)
    lines = err.strip().splitlines()
    assert code == 2, (name, out, err)
    assert len(lines) == 1 and lines[0].startswith("spot_jax.library: error: "), (name, err)
    assert fragment in lines[0], (name, lines[0])
    assert _snapshot(lib) == before, name
  # the library itself also refuses another width, without being told the model's
  with pytest.raises(prompt_library.ConfigError, match="this library's is 64"):
    prompt_library.Library(lib).add(entry_id="narrow", task="t", run_id="r", seed=0,
                                    fingerprint=FP0,
                             prompt=np.ones((4, 32)), embedding=np.ones((4, 32)), score=1.0,
                                    metric="accuracy")
  assert _snapshot(lib) == before


def test_corrupt_and_foreign_entries_are_reported_and_skipped(lib, capsys):
  (lib / "entries" / "garbage.json").write_text("{not json")
  (lib / "entries" / "alien.json").write_text(json.dumps({"format": "someone else's",
                                                          "id": "alien"}))
  foreign = json.loads((lib / "entries" / "spot_test_parity_v1.p1.json").read_text())
  foreign.update(id="foreign", fingerprint={"id": "0123456789abcdef", "checkpoint": "random:9"})
  (lib / "entries" / "foreign.json").write_text(json.dumps(foreign))
  for kind in ("prompt", "embedding"):
    src = lib / "arrays" / f"spot_test_parity_v1.p1.{kind}.npy"
    (lib / "arrays" / f"foreign.{kind}.npy").write_bytes(src.read_bytes())
  flipped = lib / "arrays" / "spot_test_sentiment_v1.p0.prompt.npy"
  data = bytearray(flipped.read_bytes())
  data[-1] ^= 0xFF
  flipped.write_bytes(bytes(data))
  entries, problems = prompt_library.Library(lib).load()
  assert [e.id for e in entries] == ["spot_test_parity_v1.p1"]
  assert len(problems) == 4, problems
  joined = "\n".join(problems)
  for fragment in ("garbage.json: unreadable json", "alien.json: not a spot_jax library entry",
                   "foreign.json: foreign", "spot_test_sentiment_v1.p0.json: its prompt file"):
    assert fragment in joined, joined
  code, out, err = _run(["list", f"--library={lib}"], capsys)
  assert code == 0 and "1 entries, 4 skipped" in out
  assert err.count("spot_jax.library: warning: skipped entry") == 4
  code, _, err = _run(["show", f"--library={lib}", "--id=spot_test_sentiment_v1.p0"], capsys)
  assert code == 2 and "is unusable" in err


_WRITER = textwrap.dedent("""
    import pathlib, sys, time
    import numpy as np
    from spot_jax.spot import library as prompt_library
    root, tag, go, n = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), int(sys.argv[4])
    fp = {"id": "abc", "config": "c", "checkpoint": "random:0"}
    while not go.exists():
      time.sleep(0.01)
    lib = prompt_library.Library(root)
    for i in range(n):
      p = np.full((3, 8), i, np.float32)
      lib.add(entry_id=f"{tag}{i}", task="t", run_id=tag, seed=0, fingerprint=fp, prompt=p,
              embedding=p, score=float(i), metric="accuracy")
""")


def test_two_processes_adding_at_once_lose_nothing(tmp_path):
  go, n = tmp_path / "go", 25
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path / "lib"), tag,
                             str(go), str(n)],
                            cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
           for tag in ("a", "b")]
  import time  # pylint: disable=g-import-not-at-top
  time.sleep(2.0)  # both are importing and waiting for the start signal
  go.write_text("go")
  for p in procs:
    assert p.wait(timeout=120) == 0, p.stderr.read()
  entries, problems = prompt_library.Library(tmp_path / "lib").load()
  assert problems == []
  assert (sorted(e.id for e in entries)
          == sorted([f"a{i}" for i in range(n)] + [f"b{i}" for i in range(n)]))
  assert not [p for p in (tmp_path / "lib").rglob("*.tmp")]


def test_command_line_bad_inputs_exit_2_with_one_line(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
  cases = [(["list", f"--library={tmp_path / 'none'}"], "does not exist"),
           (["frobnicate"], "invalid choice"),
           (["add", f"--library={tmp_path / 'l'}", "--prompt=/nonexistent.npy",
             "--embedding=/x.npy", "--task=spot_test_parity_v1", *MODEL], "does not exist"),
           (["add", f"--library={tmp_path / 'a_file'}", f"--prompt={tmp_path / 'p.npy'}",
             f"--embedding={tmp_path / 'p.npy'}", "--task=spot_test_parity_v1", *MODEL],
            "--library '" + str(tmp_path / "a_file") + "' is a file, not a directory"),
           (["list", f"--library={tmp_path / 'a_file'}"], "is a file, not a library directory")]
  (tmp_path / "a_file").write_text("not a library")
  np.save(tmp_path / "p.npy", np.zeros((2, 64), np.float32))
  for argv, fragment in cases:
    proc = subprocess.run([sys.executable, "-m", "spot_jax.library", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    # TensorFlow's native start-up logging may precede it; the program's own output is one line
    lines = [l for l in proc.stderr.splitlines() if l.startswith("spot_jax.library:")]
    assert (len(lines) == 1 and lines[0].startswith("spot_jax.library: error:")
            and fragment in lines[0]), proc.stderr
  assert not (tmp_path / "l").exists()  # a bad prompt path creates no library
