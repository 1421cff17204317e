"""What the mixed-batch serving tests share: a table of prompts and a batch of padded rows."""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from spot_jax.serve.catalog import prompt_loaders
from spot_jax.serve.catalog.table import PromptTable
from tests.helpers.prompt_train import frozen_backbone


def mixed_setup(config, modules: Mapping, make_params: Callable, lengths: Sequence[int],
                width: int):
  """The frozen backbone (seed 0), each module's parameters (`make_params(module, backbone,
  seed)`, seeds 1, 2, ...), the served table of them, and int32 rows [len(lengths), width] of
  random tokens, row r real up to lengths[r] and padded after:
  -> (backbone, modules, params by name, table, rows)."""
  backbone = frozen_backbone(config, 0)
  params = {n: make_params(m, backbone, i + 1) for i, (n, m) in enumerate(modules.items())}
  table = PromptTable([prompt_loaders.from_module(n, m, params[n]) for n, m in modules.items()],
                      config.emb_dim)
  rng = np.random.RandomState(0)
  tokens = rng.randint(2, config.vocab_size, size=(len(lengths), width)).astype(np.int32)
  for row, n in enumerate(lengths):
    tokens[row, n:] = 0
  return backbone, modules, params, table, tokens


def trained_looking_params(config, module, backbone, seed: int):
  """The module's parameters, every leaf moved off its initial value (B of DePT is not zero)."""
  import jax  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.t5 import Transformer  # pylint: disable=g-import-not-at-top
  from tests.helpers.prompt_train import create_prompt_params  # pylint: disable=g-import-not-at-top
  params = create_prompt_params(Transformer(config, prompt=module), backbone, seed)
  rs = np.random.RandomState(seed)
  return jax.tree.map(lambda v: np.asarray(v) + rs.normal(0, 0.7, v.shape).astype(np.float32),
                      params)
