"""Every shipped gin file parses, declares its command in its header, and builds what it names."""
from __future__ import annotations

import re

import gin
import pytest

from spot_jax.cli import gin_flags
from spot_jax.backbones import decoder, t5
from spot_jax.embedded import decoder_config
from tests.helpers import REPO

MODEL_FILES = sorted((REPO / "gin" / "models").glob("*.gin"))
RUN_FILES = sorted((REPO / "gin" / "runs").glob("*.gin"))
ALL_FILES = sorted(f for f in (REPO / "gin").rglob("*.gin")
                   if "t5x" not in f.relative_to(REPO).parts)  # gin/t5x: test_t5x_gin.py


def _parse(files, bindings=()):
  gin.clear_config(clear_constants=True)
  for path in gin_flags.search_paths([]):
    gin.add_config_file_search_path(path)
  gin.parse_config_files_and_bindings([str(f) for f in files], list(bindings),
                                      finalize_config=False)


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
  if path.stem == decoder_config.NAME:  # the embedded toy decoder's config lives beside it
    config = gin.get_configurable(decoder_config.toy_config)()
    assert config == decoder_config.toy_config()
  elif path.stem in decoder.CONFIGS:  # a decoder-only backbone's file
    config = gin.get_configurable(decoder.config_by_name)()
    assert config == decoder.config_by_name(path.stem)
  else:
    config = gin.get_configurable(t5.config_by_name)()
    assert config == t5.config_by_name(path.stem, dropout_rate=0.1)
  model = gin.query_parameter("%MODEL")
  assert model is not None
  assert gin.query_parameter("%PROMPT") is None


@pytest.mark.parametrize("path", RUN_FILES, ids=lambda p: p.name)
def test_run_files_parse_with_their_required_macros(path):
  required = {"MODEL_DIR": "'/tmp/x'", "MIXTURE_OR_TASK_NAME": "'spot_synthetic_sentiment_v100'"}
  bindings = [f"{k}={v}" for k, v in required.items()]
  _parse([REPO / "gin" / "models" / "t5_1_1_test.gin", path], bindings)
  gin.finalize()


def test_required_macro_is_enforced():
  _parse([REPO / "gin" / "models" / "t5_1_1_test.gin", REPO / "gin" / "runs" / "prompt_tune.gin"],
         ["MIXTURE_OR_TASK_NAME='x'"])
  with pytest.raises(ValueError, match="MODEL_DIR"):
    gin.finalize()


# --- every documented command line is accepted (no override it shows is unused) -------------------

DOCUMENTED = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *ALL_FILES]
GIN_PROGRAMS = ("spot_jax.train", "spot_jax.eval")


def documented_commands() -> list[tuple[str, str, list[str]]]:
  """(where, module, args) of every `python -m spot_jax.train|eval ...` in the docs
  and gin headers."""
  import shlex  # pylint: disable=g-import-not-at-top
  out = []
  for path in DOCUMENTED:
    lines = path.read_text().splitlines()
    if path.suffix == ".gin":
      lines = [l[1:] for l in lines if l.startswith("#")]
    i = 0
    while i < len(lines):
      start = lines[i].find("python -m spot_jax.")
      if start < 0:
        i += 1
        continue
      text, first = lines[i][start:], i
      while text.rstrip().endswith("\\") and i + 1 < len(lines):
        i += 1
        text = text.rstrip()[:-1] + " " + lines[i].strip()
      i += 1
      tokens = shlex.split(text.split("`")[0])
      if any(t.startswith("$") for t in tokens):  # shell variables: docs/tasks.md's worked example,
        continue                               # which tests/tasks/test_user_task.py runs as written
      if tokens[2] in GIN_PROGRAMS and len(tokens) > 3:  # not a mention in prose
        out.append((f"{path.relative_to(REPO)}:{first + 1}", tokens[2], tokens[3:]))
  return out


def test_documented_commands_are_found():
  where = {w.split(":")[0] for w, _, _ in documented_commands()}
  assert ({"README.md", "gin/runs/prompt_tune.gin", "gin/runs/eval.gin",
           "gin/test/smoke.gin"} <= where)


@pytest.mark.parametrize("where, module, args", documented_commands(),
                         ids=lambda v: v if isinstance(v, str) and ":" in v else "")
def test_documented_command_uses_every_override(where, module, args):
  """Parsing each documented command (files, overrides, unused-override check) raises nothing."""
  gin.clear_config(clear_constants=True)
  program = program_module(module)
  parsed = gin_flags.parse_args(args, module, "")
  gin_flags.parse_gin(parsed, program.GIN_ROOTS)


def program_module(name: str):
  """The module `python -m name` runs: `name` itself, or `name.__main__` for a package."""
  import importlib  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(name)
  return importlib.import_module(f"{name}.__main__") if hasattr(module, "__path__") else module


def documented_override_keys() -> list[str]:
  """Every `--gin.KEY=` written in prose in README.md and docs/ (e.g. `--gin.NUM_PARTITIONS=N`)."""
  keys = set()
  for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
    if path.name != T5X_DOC:
      keys |= set(re.findall(r"--gin\.([A-Za-z_][\w./]*)=", path.read_text()))
  return sorted(keys - {"KEY", "X"})  # placeholders of the flag table and the error list


