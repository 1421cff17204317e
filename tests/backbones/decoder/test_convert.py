"""`python -m spot_jax.convert` on decoder-only models: Hugging Face -> Gemma orbax -> Hugging
Face reproduces every tensor; bad input is one line, exit 2, and nothing is written."""
from __future__ import annotations

import contextlib
import io
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spot_jax import cli, convert  # noqa: E402
from spot_jax.backbones.decoder import checkpoints  # noqa: E402
from tests.helpers import causal_models  # noqa: E402


def _run(args):
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    code = cli.run(convert.main, args, "spot_jax.convert")
  return code, err.getvalue()


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("gemma3_hf")
  causal_models.hf_model("gemma3").save_pretrained(path)
  return str(path)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("llama_hf")
  causal_models.hf_model("llama").save_pretrained(path)
  return str(path)


def test_hf_to_gemma_and_back_keeps_every_tensor(gemma_dir, tmp_path):
  orbax_dir, hf_dir = str(tmp_path / "orbax"), str(tmp_path / "hf")
  assert _run([f"--hf_dir={gemma_dir}", f"--output_dir={orbax_dir}"]) == (0, "")
  config, params = checkpoints.load_checkpoint(gemma_dir)
  restored = checkpoints.load_gemma_orbax(orbax_dir, config)
  flat = dict(_leaves(params))
  assert dict(_leaves(restored)).keys() == flat.keys()
  for name, value in _leaves(restored):
    np.testing.assert_array_equal(value, flat[name], err_msg=name)
  # back to HF (the command line's --checkpoint needs a registered config name; the tiny
  # test model has none, so the function behind it is called with the model's own config)
  from spot_jax.backbones.decoder import convert as decoder_convert
  decoder_convert.to_hf(orbax_dir, config, hf_dir)
  original = transformers.AutoModelForCausalLM.from_pretrained(gemma_dir).state_dict()
  again = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).state_dict()
  assert original.keys() == again.keys()
  for name, value in original.items():
    np.testing.assert_array_equal(again[name].numpy(), value.numpy(), err_msg=name)


def _leaves(tree, prefix=""):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _leaves(value, f"{prefix}{key}/")
    else:
      yield f"{prefix}{key}", np.asarray(value)


@pytest.mark.parametrize("case", ["t5_format", "llama_to_gemma", "checkpoint_of_other_model",
                                  "wrong_config"])
def test_bad_input_is_one_line_and_exit_2(gemma_dir, llama_dir, tmp_path, case):
  out = str(tmp_path / "out")
  args, needle = {
      "t5_format": ([f"--hf_dir={gemma_dir}", f"--output_dir={out}", "--format=t5x"],
                    "--format=t5x is a T5 format"),
      "llama_to_gemma": ([f"--hf_dir={llama_dir}", f"--output_dir={out}"],
                         "a Gemma orbax checkpoint cannot hold"),
      "checkpoint_of_other_model": ([f"--checkpoint={gemma_dir}", f"--output_dir={out}",
                                    "--model=decoder_tiny_gemma3"], "does not match"),
      "wrong_config": ([f"--hf_dir={gemma_dir}", f"--output_dir={out}",
                        "--model=decoder_tiny_llama"], "the checkpoint has"),
  }[case]
  code, err = _run(args)
  assert code == 2, err
  assert err.strip().count("\n") == 0 and err.startswith("spot_jax.convert: error: "), err
  assert needle in err, err
  assert not os.path.exists(out)
