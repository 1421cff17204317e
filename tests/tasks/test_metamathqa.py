"""PEFT's MetaMathQA -> GSM8K recipe: the splits as PEFT draws them, the files register as a
plain prompt/completion task scored by GSM8K's answer, and the gin recipe holds PEFT's settings."""
import json

import gin
import numpy as np
import pytest
import seqio

from spot_jax.cli import gin_flags
from tasks import metamathqa
from tests.helpers import REPO


def _examples(n, prefix, long_every=0):
  return [{"query": f"{prefix} {i}?" + ("x" * 1400 if long_every and i % long_every == 0 else ""),
           "response": f"so {i}.\n#### {i}"} for i in range(n)]


def test_splits_are_peft_s():
  metamath, train, test = _examples(30, "mm", long_every=7), _examples(120, "tr"), \
      _examples(9, "te")
  rows = metamathqa.splits(metamath, train, test)
  assert len(rows["train"]) == 30 - len(range(0, 30, 7))  # 1,300 characters at most
  np.random.seed(0)  # PEFT's draw: the global numpy generator seeded 0, one shuffle
  indices = np.arange(len(train))
  np.random.shuffle(indices)
  assert rows["validation"] == [
      {"prompt": f"Question: {train[i]['query']} Think step by step.\nAnswer:",
       "completion": train[i]["response"]} for i in indices[:50]]
  assert [r["completion"] for r in rows["test"]] == [e["response"] for e in test]


def test_prepared_files_register_as_a_plain_task_scored_by_the_number(tmp_path):
  metamathqa.write(metamathqa.splits(_examples(8, "mm"), _examples(60, "tr"),
                                     _examples(4, "te")), str(tmp_path))
  name = metamathqa.register(str(tmp_path), tokenizer="embedded_decoder",
                             name="test_metamathqa_v1")
  task = seqio.get_mixture_or_task(name)
  assert set(task.source.splits) == {"train", "validation", "test"}
  first = json.loads((tmp_path / "test.jsonl").read_text().splitlines()[0])
  ex = next(task.source.get_dataset("test", shuffle=False).as_numpy_iterator())
  assert ex["inputs_pretokenized"].decode() == first["prompt"] == "Question: te 0? Think step " \
      "by step.\nAnswer:"
  assert task.postprocess_fn("... The answer is: 0.0", is_target=False) == \
      task.postprocess_fn(first["completion"], is_target=True) == "0"


@pytest.fixture
def recipe():
  gin.clear_config(clear_constants=True)
  for path in gin_flags.search_paths([]):
    gin.add_config_file_search_path(path)
  gin.parse_config_files_and_bindings(
      [str(REPO / "gin" / "recipes" / "peft_metamathqa_prompt_tuning.gin")],
      ["MODEL_DIR='/tmp/x'", "MIXTURE_OR_TASK_MODULE='m.py'"], finalize_config=False)
  yield
  gin.clear_config(clear_constants=True)


def test_the_recipe_holds_peft_s_settings(recipe):  # pylint: disable=redefined-outer-name,unused-argument
  """default_training_params.json and the sample_vocab experiment's lr (1e-3)."""
  query = gin.query_parameter
  assert query("%PROMPT_LENGTH") == 200 and query("%BATCH_SIZE") == 4
  assert query("%TRAIN_STEPS") == 5000 and query("%EVAL_PERIOD") == 250
  lengths = query("%TASK_FEATURE_LENGTHS")
  assert lengths["inputs"] + lengths["targets"] == 768
  assert query("%ACTIVATION_DTYPE") == "bfloat16"
  assert query("optimizers.warmup_cosine_decay.peak_value") == 1e-3
  assert query("optimizers.warmup_cosine_decay.warmup_steps") == 500  # 10% of the steps
  assert query("optimizers.adamw.grad_clip_norm") == 1.0
  assert query("%MIXTURE_OR_TASK_NAME") == metamathqa.TASK
