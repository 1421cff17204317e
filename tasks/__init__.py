"""spot-jax seqio tasks and mixtures; `import tasks` registers all of them.

Importing is idempotent (names already in the seqio registries are left alone)
and never touches the network: data locations and the vocabulary file are
looked up when a dataset is built. Every name is listed in `tasks.names`;
`python -m tasks list` shows each task's source and whether its data is present.
`register_file_task` registers a task of your own from a TSV or JSONL file (`tasks.user`);
`register_chat_task` one from instruction data in chat shapes (`tasks.chat`).

  registry        idempotent seqio registration of tasks and their source variants
  names           every registered task and mixture name; the SPoT study's task lists
  vocab           the T5 vocabulary and the output features every task uses
  vocab_check     how a vocabulary spells texts and label words (`python -m tasks vocab`)
  data_dirs       where task data lives: the TFDS data_dir and the local-files directory
  sources         seqio data sources that never reach the network
  preprocessors   raw TFDS-shaped examples -> {"inputs", "targets"} strings
  postprocessors  decoded strings -> metric inputs, as T5 does
  metrics         T5's metrics in seqio's form
  scoring         score decoded predictions with a task's postprocessor and metrics
  glue            GLUE in T5's text-to-text format
  super_glue      SuperGLUE in T5's text-to-text format
  qa              SQuAD, DROP, MRQA, RACE
  classification  classification and similarity tasks T5 never defined
  c4              C4 prefix language modelling (a SPoT source task)
  mixtures        examples-proportional mixtures
  synthetic       synthetic tasks for smoke runs and trainer tests
  embedded        the embedded suite for the toy T5 (no downloads)
  user            your own task from a TSV or JSONL file
  chat            your own instruction task from JSONL (prompt/completion or messages)
  chat_format     instruction rows -> (inputs, targets) texts through the chat template
  answers         answers extracted from generated text (GSM8K's built in); exact match
  embedded_chat   the embedded suite's sums as conversations, for the toy decoder
  metamathqa      PEFT's MetaMathQA -> GSM8K benchmark: its splits prepared, then registered
  prepare         write a TFDS dataset from examples you already have
"""
# First, so that `python -m tasks` starts without TensorFlow's log lines (spot_jax/quiet_logs.py).
import spot_jax  # pylint: disable=unused-import
from tasks import c4
from tasks import classification
from tasks import glue
from tasks import mixtures
from tasks import qa
from tasks import super_glue
from tasks.data_dirs import (DataNotFoundError, files_dir, set_files_dir, set_tfds_data_dir,
                             tfds_data_dir)
from tasks.mixtures import register_mixture
from tasks.names import SOURCE_TASKS, TARGET_TASKS
from tasks.registry import SPECS, register_file_variant, register_hf_variant
from tasks.chat import register_chat_task
from tasks.user import register_file_task
from tasks.vocab import get_vocabulary

glue.register_all()
super_glue.register_all()
classification.register_all()
qa.register_all()
c4.register_all()
mixtures.register_all()
