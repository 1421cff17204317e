"""`python -m spot_jax.train`: gin-configured training (t5x's command line conventions).

  python -m spot_jax.train \
    --gin_file=gin/models/t5_1_1_base.gin \
    --gin_file=gin/prompts/prompt_tuning_sampled_vocab.gin \
    --gin_file=gin/runs/prompt_tune.gin \
    --gin.MODEL_DIR="'/tmp/rte'" --gin.MIXTURE_OR_TASK_NAME="'spot_glue_rte_v200'" \
    --gin.INITIAL_CHECKPOINT_PATH="'/ckpts/t5_1_1_lm100k_base/checkpoint_1100000'" \
    --gin.PROMPT_LENGTH=100

The run files bind `spot_jax.train.train` (see gin/runs/); this module only parses flags.
"""
from __future__ import annotations

import sys

from spot_jax.cli import gin_flags

# main() calls these configurables; gin overrides they never reach are refused.
PROGRAM = gin_flags.Program("spot_jax.train", __doc__.splitlines()[0],
                            roots=("spot_jax.train.train",))
GIN_ROOTS = PROGRAM.roots
main = PROGRAM.main

if __name__ == "__main__":
  sys.exit(PROGRAM(sys.argv[1:]))
