"""K prompt runs in one jitted step equal the same runs trained one at a time.

Tiny byte-vocabulary T5 (dropout 0.1 on), a local TSV task. For Prompt Tuning, SMoP and Residual:
K = 3 seeds in one job against the same 3 runs alone: per-step losses within 1e-5 over the first
5 steps, final prompts within 1e-4; each run's directory is an ordinary run directory. Bad input
(an empty or duplicate seed list, lists of different lengths, runs whose shapes differ) is one
line naming the setting, with nothing written.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest

from spot_jax import data, models, prompts
from spot_jax import train as train_lib
from spot_jax.errors import ConfigError
from spot_jax.run_dir import RunDir
from spot_jax.t5 import Transformer, config_by_name, save_checkpoint
from spot_jax.train import evaluator as evaluator_lib
from tests import local_tasks

SEEDS = (0, 1, 2)
STEPS = 8
LENGTHS = {"inputs": 24, "targets": 4}
METHODS = {
    "pt": lambda: prompts.PromptTuning(length=4, prompt_init=prompts.sampled_vocab(256)),
    "smop": lambda: prompts.SMoP(num_prompts=3, length=2, prompt_init=prompts.sampled_vocab(256)),
    "residual": lambda: prompts.ResidualPrompt(length=4, bottleneck=8,
                                               prompt_init=prompts.sampled_vocab(256)),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
  """One frozen backbone for every run (a random backbone would follow each run's seed)."""
  model = models.EncoderDecoderModel(Transformer(config_by_name("t5_1_1_byte_tiny")))
  params = models.unbox(model.init_backbone(jax.random.PRNGKey(7), model.dummy_batch(8, 4)))
  path = tmp_path_factory.mktemp("ckpt") / "checkpoint_0"
  save_checkpoint(jax.device_get(params), str(path), format="t5x")
  return str(path)


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> str:
  paths = local_tasks.write_tsv_task_files(tmp_path_factory.mktemp("tsv"), n_train=128, n_val=16)
  return local_tasks.register_tsv_task("test_runs_polarity", paths)


def _model(method: str) -> models.EncoderDecoderModel:
  config = config_by_name("t5_1_1_byte_tiny", dropout_rate=0.1)
  return models.EncoderDecoderModel(Transformer(config, prompt=METHODS[method]()))


def _train(model, task, model_dir, checkpoint, **kwargs):
  # One run's data order follows its seed, as gin's RANDOM_SEED sets both (K runs: each its own).
  cfg = data.DatasetConfig(task, LENGTHS, batch_size=4, seed=kwargs.get("seed", 0), module=None)
  eval_cfg = evaluator_lib.EvalConfig(task, LENGTHS, batch_size=8)
  return train_lib.train(model=model, train_dataset_cfg=cfg, total_steps=STEPS, model_dir=str(model_dir),
                         eval_cfg=eval_cfg, eval_period=STEPS, log_period=1, verbose=False,
                         checkpoint_cfg=train_lib.CheckpointConfig(best_metric="accuracy"),
                         initial_checkpoint_path=checkpoint, **kwargs)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_k_runs_in_one_step_equal_the_runs_one_at_a_time(tmp_path, task, checkpoint, method):
  model = _model(method)
  together = _train(model, task, tmp_path / "job", checkpoint, seeds=list(SEEDS))
  assert together.compilations == 1 and len(together.runs) == len(SEEDS)
  for k, seed in enumerate(SEEDS):
    alone = _train(model, task, tmp_path / f"alone_{seed}", checkpoint, seed=seed)
    run = together.runs[k]
    assert run.run.seed == seed and run.run.run_dir.path == tmp_path / "job" / f"seed_{seed}"
    losses_k = [h["loss"] for h in run.history[:5]]
    losses_1 = [h["loss"] for h in alone.history[:5]]
    np.testing.assert_allclose(losses_k, losses_1, rtol=0, atol=1e-5)
    a, b = RunDir(run.run.run_dir.path), RunDir(tmp_path / f"alone_{seed}")
    np.testing.assert_allclose(np.load(a.prompt_path(STEPS)), np.load(b.prompt_path(STEPS)),
                               rtol=0, atol=1e-4)
    # an ordinary run directory: its own record, states, exports and evaluation
    record = a.read_record()
    assert (record.seed, record.task, record.finished) == (seed, task, True)
    assert a.state_steps() == [STEPS] and a.best_steps() and a.embedding_prompt()[1] == STEPS // 3
    assert record.score == pytest.approx(b.read_record().score, abs=1e-9)
  # the runs really differ (their own seeds: initialisation, data order, dropout keys)
  first = [np.load(RunDir(r.run.run_dir.path).prompt_path(STEPS)) for r in together.runs]
  assert not np.allclose(first[0], first[1])


def test_tasks_and_seeds_zip_into_runs_with_their_own_evaluation(tmp_path, task, checkpoint,
                                                                  tmp_path_factory):
  paths = local_tasks.write_tsv_task_files(tmp_path_factory.mktemp("tsv2"), n_train=64, n_val=8)
  other = local_tasks.register_tsv_task("test_runs_polarity_b", paths)
  result = _train(_model("pt"), task, tmp_path / "job", checkpoint, tasks=[task, other], seeds=[3, 4])
  names = sorted(p.name for p in (tmp_path / "job").iterdir())
  assert names == sorted(["job.json", f"{other}.seed_4", f"{task}.seed_3"])
  for run in result.runs:
    (_, metrics), = [h for h in run.eval_history if h[0] == STEPS]
    assert list(metrics) == [run.run.task]  # each run evaluated its own task
    assert RunDir(run.run.run_dir.path).read_record().task == run.run.task


@pytest.mark.parametrize("kwargs, message", [
    (dict(seeds=[]), "SEEDS is empty"),
    (dict(seeds=[0, 1, 0]), "SEEDS lists 0 twice"),
    (dict(seeds=[0, "1"]), "SEEDS[1]='1' is not a non-negative integer seed"),
    (dict(seeds=[0, 1], tasks=["a"]), "SEEDS has 2 entries and TASKS 1"),
    (dict(tasks=[]), "TASKS is empty"),
    (dict(runs=[train_lib.RunSpec(0), train_lib.RunSpec(1, prompt_init=prompts.from_array(
        np.zeros((5, 64), np.float32)))]), "run seed_1's prompt cannot be initialised"),
])
def test_bad_run_lists_are_one_line_and_nothing_is_written(tmp_path, task, checkpoint, kwargs,
                                                           message):
  with pytest.raises(ConfigError) as info:
    _train(_model("pt"), task, tmp_path / "job", checkpoint, **kwargs)
  assert message in str(info.value) and "\n" not in str(info.value)
  assert not (tmp_path / "job").exists()
