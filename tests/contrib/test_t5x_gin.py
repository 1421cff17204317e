"""gin/t5x/: generated model files are current, every file parses (syntax always; fully with t5x),
and nothing outside spot_jax/contrib/t5x imports t5x."""
from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

import gin
import pytest
from gin import config_parser
from tests.helpers import REPO

T5X_GIN = sorted((REPO / "gin" / "t5x").rglob("*.gin"))
MODEL_FILES = sorted(p for p in (REPO / "gin" / "t5x" / "models").glob("*.gin")
                     if p.name != "common.gin")
HAS_T5X = importlib.util.find_spec("t5x") is not None
needs_t5x = pytest.mark.skipif(not HAS_T5X, reason="t5x is not importable (install it from its "
                                                   "repository: docs/t5x.md)")

sys.path.insert(0, str(REPO / "gin" / "t5x"))
import generate_models  # pylint: disable=g-import-not-at-top,wrong-import-position


class _SyntaxOnly(config_parser.ParserDelegate):
  """Accepts any reference or macro: parses gin syntax without importing what files name."""

  def configurable_reference(self, scoped_configurable_name, evaluate):
    return (scoped_configurable_name, evaluate)

  def macro(self, macro_name):
    return macro_name


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config(clear_constants=True)
  yield
  gin.clear_config(clear_constants=True)


def test_model_files_are_the_generator_output():
  expected = generate_models.expected_files()
  assert sorted(expected) == sorted(p.name for p in MODEL_FILES)
  assert len(expected) == 11 * len(generate_models.METHODS)  # T5.1.1 + LM-adapted small..xxl, tiny
  assert {"prompt_tuning", "smop", "residual", "prefix_tuning", "ptuning_v2", "dept",
          "residual_smop", "attempt", "mpt"} <= set(generate_models.METHODS)
  for path in MODEL_FILES:
    assert (path.read_text()
            == expected[path.name]), f"{path.name} is stale: run python gin/t5x/generate_models.py"


@pytest.mark.parametrize("path", T5X_GIN, ids=lambda p: str(p.relative_to(REPO)))
def test_syntax_and_header(path):
  text = path.read_text()
  statements = list(config_parser.ConfigParser(text, _SyntaxOnly()))
  assert statements
  header = [l for l in text.splitlines() if l.startswith("#")]
  assert any("python -m t5x.train" in l for l in header), f"{path} header shows no command"
  for include in re.findall(r"^include '([^']+)'", text, flags=re.M):
    if not include.startswith("t5x/"):
      assert (REPO / include).is_file(), f"{path.name} includes missing {include}"


def test_nothing_outside_contrib_t5x_imports_t5x():
  pattern = re.compile(r"^\s*(import t5x\b|from t5x\b)", re.M)
  offenders = []
  for path in sorted(list((REPO / "spot_jax").rglob("*.py"))
                     + list((REPO / "tasks").rglob("*.py"))):
    rel = path.relative_to(REPO)
    if rel.parts[:3] == ("spot_jax", "contrib", "t5x"):
      continue
    if pattern.search(path.read_text()):
      offenders.append(str(rel))
  assert offenders == []


@pytest.fixture(scope="module")
def method_sources(tmp_path_factory) -> dict[str, list[str]]:
  """The bindings ATTEMPT and MPT files need to build their prompt module: library sources and
  an MPT source adapter (read when the module is built; widths are checked only when it runs)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones import t5  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.export import peft_mpt  # pylint: disable=g-import-not-at-top
  from spot_jax.spot import library as prompt_library  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("sources")
  lib = prompt_library.Library(root / "lib")
  for i in range(2):
    prompt = np.full((100, 8), i, np.float32)
    lib.add(entry_id=f"s{i}", task="t", run_id="r", seed=0, fingerprint={"id": "x"},
            prompt=prompt, embedding=prompt, score=None, metric="accuracy")
  config = t5.config_by_name("t5_1_1_test")
  peft_mpt.export_adapter({"shared": np.ones((100, config.emb_dim)),
                           "task_cols": np.ones((2, 100, 1)),
                           "task_rows": np.ones((2, 1, config.emb_dim))}, config, str(root / "mpt"))
  return {"attempt": [f"SOURCE_PROMPTS=['{root / 'lib'}#s0', '{root / 'lib'}#s1']"],
          "mpt": [f"MPT_SOURCE='{root / 'mpt'}'"]}


@needs_t5x
@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.name)
def test_model_file_builds_its_model(path, method_sources):
  from spot_jax import prompts  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones import t5  # pylint: disable=g-import-not-at-top
  from spot_jax.contrib.t5x import models  # pylint: disable=g-import-not-at-top
  gin.add_config_file_search_path(str(REPO))
  bindings = next((b for m, b in method_sources.items() if path.stem.endswith("_" + m)), [])
  gin.parse_config_files_and_bindings([str(path)], bindings, finalize_config=False)
  model = gin.query_parameter("%MODEL").scoped_configurable_fn()
  assert isinstance(model, models.PromptEncoderDecoderModel)
  size, method = path.stem.split("_prompt_tuning")[0], None
  for m in generate_models.METHODS:
    if path.stem.endswith("_" + m):
      size, method = path.stem[:-len(m) - 1], m
  expected_prompt = {"prompt_tuning": prompts.PromptTuning, "smop": prompts.SMoP,
                     "residual": prompts.ResidualPrompt, "prefix_tuning": prompts.PrefixTuning,
                     "ptuning_v2": prompts.PTuningV2, "dept": prompts.DePT,
                     "residual_smop": prompts.ResidualSMoP, "attempt": prompts.Attempt,
                     "mpt": prompts.MultitaskPrompt}[method]
  assert isinstance(model.module.prompt, expected_prompt)
  dtype = "float32" if size.endswith("tiny") else "bfloat16"
  assert model.module.config == t5.config_by_name(size, dropout_rate=0.1, dtype=dtype)


@needs_t5x
def test_run_file_parses_with_a_model_file(monkeypatch):
  import t5x.train  # pylint: disable=g-import-not-at-top
  # t5x's run files bind `__main__.train` (t5x.train is __main__ under `python -m t5x.train`).
  monkeypatch.setattr(sys.modules["__main__"], "train", t5x.train.train, raising=False)
  gin.add_config_file_search_path(str(REPO))
  gin.add_config_file_search_path(str(pathlib.Path(t5x.__file__).parents[1]))
  gin.parse_config_files_and_bindings(
      ["gin/t5x/models/t5_1_1_lm100k_base_smop.gin", "gin/t5x/runs/prompt_tune.gin"],
      ["MODEL_DIR='/tmp/x'", "MIXTURE_OR_TASK_NAME='spot_glue_rte_v200'",
       "INITIAL_CHECKPOINT_PATH='/c'"],
      finalize_config=False)
  gin.finalize()
  from t5x import utils  # pylint: disable=g-import-not-at-top
  restore = gin.get_configurable(utils.RestoreCheckpointConfig)(path="/c")
  assert restore.fallback_to_scratch and len(restore.state_transformation_fns) == 1
  assert gin.query_parameter("train/utils.DatasetConfig.pack") is False
