"""ULPT as a user runs it: `python -m spot_jax.train` from gin/prompts/ulpt.gin on a tiny model,
SIGKILL and restart (the same final prompt and projection as an uninterrupted run), then
`python -m spot_jax.infer` on the run directory (the unfolded module's predictions), the HTTP
server on it beside a Prompt Tuning prompt (the same answers, in one batch), and a SPoT transfer
from the run (gin/prompts/ulpt_transfer.gin), refused in one line when the target's projection
differs."""
from __future__ import annotations

import concurrent.futures
import json
import pathlib
import re
import subprocess
import urllib.request

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import seqio

from spot_jax import models, partitioning
from spot_jax import backbone as backbone_lib
from spot_jax.backbones.t5 import Transformer, config_by_name, generate
from spot_jax.prompts import ULPT, ulpt
from spot_jax.run_dir import RunDir
from tests.helpers import REPO, serve_http
from tests.helpers.kill import kill_at_checkpoint  # noqa: E402
from tests.helpers.train_cli import _cmd, _env, _losses, run_in_one_process

STEPS, RANK, LENGTH = 120, 8, 6
MODEL = ["--gin_file=gin/models/t5_1_1_byte_tiny.gin"]
RUN = ["--gin_file=gin/runs/prompt_tune.gin"]
COMMON = ["--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentiment_v100'",
          "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}", "--gin.BATCH_SIZE=16",
          "--gin.train.train.eval_cfg=None", "--gin.CHECKPOINT_PERIOD=20",
          f"--gin.PROMPT_LENGTH={LENGTH}", f"--gin.ULPT_RANK={RANK}"]
TRAIN = [*MODEL, "--gin_file=gin/prompts/ulpt.gin", *RUN, *COMMON, f"--gin.TRAIN_STEPS={STEPS}",
         f"--gin.train.train.log_period={STEPS // 6}"]
TRANSFER = [*MODEL, "--gin_file=gin/prompts/ulpt_transfer.gin", *RUN, *COMMON,
            "--gin.TRAIN_STEPS=2", "--gin.train.train.log_period=1"]
