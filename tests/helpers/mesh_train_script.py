"""Runs 5 training steps on meshes given on the command line and prints JSON results.

Run as a subprocess (XLA_FLAGS must be set before jax is imported):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python tests/helpers/mesh_train_script.py OUT_DIR 4 1
Each argument after OUT_DIR is a num_partitions value (model-axis size).
"""
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import jax  # pylint: disable=g-import-not-at-top

from spot_jax import data, models, prompts
from spot_jax import train as train_lib
from spot_jax.backbones.t5 import Transformer, config_by_name
from tests.helpers import local_tasks


def main(out_dir: str, partitions: list[int]) -> None:
  out = pathlib.Path(out_dir)
  task = local_tasks.register_tsv_task("test_mesh_polarity",
                                       local_tasks.write_tsv_task_files(out / "tsv"))
  prompt = prompts.PromptTuning(length=4, prompt_init=prompts.sampled_vocab(num_most_frequent=256))
  model = models.EncoderDecoderModel(Transformer(config_by_name("t5_1_1_byte_tiny"), prompt=prompt))
  cfg = data.DatasetConfig(task, {"inputs": 32, "targets": 4}, batch_size=8)
  results = {}
  for n in partitions:
    r = train_lib.train(model=model, train_dataset_cfg=cfg, total_steps=5,
                      model_dir=str(out / f"run_{n}"), num_partitions=n, log_period=1,
                      verbose=False)
    frozen_specs = {jax.tree_util.keystr(p): str(x.sharding.spec)
                    for p, x in jax.tree_util.tree_flatten_with_path(r.frozen_params)[0]}
    prompt_leaf = r.state.params["prompt"]["prompt"]
    results[str(n)] = {
        "devices": jax.device_count(),
        "mesh": dict(r.mesh.shape),
        "losses": [h["loss"] for h in r.history],
        "prompt_replicated": prompt_leaf.sharding.is_fully_replicated,
        "prompt_spec": str(prompt_leaf.sharding.spec),
        "frozen_specs": frozen_specs,
        "compilations": r.compilations,
    }
  print("RESULT " + json.dumps(results))


if __name__ == "__main__":
  main(sys.argv[1], [int(a) for a in sys.argv[2:]])
