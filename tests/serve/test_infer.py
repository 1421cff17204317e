"""`python -m spot_jax.infer` end to end on a tiny byte-vocabulary model: mixed prompts from a
.npy, a run directory (SMoP with its router) and a PEFT adapter; class labels; ensembles;
interpretation; exports; and bad input (one stderr line, exit 2, no output file)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from spot_jax import cli, fileio, infer
from spot_jax.train import checkpointer
from spot_jax.prompts import PromptTuning
from spot_jax.serve.model import mixed
from spot_jax.serve.export import peft_io
from spot_jax.backbones.t5 import Transformer, checkpoints, config_by_name, generate
from tests.helpers import REPO
from tests.helpers.prompt_train import frozen_backbone

CONFIG = config_by_name("t5_1_1_byte_tiny", dropout_rate=0.0)
COMMON = ["--model=t5_1_1_byte_tiny", "--vocab=byte", "--input_length=16",
          "--target_length=6", "--batch_size=4"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("infer")
  backbone = jax.tree_util.tree_map(np.asarray, frozen_backbone(CONFIG, 0))
  checkpoints.save_checkpoint(backbone, str(root / "ckpt"), format="t5x")
  rs = np.random.RandomState(0)
  np.save(root / "a.npy", rs.normal(0, 2, (3, CONFIG.emb_dim)).astype(np.float32))
  np.save(root / "b.npy", rs.normal(0, 2, (5, CONFIG.emb_dim)).astype(np.float32))
  np.save(root / "narrow.npy", rs.normal(0, 2, (3, 32)).astype(np.float32))
  run = checkpointer.Checkpointer(str(root / "smop_run"))
  smop = {"prompts": rs.normal(0, 2, (3, 2, CONFIG.emb_dim)).astype(np.float32),
          "router": {"kernel": rs.normal(0, 3, (CONFIG.emb_dim, 3)).astype(np.float32)}}
  run.save_best(7, {"params": {"prompt": smop}, "step": np.int32(7)}, "accuracy", 0.5)
  fileio.save_npy(run.run_dir.prompt_path("best"), smop["prompts"])
  run.close()
  peft_io.export_adapter(np.load(root / "b.npy"), CONFIG, str(root / "b_adapter"))
  peft_io.export_adapter(np.ones((2, 32), np.float32), config_by_name("t5_1_1_test"),
                         str(root / "other_adapter"))
  (root / "lora").mkdir()
  (root / "lora" / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4}')
  lines = [{"input": "a good film", "prompt": "a", "target": "pos"},
           {"input": "dull", "prompt": "smop"},
           {"input": "never again", "prompt": "b_peft", "id": "x3"},
           {"input": "fine", "prompt": "b"},
           {"input": "great acting and a good plot", "prompt": "smop"}]
  (root / "in.jsonl").write_text("\n".join(json.dumps(l) for l in lines) + "\n")
  return root, backbone


def _prompts(root):
  return [f"--prompt=a={root}/a.npy", f"--prompt=b={root}/b.npy", f"--prompt=smop={root}/smop_run",
          f"--prompt=b_peft={root}/b_adapter"]


def _run(argv, capsys):
  status = cli.run(infer.main, argv, infer.PROG)
  out, err = capsys.readouterr()
  return status, out, err


def _alone(backbone, prompt, text, vocab):
  """The reference: the prompt as a PromptTuning module, one input alone, t5.generate."""
  ids = list(vocab.encode(text))[:15] + [1]
  tokens = np.zeros((1, 16), np.int32)
  tokens[0, :len(ids)] = ids
  out, _ = generate(Transformer(CONFIG, prompt=PromptTuning(prompt.shape[0])),
                    {**backbone, "prompt": {"prompt": jnp.asarray(prompt)}}, jnp.asarray(tokens),
                    max_decode_length=6)
  row = [int(t) for t in np.asarray(out[0])]
  return vocab.decode([t for t in row[:row.index(1) if 1 in row else None] if t > 0])


def test_mixed_predictions_jsonl(files, capsys):
  root, backbone = files
  out_path = root / "out.jsonl"
  status, out, err = _run(COMMON + _prompts(root) + [f"--checkpoint={root}/ckpt",
                                                     f"--input={root}/in.jsonl",
                                                     f"--output={out_path}"], capsys)
  assert status == 0, err
  records = [json.loads(l) for l in out_path.read_text().splitlines()]
  assert [r["prompt"] for r in records] == ["a", "smop", "b_peft", "b", "smop"]
  assert records[2]["id"] == "x3" and records[0]["target"] == "pos"
  assert all(set(r) >= {"input", "prompt", "prediction", "score"} for r in records)
  vocab = seqio.ByteVocabulary()
  assert records[0]["prediction"] == _alone(backbone, np.load(root / "a.npy"), "a good film", vocab)
  # The PEFT adapter holds b's prompt: same prediction as the .npy for the same input.
  assert records[3]["prediction"] == _alone(backbone, np.load(root / "b.npy"), "fine", vocab)
  assert "wrote 5 predictions" in out
  assert json.loads(out.splitlines()[0]) == {"num_scored": 1, "accuracy": {
      "a": float(records[0]["prediction"] == "pos")}}


def test_the_inputs_cut_are_named_with_their_line_and_length(files, capsys):
  root, _ = files
  long = "this input is much longer than sixteen bytes"
  (root / "long.txt").write_text(f"fine\n\n{long}\nok\n{'x' * 20}\n")
  status, _, err = _run(COMMON + [f"--prompt={root}/a.npy", f"--checkpoint={root}/ckpt",
                                  f"--input={root}/long.txt", f"--output={root}/long.jsonl"],
                        capsys)
  assert status == 0, err
  # Byte ids: one per character, plus EOS; the blank line 2 still counts as a line.
  assert err.splitlines() == [
      f"warning: 2 of 4 inputs of {root}/long.txt were longer than --input_length=16 tokens (EOS "
      f"included) and were cut, so their answers may be wrong: line 3: {len(long) + 1} tokens; "
      f"line 5: 21 tokens; --input_length={len(long) + 1} keeps them whole"]


def test_class_labels_and_ensemble(files, capsys):
  root, _ = files
  text = root / "in.txt"
  text.write_text("a good film\n\ndull\nnever again\n")
  out_path = root / "labels.jsonl"
  status, _, err = _run(COMMON + _prompts(root)[:2] + [
      f"--checkpoint={root}/ckpt", f"--input={text}", f"--output={out_path}", "--default_prompt=a",
      "--label=pos", "--label=neg"], capsys)
  assert status == 0, err
  records = [json.loads(l) for l in out_path.read_text().splitlines()]
  assert len(records) == 3
  for r in records:
    assert r["prediction"] == max(r["label_scores"], key=r["label_scores"].get)
    assert r["score"] == max(r["label_scores"].values()) < 0
  before = mixed.generate_mixed._cache_size()  # pylint: disable=protected-access
  ens = root / "ens.jsonl"
  jsonl = root / "ens_in.jsonl"
  jsonl.write_text("".join(json.dumps({"input": t, "target": g}) + "\n" for t, g in
                           [("a good film", "x"), ("dull", "y"), ("ok", "z")]))
  status, out, err = _run(COMMON + _prompts(root) + [f"--checkpoint={root}/ckpt",
                                                     f"--input={jsonl}", f"--output={ens}",
                                                     "--ensemble"], capsys)
  assert status == 0, err
  records = [json.loads(l) for l in ens.read_text().splitlines()]
  for r in records:
    assert r["prompt"] == "ensemble(a,b,smop,b_peft)"
    assert set(r["predictions"]) == {"a", "b", "smop", "b_peft"}
    assert r["predictions"]["b"] == r["predictions"]["b_peft"]
    assert r["votes"][r["prediction"]] == max(r["votes"].values())
    assert sum(r["votes"].values()) == 4
  summary = json.loads((root / "ens.jsonl.summary.json").read_text())
  assert set(summary) >= {"ensemble_accuracy", "mean_accuracy", "best_single",
                          "per_prompt_accuracy"}
  assert json.loads(out.splitlines()[0]) == summary
  # 3 inputs, 4 prompts, batch_size 4: one batch of 16 rows, one compilation.
  assert mixed.generate_mixed._cache_size() - before == 1  # pylint: disable=protected-access
  # Mean log-prob combination: the answer is one of the prompts' answers.
  status, _, err = _run(COMMON + _prompts(root) + [f"--checkpoint={root}/ckpt", f"--input={jsonl}",
                                                   f"--output={ens}", "--ensemble",
                                                   "--combine=logprob"], capsys)
  assert status == 0, err
  for r in (json.loads(l) for l in ens.read_text().splitlines()):
    assert r["prediction"] in r["predictions"].values()


def test_interpret_and_exports(files, capsys):
  root, backbone = files
  embedding = backbone["token_embedder"]["embedding"]
  rows = [65, 98, 120]
  np.save(root / "rows.npy", embedding[rows])
  out_json = root / "near.json"
  status, out, err = _run(COMMON + [f"--checkpoint={root}/ckpt", f"--prompt=rows={root}/rows.npy",
                                    f"--prompt=smop={root}/smop_run", "--interpret",
                                    f"--output={out_json}", "--top_tokens=3"], capsys)
  assert status == 0, err
  records = json.loads(out_json.read_text())
  firsts = [r["neighbours"][0]["id"] for r in records if r["prompt"] == "rows"]
  assert firsts == rows
  assert [r["sub_prompt"] for r in records if r["prompt"] == "smop"] == [0, 0, 1, 1, 2, 2]
  assert out.splitlines()[1].startswith("rows\t0\t0\t")
  status, out, err = _run(COMMON + [f"--prompt=a={root}/a.npy", f"--export_peft={root}/a_peft",
                                    "--base_model=t5-byte-tiny"], capsys)
  assert status == 0, err
  assert np.array_equal(peft_io.read_adapter(str(root / "a_peft"), CONFIG), np.load(root / "a.npy"))
  cfg = json.loads((root / "a_peft" / "adapter_config.json").read_text())
  assert cfg["base_model_name_or_path"] == "t5-byte-tiny" and cfg["num_virtual_tokens"] == 3
  status, _, err = _run(COMMON + [f"--prompt=p={root}/b_adapter", f"--export_npy={root}/b2.npy"],
                        capsys)
  assert status == 0, err
  assert np.array_equal(np.load(root / "b2.npy"), np.load(root / "b.npy"))


@pytest.mark.parametrize("case, extra, message", [
    ("width", ["--prompt=n={root}/narrow.npy"],
     "has width 32 but the model's embedding width is 64"),
    ("empty", ["--prompt=a={root}/a.npy", "--input={root}/empty.jsonl"], "holds no inputs"),
    ("malformed", ["--prompt=a={root}/a.npy", "--input={root}/bad.jsonl"],
     "line 2 is not valid JSON"),
    ("no_input_field", ["--prompt=a={root}/a.npy", "--input={root}/noinput.jsonl"],
     "line 1 has no string \"input\" field"),
    ("unknown_prompt", ["--prompt=a={root}/a.npy", "--prompt=b={root}/b.npy",
                        "--input={root}/unknown.jsonl"], "unknown prompt name 'zzz'; valid: a, b"),
    ("other_model", ["--prompt=o={root}/other_adapter"], "was made for another base model"),
    ("other_type", ["--prompt=l={root}/lora"], "is a LORA adapter; only PROMPT_TUNING"),
    ("smop_npy", ["--prompt=s={root}/smop_run/prompts/prompt_best.npy"], "without their router"),
    ("missing", ["--prompt=m={root}/nope.npy"], "does not exist"),
    ("flag", ["--prompt=a={root}/a.npy", "--method=nucleus"], "argument --method: invalid choice"),
])
def test_bad_input_one_line_and_no_output(files, capsys, case, extra, message):
  root, _ = files
  (root / "empty.jsonl").write_text("\n  \n")
  (root / "bad.jsonl").write_text('{"input": "ok"}\n{"input": "x"\n')
  (root / "noinput.jsonl").write_text('{"text": "ok"}\n')
  (root / "unknown.jsonl").write_text('{"input": "ok", "prompt": "a"}\n'
                                      '{"input": "x", "prompt": "zzz"}\n')
  out_dir = root / f"bad_{case}"
  out_dir.mkdir()
  extra = [e.format(root=root) for e in extra]
  has_input = any(e.startswith("--input=") for e in extra)
  default_input = [] if has_input else [f"--input={root}/in.jsonl"]
  argv = COMMON + extra + default_input + [f"--output={out_dir}/out.jsonl"]
  status, _, err = _run(argv, capsys)
  assert status == 2
  lines = err.splitlines()
  assert len(lines) == 1 and lines[0].startswith("spot_jax.infer: error: "), err
  assert message in lines[0]
  assert os.listdir(out_dir) == []


@pytest.mark.parametrize("interpret", [False, True])
def test_output_that_cannot_be_a_file_stops_before_the_model(files, capsys, interpret):
  root, _ = files
  (root / "out_is_dir").mkdir(exist_ok=True)
  mode = ["--interpret"] if interpret else [f"--input={root}/in.jsonl"]
  for output, message in [(root / "out_is_dir", "is a directory"),
                          (root / "nope" / "o.jsonl", "does not exist")]:
    status, out, err = _run(COMMON + [f"--prompt=a={root}/a.npy", *mode,
                                      f"--output={output}"], capsys)
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"spot_jax.infer: error: --output '{output}'") and message in err
  assert os.listdir(root / "out_is_dir") == [] and not (root / "nope").exists()


def test_export_to_a_path_that_cannot_take_it_is_one_line(files, capsys):
  root, _ = files
  (root / "plain_file").write_text("x")
  (root / "npy_dir").mkdir(exist_ok=True)
  for flag, target, message in [
      ("--export_npy", root / "npy_dir", "is a directory; give a file path"),
      ("--export_npy", root / "nope" / "a.npy", "nope' does not exist"),
      ("--export_peft", root / "plain_file" / "adapter",
       "--export_peft's folder '" + str(root / "plain_file") + "' is a file, not a directory")]:
    status, out, err = _run(COMMON + [f"--prompt=a={root}/a.npy", f"{flag}={target}"], capsys)
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("spot_jax.infer: error: ") and message in err, err
  assert os.listdir(root / "npy_dir") == [] and (root / "plain_file").read_text() == "x"


def test_failure_mid_run_leaves_no_partial_output(files, capsys, monkeypatch):
  """A crash in the second batch (5 inputs, 4 per batch): the earlier output file stays as it
  was and no temp file is left."""
  root, _ = files
  out_dir = root / "crash"
  out_dir.mkdir()
  (out_dir / "out.jsonl").write_text("previous\n")
  calls = []
  real = mixed.generate_mixed

  def failing(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
      raise KeyboardInterrupt
    return real(*args, **kwargs)

  monkeypatch.setattr(mixed, "generate_mixed", failing)
  status, _, err = _run(COMMON + _prompts(root) + [f"--checkpoint={root}/ckpt",
                                                   f"--input={root}/in.jsonl",
                                                   f"--output={out_dir}/out.jsonl"], capsys)
  assert status == 130 and len(calls) == 2, err
  assert os.listdir(out_dir) == ["out.jsonl"]
  assert (out_dir / "out.jsonl").read_text() == "previous\n"


def test_module_entry_point_bad_input(files):
  root, _ = files
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
  proc = subprocess.run([sys.executable, "-m", "spot_jax.infer", *COMMON,
                         f"--prompt=n={root}/narrow.npy", f"--input={root}/in.jsonl",
                         f"--output={root}/x.jsonl"], capture_output=True, text=True, env=env,
                        cwd=REPO, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  errors = [l for l in proc.stderr.splitlines() if l.startswith("spot_jax.infer: error:")]
  assert len(errors) == 1 and "width 32" in errors[0], proc.stderr[-2000:]
  assert not (root / "x.jsonl").exists()


def test_library_entry_is_served_and_another_models_entry_refused(files, capsys, tmp_path):
  """`LIBRARY_DIR#ID` serves the entry's best prompt; an entry of another frozen model
  is refused."""
  from spot_jax import backbone as backbone_lib  # pylint: disable=g-import-not-at-top
  from spot_jax.spot import library as prompt_library  # pylint: disable=g-import-not-at-top
  root, backbone = files
  prompt = np.load(root / "a.npy")
  for entry_id, checkpoint in (("a.served", str(root / "ckpt")), ("a.other", None)):
    # one library per frozen model (the library itself refuses to mix them)
    prompt_library.Library(tmp_path / entry_id.split(".")[1]).add(
        entry_id=entry_id, task="spot_synthetic_sentiment_v100", run_id=entry_id, seed=0,
 fingerprint=backbone_lib.fingerprint(CONFIG, checkpoint, 0), prompt=prompt,
 embedding=prompt, score=1.0, metric="accuracy", embed_dim=CONFIG.emb_dim)
  (tmp_path / "in.jsonl").write_text(json.dumps({"input": "a good film"}) + "\n")
  out_path = tmp_path / "out.jsonl"
  status, _, err = _run(COMMON + [f"--prompt={tmp_path}/served#a.served",
                                  f"--checkpoint={root}/ckpt",
                                  f"--input={tmp_path}/in.jsonl", f"--output={out_path}"], capsys)
  assert status == 0, err
  record = json.loads(out_path.read_text())
  assert record["prompt"] == "a.served"
  assert record["prediction"] == _alone(backbone, prompt, "a good film", seqio.ByteVocabulary())
  out_path.unlink()
  status, _, err = _run(COMMON + [f"--prompt={tmp_path}/other#a.other", f"--checkpoint={root}/ckpt",
                                  f"--input={tmp_path}/in.jsonl", f"--output={out_path}"], capsys)
  assert status == 2 and len(err.strip().splitlines()) == 1, err
  assert "was trained against frozen model" in err and not out_path.exists()
