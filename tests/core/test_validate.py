"""spot_jax.validate: each check's accepted and refused values, and its one-line message."""
import os
import re

import numpy as np
import pytest

from spot_jax import validate
from spot_jax.errors import ConfigError


def _refusal(check, *args, **kwargs) -> str:
  with pytest.raises(ConfigError) as info:
    check(*args, **kwargs)
  message = str(info.value)
  assert "\n" not in message
  return message


@pytest.mark.parametrize("value, minimum, want", [
    (1, 1, 1), (7, 1, 7), (np.int64(3), 1, 3), (0, 0, 0), (2, 2, 2)])
def test_positive_int_accepts_and_normalises(value, minimum, want):
  got = validate.positive_int(value, "--steps", minimum=minimum)
  assert got == want and type(got) is int


@pytest.mark.parametrize("value, minimum, message", [
    (0, 1, "--steps=0 must be a positive integer"),
    (-5, 1, "--steps=-5 must be a positive integer"),
    (2.0, 1, "--steps=2.0 must be a positive integer"),
    ("3", 1, "--steps='3' must be a positive integer"),
    (True, 1, "--steps=True must be a positive integer"),
    (None, 1, "--steps=None must be a positive integer"),
    (-1, 0, "--steps=-1 must be an integer >= 0"),
    (1, 2, "--steps=1 must be an integer >= 2")])
def test_positive_int_refuses(value, minimum, message):
  assert _refusal(validate.positive_int, value, "--steps", minimum=minimum) == message


def test_an_optional_setting_left_unset_passes():
  assert validate.positive_int(None, "--top_k", minimum=0, optional=True) is None
  assert validate.positive_int(4, "--top_k", minimum=0, optional=True) == 4
  assert _refusal(validate.positive_int, -1, "--top_k", minimum=0, optional=True) == (
      "--top_k=-1 must be an integer >= 0")


def test_note_and_example_make_the_message_specific():
  message = _refusal(validate.positive_int, 1, "seeds", minimum=2,
                     note="one seed carries no interval", example=5)
  assert message == "seeds=1 must be an integer >= 2 (one seed carries no interval), e.g. seeds=5"


@pytest.mark.parametrize("check, value", [
    (validate.positive, 0.5), (validate.positive, 3), (validate.positive, np.float32(1e-6)),
    (validate.non_negative, 0), (validate.non_negative, 2.5), (validate.non_negative, np.int32(4))])
def test_numbers_accept_and_normalise(check, value):
  got = check(value, "SMoP.gumbel_temperature")
  assert got == pytest.approx(float(value)) and type(got) is float


@pytest.mark.parametrize("check, value, valid", [
    (validate.positive, 0, "a number > 0"),
    (validate.positive, -0.3, "a number > 0"),
    (validate.positive, float("nan"), "a number > 0"),
    (validate.positive, float("inf"), "a number > 0"),
    (validate.positive, "0.3", "a number > 0"),
    (validate.positive, False, "a number > 0"),
    (validate.non_negative, -1.0, "a number >= 0"),
    (validate.non_negative, float("nan"), "a number >= 0"),
    (validate.non_negative, None, "a number >= 0")])
def test_numbers_refuse(check, value, valid):
  message = _refusal(check, value, "SMoP.gumbel_temperature")
  assert message == f"SMoP.gumbel_temperature={value!r} must be {valid}"


def test_infinity_passes_only_where_allowed():
  assert validate.positive(float("inf"), "learning_rate", finite=False) == float("inf")
  assert validate.non_negative(float("inf"), "--max_wait_ms", finite=False) == float("inf")
  for value in (float("nan"), 0.0, -float("inf")):
    assert _refusal(validate.positive, value, "learning_rate", finite=False) == (
        f"learning_rate={value!r} must be a number > 0")


def test_a_unit_names_what_a_number_counts():
  message = _refusal(validate.positive, -1.0, "margin", unit="points",
                     note="the difference the claim tolerates", example=3)
  assert message == ("margin=-1.0 must be a number of points > 0 (the difference the claim "
                     "tolerates), e.g. margin=3")
  assert _refusal(validate.non_negative, -2, "training SD", unit="points") == (
      "training SD=-2 must be a number of points >= 0")


@pytest.mark.parametrize("value, low_closed, high_closed", [
    (0.5, False, False), (1e-9, False, False), (0.0, True, False), (1.0, False, True),
    (0, True, True), (1, True, True)])
def test_fraction_accepts_inside_its_interval(value, low_closed, high_closed):
  got = validate.fraction(value, "level", low_closed=low_closed, high_closed=high_closed)
  assert got == float(value) and type(got) is float


@pytest.mark.parametrize("value, low_closed, high_closed, interval", [
    (0.0, False, False, "(0, 1)"), (1.0, False, False, "(0, 1)"), (1.5, False, False, "(0, 1)"),
    (1.0, True, False, "[0, 1)"), (-0.1, True, False, "[0, 1)"), (0.0, False, True, "(0, 1]"),
    (1.01, True, True, "[0, 1]"), (float("nan"), True, True, "[0, 1]"),
    ("0.5", False, False, "(0, 1)"), (True, True, True, "[0, 1]")])