# docs/t5x.md documents overrides of `python -m t5x.train` with gin/t5x/ files, not of spot-jax's
# own programs: each must be a macro those files define.
T5X_DOC = "t5x.md"


def test_t5x_documented_overrides_are_macros_of_gin_t5x():
  text = (REPO / "docs" / T5X_DOC).read_text()
  defined = set()
  for path in (REPO / "gin" / "t5x").rglob("*.gin"):
    text_ = path.read_text()
    # defined there, or referenced there (then t5x's included run files define it, e.g. MODEL_DIR)
    defined |= set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*=", text_, re.M))
    defined |= set(re.findall(r"%([A-Z][A-Z0-9_]*)", text_))
  spot_programs = {a[len("--gin."):].split("=", 1)[0] for where, _, args in documented_commands()
                   if where.startswith(f"docs/{T5X_DOC}:") for a in args if a.startswith("--gin.")}
  for key in set(re.findall(r"--gin\.([A-Z][A-Z0-9_]*)=", text)) - spot_programs:
    assert key in defined, (f"docs/t5x.md documents --gin.{key}=, which no gin/t5x file "
                            "defines or uses")


@pytest.fixture(scope="module")
def used_by_documented_commands():
  """For each documented command: a function telling whether an override key is used by it."""
  import importlib  # pylint: disable=g-import-not-at-top
  from spot_jax.cli import gin_overrides  # pylint: disable=g-import-not-at-top
  checks = []
  for where, module, args in documented_commands():
    gin.clear_config(clear_constants=True)
    roots = program_module(module).GIN_ROOTS
    gin_flags.parse_gin(gin_flags.parse_args(args, module, ""), roots)
    used = gin_overrides.used_keys(gin_overrides.resolve_roots(roots))
    keys = {}
    for key in documented_override_keys():
      try:
        keys[key] = gin_overrides.override_key(f"{key}=None") in used
      except ValueError:  # a configurable this command does not import
        keys[key] = False
    checks.append((where, keys))
  return checks


@pytest.mark.parametrize("key", documented_override_keys())
def test_documented_override_is_used_by_a_documented_command(key, used_by_documented_commands):
  users = [where for where, keys in used_by_documented_commands if keys[key]]
  assert users, f"--gin.{key}=... is documented, but no documented command would use it"


@pytest.mark.parametrize("override, message", [
    ("PROMPT_LENGTH=7", "nothing in this configuration uses the macro PROMPT_LENGTH; did you mean "
                        "PROMPT or prompts.PromptTuning.length?"),
    ("prompts.SMoP.num_prompts=3", "prompts.SMoP"),  # unknown, or (once imported) unused
    ("eval/data.DatasetConfig.batch_size=8", "uses data.DatasetConfig in scope 'eval'"),
])
def test_unused_or_unknown_override_is_refused_before_training(override, message):
  from spot_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  gin.clear_config(clear_constants=True)
  parsed = gin_flags.parse_args(["--gin_file=gin/test/smoke.gin", "--gin.MODEL_DIR='/tmp/x'",
                                 f"--gin.{override}"],
                                "spot_jax.train", "")
  with pytest.raises(ConfigError, match=re.escape(message)):
    gin_flags.parse_gin(parsed, ("spot_jax.train.train",))
  gin.clear_config(clear_constants=True)
  allowed = gin_flags.parse_args(["--gin_file=gin/test/smoke.gin", "--gin.MODEL_DIR='/tmp/x'",
                                  "--gin.PROMPT_LENGTH=7",
                                  "--allow_unused_gin_overrides"], "spot_jax.train", "")
  gin_flags.parse_gin(allowed, ("spot_jax.train.train",))  # the escape hatch


def test_used_overrides_follow_scopes_and_macros():
  """Overrides reached only through a scoped reference or a macro chain count as used."""
  gin.clear_config(clear_constants=True)
  parsed = gin_flags.parse_args(["--gin_file=gin/test/smoke.gin", "--gin.MODEL_DIR='/tmp/x'",
                                 "--gin.train/data.DatasetConfig.batch_size=8",
                                 "--gin.DROPOUT_RATE=0.2",
                                 "--gin.optimizers.adafactor.decay_rate=0.5",
                                 "--gin.prompts.sampled_vocab.num_most_frequent=100"],
                                "spot_jax.train", "")
  gin_flags.parse_gin(parsed, ("spot_jax.train.train",))
  assert gin.query_parameter("train/data.DatasetConfig.batch_size") == 8


def test_without_declared_roots_the_unreferenced_bound_configurables_are_the_roots():
  """Entry points that pass no roots still refuse an unused macro and accept used overrides."""
  from spot_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  gin.clear_config(clear_constants=True)
  parsed = gin_flags.parse_args([*SMOKE_ARGS, "--gin.PROMPT_LENGTH=7"], "spot_jax.x", "")
  with pytest.raises(ConfigError, match="uses the macro PROMPT_LENGTH"):
    gin_flags.parse_gin(parsed)
  gin.clear_config(clear_constants=True)
  gin_flags.parse_gin(gin_flags.parse_args([*SMOKE_ARGS, "--gin.TRAIN_STEPS=7",
                                            "--gin.DROPOUT_RATE=0.2"],
                                           "spot_jax.x", ""))


SMOKE_ARGS = ["--gin_file=gin/test/smoke.gin", "--gin.MODEL_DIR='/tmp/x'"]
