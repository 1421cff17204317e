"""Every folder a program writes into the working directory by default is ignored by git, so a
run from the checkout leaves `git status` clean."""
from __future__ import annotations

import re
import subprocess

import pytest
from tests.helpers import REPO

# An output-folder flag with a relative default: flags.add_output_dir(..., default="x") or
# add_argument("--output_dir"/"--*_dir", default="x").
DEFAULT_DIR = re.compile(r"""(?:add_output_dir\(|add_argument\(\s*["']--\w*dir["'])"""
                         r"""(?:[^()]|\([^()]*\))*?"""
                         r"""\bdefault=["']([^"'/][^"']*)["']""", re.S)


def _default_output_dirs() -> dict[str, str]:
  found = {}
  for root in ("spot_jax", "tasks", "benchmarks"):
    for path in sorted((REPO / root).rglob("*.py")):
      for match in DEFAULT_DIR.finditer(path.read_text()):
        found[match[1]] = str(path.relative_to(REPO))
  return found


def test_the_demo_default_is_found():
  assert _default_output_dirs().get("spot_demo") == "spot_jax/demo/__main__.py"


@pytest.mark.parametrize("folder", sorted(_default_output_dirs()))
def test_default_output_folders_are_ignored(folder):
  if not (REPO / ".git").exists():
    pytest.skip("not a git checkout")
  proc = subprocess.run(["git", "check-ignore", "-q", f"{folder}/results.json"], cwd=REPO)
  assert proc.returncode == 0, f"{folder}/ ({_default_output_dirs()[folder]}) is not in .gitignore"
