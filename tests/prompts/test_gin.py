"""Every gin/prompts/ file parses, provides exactly one PROMPT and builds a working module."""
from __future__ import annotations

import re

import gin
import jax
import numpy as np
import pytest

from spot_jax import prompts
from tests.helpers import prompt_train as util
from spot_jax.backbones.t5 import Transformer
from tests.helpers import REPO

PROMPTS_DIR = REPO / "gin" / "prompts"

EXPECTED_FILES = (
    "prompt_tuning_uniform", "prompt_tuning_sampled_vocab", "prompt_tuning_class_labels",
    "prompt_tuning_text", "prompt_tuning_file", "spot_transfer", "smop", "smop_top2",
    "smop_gumbel", "smop_stochastic", "smop_single", "smop_no_perturbation", "residual",
    "residual_per_token", "prefix_tuning", "prefix_tuning_peft", "ptuning_v2", "dept",
    "residual_smop", "attempt", "attempt_multitask", "mpt_distill", "mpt_target",
    "mpt_target_factors", "ulpt", "ulpt_transfer")

# Files whose every initialiser works on the 128-token test backbone, with the bindings of
# their required macros and the attributes the built module must have.
BACKBONE_FILES = {
    "prompt_tuning_uniform": (["PROMPT_LENGTH = 7"], prompts.PromptTuning, {"length": 7}),
    "prompt_tuning_sampled_vocab": (["PROMPT_LENGTH = 150"], prompts.PromptTuning,
                                    {"length": 150}),
    "smop": ([], prompts.SMoP, {"routing": "linear", "num_prompts": 4, "length": 5,
                                "perturbation_std": 1.0}),
    "smop_no_perturbation": ([], prompts.SMoP, {"routing": "linear", "perturbation_std": 0.0}),
    "smop_top2": ([], prompts.SMoP, {"routing": "top2"}),
    "smop_gumbel": ([], prompts.SMoP, {"routing": "gumbel", "gumbel_temperature": 1.0}),
    "smop_stochastic": ([], prompts.SMoP, {"routing": "stochastic"}),
    "smop_single": ([], prompts.SMoP, {"routing": "single", "num_prompts": 1}),
    "residual": (["PROMPT_LENGTH = 10", "BOTTLENECK = 16"], prompts.ResidualPrompt,
                 {"shared_mlp": True, "skip": True, "length": 10}),
    "residual_per_token": (["PROMPT_LENGTH = 10", "BOTTLENECK = 16"], prompts.ResidualPrompt,
                           {"shared_mlp": False}),
    "dept": (["MAX_INPUT_LENGTH = 32", "LEARNING_RATE = 0.3"], prompts.DePT,
             {"length": 40, "rank": 45, "max_length": 32}),
    "residual_smop": (["BOTTLENECK = 16"], prompts.ResidualSMoP,
                      {"num_prompts": 4, "length": 5, "shared_mlp": True}),
    "prefix_tuning": (["PROMPT_LENGTH = 4"], prompts.PrefixTuning,
                      {"length": 4, "attention": ("encoder", "decoder", "cross"),
                       "layout": "separate", "projection": False}),
    "prefix_tuning_peft": (["PROMPT_LENGTH = 4"], prompts.PrefixTuning,
                           {"attention": ("decoder",), "layout": "peft", "projection": True}),
    "ptuning_v2": (["PROMPT_LENGTH = 4", "DEEP_STACKS = ('encoder', 'decoder')"],
                   prompts.PTuningV2, {"length": 4, "stacks": ("encoder", "decoder")}),
    "ulpt": (["PROMPT_LENGTH = 10", "ULPT_RANK = 2"], prompts.ULPT,
             {"length": 10, "rank": 2, "projection_seed": 0}),
}

REQUIRED_MACROS = {
    "prompt_tuning_uniform": ["PROMPT_LENGTH"],
    "prompt_tuning_sampled_vocab": ["PROMPT_LENGTH"],
    "prompt_tuning_class_labels": ["PROMPT_LENGTH", "CLASS_LABELS"],
    "prompt_tuning_text": ["PROMPT_LENGTH", "PROMPT_TEXT"],
    "prompt_tuning_file": ["PROMPT_LENGTH", "INIT_PROMPT_FILE"],
    "spot_transfer": ["PROMPT_LENGTH", "SOURCE_MODEL_DIR"],
    "residual": ["PROMPT_LENGTH"],
    "residual_per_token": ["PROMPT_LENGTH"],
    "prefix_tuning": ["PROMPT_LENGTH"],
    "prefix_tuning_peft": ["PROMPT_LENGTH"],
    "ptuning_v2": ["PROMPT_LENGTH"],
    "attempt": ["SOURCE_PROMPTS"],
    "attempt_multitask": ["SOURCE_PROMPTS", "TASK_NAMES"],
    "mpt_distill": ["TASK_NAMES", "TEACHER_LIBRARY", "PROMPT_LENGTH"],
    "mpt_target": ["MPT_SOURCE", "PROMPT_LENGTH"],
    "mpt_target_factors": ["MPT_SOURCE", "PROMPT_LENGTH"],
    "ulpt": ["PROMPT_LENGTH"],
    "ulpt_transfer": ["SOURCE_MODEL_DIR", "PROMPT_LENGTH", "ULPT_RANK"],
}