CONFIG = config_by_name("t5_1_1_byte_tiny", dropout_rate=0.0)
TEXTS = ["a good film", "dull and slow", "never again", "great acting and a good plot"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[pathlib.Path, dict]:
  """An uninterrupted run (ref), one SIGKILLed once checkpoint 20 exists then restarted
  (killed), `infer` on ref, a transfer from ref and one with another projection seed; all but
  the killed run in one process, each as `python -m` would. -> (root, {case: result})."""
  root = tmp_path_factory.mktemp("ulpt")
  proc = subprocess.Popen(_cmd(*TRAIN, f"--gin.MODEL_DIR='{root / 'killed'}'"), cwd=REPO,
                          env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  kill_at_checkpoint(proc, root / "killed", 20, STEPS)
  (root / "in.jsonl").write_text("\n".join(json.dumps({"input": t}) for t in TEXTS) + "\n")
  source = f"--gin.SOURCE_MODEL_DIR='{root / 'ref'}'"
  cases = {run: ("spot_jax.train", [*TRAIN, f"--gin.MODEL_DIR='{root / run}'"])
           for run in ("ref", "killed")}
  cases["infer"] = ("spot_jax.infer", [
      "--model=t5_1_1_byte_tiny", "--vocab=byte", f"--prompt=u={root / 'ref'}",
      f"--input={root / 'in.jsonl'}", f"--output={root / 'out.jsonl'}", "--input_length=48",
      "--target_length=6"])
  cases["transfer"] = ("spot_jax.train", [*TRANSFER, source,
                                          f"--gin.MODEL_DIR='{root / 'transfer'}'"])
  cases["other projection"] = ("spot_jax.train", [*TRANSFER, source, "--gin.ULPT_PROJECTION_SEED=1",
                                                  f"--gin.MODEL_DIR='{root / 'other'}'"])
  return root, dict(zip(cases, run_in_one_process(list(cases.values()))))


def _reference_predictions(module, run_dir: pathlib.Path, texts: list[str]) -> list[str]:
  """The unfolded module with the run's final state, each input alone, t5.generate."""
  state = ocp.StandardCheckpointer().restore(run_dir / "checkpoints" / str(STEPS) / "default")
  model = models.EncoderDecoderModel(Transformer(CONFIG))
  backbone, _ = backbone_lib.load_backbone(model, model.dummy_batch(4, 4), None, 0,
                                           partitioning.create_mesh(1),
                                           partitioning.logical_rules(), info=lambda _: None)
  vocab = seqio.ByteVocabulary()
  out = []
  for text in texts:
    ids = list(vocab.encode(text))[:47] + [1]
    tokens = np.zeros((1, 48), np.int32)
    tokens[0, :len(ids)] = ids
    decoded, _ = generate(Transformer(CONFIG, prompt=module),
                          {**backbone, "prompt": state["params"]["prompt"]}, jnp.asarray(tokens),
                          max_decode_length=6)
    row = [int(t) for t in np.asarray(decoded[0])]
    out.append(vocab.decode([t for t in row[:row.index(1) if 1 in row else None] if t > 0]))
  return out


def test_trains_from_gin_resumes_after_sigkill_and_serves(runs):
  root, results = runs
  reference = results["ref"]
  assert reference.returncode == 0, reference.stderr[-3000:]
  losses = _losses(reference.stdout)
  assert len(losses) == 6 and min(losses[1:]) < losses[0], reference.stdout[-2000:]
  ref, killed = RunDir(root / "ref"), RunDir(root / "killed")
  method = ref.read_record().method
  assert {k: method[k] for k in ("class", "length", "rank", "projection_seed",
                                 "projection_generator")} == {
      "class": "ULPT", "length": LENGTH, "rank": RANK, "projection_seed": 0,
      "projection_generator": ulpt.XAVIER}
  assert method["projection"] == ulpt.projection_record(ulpt.XAVIER, 0, RANK, CONFIG.emb_dim)
  kept = np.load(ref.prompts / f"projection_step_{STEPS}.npy")
  np.testing.assert_array_equal(kept, ulpt.projection(ulpt.XAVIER, 0, RANK, CONFIG.emb_dim))
  state = ocp.StandardCheckpointer().restore(root / "ref" / "checkpoints" / str(STEPS) / "default")
  assert sorted(state["params"]["prompt"]) == ["scale", "shift", "z"]  # P is never saved

  resumed = results["killed"]
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from" in resumed.stdout
  assert int(re.search(rf"^step (\d+)/{STEPS}", resumed.stdout, re.M).group(1)) > 20
  for name in (f"prompt_step_{STEPS}.npy", f"projection_step_{STEPS}.npy"):
    np.testing.assert_allclose(np.load(killed.prompts / name), np.load(ref.prompts / name),
                               rtol=0, atol=1e-6)

  served = results["infer"]
  assert served.returncode == 0, served.stderr[-2000:]
  predictions = [json.loads(l)["prediction"]
                 for l in (root / "out.jsonl").read_text().splitlines()]
  assert predictions == _reference_predictions(ULPT(LENGTH, rank=RANK), root / "ref", TEXTS)


def test_the_http_server_answers_the_run_as_infer_in_a_mixed_batch(runs):
  """A real server on the ULPT run directory and a Prompt Tuning prompt: concurrent requests
  for both share a batch, and the ULPT answers are infer's on the run directory."""
  root, results = runs
  assert results["infer"].returncode == 0, results["infer"].stderr[-2000:]
  want = [json.loads(l)["prediction"] for l in (root / "out.jsonl").read_text().splitlines()]
  other = root / "pt.npy"
  np.save(other, np.random.RandomState(0).uniform(-0.5, 0.5, (3, CONFIG.emb_dim)))
  server = serve_http.start({"u": str(root / "ref"), "pt": str(other)},
                            extra=["--input_length=48", "--target_length=6"],
                            backbone=["--model=t5_1_1_byte_tiny", "--vocab=byte"])
  try:
    batches = server.metric("spot_serve_batch_rows_count", kind="generate")

    def ask(model: str, text: str) -> str:
      body = json.dumps({"model": model, "prompt": text, "max_tokens": 6}).encode()
      request = urllib.request.Request(server.url + "/v1/completions", data=body,
                                       headers={"Content-Type": "application/json"})
      with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())["choices"][0]["text"]

    calls = [("u", t) for t in TEXTS] + [("pt", t) for t in TEXTS]
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
      answers = list(pool.map(lambda c: ask(*c), calls))
    assert answers[:len(TEXTS)] == want
    assert server.metric("spot_serve_batch_rows_count", kind="generate") < batches + len(calls)
  finally:
    assert server.stop() == 0


def test_a_transfer_starts_from_the_source_and_refuses_another_projection(runs):
  root, results = runs
  transfer = results["transfer"]
  assert transfer.returncode == 0, transfer.stderr[-3000:]
  record = RunDir(root / "transfer").read_record()
  for part in ("z", "scale", "shift"):
    assert f"ULPT run {root / 'ref'} ({part}" in record.init, record.init
  served_step = RunDir(root / "ref").exported_prompt()[1]
  state = ocp.StandardCheckpointer().restore(
      root / "ref" / "checkpoints" / str(served_step) / "default")["params"]["prompt"]
  for part in ("z", "scale", "shift"):
    init = ulpt.from_run(str(root / "ref"), part)
    np.testing.assert_array_equal(init(None, state[part].shape, None), state[part])

  other = results["other projection"]
  assert other.returncode == 2 and "Traceback" not in other.stderr
  lines = other.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("spot_jax.train: error: "), other.stderr
  assert (f"ULPT: the source {root / 'ref'} was trained with projection {ulpt.XAVIER} seed 0 "
          f"rank {RANK}, this prompt's is {ulpt.XAVIER} seed 1") in lines[0]
  assert not (root / "other").exists()