def test_fraction_refuses_outside_its_interval(value, low_closed, high_closed, interval):
  message = _refusal(validate.fraction, value, "level", low_closed=low_closed,
                     high_closed=high_closed)
  assert message == f"level={value!r} must be in {interval}"


def test_fraction_example():
  assert _refusal(validate.fraction, 1.5, "level", example=0.95) == (
      "level=1.5 must be in (0, 1), e.g. level=0.95")


def test_one_of_accepts_a_valid_value():
  assert validate.one_of("smop", "--method", ("prompt_tuning", "smop")) == "smop"
  assert validate.one_of(2, "--bits", (1, 2, 4)) == 2


def test_one_of_suggests_the_close_names():
  message = _refusal(validate.one_of, "smpo", "--method", ("prompt_tuning", "smop", "dept"))
  assert message == ("--method='smpo' is unknown (did you mean 'smop'?); "
                     "valid: prompt_tuning, smop, dept")


def test_one_of_without_a_close_name_lists_the_valid_ones():
  message = _refusal(validate.one_of, "zzz", "SMoP.routing", ("stochastic", "top2"))
  assert message == "SMoP.routing='zzz' is unknown; valid: stochastic, top2"
  assert _refusal(validate.one_of, 3, "--bits", (1, 2, 4)) == "--bits=3 is unknown; valid: 1, 2, 4"


def test_close_names_ignore_case_and_keep_the_candidates_spelling():
  assert validate.close_names("train_steps", ["TRAIN_STEPS", "EVAL_PERIOD"]) == ["TRAIN_STEPS"]
  assert validate.close_names("zzz", ["TRAIN_STEPS"]) == []
  assert len(validate.close_names("ab", ["abc", "abd", "abe", "abf"], n=2)) == 2
  assert validate.close_names("smop_v", ["dept", "smop", "smop_v2"]) == ["smop_v2", "smop"]


def test_non_empty():
  assert validate.non_empty(["a", "b"], "--tasks", "task names") == ("a", "b")
  assert validate.non_empty(iter([3]), "--tasks", "task names") == (3,)
  for empty in ([], (), None):
    assert _refusal(validate.non_empty, empty, "--tasks", "one task name or more") == (
        "--tasks is empty; give one task name or more")


def test_existing_file(tmp_path):
  path = tmp_path / "inputs.tsv"
  path.write_text("x\n")
  assert validate.existing_file(str(path), "--input", "a .tsv file") == path
  missing = str(tmp_path / "absent.tsv")
  assert _refusal(validate.existing_file, missing, "--input", "a .tsv file") == (
      f"--input {missing!r} does not exist; give a .tsv file")
  assert _refusal(validate.existing_file, str(tmp_path), "--input", "a .tsv file") == (
      f"--input {str(tmp_path)!r} is a directory, not a file; give a .tsv file")


def test_existing_dir(tmp_path):
  assert validate.existing_dir(str(tmp_path), "MODEL_DIR", "a run directory") == tmp_path
  missing = str(tmp_path / "absent")
  assert _refusal(validate.existing_dir, missing, "MODEL_DIR", "a run directory") == (
      f"MODEL_DIR {missing!r} does not exist; give a run directory")
  file = tmp_path / "f"
  file.write_text("")
  assert _refusal(validate.existing_dir, str(file), "MODEL_DIR", "a run directory") == (
      f"MODEL_DIR {str(file)!r} is a file, not a directory; give a run directory")


def test_output_file_accepts_a_new_or_existing_file_and_leaves_it_alone(tmp_path):
  assert validate.output_file(tmp_path / "new.json", "--json") == tmp_path / "new.json"
  assert not (tmp_path / "new.json").exists()
  (tmp_path / "old.json").write_text("kept")
  validate.output_file(tmp_path / "old.json", "--json")
  assert (tmp_path / "old.json").read_text() == "kept"
  assert os.listdir(tmp_path) == ["old.json"]  # the probe file is gone


@pytest.mark.parametrize("make, why", [
    (lambda d: d / "missing" / "x.json",
     "missing' does not exist; give a file in an existing directory"),
    (lambda d: d, "is a directory; give a file path"),
    (lambda d: d / "plain.txt" / "x.json", "plain.txt' is not a directory"),
])
def test_output_file_refuses_what_cannot_be_written(tmp_path, make, why):
  (tmp_path / "plain.txt").write_text("x")
  path = make(tmp_path)
  message = _refusal(validate.output_file, path, "--markdown")
  assert message.startswith(f"--markdown {str(path)!r}") and why in message
  assert not (tmp_path / "missing").exists()


def test_output_file_refuses_a_folder_that_takes_no_files():
  if not os.path.isdir("/proc/self"):
    pytest.skip("needs /proc, a folder where nobody (root included) can create files")
  message = _refusal(validate.output_file, "/proc/self/x.json", "--json")
  assert re.match(r"--json '/proc/self/x.json': cannot write in '/proc/self' \(.*\); give a "
                  r"file in a directory you can write to$", message)
