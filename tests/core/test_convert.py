"""`python -m spot_jax.convert`: Hugging Face directory -> T5X / orbax checkpoint.

The converted checkpoint, loaded by `load_checkpoint`, must reproduce the Hugging Face logits
within 1e-4; bad input must fail with one line on stderr and a non-zero exit status.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spot_jax import cli, convert  # noqa: E402
from spot_jax.backbones.t5 import T5Config, Transformer, load_checkpoint  # noqa: E402
from spot_jax.backbones.t5 import checkpoints  # noqa: E402
from tests.helpers import REPO as REPO_ROOT  # noqa: E402

CONFIG = T5Config(vocab_size=56, emb_dim=16, num_heads=4, head_dim=4, mlp_dim=32,
                  num_encoder_layers=2, num_decoder_layers=2, mlp_activations=("gelu", "linear"),
                  logits_via_embedding=False, relative_attention_num_buckets=8,
                  relative_attention_max_distance=16, dropout_rate=0.0)


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
  """A random tiny T5.1.1-style HF model (untied lm_head) saved with safetensors."""
  hf_config = transformers.T5Config(
      vocab_size=CONFIG.vocab_size, d_model=CONFIG.emb_dim, d_kv=CONFIG.head_dim,
      d_ff=CONFIG.mlp_dim, num_layers=2, num_heads=CONFIG.num_heads,
      relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
      feed_forward_proj="gated-gelu", tie_word_embeddings=False)
  torch.manual_seed(7)
  model = transformers.T5ForConditionalGeneration(hf_config).eval()
  model.lm_head.weight = torch.nn.Parameter(torch.randn(CONFIG.vocab_size, CONFIG.emb_dim) * 0.25)
  directory = tmp_path_factory.mktemp("hf") / "t5-tiny"
  model.save_pretrained(directory)
  return model, str(directory)


def run_cli(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  return subprocess.run([sys.executable, "-m", "spot_jax.convert", *args], env=env, cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=300)


def max_logit_diff(model, params) -> float:
  rng = np.random.RandomState(0)
  enc = rng.randint(2, CONFIG.vocab_size, size=(3, 10)); enc[1, 6:] = 0; enc[2, 2:] = 0
  tgt = rng.randint(2, CONFIG.vocab_size, size=(3, 5)); tgt[0, 3:] = 0
  dec_in = np.concatenate([np.zeros((3, 1), np.int64), tgt[:, :-1]], 1); dec_in[tgt == 0] = 0
  logits = Transformer(CONFIG).apply({"params": params}, jnp.asarray(enc), jnp.asarray(dec_in),
                                     jnp.asarray(tgt), enable_dropout=False)
  with torch.no_grad():
    ref = model(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0).long(),
                decoder_input_ids=torch.tensor(dec_in)).logits.numpy()
  return float(np.abs(np.asarray(logits) - ref)[tgt > 0].max())


def test_cli_t5x_reproduces_hf_logits(hf_model, tmp_path):
  model, hf_dir = hf_model
  out = str(tmp_path / "checkpoint_0")
  run = run_cli(f"--hf_dir={hf_dir}", f"--output_dir={out}")
  assert run.returncode == 0, run.stderr
  tensors = len(checkpoints.abstract_params(CONFIG)[0])
  assert run.stdout.count("\n") == 1
  assert run.stdout.startswith(f"wrote t5x checkpoint with {tensors} tensors")
  assert run.stdout.strip().endswith(f"to {out}")
  assert checkpoints.detect_format(out) == ("t5x", os.path.join(out, "checkpoint"))
  diff = max_logit_diff(model, load_checkpoint(out, CONFIG))
  assert diff < 1e-4, diff


def test_orbax_output_holds_the_same_parameters(hf_model, tmp_path, capsys):
  model, hf_dir = hf_model
  out = str(tmp_path / "orbax")
  assert convert.main([f"--hf_dir={hf_dir}", f"--output_dir={out}", "--format=orbax"]) == 0
  assert "wrote orbax checkpoint" in capsys.readouterr().out
  params = load_checkpoint(out, CONFIG)
  direct = load_checkpoint(hf_dir, CONFIG)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               params, direct)
  assert max_logit_diff(model, params) < 1e-4


def test_config_name_must_match(hf_model, tmp_path, capsys):
  _, hf_dir = hf_model
  out = str(tmp_path / "named")
  assert cli.run(convert.main, [f"--hf_dir={hf_dir}", f"--output_dir={out}", "--model=t5_1_1_tiny"],
                 "spot_jax.convert") == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("spot_jax.convert: error: ")
  assert "d_model=16 but T5Config.emb_dim=4" in err
  assert not os.path.exists(out)


@pytest.mark.parametrize("case", ["missing_dir", "not_hf", "exists", "bad_format", "no_flags"])
def test_bad_input_is_one_line_and_nonzero(hf_model, tmp_path, case):
  _, hf_dir = hf_model
  out = str(tmp_path / "out")
  args = {
      "missing_dir": [f"--hf_dir={tmp_path / 'absent'}", f"--output_dir={out}"],
      "not_hf": [f"--hf_dir={tmp_path}", f"--output_dir={out}"],
      "exists": [f"--hf_dir={hf_dir}", f"--output_dir={tmp_path}"],
      "bad_format": [f"--hf_dir={hf_dir}", f"--output_dir={out}", "--format=npz"],
      "no_flags": [],
  }[case]
  needle = {"missing_dir": "absent' does not exist", "not_hf": "config.json not found",
            "exists": "exists; pass --overwrite", "bad_format": "invalid choice",
            "no_flags": "--hf_dir"}[case]
  if case == "missing_dir":
    run = run_cli(*args)  # once through the real command line
    code, err = run.returncode, run.stderr
  else:
    code, err = _main_in_process(args)
  assert code == 2
  assert err.strip().count("\n") == 0 and err.startswith("spot_jax.convert: error: "), err
  assert needle in err
  assert not os.path.exists(out)


def _main_in_process(args):
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    code = cli.run(convert.main, args, "spot_jax.convert")
  return code, err.getvalue()