@gin.configurable("spot_prompt_probe")
def _probe(prompt=gin.REQUIRED):
  return prompt


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _build(name: str, bindings: list[str]):
  gin.parse_config_files_and_bindings([str(PROMPTS_DIR / f"{name}.gin")],
                                      bindings + ["spot_prompt_probe.prompt = %PROMPT"])
  return _probe()


def test_every_prompt_file_exists_with_one_prompt_and_a_command_line():
  found = sorted(p.stem for p in PROMPTS_DIR.glob("*.gin"))
  assert sorted(EXPECTED_FILES) == found
  for name in EXPECTED_FILES:
    text = (PROMPTS_DIR / f"{name}.gin").read_text()
    assert len(re.findall(r"^PROMPT = @prompts\.\w+\(\)$", text, re.M)) == 1, name
    assert "from __gin__ import dynamic_registration" in text, name
    assert "python -m spot_jax.train" in text and f"--gin_file=gin/prompts/{name}.gin" in text
    header = text.split("from __gin__")[0]
    for macro in REQUIRED_MACROS.get(name, []):
      assert f"{macro} = %gin.REQUIRED" in text and macro in header, (name, macro)


@pytest.mark.parametrize("name", sorted(REQUIRED_MACROS))
def test_missing_required_macro_is_named(name):
  with pytest.raises(ValueError, match=REQUIRED_MACROS[name][-1]):
    gin.parse_config_files_and_bindings(
        [str(PROMPTS_DIR / f"{name}.gin")], [f"{m} = 1" for m in REQUIRED_MACROS[name][:-1]])


@pytest.mark.parametrize("name", sorted(BACKBONE_FILES))
def test_file_builds_a_module_that_creates_its_params(name):
  bindings, cls, attrs = BACKBONE_FILES[name]
  module = _build(name, bindings)
  assert type(module) is cls
  for attr, value in attrs.items():
    assert getattr(module, attr) == value, (name, attr)
  model = Transformer(util.TEST_CONFIG, prompt=module)
  deep_method = isinstance(module, prompts.DEEP_PROMPT_METHODS)
  params = util.create_prompt_params(model, util.frozen_backbone(), full_model=deep_method)
  exported = prompts.effective_prompt(module, params, util.TEST_CONFIG)
  if deep_method:  # a record of per-layer prefixes or tokens (prompts/deep.py)
    parts = prompts.deep.from_record(exported)
    assert all(v.shape[0] == 2 and module.length in v.shape for v in parts.values()), parts.keys()
  elif issubclass(cls, prompts.SMoP):
    assert exported.shape == (module.num_prompts, module.length, util.TEST_CONFIG.emb_dim)
  else:
    assert exported.shape == (module.length, util.TEST_CONFIG.emb_dim)


def test_file_and_transfer_files_load_their_sources(tmp_path):
  source = np.random.RandomState(0).randn(6, util.TEST_CONFIG.emb_dim).astype(np.float32)
  np.save(tmp_path / "p.npy", source)
  (tmp_path / "run" / "prompts").mkdir(parents=True)
  np.save(tmp_path / "run" / "prompts" / "prompt_step_40.npy", source * 2)
  cases = {
      "prompt_tuning_file": ([f"INIT_PROMPT_FILE = '{tmp_path / 'p.npy'}'"], source),
      "spot_transfer": ([f"SOURCE_MODEL_DIR = '{tmp_path / 'run'}'"], source * 2),
  }
  for name, (bindings, expected) in cases.items():
    gin.clear_config()
    module = _build(name, bindings + ["PROMPT_LENGTH = 6"])
    model = Transformer(util.TEST_CONFIG, prompt=module)
    params = util.create_prompt_params(model, util.frozen_backbone())
    np.testing.assert_array_equal(np.asarray(params["prompt"]), expected)


def test_vocabulary_files_use_the_real_t5_vocab(t5_fixtures, t5_vocab_path):
  seqio = pytest.importorskip("seqio")
  table_path = t5_fixtures / "tiny_embeddings_32128x4.npy"
  if not table_path.exists():
    pytest.skip(f"{table_path} not found")
  table = np.load(table_path).astype(np.float32)
  vocab = seqio.SentencePieceVocabulary(t5_vocab_path)
  rng = jax.random.PRNGKey(0)

  module = _build("prompt_tuning_class_labels", [
      "PROMPT_LENGTH = 4", "CLASS_LABELS = ['entailment', 'not_entailment']",
      f"VOCABULARY_FILE = '{t5_vocab_path}'"])
  value = np.asarray(module.prompt_init(rng, (4, 4), table))
  np.testing.assert_allclose(value[0], table[vocab.encode("entailment")].mean(0), atol=1e-7)

  gin.clear_config()
  text = "Does the first sentence imply the second?"
  n = len(vocab.encode(text))
  module = _build("prompt_tuning_text", [
      f"PROMPT_LENGTH = {n}", f"PROMPT_TEXT = '{text}'", f"VOCABULARY_FILE = '{t5_vocab_path}'"])
  np.testing.assert_array_equal(np.asarray(module.prompt_init(rng, (n, 4), table)),
                                table[vocab.encode(text)])
  # test_prompts_initializers tokenizes with sentencepiece directly: the same ids as seqio's.
  sentencepiece = pytest.importorskip("sentencepiece")
  processor = sentencepiece.SentencePieceProcessor(model_file=t5_vocab_path)
  for s in (text, "entailment", "not_entailment"):
    assert processor.encode(s) == list(vocab.encode(s))


