"""spot-jax seqio tasks and mixtures; `import tasks` registers all of them.

Importing is idempotent (a name already in the seqio registry is left alone)
and never touches the network: data locations are looked up when a dataset is
built. Names are listed in `tasks.names`.
"""
from tasks import glue
from tasks import super_glue
from tasks.data_dirs import DataNotFoundError, files_dir, set_files_dir, set_tfds_data_dir, tfds_data_dir
from tasks.names import SOURCE_TASKS, TARGET_TASKS
from tasks.registry import SPECS, register_file_variant, register_hf_variant
from tasks.vocab import get_vocabulary

glue.register_all()
super_glue.register_all()
