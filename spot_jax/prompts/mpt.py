"""MPT, multitask prompt tuning (Wang et al. 2023): a shared prompt times rank-r task factors.

Task k's prompt is the shared prompt P* [L, E] scaled elementwise by a low-rank matrix:

    P_k = P* o (U_k V_k)          U_k [L, r] ("task columns"), V_k [r, E] ("task rows")

(r = 1 in the paper: P_k = P* o (u_k v_k^T)). Each example uses its own task's prompt (the
model's `task_index` feature; rows without it use `default_task`). The same parameterisation
as PEFT's MULTITASK_PROMPT_TUNING (prompt_embeddings = P*, prefix_task_cols = U,
prefix_task_rows = V), so adapters convert both ways (`spot_jax.serve.export.peft_mpt`).

Source training (K source tasks) distils per-task teacher prompts into P* and the factors
(`spot_jax.spot.distill`); a target (K = 1) starts from the source's P* (and, like PEFT's
AVERAGE_SOURCE_TASKS, the mean source factors) and trains P* and its factors, or only the
factors when `frozen_shared` holds P* as a constant. A trained target folds to the plain prompt
P* o (U V) [L, E] for serving (`fold`, `folded_module`).
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.prompts import common, initializers
from spot_jax.prompts.prompt_tuning import PromptTuning

Array = jax.Array


def ones() -> initializers.Initializer:
  """All ones: U V = 1 at the start, so every task's prompt starts as P* itself."""
  return lambda rng, shape, embedding: jnp.ones(tuple(shape), jnp.float32)


def normal(std: float = 0.02) -> initializers.Initializer:
  """N(0, std^2) entries (PEFT's initialisation of the task factors)."""
  validate.non_negative(std, "mpt.normal std")
  return lambda rng, shape, embedding: std * jax.random.normal(rng, tuple(shape), jnp.float32)


def factored_prompts(shared: Array, cols: Array, rows: Array) -> Array:
  """P* [L, E], U [K, L, r], V [K, r, E] -> P [K, L, E] = P* o (U_k V_k), float32."""
  product = jnp.einsum("klr,kre->kle", cols, rows, precision=jax.lax.Precision.HIGHEST)
  return shared[None].astype(jnp.float32) * product


