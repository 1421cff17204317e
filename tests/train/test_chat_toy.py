"""The embedded chat task learns: a 10-token prompt on the toy decoder, 100 steps, answers the
held-out sums it could not answer untrained (exact match from generation, in the eval logs)."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from spot_jax import backbone as backbone_lib
from spot_jax import data, embedded, models, prompts
from spot_jax import train as train_lib
from spot_jax.backbones.decoder.network import DecoderLM
from spot_jax.embedded import decoder_config
from spot_jax.train import evaluator as evaluator_lib
from spot_jax.train import optimizers
from tasks import embedded_chat

LENGTHS = {"inputs": 24, "targets": 4}
STEPS = 100

pytestmark = pytest.mark.skipif(
    not pathlib.Path(embedded.DECODER_CHECKPOINT_PATH).is_dir(),
    reason="no toy decoder; run python -m spot_jax.embedded.pretrain_decoder")


def _model():
  prompt = prompts.PromptTuning(length=10, prompt_init=prompts.sampled_vocab())
  return models.DecoderOnlyModel(DecoderLM(decoder_config.toy_config(), prompt=prompt))


def test_the_toy_chat_task_learns(tmp_path):
  name = embedded_chat.register()
  model = _model()
  eval_cfg = evaluator_lib.EvalConfig(name, LENGTHS, batch_size=100, num_examples=200)
  result = train_lib.train(
      model=model, total_steps=STEPS, model_dir=str(tmp_path), optimizer=optimizers.adafactor(),
      train_dataset_cfg=data.DatasetConfig(name, LENGTHS, batch_size=16, seed=0),
      eval_cfg=eval_cfg, eval_period=STEPS, verbose=False,
      initial_checkpoint_path=embedded.DECODER_CHECKPOINT_PATH)
  (step, metrics), = result.eval_history
  trained = metrics[name]["exact_match"]
  # the same prompt before training: the run's initial prompt, evaluated the same way
  start = models.unbox(model.init_prompt(backbone_lib.seed_keys(0)[1], result.frozen_params,
                                         model.dummy_batch(LENGTHS["inputs"],
                                                           LENGTHS["targets"])))
  untrained = evaluator_lib.Evaluator(model, eval_cfg).evaluate(
      models.merge_params(result.frozen_params, start))[name]["exact_match"]
  print(f"exact match on 200 held-out sums: {untrained:.1f} untrained -> {trained:.1f}")
  assert step == STEPS and trained >= 50.0 and trained >= untrained + 40.0, (untrained, trained)
  # the eval log holds each example's generation and the metric beside it
  log_dir = tmp_path / "eval"
  lines = [json.loads(l) for l in (log_dir / f"{name}-{STEPS:06}.jsonl").read_text().splitlines()]
  assert len(lines) == 200 and {"input", "target", "prediction"} <= set(lines[0])
  hits = [l["prediction"] == l["target"] for l in lines]
  np.testing.assert_allclose(100.0 * np.mean(hits), trained, atol=1e-9)
  metric_lines = (log_dir / f"{name}-metrics.jsonl").read_text().splitlines()
  assert json.loads(metric_lines[-1])["exact_match"] == pytest.approx(trained)
