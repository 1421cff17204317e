"""What `pip install .` installs: the library, the task registries and the toy models' files;
never the benchmarks, which run from a checkout."""
import subprocess
import sys
import zipfile

import pytest
from tests.helpers import REPO


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory):
  out = tmp_path_factory.mktemp("wheel")
  proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                         "-q", str(REPO), "-w", str(out)], capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  (wheel,) = out.glob("spot_jax-*.whl")
  return zipfile.ZipFile(wheel).namelist()


def test_benchmarks_are_not_installed(wheel_names):
  tops = {name.split("/")[0] for name in wheel_names}
  assert "benchmarks" not in tops and "spot_jax/bench" not in {n[:14] for n in wheel_names}
  assert {"spot_jax", "tasks"} <= tops


def test_the_toy_model_and_gin_files_are_installed(wheel_names):
  names = set(wheel_names)
  assert "spot_jax/embedded/toy_t5/spm.model" in names
  assert "spot_jax/embedded/toy_t5/checkpoint/checkpoint" in names
  assert any(n.startswith("spot_jax/embedded/toy_t5/checkpoint/") and n.endswith("/.zarray")
             for n in names)
  for name in ("spm.model", "decoder_toy.gin", "README.md", "losses.json", "eval.json",
               "checkpoint/config.json", "checkpoint/model.safetensors"):
    assert f"spot_jax/embedded/toy_decoder/{name}" in names, name