class MultitaskPrompt(common.TaskIndexed):
  """K task prompts P_k = P* o (U_k V_k) of length L, selected per example by its task index.

  Parameters (under the backbone's `prompt/` subtree):
    shared [L, E] float32, axes ("prompt", "prompt_embed") (absent when `frozen_shared` is set);
    task_cols [K, L, r] ("prompts", "prompt", "prompt_mlp"); task_rows [K, r, E]
    ("prompts", "prompt_mlp", "prompt_embed"). Trainable count: L*E + K*r*(L + E), or
    K*r*(L + E) with a frozen shared prompt.

  Attributes:
    length: L (>= 1).
    num_tasks: K (>= 1): source tasks in distillation, 1 for a target.
    rank: r (1 in the paper and PEFT's default).
    shared_init: initialiser of P* (e.g. `from_checkpoint` / `spot_jax.serve.export.peft_mpt`).
    cols_init, rows_init: initialisers of U [K, L, r] and V [K, r, E] (default all ones).
    frozen_shared: None (P* trains), or a [L, E] array (or `common.Constant`) used as a
      constant P*: only the factors train.
    and, by keyword, `common.TaskIndexed`'s: default_task, placement, dtype.
  """
  length: int
  num_tasks: int = 1
  rank: int = 1
  shared_init: initializers.Initializer = initializers.sampled_vocab()
  cols_init: initializers.Initializer = ones()
  rows_init: initializers.Initializer = ones()
  frozen_shared: Optional[Any] = None

  def __post_init__(self):
    length = validate.positive_int(self.length, "MultitaskPrompt.length")
    k = validate.positive_int(self.num_tasks, "MultitaskPrompt.num_tasks")
    validate.positive_int(self.rank, "MultitaskPrompt.rank")
    self.check_task_settings(k, "MultitaskPrompt")
    if self.frozen_shared is not None:
      shared = common.Constant(self.frozen_shared)
      if shared.value.ndim != 2 or shared.shape[0] != length:
        raise ConfigError(f"MultitaskPrompt.frozen_shared has shape {shared.shape}; give the "
                          f"shared prompt [{length}, E]")
      object.__setattr__(self, "frozen_shared", shared)
    super().__post_init__()

  def row_prompts(self, embedded: Array, valid: Array, task_index: Array,
                  embedding: Array) -> Array:
    """Each row's task prompt P* o (u_k v_k): [B, L, E]."""
    del valid  # the prompt does not depend on the input
    embed = embedded.shape[-1]
    k, length, r = self.num_tasks, self.length, self.rank
    if self.frozen_shared is None:
      shared = common.prompt_param(self, "shared", self.shared_init, (length, embed),
                                   ("prompt", "prompt_embed"), embedding)
    else:
      if self.frozen_shared.shape[1] != embed:
        raise ConfigError(f"MultitaskPrompt.frozen_shared has width {self.frozen_shared.shape[1]} "
                          f"but the backbone's is {embed}; give a shared prompt of this model")
      shared = jnp.asarray(self.frozen_shared.value)
    cols = common.prompt_param(self, "task_cols", self.cols_init, (k, length, r),
                               ("prompts", "prompt", "prompt_mlp"), embedding)
    rows = common.prompt_param(self, "task_rows", self.rows_init, (k, r, embed),
                               ("prompts", "prompt_mlp", "prompt_embed"), embedding)
    cols, rows = jnp.asarray(cols), jnp.asarray(rows)  # parameters may come in as NumPy
    return factored_prompts(shared, cols[task_index], rows[task_index])

  def _arrays(self, params: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    params = common.unboxed_numpy(params)
    missing = {"task_cols", "task_rows"} - set(params)
    if self.frozen_shared is None:
      missing |= {"shared"} - set(params)
    if missing:
      raise ConfigError(f"MultitaskPrompt: the parameter subtree lacks {sorted(missing)}; pass the "
                        f"`prompt` subtree of a MultitaskPrompt model")
    shared = self.frozen_shared.value if self.frozen_shared is not None else params["shared"]
    return (np.asarray(shared, np.float32), np.asarray(params["task_cols"], np.float32),
            np.asarray(params["task_rows"], np.float32))

  def shared_and_factors(self, params: Any) -> dict[str, np.ndarray]:
    """{"shared": P* [L, E], "task_cols": U [K, L, r], "task_rows": V [K, r, E]} as float32."""
    shared, cols, rows = self._arrays(params)
    return {"shared": shared, "task_cols": cols, "task_rows": rows}

  def task_prompts(self, params: Any) -> np.ndarray:
    """Every task's folded prompt P* o (U_k V_k), [K, L, E] float32."""
    return np.asarray(factored_prompts(*map(jnp.asarray, self._arrays(params))), np.float32)

  def fold(self, params: Any, task: Optional[int] = None) -> dict[str, Array]:
    """The parameters {"prompt": P_task [L, E]} of the equivalent `folded_module()`.

    Args:
      params: this module's parameter subtree, boxed or not.
      task: which task's prompt (default: `default_task`).
    """
    task = self.default_task if task is None else task
    if not 0 <= task < self.num_tasks:
      raise ConfigError(f"MultitaskPrompt.fold: task {task} is not in 0..{self.num_tasks - 1}")
    return {"prompt": jnp.asarray(self.task_prompts(params)[task])}

  def folded_module(self) -> PromptTuning:
    """The PromptTuning module that, with `fold(params)`, computes the same outputs."""
    return PromptTuning(self.length, placement=self.placement, dtype=self.dtype, parent=None)

  def export_prompt(self, params: Any) -> np.ndarray:
    """The folded prompt [L, E] of a single task, or every task's [K, L, E]."""
    prompts = self.task_prompts(params)
    return prompts[0] if self.num_tasks == 1 else prompts
