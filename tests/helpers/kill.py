"""SIGKILL of a training subprocess at a chosen moment, for the exact-resume tests."""
from __future__ import annotations

import pathlib
import signal
import subprocess
import time
from typing import Callable


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float = 300,
              poll: float = 0.02) -> None:
  """Waits until `ready()` while `proc` still runs, then SIGKILLs and reaps it."""
  deadline = time.time() + timeout
  while not ready():
    assert proc.poll() is None, "training ended before it could be killed"
    assert time.time() < deadline, "no checkpoint appeared"
    time.sleep(poll)
  proc.send_signal(signal.SIGKILL)
  proc.wait(timeout=60)


def kill_at_checkpoint(proc: subprocess.Popen, run_dir: pathlib.Path, step: int, final_step: int,
                       timeout: float = 300) -> None:
  """SIGKILLs `proc` once `run_dir` holds checkpoints/<step>; checks it had not reached the end
  (no prompts/prompt_step_<final_step>.npy), or the test would not test resuming."""
  kill_when(proc, lambda: (run_dir / "checkpoints" / str(step)).is_dir(), timeout)
  assert not (run_dir / "prompts" / f"prompt_step_{final_step}.npy").exists(), \
      "killed too late to test resuming"
