"""A decoder-only run directory serves alone: `infer` on it (no --model, no --vocab: its
run.json names the kind, config, random seed and vocabulary) reproduces the trainer's
evaluation predictions on the task's validation split, and a T5 model refuses it in one line."""
from __future__ import annotations

import json

from spot_jax import cli, data, infer, models, prompts
from spot_jax import train as train_lib
from spot_jax.backbones.decoder.config import config_by_name
from spot_jax.backbones.decoder.network import DecoderLM
from spot_jax.train import evaluator as evaluator_lib, optimizers
from tests.helpers import local_tasks

LENGTHS = {"inputs": 24, "targets": 4}
CONFIG = config_by_name("decoder_tiny_llama")


def test_a_decoder_run_serves_as_the_trainer_evaluated_it(tmp_path, capsys):
  task = local_tasks.register_tsv_task("test_decoder_serve_polarity",
                                       local_tasks.write_tsv_task_files(tmp_path / "tsv"))
  model = models.DecoderOnlyModel(
      DecoderLM(CONFIG, prompt=prompts.PromptTuning(4, prompt_init=prompts.sampled_vocab())),
      eos_id=1)  # the bytes' EOS
  run = tmp_path / "run"
  train_lib.train(model=model, train_dataset_cfg=data.DatasetConfig(task, LENGTHS, batch_size=8),
                  total_steps=3, model_dir=str(run), optimizer=optimizers.adafactor(),
                  eval_period=3, log_period=10, verbose=False,
                  eval_cfg=evaluator_lib.EvalConfig(task, LENGTHS, batch_size=16))
  trained = [json.loads(line)["prediction"]
             for line in (run / "eval" / f"{task}-000003.jsonl").read_text().splitlines()]
  out = tmp_path / "served.jsonl"
  argv = [f"--prompt={run}", f"--task={task}", "--split=validation", "--input_length=24",
          "--target_length=4", f"--output={out}", "--compilation_cache_dir=none"]
  assert cli.run(infer.main, argv, infer.PROG) == 0, capsys.readouterr().err
  served = [json.loads(line)["prediction"] for line in out.read_text().splitlines()]
  assert served == trained and len(served) >= 8
  capsys.readouterr()
  status = cli.run(infer.main, [*argv[:-1], "--model=t5_1_1_test", f"--output={tmp_path}/x"],
                   infer.PROG)
  err = capsys.readouterr().err.strip().splitlines()
  assert status == 2 and len(err) == 1 and "does not move between backbone kinds" in err[0]
  assert not (tmp_path / "x").exists()
