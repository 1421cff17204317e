"""spot_jax.train.eval_log.JSONLogger writes seqio.JSONLogger's files, byte for byte, and encodes
a dataset's inputs once for every run evaluated on it."""
from __future__ import annotations

import numpy as np
import pytest
import seqio
import tensorflow as tf

from spot_jax.train import eval_log


def _dataset(n: int = 6) -> tf.data.Dataset:
  rng = np.random.default_rng(0)
  return tf.data.Dataset.from_tensor_slices({
      "inputs_pretokenized": np.array([f"sentence {i} é ✓".encode() for i in range(n)]),
      "inputs": rng.integers(0, 300, (n, 40)).astype(np.int32),  # > 32 values: a summary string
      "targets": rng.integers(0, 300, (n, 5)).astype(np.int32),
      "weight": rng.random(n).astype(np.float32),
      "label": np.arange(n, dtype=np.int64) % 2 == 0,
  }).cache()


def _write(logger_cls, out, dataset, step, inferences, **kwargs) -> dict[str, bytes]:
  out.mkdir()
  logger = logger_cls(output_dir=str(out), **kwargs)
  targets = [f"target {i}" for i in range(6)]
  logger(task_name="some_task", step=step, metrics={"accuracy": seqio.metrics.Scalar(50.0)},
         dataset=dataset, inferences=inferences, targets=targets)
  return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("step", [7, None])
@pytest.mark.parametrize("write_n_results", [None, 3, 0])
def test_the_same_files_as_seqio(tmp_path, step, write_n_results):
  dataset = _dataset()
  inferences = {"output": [f"out {i}" for i in range(6)], "prediction": [i % 3 for i in range(6)],
                "score": [np.float32(i / 7) for i in range(6)],
                "odd": [object()] * 6,  # not serializable: both drop the field (a warning)
                "aux_value": {"logits": [np.arange(3, dtype=np.float32) * i for i in range(6)]}}
  ours = _write(eval_log.JSONLogger, tmp_path / "ours", dataset, step, inferences,
                write_n_results=write_n_results)
  theirs = _write(seqio.JSONLogger, tmp_path / "seqio", dataset, step, inferences,
                  write_n_results=write_n_results)
  assert ours == theirs
  expected = 2 if write_n_results != 0 else 1
  assert len(ours) == expected and "some_task-metrics.jsonl" in ours
  if write_n_results != 0:
    lines = ours[f"some_task-{-1 if step is None else step:06}.jsonl"].decode().splitlines()
    assert len(lines) == (write_n_results or 6) and '"odd"' not in lines[0]
    assert '"aux_logits": [0.0, 1.0, 2.0]' in lines[1] and '"score": 0.1428' in lines[1]


def test_a_datasets_inputs_are_encoded_once_for_every_run(tmp_path, monkeypatch):
  dataset = _dataset()
  reads = []
  real = eval_log.tfds.as_numpy
  monkeypatch.setattr(eval_log.tfds, "as_numpy", lambda ds: reads.append(ds) or real(ds))
  files = [_write(eval_log.JSONLogger, tmp_path / f"run{k}", dataset, 3,
                  {"output": [f"run {k} out {i}" for i in range(6)]}) for k in range(3)]
  assert len(reads) == 1 and dataset in eval_log._ENCODED  # pylint: disable=protected-access
  assert [f["some_task-000003.jsonl"].decode().count("run ") for f in files] == [6, 6, 6]
  other = _dataset(4)  # another dataset is encoded on its own
  _write(eval_log.JSONLogger, tmp_path / "other", other, 3, {"output": ["x"] * 4})
  assert len(reads) == 2
