"""Examples-proportional mixtures: sampling proportions, the cap K, registration rules."""
from __future__ import annotations

import collections
import json
import os

import pytest
import seqio

import tasks
from tasks import mixtures, names
from tests.helpers import REPO

SHARED_VOCAB = REPO.parent / "shared" / "fixtures" / "t5" / "t5_vocab"
SEQ = {"inputs": 32, "targets": 8}
SIZES = {"mix_a": 30, "mix_b": 10}


@pytest.fixture(scope="module")
def two_tiny_tasks(tmp_path_factory):
  """Two local-file tasks (CR's format) with 30 and 10 training examples."""
  if not SHARED_VOCAB.exists():
    pytest.skip(f"real T5 vocabulary not found at {SHARED_VOCAB} (../shared/fixtures is "
                "beside the repo)")
  old = os.environ.get("SPOT_JAX_VOCAB")
  os.environ["SPOT_JAX_VOCAB"] = str(SHARED_VOCAB)
  root = tmp_path_factory.mktemp("mix_files")
  for dataset, n in SIZES.items():
    (root / dataset).mkdir()
    rows = [{"sentence": f"{dataset} {i}", "label": i % 2} for i in range(n)]
    (root / dataset / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  # register_file_variant names the variant after the task, so give each its own base task.
  task_a = tasks.register_file_variant(names.OTHER["cr"], data_dir=str(root), dataset="mix_a",
                                       splits=("train",))
  task_b = tasks.register_file_variant(names.GLUE["glue_sst2"], data_dir=str(root), dataset="mix_b",
                                       splits=("train",))
  yield {"mix_a": task_a, "mix_b": task_b}
  if old is None:
    del os.environ["SPOT_JAX_VOCAB"]
  else:
    os.environ["SPOT_JAX_VOCAB"] = old


def _sample_fractions(mixture_name: str, n: int) -> dict:
  ds = seqio.get_mixture_or_task(mixture_name).get_dataset(SEQ, split="train", shuffle=True, seed=7,
                                                           num_epochs=None, copy_pretokenized=True)
  counts = collections.Counter()
  for example in ds.take(n).as_numpy_iterator():
    # "cr sentence: mix_a 3", "sst2 sentence: mix_b 4"
    text = example["inputs_pretokenized"].decode()
    counts[text.split(" ")[2]] += 1
  return {k: v / n for k, v in counts.items()}


@pytest.mark.parametrize("maximum,expected_a", [(2 ** 19, 30 / 40), (12, 12 / 22)],
                         ids=["uncapped", "capped"])
def test_mixture_samples_in_proportion_to_capped_sizes(two_tiny_tasks, maximum, expected_a):
  """Rates are min(size, K); 4,000 draws match them within 4 binomial standard deviations
  (< 0.032)."""
  name = mixtures.register_mixture(f"test_mix_{maximum}", list(two_tiny_tasks.values()),
                                   maximum=maximum)
  mixture = seqio.get_mixture_or_task(name)
  rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
  assert (rates == {two_tiny_tasks["mix_a"]: min(30, maximum),
                    two_tiny_tasks["mix_b"]: min(10, maximum)})
  n = 4000
  fractions = _sample_fractions(name, n)
  tolerance = 4 * (expected_a * (1 - expected_a) / n) ** 0.5
  assert abs(fractions["mix_a"] - expected_a) < tolerance
  assert fractions["mix_a"] + fractions["mix_b"] == pytest.approx(1.0)


def test_register_mixture_is_idempotent_and_rejects_conflicts(two_tiny_tasks):
  members = list(two_tiny_tasks.values())
  assert mixtures.register_mixture("test_mix_idem", members) == "test_mix_idem"
  assert mixtures.register_mixture("test_mix_idem", list(reversed(members))) == "test_mix_idem"
  with pytest.raises(ValueError, match="cannot redefine"):
    mixtures.register_mixture("test_mix_idem", members[:1])
  with pytest.raises(ValueError, match="cannot redefine"):
    mixtures.register_mixture("test_mix_idem", members, maximum=5)
  with pytest.raises(ValueError, match="neither a registered task nor a mixture"):
    mixtures.register_mixture("test_mix_bad", ["no_such_task_v200"])
  with pytest.raises(ValueError, match="already a task name"):
    mixtures.register_mixture(members[0], members)


def test_nested_mixtures_are_flattened_and_dev_sets_get_rate_zero():
  mnli = seqio.get_mixture_or_task(names.MIXTURES["glue_mnli_and_dev"])
  matched = seqio.get_mixture_or_task(names.GLUE["glue_mnli_matched"])
  assert mixtures.ExamplesProportional()(matched) == 0.0
  glue_members = {t.name for t in seqio.get_mixture_or_task(names.MIXTURES["glue"]).tasks}
  assert {t.name for t in mnli.tasks} <= glue_members
  assert (len(glue_members) == 10
          and not any(n in seqio.MixtureRegistry.names() for n in glue_members))


def test_study_lists_and_sources_mixture():
  assert len(names.SOURCE_TASKS) == 16 and len(names.TARGET_TASKS) == 10
  for name in list(names.SOURCE_TASKS.values()) + list(names.TARGET_TASKS.values()):
    assert name in seqio.TaskRegistry.names() or name in seqio.MixtureRegistry.names(), name
  sources = {t.name for t in seqio.get_mixture_or_task(names.MIXTURES["sources"]).tasks}
  assert sources == set(mixtures.leaf_tasks(list(names.SOURCE_TASKS.values())))
  for mixture in names.MIXTURES.values():
    rates = set(seqio.get_mixture_or_task(mixture)._task_to_rate.values())  # pylint: disable=protected-access
    assert rates == {mixtures.ExamplesProportional(2 ** 19)}, mixture


def test_mixture_feeds_the_encoder_decoder_feature_converter(two_tiny_tasks):
  name = mixtures.register_mixture("test_mix_converter", list(two_tiny_tasks.values()))
  ds = seqio.get_mixture_or_task(name).get_dataset(SEQ, split="train", shuffle=False, seed=0,
                                                   num_epochs=1)
  converted = seqio.EncDecFeatureConverter(pack=False)(ds, SEQ)
  # One epoch of a mixture stops when a task runs out, so at least min(SIZES) examples exist.
  examples = list(converted.take(min(SIZES.values())).as_numpy_iterator())
  assert len(examples) == min(SIZES.values())
  for ex in examples:
    assert ex["encoder_input_tokens"].shape == (32,) and ex["decoder_target_tokens"].shape == (8,)
    assert ex["decoder_input_tokens"][0] == 0
    assert ex["decoder_input_tokens"][1:].tolist() == ex["decoder_target_tokens"][:-1].tolist()
