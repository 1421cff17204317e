"""Serving DePT (prompt + per-row input offsets) and Residual SMoP (as its folded SMoP) in mixed
batches: each row decodes and scores like its own unfolded module alone, with one compilation;
run directories and exported files bring the offset and the folded prompts."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import cli, infer
from spot_jax.prompts import DePT, PromptTuning, ResidualSMoP, SMoP, initializers
from spot_jax.serve.model import mixed
from spot_jax.serve.catalog import prompt_loaders
from spot_jax.serve.catalog.table import PromptTable, ServedPrompt
from spot_jax.backbones.t5 import Transformer, config_by_name, generate
from spot_jax.backbones.t5.generation import search_settings
from spot_jax import fileio
from spot_jax.train import checkpointer
from tests.helpers.serve import mixed_setup, trained_looking_params

CONFIG = config_by_name("t5_1_1_test", dropout_rate=0.0)
DECODE = 6
WIDTH = 10


def _trained_looking(module, backbone, seed):
  return trained_looking_params(CONFIG, module, backbone, seed)


@pytest.fixture(scope="module")
def setup():
  init = initializers.uniform(2.0)
  modules = {
      "pt": PromptTuning(3, prompt_init=init),
      "dept_a": DePT(2, max_length=WIDTH, rank=3, prompt_init=init),
      "dept_b": DePT(4, max_length=16, rank=2, alpha=4.0, prompt_init=init),
      "rsmop": ResidualSMoP(num_prompts=3, length=2, bottleneck=8, shared_mlp=False,
                            prompt_init=init, router_init=jax.nn.initializers.normal(3.0)),
      "smop": SMoP(num_prompts=2, length=3, prompt_init=init,
                   router_init=jax.nn.initializers.normal(3.0)),
  }
  return mixed_setup(CONFIG, modules, _trained_looking, [10, 4, 7, 2, 10, 5, 8, 3, 6, 9], WIDTH)


def test_table_holds_folded_forms(setup):
  _, modules, params, table, _ = setup
  arrays = table.arrays
  assert arrays.offsets.shape == (5, 16, CONFIG.emb_dim)
  assert arrays.offset_lengths.tolist() == [0, WIDTH, 16, 0, 0]
  assert np.all(arrays.offsets[[0, 3, 4]] == 0) and np.all(arrays.offsets[1, WIDTH:] == 0)
  np.testing.assert_array_equal(arrays.offsets[2],
                                modules["dept_b"].fold(params["dept_b"])["offset"])
  rsmop = table.entries[3]
  assert rsmop.routing == "linear" and rsmop.num_prompts == 3
  np.testing.assert_array_equal(rsmop.prompts, modules["rsmop"].fold(params["rsmop"])["prompts"])
  assert np.abs(rsmop.prompts - params["rsmop"]["prompts"]).max() > 0.1  # folded, not raw
  # a table without DePT entries has no offsets to add
  assert PromptTable([table.entries[0]], CONFIG.emb_dim).arrays.offsets.shape[1] == 0


def test_mixed_batches_equal_each_row_alone_and_compile_once(setup):
  backbone, modules, params, table, tokens = setup
  dynamic, static = search_settings(Transformer(CONFIG), max_decode_length=DECODE)
  refs = {}
  before = mixed.generate_mixed._cache_size()  # pylint: disable=protected-access
  for mix in ([1, 2, 3, 0, 4, 1, 2, 3, 0, 1], [3, 3, 2, 2, 1, 1, 0, 4, 4, 3], [2] * 10):
    served, _ = mixed.generate_mixed(Transformer(CONFIG), backbone, table.arrays,
                                     jnp.asarray(mix, jnp.int32), jnp.asarray(tokens), *dynamic,
                                     placement="prefix", **static)
    for row, entry in enumerate(mix):
      name = table.names[entry]
      if (row, name) not in refs:
        ref, _ = generate(Transformer(CONFIG, prompt=modules[name]),
                          {**backbone, "prompt": params[name]}, jnp.asarray(tokens[row][None]),
                          max_decode_length=DECODE)
        refs[row, name] = np.asarray(ref[0])
      np.testing.assert_array_equal(np.asarray(served[row]), refs[row, name],
                                    err_msg=f"mix {mix} row {row} ({name})")
  assert mixed.generate_mixed._cache_size() - before == 1  # pylint: disable=protected-access


def test_mixed_scores_equal_the_unfolded_modules(setup):
  """Log-likelihoods of targets under the served (folded) forms equal the modules' own."""
  backbone, modules, params, table, tokens = setup
  rs = np.random.RandomState(3)
  targets = rs.randint(2, CONFIG.vocab_size, size=(10, 4)).astype(np.int32)
  mix = np.array([1, 2, 3, 1, 2, 3, 0, 4, 1, 2], np.int32)
  served = np.asarray(mixed.score_mixed(Transformer(CONFIG), backbone, table.arrays,
                                        jnp.asarray(mix), jnp.asarray(tokens), jnp.asarray(targets),
                                        placement="prefix"))
  decoder_input = np.concatenate([np.zeros((10, 1), np.int32), targets[:, :-1]], 1)
  for row, entry in enumerate(mix):
    name = table.names[entry]
    logits = Transformer(CONFIG, prompt=modules[name]).apply(
        {"params": {**backbone, "prompt": params[name]}}, tokens[row][None],
        decoder_input[row][None], enable_dropout=False)
    logp = np.asarray(jax.nn.log_softmax(logits[0]), np.float64)
    want = logp[np.arange(4), targets[row]].sum()
    assert abs(served[row] - want) <= 1e-4, (name, served[row], want)
  # the offsets matter: serving DePT's prompt without its offset scores differently
  bare = PromptTable([ServedPrompt("p", table.entries[1].prompts[0])], CONFIG.emb_dim)
  without = np.asarray(mixed.score_mixed(Transformer(CONFIG), backbone, bare.arrays,
                                         jnp.zeros((1,), jnp.int32), jnp.asarray(tokens[:1]),
                                         jnp.asarray(targets[:1]), placement="prefix"))
  assert abs(without[0] - served[0]) > 1e-2


