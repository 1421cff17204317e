"""Every shipped gin file parses, declares its command in its header, and builds what it names."""
from __future__ import annotations

import pathlib

import gin
import pytest

from spot_jax import gin_utils
from spot_jax import t5

REPO = pathlib.Path(__file__).resolve().parents[1]
MODEL_FILES = sorted((REPO / "gin" / "models").glob("*.gin"))
RUN_FILES = sorted((REPO / "gin" / "runs").glob("*.gin"))
ALL_FILES = sorted(f for f in (REPO / "gin").rglob("*.gin") if "t5x" not in f.relative_to(REPO).parts)  # gin/t5x: test_t5x_gin.py


def _parse(files, bindings=()):
  gin.clear_config(clear_constants=True)
  for path in gin_utils.search_paths([]):
    gin.add_config_file_search_path(path)
  gin.parse_config_files_and_bindings([str(f) for f in files], list(bindings), finalize_config=False)


@pytest.fixture(autouse=True)
def _clean_gin():
  yield
  gin.clear_config(clear_constants=True)


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_header_shows_a_full_command(path):
  header = [l for l in path.read_text().splitlines() if l.startswith("#")]
  assert header, f"{path} has no header comment"
  assert any("python -m spot_jax." in l for l in header), f"{path} header shows no command"


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.name)
def test_model_files_build_their_named_config(path):
  _parse([path])
  config = gin.get_configurable(t5.config_by_name)()
  assert config == t5.config_by_name(path.stem, dropout_rate=0.1)
  model = gin.query_parameter("%MODEL")
  assert model is not None
  assert gin.query_parameter("%PROMPT") is None


@pytest.mark.parametrize("path", RUN_FILES, ids=lambda p: p.name)
def test_run_files_parse_with_their_required_macros(path):
  required = {"MODEL_DIR": "'/tmp/x'", "MIXTURE_OR_TASK_NAME": "'spot_synthetic_sentiment_v100'",
              "CHECKPOINT_DIR": "'/tmp/x'"}
  bindings = [f"{k}={v}" for k, v in required.items()]
  _parse([REPO / "gin" / "models" / "t5_1_1_test.gin", path], bindings)
  gin.finalize()


def test_required_macro_is_enforced():
  _parse([REPO / "gin" / "models" / "t5_1_1_test.gin", REPO / "gin" / "runs" / "prompt_tune.gin"],
         ["MIXTURE_OR_TASK_NAME='x'"])
  with pytest.raises(ValueError, match="MODEL_DIR"):
    gin.finalize()
