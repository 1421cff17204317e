"""MPT's prompt distillation (Wang et al. 2023, section 3.2): the student model of source training.

The student is the frozen backbone with a `MultitaskPrompt` (task k's prompt P* o (u_k v_k^T));
the teacher of an example of task k is the same frozen backbone with task k's teacher prompt
(a SPoT library entry, `spot_jax.spot.sources.library_prompts(tasks=...)`). The loss adds the
paper's two distillation terms to the task loss:

    L = L_task + lambda * (L_logits + L_hidden)
    L_logits = KL(p_teacher || p_student) per target token (softmax at temperature tau, times
               tau^2), summed over real target tokens, divided by their number
    L_hidden = (H_student - H_teacher)^2 averaged over the embedding and the real encoder
               positions (prompt positions included): the encoder's output, the hidden states
               the decoder reads (the paper does not name a layer; both prompts have L tokens,
               so positions align)

The teacher runs without dropout and without gradient. `PromptDistillationModel` is an
`EncoderDecoderModel` whose `loss_fn` does this, so `spot_jax.train.train` trains it unchanged;
batches need the `task_index` feature (DatasetConfig.task_names = the tasks in teacher order).
Evaluation and prediction are the student's alone.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp

from spot_jax import models
from spot_jax.errors import ConfigError
from spot_jax.prompts import common, placement as placement_lib
from spot_jax.prompts.mpt import MultitaskPrompt
from spot_jax.backbones.t5 import network

Array = jax.Array


def kl_per_token(teacher_logits: Array, student_logits: Array, temperature: float) -> Array:
  """KL(softmax(t / tau) || softmax(s / tau)) * tau^2 per position: [B, S, V] -> [B, S]."""
  t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature)
  s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature)
  return jnp.sum(jnp.exp(t) * (t - s), axis=-1) * temperature ** 2


@dataclasses.dataclass(frozen=True)
class PromptDistillationModel(models.EncoderDecoderModel):
  """The student of MPT's source training, with the teacher terms in its loss.

  Attributes (besides `EncoderDecoderModel`'s; `module.prompt` must be a `MultitaskPrompt`):
    teacher_prompts: [K, L, E] teacher prompts (array or `common.Constant`), row k task k's.
    distill_weight: lambda (the paper's 0.9).
    kl_temperature: tau of the logit term.
  """
  teacher_prompts: Any = None
  distill_weight: float = 0.9
  kl_temperature: float = 1.0

  def __post_init__(self):
    prompt = self.module.prompt
    if not isinstance(prompt, MultitaskPrompt):
      raise ConfigError(f"prompt distillation trains a MultitaskPrompt student, not "
                        f"{type(prompt).__name__}; set PROMPT = @prompts.MultitaskPrompt()")
    if self.teacher_prompts is None:
      raise ConfigError("PromptDistillationModel.teacher_prompts is missing; give the [K, L, E] "
                        "teacher prompts, e.g. @sources.library_prompts(tasks=%TASK_NAMES)")
    teachers = common.Constant(self.teacher_prompts)
    want = (prompt.num_tasks, prompt.length)
    if teachers.value.ndim != 3 or teachers.shape[:2] != want:
      raise ConfigError(f"teacher prompts of shape {teachers.shape} do not fit a student of "
                        f"{want[0]} tasks and {want[1]} tokens; give one [{want[1]}, E] teacher "
                        f"per task, in task order")
    if not self.distill_weight >= 0 or not self.kl_temperature > 0:
      raise ConfigError(f"distill_weight={self.distill_weight!r}, kl_temperature="
                        f"{self.kl_temperature!r}; give distill_weight >= 0 and kl_temperature > 0")
    object.__setattr__(self, "teacher_prompts", teachers)

  def _teacher(self, frozen: Mapping[str, Any], batch: Mapping[str, Array], task: Array
               ) -> tuple[Array, Array, Array]:
    """(logits [B, S, V], encoded [B, L + T, E], valid [B, L + T]) of each row's teacher."""
    backbone = self.backbone_module()
    tokens = batch["encoder_input_tokens"]
    embedded = backbone.apply({"params": frozen}, tokens, method=lambda m, t: m.token_embedder(t))
    prompt = jnp.asarray(self.teacher_prompts.value)[task]  # [B, L, E]
    x, valid = placement_lib.combine(prompt, embedded, tokens > 0, self.module.prompt.placement)
    encoded = backbone.apply({"params": frozen}, x, valid,
                             method=lambda m, x, v: m.encoder(x, v, True))
    logits = backbone.apply({"params": frozen}, encoded, valid, batch["decoder_input_tokens"],
                            batch["decoder_target_tokens"], enable_dropout=False,
                            method=network.Transformer.decode)
    return jax.lax.stop_gradient((logits, encoded, valid))

  def loss_fn(self, params: models.Params, batch: Mapping[str, Array],
              dropout_rng: Optional[Array], enable_dropout: bool = True
              ) -> tuple[Array, dict[str, Array]]:
    """The student's task loss plus distill_weight * (logit KL + hidden-state MSE), and metrics."""
    task = batch.get("task_index")
    if task is None:
      raise ConfigError("prompt distillation got a batch without task_index; set the "
                        "DatasetConfig's task_names (TASK_NAMES) to the tasks in teacher order")
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
    logits, state = self.module.apply(
        {"params": params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
        batch["decoder_target_tokens"], enable_dropout=enable_dropout, rngs=rngs,
        mutable=["intermediates", "aux_loss"], task_index=task,
        capture_intermediates=lambda mdl, method: isinstance(mdl, network.Encoder))
    intermediates = dict(state.get("intermediates", {}))
    student_encoded = intermediates.pop("encoder")["__call__"][0]
    state = dict(state, intermediates=intermediates)
    loss, metrics = self.task_loss(logits, batch, state)
    frozen = {k: v for k, v in params.items() if k != models.PROMPT_KEY}
    teacher_logits, teacher_encoded, valid = self._teacher(frozen, batch, task)

    targets = batch["decoder_target_tokens"]
    weights = batch.get("decoder_loss_weights", None)
    weights = ((targets > 0) if weights is None else weights).astype(jnp.float32)
    kl = jnp.sum(kl_per_token(teacher_logits, logits, self.kl_temperature) * weights)
    kl = kl / jnp.maximum(jnp.sum(weights), 1.0)
    mask = valid.astype(jnp.float32)[..., None]
    squared = jnp.square(student_encoded.astype(jnp.float32) - teacher_encoded.astype(jnp.float32))
    hidden = jnp.sum(squared * mask) / jnp.maximum(jnp.sum(mask) * squared.shape[-1], 1.0)
    metrics.update(task_loss=loss, distill_kl=kl, distill_hidden=hidden)
    return loss + self.distill_weight * (kl + hidden), metrics
