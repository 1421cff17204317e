"""The prompted encoder-decoder: a T5 `Transformer` (optionally with a prompt module) plus its loss.

`EncoderDecoderModel` knows how to compute the loss of a batch, make the prompt's initial
parameters from the frozen ones, and predict / score batches. It holds no parameters itself.

Batches are dicts of int32 arrays: encoder_input_tokens [B, T], decoder_input_tokens [B, S],
decoder_target_tokens [B, S] and optionally decoder_loss_weights [B, S] (t5x's features) and
task_index [B] (each example's task, read by multi-task prompt methods only).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Union

import jax
import jax.numpy as jnp

from spot_jax import losses
from spot_jax.backbones import memory
from spot_jax.backbones.t5 import network, scoring
from spot_jax.models.common import PROMPT_KEY, Params, loss_and_metrics

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class EncoderDecoderModel:
  """Loss, initialisation and inference around a T5 `Transformer`.

  Attributes:
    module: the Flax network; `module.prompt` is the prompt method or None.
    z_loss: coefficient of t5x's z-loss.
    label_smoothing: label smoothing of the cross-entropy.
    loss_normalizing_factor: see `losses.cross_entropy_with_z_loss`.
    decode_method: "greedy", "beam" or "sample" for `predict_batch`.
    num_beams: beams for beam search.
    beam_alpha: beam search length-penalty exponent.
    eos_id: end-of-sequence id.
  """
  module: network.Transformer
  z_loss: float = 1e-4
  label_smoothing: float = 0.0
  loss_normalizing_factor: Union[None, str, float] = losses.NUM_REAL_TARGET_TOKENS
  decode_method: str = "greedy"
  num_beams: int = 4
  beam_alpha: float = 0.6
  eos_id: int = 1

  kind = "t5"  # the backbone kind (`spot_jax.backbones.kinds`)
  feature_layout = "encoder_decoder"  # the batches it reads (`spot_jax.data.FEATURE_LAYOUTS`)

  @property
  def config(self):
    return self.module.config

  def with_config(self, config: Any) -> "EncoderDecoderModel":
    """This model around the same network of another `T5Config` (e.g. its frozen dtype or
    remat policy resolved)."""
    return dataclasses.replace(self, module=self.module.clone(config=config))

  @property
  def has_prompt(self) -> bool:
    return self.module.prompt is not None

  @property
  def prompt_length(self) -> int:
    """Positions the prompt adds to the encoder input (0 without a prompt or for deep prompts)."""
    if self.module.prompt is None or network.is_deep_prompt(self.module.prompt):
      return 0
    return int(getattr(self.module.prompt, "length"))

  # --- parameters -------------------------------------------------------------------------

  @staticmethod
  def dummy_batch(input_length: int, target_length: int, batch_size: int = 1) -> dict[str, Array]:
    """An all-ones batch of the given lengths (for shape inference and initialisation)."""
    enc = jnp.ones((batch_size, input_length), jnp.int32)
    dec = jnp.ones((batch_size, target_length), jnp.int32)
    return {"encoder_input_tokens": enc, "decoder_input_tokens": dec, "decoder_target_tokens": dec}

  def backbone_module(self) -> network.Transformer:
    """The same network without the prompt (the frozen part's own tree)."""
    return self.module.clone(prompt=None)

  def init_backbone(self, rng: Array, batch: Mapping[str, Array]) -> Params:
    """Randomly initialised backbone parameters (boxed with logical axes), in the config's
    `frozen_dtype`."""
    variables = self.backbone_module().init(
        {"params": rng}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
        batch["decoder_target_tokens"], enable_dropout=False)
    return memory.cast(variables["params"], self.config.frozen_dtype)

  def init_prompt(self, rng: Array, frozen_params: Params, batch: Mapping[str, Array]) -> Params:
    """Prompt-side parameters `{"prompt": ...}` (boxed), initialised against the frozen weights.

    The prompt initialisers see the real (loaded) embedding table because the frozen
    parameters are given and only the missing prompt parameters are created.
    """
    if not self.has_prompt:
      return {}
    _, variables = self.module.apply(
        {"params": frozen_params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
        batch["decoder_target_tokens"], enable_dropout=False,
        rngs={"params": rng, "dropout": rng}, mutable=["params"])
    return {PROMPT_KEY: variables["params"][PROMPT_KEY]}

  # --- training ---------------------------------------------------------------------------

  def for_batches(self, task_feature_lengths: Mapping[str, int]) -> "EncoderDecoderModel":
    """This model for training batches of these lengths: itself (its decoder already runs on
    the targets alone)."""
    del task_feature_lengths
    return self

  def loss_fn(self, params: Params, batch: Mapping[str, Array], dropout_rng: Optional[Array],
              enable_dropout: bool = True) -> tuple[Array, dict[str, Array]]:
    """Loss of a batch and metrics (sums, prompt statistics, auxiliary losses)."""
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
    logits, state = self.module.apply(
        {"params": params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
        batch["decoder_target_tokens"], enable_dropout=enable_dropout, rngs=rngs,
        mutable=["intermediates", "aux_loss"], task_index=batch.get("task_index"))
    return self.task_loss(logits, batch, state)

  def task_loss(self, logits: Array, batch: Mapping[str, Array], state: Mapping[str, Any]
                ) -> tuple[Array, dict[str, Array]]:
    """The loss of teacher-forced `logits` [B, S, V] and the sown `state` (see `loss_fn`)."""
    targets = batch["decoder_target_tokens"]
    weights = batch.get("decoder_loss_weights", None)
    weights = (targets > 0) if weights is None else weights
    return loss_and_metrics(logits, targets, weights, state, z_loss=self.z_loss,
                            label_smoothing=self.label_smoothing,
                            loss_normalizing_factor=self.loss_normalizing_factor)

  # --- inference --------------------------------------------------------------------------

  def predict_batch(self, params: Params, encoder_input_tokens: Array, max_decode_length: int,
                    rng: Optional[Array] = None) -> Array:
    """Decoded token ids [B, max_decode_length] (0 after EOS)."""
    from spot_jax.backbones.t5 import generate  # pylint: disable=g-import-not-at-top
    tokens, _ = generate(self.module, params, encoder_input_tokens,
                         max_decode_length=max_decode_length, method=self.decode_method,
                         num_beams=self.num_beams, alpha=self.beam_alpha, rng=rng,
                         eos_id=self.eos_id)
    return tokens

  def score_batch(self, params: Params, batch: Mapping[str, Array]) -> Array:
    """Sum of target-token log-probabilities per example, [B]."""
    logits = self.module.apply({"params": params}, batch["encoder_input_tokens"],
                               batch["decoder_input_tokens"], batch["decoder_target_tokens"],
                               enable_dropout=False, task_index=batch.get("task_index"))
    return scoring.sequence_log_likelihood(logits, batch["decoder_target_tokens"])

  def classify_batch(self, params: Params, encoder_input_tokens: Array, labels: Array,
                     task_index: Optional[Array] = None) -> Array:
    """Log-likelihoods [B, C] of label rows labels [C, S] (EOS included, 0 = padding) for
    inputs [B, T]: each input is encoded once with the prompt, its C labels decoded."""
    encoded, valid = self.module.apply({"params": params}, encoder_input_tokens,
                                       enable_dropout=False, task_index=task_index,
                                       method=network.Transformer.encode)
    return scoring.label_log_likelihoods(self.module, params, encoded, valid, labels)

