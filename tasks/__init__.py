"""spot-jax seqio tasks and mixtures; `import tasks` registers all of them.

Importing is idempotent (names already in the seqio registries are left alone)
and never touches the network: data locations and the vocabulary file are
looked up when a dataset is built. Every name is listed in `tasks.names`;
`python -m tasks list` shows each task's source and whether its data is present.
`register_file_task` registers a task of your own from a TSV or JSONL file (`tasks.user`).
"""
# First, so that `python -m tasks` starts without TensorFlow's log lines (spot_jax/startup.py).
import spot_jax  # pylint: disable=unused-import
from tasks import c4
from tasks import classification
from tasks import glue
from tasks import mixtures
from tasks import qa
from tasks import super_glue
from tasks.data_dirs import DataNotFoundError, files_dir, set_files_dir, set_tfds_data_dir, tfds_data_dir
from tasks.mixtures import register_mixture
from tasks.names import SOURCE_TASKS, TARGET_TASKS
from tasks.registry import SPECS, register_file_variant, register_hf_variant
from tasks.user import register_file_task
from tasks.vocab import get_vocabulary

glue.register_all()
super_glue.register_all()
classification.register_all()
qa.register_all()
c4.register_all()
mixtures.register_all()
