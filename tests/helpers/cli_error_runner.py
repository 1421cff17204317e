"""Runs command-line cases in one Python process, each exactly as `python -m <module> <args>` would.

  python tests/helpers/cli_error_runner.py cases.json results.json

or, from a test, `run_cases(cases, env, timeout)`: that process, started, and its results.

cases.json: [{"module": "spot_jax.train", "args": [...], "model_dir": "/path" | null}, ...]. For
each case the module runs as __main__ (runpy), with file descriptors 1 and 2 redirected, so the
results hold everything written to stdout/stderr (Python and C++ alike), the exit status, and a
hash of the files under `model_dir` afterwards. Between cases gin is cleared and Python's
exception hooks are reset, so each case must keep its own teardown quiet.
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import pathlib
import runpy
import subprocess
import sys
import tempfile
import threading
import warnings

# runpy warns when a module it runs as __main__ was imported by an earlier case (an artefact of
# running many cases in one process; `python -m` never sees it).
warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package",
                        category=RuntimeWarning)


def tree_hash(path) -> str:
  """sha256 over the relative names and bytes of every file and the names of every folder under
  `path` ("" if absent): a refusal that leaves an empty folder behind changes it."""
  root = pathlib.Path(path)
  if not root.exists():
    return ""
  digest = hashlib.sha256()
  for f in sorted(root.rglob("*")):
    data = f.read_bytes() if f.is_file() else b"/"
    digest.update(str(f.relative_to(root)).encode() + b"\0" + data + b"\0")
  return digest.hexdigest()


def run_case(module: str, args: list[str]) -> tuple[int, str, str]:
  """(exit status, stdout, stderr) of `python -m module *args`, run in this process."""
  import gin  # pylint: disable=g-import-not-at-top
  gin.clear_config(clear_constants=True)
  sys.unraisablehook, threading.excepthook = sys.__unraisablehook__, threading.__excepthook__
  saved = {fd: os.dup(fd) for fd in (1, 2)}
  files = {fd: tempfile.TemporaryFile() for fd in (1, 2)}
  sys.argv = [module, *args]
  try:
    for fd in (1, 2):
      sys.stdout.flush(), sys.stderr.flush()
      os.dup2(files[fd].fileno(), fd)
    try:
      runpy.run_module(module, run_name="__main__", alter_sys=True)
      code = 0
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    gc.collect()  # what the case left for the collector reports here, into the case's output
    # What outlives the case leaves the collector's reach: a later case's collections (this one,
    # spot_jax.cli's on an error) scan what that case made, not a heap grown by every case.
    gc.freeze()
  finally:
    sys.stdout.flush(), sys.stderr.flush()
    for fd in (1, 2):
      os.dup2(saved[fd], fd)
      os.close(saved[fd])
  out = []
  for fd in (1, 2):
    files[fd].seek(0)
    out.append(files[fd].read().decode(errors="replace"))
  return code, out[0], out[1]


def run_cases(cases: list[dict], env: dict, timeout: float) -> list[dict]:
  """Runs `cases` (as cases.json holds them) in one fresh process of this runner, from the
  repository's folder with environment `env`. -> one {"code", "stdout", "stderr", "hash"} per
  case, in order."""
  with tempfile.TemporaryDirectory() as tmp:
    cases_file, results_file = os.path.join(tmp, "cases.json"), os.path.join(tmp, "results.json")
    pathlib.Path(cases_file).write_text(json.dumps(cases))
    proc = subprocess.run([sys.executable, __file__, cases_file, results_file],
                          cwd=pathlib.Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(pathlib.Path(results_file).read_text())


def main(cases_file: str, results_file: str) -> None:
  from spot_jax import quiet_logs  # pylint: disable=g-import-not-at-top
  quiet_logs.quiet()  # as `python -m spot_jax.<prog>` does before anything loads TensorFlow
  from spot_jax import runtime  # pylint: disable=g-import-not-at-top

  def exit_now(status: int) -> None:  # infer's os._exit would end this runner with its case
    sys.stdout.flush(), sys.stderr.flush()
    raise SystemExit(status)

  runtime.exit_now = exit_now
  cases = json.loads(pathlib.Path(cases_file).read_text())
  results = []
  for case in cases:
    code, stdout, stderr = run_case(case["module"], case["args"])
    results.append({"code": code, "stdout": stdout, "stderr": stderr,
                    "hash": tree_hash(case["model_dir"]) if case.get("model_dir") else ""})
  pathlib.Path(results_file).write_text(json.dumps(results))


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