def test_prompt_file_replaces_the_model_files_default_prompt():
  models_file = REPO / "gin" / "models" / "t5_1_1_test.gin"
  if not models_file.exists():
    pytest.skip(f"{models_file} not written yet")
  text = models_file.read_text()
  if "PROMPT = None" not in text:
    pytest.skip("the models gin file no longer declares a default PROMPT")
  gin.parse_config_files_and_bindings(
      [str(models_file), str(PROMPTS_DIR / "smop_top2.gin")],
      ["spot_prompt_probe.prompt = %PROMPT"])
  assert isinstance(_probe(), prompts.SMoP) and _probe().routing == "top2"


def test_attempt_and_mpt_files_load_their_sources(tmp_path):
  """ATTEMPT's sources and MPT's teachers come from a library; an MPT target from a source."""
  from spot_jax.serve.export import peft_mpt  # pylint: disable=g-import-not-at-top
  from spot_jax.spot import distill, library as prompt_library  # pylint: disable=g-import-not-at-top
  e = util.TEST_CONFIG.emb_dim
  lib = prompt_library.Library(tmp_path / "lib")
  rs = np.random.RandomState(0)
  entries = {"a.p0": "task_a", "b.p0": "task_b", "b.p1": "task_b"}
  for i, (entry_id, task) in enumerate(entries.items()):
    prompt = rs.normal(0, 1, (4, e)).astype(np.float32)
    lib.add(entry_id=entry_id, task=task, run_id=entry_id, seed=0, fingerprint={"id": "m"},
            prompt=prompt, embedding=prompt, score=float(i), metric="accuracy")
  refs = f"SOURCE_PROMPTS = ['{tmp_path / 'lib'}#b.p1', '{tmp_path / 'lib'}#a.p0']"
  module = _build("attempt", [refs])
  assert type(module) is prompts.Attempt and module.num_targets == 1 and module.length == 4
  np.testing.assert_array_equal(module.source_prompts.value,
                                [lib.get("b.p1").prompt, lib.get("a.p0").prompt])
  gin.clear_config()
  module = _build("attempt_multitask", [refs, "TASK_NAMES = ['task_a', 'task_b', 'task_c']"])
  assert module.num_targets == 3
  assert str(gin.query_parameter("train/data.DatasetConfig.task_names")) == "%TASK_NAMES"
  assert gin.query_parameter("%TASK_NAMES") == ["task_a", "task_b", "task_c"]
  gin.clear_config()
  gin.parse_config_files_and_bindings(
      [str(REPO / "gin" / "models" / "t5_1_1_test.gin"), str(PROMPTS_DIR / "mpt_distill.gin")],
      ["TASK_NAMES = ['task_b', 'task_a']", f"TEACHER_LIBRARY = '{tmp_path / 'lib'}'",
       "PROMPT_LENGTH = 4"])
  model = gin.query_parameter("%MODEL").scoped_configurable_fn()
  assert isinstance(model, distill.PromptDistillationModel)
  assert model.module.prompt.num_tasks == 2 and model.distill_weight == 0.9
  # Teachers in TASK_NAMES order, each task's best-scoring entry (b.p1 beats b.p0).
  np.testing.assert_array_equal(model.teacher_prompts.value,
                                [lib.get("b.p1").prompt, lib.get("a.p0").prompt])
  arrays = {"shared": rs.normal(0, 1, (4, e)), "task_cols": rs.normal(0, 1, (2, 4, 1)),
            "task_rows": rs.normal(0, 1, (2, 1, e))}
  peft_mpt.export_adapter(arrays, util.TEST_CONFIG, str(tmp_path / "mpt"))
  for name in ("mpt_target", "mpt_target_factors"):
    gin.clear_config()
    module = _build(name, [f"MPT_SOURCE = '{tmp_path / 'mpt'}'", "PROMPT_LENGTH = 4"])
    params = util.create_prompt_params(Transformer(util.TEST_CONFIG, prompt=module),
                                       util.frozen_backbone())
    np.testing.assert_allclose(np.asarray(params["task_cols"]),
                               arrays["task_cols"].mean(0, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(params["task_rows"]),
                               arrays["task_rows"].mean(0, keepdims=True), rtol=1e-6)
    if name == "mpt_target":
      np.testing.assert_allclose(np.asarray(params["shared"]), arrays["shared"], rtol=1e-6)
    else:  # P* is a constant: only the factors train
      assert "shared" not in params
      np.testing.assert_allclose(module.frozen_shared.value, arrays["shared"], rtol=1e-6)