def test_inputs_longer_than_an_offset_are_refused(setup):
  _, _, _, table, _ = setup
  table.check_input_length(["dept_a", "pt"], WIDTH)
  table.check_input_length(["pt", "rsmop"], 64)  # no offset, no limit
  with pytest.raises(ValueError, match="prompt 'dept_a' offsets the first 10 input positions "
                                       r"\(DePT\) but inputs have 11; give --input_length <= 10"):
    table.check_input_length(["pt", "dept_a"], WIDTH + 1)
  with pytest.raises(ValueError, match=r"input offset of shape \(4, 3\) does not fit"):
    ServedPrompt("x", np.ones((2, 8)), offset=np.ones((4, 3)))


def _export(run: checkpointer.Checkpointer, name: str, array) -> None:
  """prompts/<name>.npy of the run, as the trainer's job writes its exports."""
  fileio.save_npy(run.run_dir.prompts / f"{name}.npy", np.asarray(array, np.float32))


def test_run_directories_and_exports_bring_the_offset_and_folded_prompts(setup, tmp_path):
  backbone, modules, params, _, _ = setup
  # a DePT run: the trainer's exports (the offset beside the prompt)
  dept, p = modules["dept_b"], params["dept_b"]
  run = checkpointer.Checkpointer(str(tmp_path / "dept_run"))
  _export(run, "offset_step_5", dept.fold(p)["offset"])
  _export(run, "prompt_step_5", p["prompt"])
  run.close()
  want = prompt_loaders.from_module("d", dept, p)
  for path in (tmp_path / "dept_run", tmp_path / "dept_run" / "prompts" / "prompt_step_5.npy"):
    got = prompt_loaders.load("d", str(path))
    np.testing.assert_array_equal(got.prompts, want.prompts)
    np.testing.assert_array_equal(got.offset, want.offset)
    assert got.source.endswith("prompt_step_5.npy + offset_step_5.npy")
  # a Residual SMoP run: the state holds the raw prompts and the MLP, the export the folded ones
  rsmop, p = modules["rsmop"], params["rsmop"]
  run = checkpointer.Checkpointer(str(tmp_path / "rsmop_run"))
  run.save_best(7, {"params": {"prompt": p}, "step": np.int32(7)}, "accuracy", 0.5)
  _export(run, "prompt_best", rsmop.export_prompt(p))
  run.close()
  got = prompt_loaders.load("r", str(tmp_path / "rsmop_run"))
  want = prompt_loaders.from_module("r", rsmop, p)
  np.testing.assert_array_equal(got.prompts, want.prompts)
  np.testing.assert_array_equal(got.router, want.router)
  assert got.routing == want.routing == "linear"


def test_infer_refuses_plain_exports_of_dept_and_long_inputs(setup, tmp_path, capsys):
  _, modules, params, _, _ = setup
  run = checkpointer.Checkpointer(str(tmp_path / "run"))
  _export(run, "offset_best", modules["dept_a"].fold(params["dept_a"])["offset"])
  _export(run, "prompt_best", params["dept_a"]["prompt"])
  run.close()
  (tmp_path / "in.txt").write_text("12 13 14\n")
  common = ["--model=t5_1_1_test", f"--prompt=d={tmp_path / 'run'}"]
  for extra, message in (
      ([f"--export_npy={tmp_path / 'x.npy'}"], "prompt 'd' is a DePT prompt with an offset"),
      ([f"--input={tmp_path / 'in.txt'}", f"--output={tmp_path / 'o.jsonl'}", "--input_length=11",
        "--vocab=byte"],
       "prompt 'd' offsets the first 10 input positions (DePT) but inputs have 11")):
    status = cli.run(infer.main, common + extra, infer.PROG)
    err = capsys.readouterr().err
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1, err
  assert not (tmp_path / "x.npy").exists() and not (tmp_path / "o.jsonl").exists()
